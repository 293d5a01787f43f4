"""Progress while a DAG runs: a pretrain job's log gets a line per epoch, and `sslbench status`, run
beside the running snakemake, lists the job with its epoch, loss, monitored kNN and time left."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from support import copy_workflow, tiny_suite_config

pytestmark = pytest.mark.slow
EPOCHS = 400  # minutes of training: the test stops it once status has seen it run


def test_status_shows_a_pretrain_job_in_progress(tmp_path):
    root = copy_workflow(tmp_path / "wf")
    cfg = tiny_suite_config(epochs=EPOCHS)
    cfg.update(methods=["simclr"], protocols=["knn"])
    (root / "long.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    dag = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "1", "results/table.csv", "--configfile", "long.yaml"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    run = root / "results" / "digits" / "simclr" / "seed0"
    try:
        deadline = time.monotonic() + 300
        while not re.search(r"^\[sslbench\] epoch 2/", read(run / "logs" / "pretrain.log"), re.M):
            assert dag.poll() is None and time.monotonic() < deadline, read(run / "logs" / "pretrain.log")
            time.sleep(0.5)
        status = subprocess.run(
            [sys.executable, "-m", "sslbench.cli", "status", "--configfile", "long.yaml"],
            cwd=root, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert dag.poll() is None, "the DAG ended before status ran: raise EPOCHS"
    finally:
        os.killpg(dag.pid, signal.SIGTERM)
        dag.wait(timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    # the kNN monitor every second epoch: the last measured, with its epoch where it is an earlier one
    shown = (
        r"^  results/digits/simclr/seed0  epoch (\d+)/400  loss \S+ kNN (\S+) RankMe \S+(?: \(epoch \d+\))?"
        r"  (.+) left$"
    )
    line = re.search(shown, status.stdout, re.M)
    assert line, status.stdout
    assert int(line[1]) >= 2 and 0 <= float(line[2]) <= 1 and line[3] != "?"
    assert "pretraining: 1 not finished, 0 finished" in status.stdout
    log = read(run / "logs" / "pretrain.log")
    assert re.search(r"^\[sslbench\] epoch 1/400 loss \S+ \d+ img/s \S+ s, .+ left$", log, re.M), log


def read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
