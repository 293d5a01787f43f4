"""Faults lose nothing: a real SIGKILL mid-training, unwritable outputs."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from sslbench import io
from conftest import METHODS_DIR, REPO

pytestmark = pytest.mark.slow


def pretrain_cmd(cfg: dict, out) -> list[str]:
    return [sys.executable, "-m", "sslbench.cli", "pretrain", "--method-dir", str(METHODS_DIR / "simclr"),
            "--config-json", json.dumps(cfg), "--seed", "0", "--out", str(out), "--device", "cpu", "--quiet",
            "--threads", "1"]


def test_sigkill_mid_epoch_then_rerun_gives_the_uninterrupted_checkpoint(tmp_path, method_config):
    cfg = method_config("simclr", train={"epochs": 4})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reference = subprocess.run(pretrain_cmd(cfg, tmp_path / "ref"), env=env, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr

    run = tmp_path / "killed"
    proc = subprocess.Popen(pretrain_cmd(cfg, run), env=env)
    first = run / "checkpoints" / "epoch_0001.pt"
    deadline = time.time() + 120
    while not first.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert first.exists(), "no epoch checkpoint appeared"
    time.sleep(0.3)  # into the second epoch
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "checkpoint.pt").exists()

    resumed = subprocess.run(pretrain_cmd(cfg, run), env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(tmp_path / "ref" / "checkpoint.pt", weights_only=False)
    b = torch.load(run / "checkpoint.pt", weights_only=False)
    assert a["encoder"].keys() == b["encoder"].keys()
    for key in a["encoder"]:
        assert torch.equal(a["encoder"][key], b["encoder"][key]), key
    assert (run / "train_log.csv").read_text().count("\n") == 5  # header + 4 epochs, none twice


def test_unwritable_output_is_a_clear_error_and_leaves_no_partial_file(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(io.OutputError, match="cannot write .*not_a_folder"):
        io.write_json(blocker / "x.json", {"a": 1})

    target = tmp_path / "result.json"
    io.write_json(target, {"old": 1})
    with pytest.raises(ValueError):
        io.write_json(target, {"bad": float("nan")})  # refused before any byte is written
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
