"""The warm server (sslbench.warm): a job forked from it computes what its own process would, and
reports errors as its own process would."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from support import REPO, pretrain_args

from sslbench import warm


def sslbench(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sslbench.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def pretrain(cfg: dict, out) -> list[str]:
    """A one-thread run that also writes its features (the pretrain rule's command line)."""
    return [*pretrain_args(cfg, out), "--features-out", str(out / "features.npz"), "--threads", "1"]


@pytest.fixture
def warm_env():
    """The environment of jobs that use a warm server of their own, in a short folder (a socket's path is
    at most 108 bytes) that is removed once the idle server has exited."""
    folder = Path(tempfile.mkdtemp(prefix="warm", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": str(REPO), warm.DIR_VARIABLE: str(folder), warm.IDLE_VARIABLE: "5"}
    env.pop("SSLBENCH_DEBUG", None)
    yield {**env, warm.SWITCH: "1"}
    wait_for(lambda: not list(folder.glob("*.sock")), "the idle server to exit", seconds=30)
    shutil.rmtree(folder)


def server_up(env: dict) -> bool:
    return bool(list(Path(env[warm.DIR_VARIABLE]).glob("*.sock")))


def wait_for(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_job_forked_from_the_warm_server_trains_the_same_bits_and_fails_the_same_way(
    tmp_path, method_config, warm_env
):
    env = warm_env
    cfg = method_config("simclr", train={"epochs": 1})

    own = sslbench(pretrain(cfg, tmp_path / "own"), {**env, warm.SWITCH: "0"})
    assert own.returncode == 0, own.stderr
    starts = sslbench(pretrain(cfg, tmp_path / "starts"), {**env, warm.SWITCH: "1"})  # no server yet
    assert starts.returncode == 0, starts.stderr
    wait_for(lambda: server_up(env), "the warm server")
    forked = sslbench(pretrain(cfg, tmp_path / "forked"), {**env, warm.SWITCH: "1"})
    assert forked.returncode == 0, forked.stderr

    def launch(run):
        return json.loads((tmp_path / run / "run.json").read_text())["meta"]["launch"]

    assert (launch("own"), launch("starts")) == ("own process", "own process")
    assert launch("forked").startswith("forked from warm server")
    reference = torch.load(tmp_path / "own" / "checkpoint.pt", weights_only=False)
    checkpoint = torch.load(tmp_path / "forked" / "checkpoint.pt", weights_only=False)
    assert reference["encoder"].keys() == checkpoint["encoder"].keys()
    for name, tensor in reference["encoder"].items():
        assert torch.equal(tensor, checkpoint["encoder"][name]), name
    import numpy as np

    own_features, forked_features = (np.load(tmp_path / run / "features.npz") for run in ("own", "forked"))
    for split in ("train", "test"):
        np.testing.assert_array_equal(own_features[split], forked_features[split])

    bad = method_config("simclr", train={"batch_size": 100_000})
    failed = sslbench(pretrain(bad, tmp_path / "bad"), {**env, warm.SWITCH: "1"})
    assert failed.returncode == 1
    assert "sslbench pretrain: error:" in failed.stderr and "Traceback" not in failed.stderr, failed.stderr


def test_a_server_serves_only_jobs_that_import_with_the_same_threads_and_kernels(monkeypatch):
    key = warm.server_key()
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    assert warm.server_key() == key
    for name, value in (
        ("OMP_NUM_THREADS", "7"),
        ("ONEDNN_MAX_CPU_ISA", "AVX2"),
        ("SSLBENCH_CPU_KERNELS", "native"),
    ):
        with monkeypatch.context() as changed:
            changed.setenv(name, value)
            assert warm.server_key() != key, name


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":  # state, parent pid; zombies are already gone
            found.append(int(stat.parent.name))
    return found


def test_a_killed_job_process_takes_its_forked_child_along(tmp_path, method_config, warm_env):
    """snakemake cancels a job by killing its process: the child running the job must stop too."""
    env = warm_env
    quick = method_config("simclr", train={"epochs": 1})
    assert sslbench(pretrain(quick, tmp_path / "starts"), env).returncode == 0  # starts the server
    wait_for(lambda: server_up(env), "the warm server")
    assert sslbench(pretrain(quick, tmp_path / "warm"), env).returncode == 0
    server = int(json.loads((tmp_path / "warm" / "run.json").read_text())["meta"]["launch"].rsplit(" ", 1)[1])

    long = method_config("simclr", train={"epochs": 200})
    job = subprocess.Popen(
        [sys.executable, "-m", "sslbench.cli", *pretrain(long, tmp_path / "long")], env=env
    )
    wait_for(lambda: children_of(server), "the forked job")
    job.kill()  # SIGKILL: nothing of the job's process runs any more
    job.wait()
    wait_for(lambda: not children_of(server), "the child to stop", seconds=30)
    assert not (tmp_path / "long" / "checkpoint.pt").exists()
