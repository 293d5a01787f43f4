"""Real torch.distributed: 2 processes, gloo backend on the CPU, launched by torchrun."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import METHODS_DIR, REPO, tiny_suite_config

pytestmark = pytest.mark.slow
DDP_DIR = Path(__file__).parent / "ddp"


def torchrun(*args: str, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("mode", ["nolabels", "labels"])
def test_supcon_on_two_ranks_equals_one_process(mode):
    run = torchrun(str(DDP_DIR / "supcon_equivalence.py"), mode)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("gradients equal") == 2


def test_torchrun_training_writes_one_checkpoint(tmp_path):
    from sslbench.config import resolve_method_config

    cfg = resolve_method_config(tiny_suite_config(epochs=1), METHODS_DIR, "simclr")
    out = tmp_path / "run"
    run = torchrun(
        "-m",
        "sslbench.cli",
        "pretrain",
        "--method-dir",
        str(METHODS_DIR / "simclr"),
        "--config-json",
        __import__("json").dumps(cfg),
        "--seed",
        "0",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--quiet",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    import torch

    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["meta"]["world_size"] == 2 and ckpt["meta"]["batch_per_process"] == 32
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_0001.pt"]


METHODS = ["simclr", "moco", "pcl", "supcon", "sela", "supervised", "random"]


def test_every_method_trains_under_torchrun_with_identical_state_on_both_ranks(tmp_path):
    import json

    run = torchrun(str(DDP_DIR / "train_every_method.py"), str(tmp_path), *METHODS, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    reports = [
        json.loads(line)
        for rank in (0, 1)
        for line in (tmp_path / f"report_rank{rank}.jsonl").read_text().splitlines()
    ]
    assert sorted((r["method"], r["rank"]) for r in reports) == sorted(
        (m, r) for m in METHODS for r in (0, 1)
    )
    for report in reports:
        assert report["mismatched"] == [], report
    for method in METHODS:
        assert (tmp_path / method / "checkpoint.pt").exists(), method
        epochs = 0 if method == "random" else 1  # the untrained floor never trains
        assert len(list((tmp_path / method / "checkpoints").glob("epoch_*.pt"))) == epochs, method
