"""Faults lose nothing: a real SIGKILL mid-training, unwritable outputs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from support import REPO, copy_workflow, pretrain_args

from sslbench import atomic

pytestmark = pytest.mark.slow


def pretrain_cmd(cfg: dict, out) -> list[str]:
    """`sslbench pretrain` of ``cfg`` into ``out`` as a fresh process on one thread."""
    return [sys.executable, "-m", "sslbench.cli", *pretrain_args(cfg, out), "--threads", "1"]


def test_sigkill_mid_epoch_then_rerun_gives_the_uninterrupted_checkpoint(tmp_path, method_config):
    cfg = method_config("simclr", train={"epochs": 4})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reference = subprocess.run(pretrain_cmd(cfg, tmp_path / "ref"), env=env, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr

    run = tmp_path / "killed"
    proc = subprocess.Popen(pretrain_cmd(cfg, run), env=env)
    first = run / "train_log.csv"  # written after each epoch's checkpoint
    deadline = time.time() + 120
    while not first.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert first.exists(), "no epoch was logged"
    proc.send_signal(signal.SIGKILL)  # at once: an epoch here takes a fraction of a second
    proc.wait()
    assert not (run / "checkpoint.pt").exists()
    latest = sorted((run / "checkpoints").glob("epoch_*.pt"))[-1]  # the last complete epoch before the kill
    assert latest.name < "epoch_0004.pt"
    killed_rows = first.read_text().splitlines(keepends=True)
    assert len(killed_rows) >= 2  # the header and epoch 1 at least

    resumed = subprocess.run(pretrain_cmd(cfg, run), env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and latest.name in resumed.stdout, resumed.stdout
    a = torch.load(tmp_path / "ref" / "checkpoint.pt", weights_only=False)
    b = torch.load(run / "checkpoint.pt", weights_only=False)
    assert a["encoder"].keys() == b["encoder"].keys()
    for key in a["encoder"]:
        assert torch.equal(a["encoder"][key], b["encoder"][key]), key
    rows = (run / "train_log.csv").read_text().splitlines(keepends=True)
    assert len(rows) == 5  # header + 4 epochs, none twice
    # The killed run's rows, timings included, byte for byte: a retrain would have measured new ones.
    assert rows[: len(killed_rows)] == killed_rows


def test_unwritable_output_is_a_clear_error_and_leaves_no_partial_file(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(atomic.OutputError, match="cannot write .*not_a_folder"):
        atomic.write_json(blocker / "x.json", {"a": 1})

    target = tmp_path / "result.json"
    atomic.write_json(target, {"old": 1})
    with pytest.raises(ValueError):
        atomic.write_json(target, {"bad": float("nan")})  # refused before any byte is written
    assert json.loads(target.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_reports_unwritable_results_without_a_traceback(tmp_path, method_config):
    blocker = tmp_path / "results"
    blocker.write_text("")
    cfg = method_config("simclr", train={"epochs": 1})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(pretrain_cmd(cfg, blocker / "run"), env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "error: cannot write" in out.stderr and "Traceback" not in out.stderr


def test_snakemake_killed_mid_training_resumes_on_the_next_run(tmp_path, method_config):
    """SIGKILL to snakemake and its training job mid-epoch; `snakemake --unlock` and a rerun resume from
    the last complete epoch and end with the checkpoint of a run that was never interrupted."""

    import yaml
    from support import tiny_suite_config

    root = tmp_path / "wf"
    root.mkdir()
    copy_workflow(root)
    cfg = tiny_suite_config(epochs=4)
    cfg.update(methods=["simclr"], protocols=["knn"])
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        "1",
        "results/table.csv",
        "--configfile",
        "tiny.yaml",
    ]

    proc = subprocess.Popen(
        cmd, cwd=root, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run = root / "results" / "digits" / "simclr" / "seed0"
    deadline = time.time() + 300
    while not (run / "checkpoints" / "epoch_0001.pt").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (run / "checkpoints" / "epoch_0001.pt").exists(), "training never wrote an epoch checkpoint"
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake and the training job, as a node failure would
    proc.wait()
    assert not (run / "checkpoint.pt").exists()

    for args in (["--unlock"], ["--rerun-incomplete"]):
        out = subprocess.run(cmd + args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed from" in (run / "logs" / "pretrain.log").read_text()
    assert (root / "results" / "table.csv").exists()

    resolved = method_config("simclr", train={"epochs": 4})
    reference = subprocess.run(
        pretrain_cmd(resolved, tmp_path / "ref"),
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert reference.returncode == 0, reference.stderr
    a = torch.load(tmp_path / "ref" / "checkpoint.pt", weights_only=False)["encoder"]
    b = torch.load(run / "checkpoint.pt", weights_only=False)["encoder"]
    assert all(torch.equal(a[k], b[k]) for k in a)
