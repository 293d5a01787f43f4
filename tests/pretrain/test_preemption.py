"""A job told to stop (a scheduler's warning before preemption: SLURM's --signal=USR1@<s>, or SIGTERM)
writes a checkpoint after the step it is in and ends; run again, it goes on from that step and ends
bit-identical to a run never stopped. For a method with a queue (moco), one with a momentum teacher,
a centre and a temperature set at each epoch start (dino) and one with an E-step at each epoch start
(pcl); and through the CLI, stopped by a real signal from outside."""

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest
import torch
from support import METHODS_DIR

from sslbench.pretrain.trainer import Preempted, Trainer, pretrain


def assert_same_checkpoint(a_path, b_path):
    a, b = torch.load(a_path, weights_only=False), torch.load(b_path, weights_only=False)
    for part in ("encoder", "method_state"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)


def assert_same_losses(a_dir, b_dir):
    a, b = pd.read_csv(a_dir / "train_log.csv"), pd.read_csv(b_dir / "train_log.csv")
    assert a["loss"].tolist() == b["loss"].tolist() and a["lr"].tolist() == b["lr"].tolist()


@pytest.mark.parametrize("name, overrides", [("moco", {}), ("dino", {}), ("pcl", {"warmup_epochs": 0})])
def test_a_stopped_run_goes_on_from_its_step_and_ends_as_one_never_stopped(
    tmp_path, method_config, name, overrides
):
    cfg = method_config(name, **overrides)
    whole = pretrain(METHODS_DIR / name, cfg, 0, tmp_path / "whole", progress=False)
    stopped = Trainer(METHODS_DIR / name, cfg, 0, tmp_path / "stopped", progress=False)
    steps, after = stopped.steps_per_epoch, 5  # told during step 5 of the second epoch
    step_end = stopped.method.on_step_end

    def on_step_end(ctx):  # a real signal to this process, from inside the step
        step_end(ctx)
        if ctx.step == steps + after:
            signal.raise_signal(signal.SIGUSR1)

    stopped.method.on_step_end = on_step_end
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(Preempted, match=r"told to stop \(SIGUSR1\) in epoch 2"):
        stopped.fit()
    assert signal.getsignal(signal.SIGUSR1) is before  # the job's own handlers put back
    folder = tmp_path / "stopped" / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.pt")) == ["epoch_0001.pt", f"epoch_0001_step_{after:06d}.pt"]
    assert not (tmp_path / "stopped" / "checkpoint.pt").exists()

    resumed = pretrain(METHODS_DIR / name, cfg, 0, tmp_path / "stopped", progress=False)
    assert_same_checkpoint(whole, resumed)
    assert_same_losses(tmp_path / "whole", tmp_path / "stopped")
    assert sorted(p.name for p in folder.glob("*.pt")) == ["epoch_0001.pt", "epoch_0002.pt"]  # superseded
    meta = json.loads((tmp_path / "stopped" / "run.json").read_text())["meta"]
    assert meta["interruptions"] == [{"epoch": 2, "step": after, "signal": "SIGUSR1"}]
    assert pd.read_csv(tmp_path / "stopped" / "train_log.csv")["stops"].fillna(0).tolist() == [0, 1]


def test_the_cli_stopped_by_sigterm_from_outside_ends_as_a_run_never_stopped(tmp_path, method_config):
    cfg = json.dumps(method_config("moco", train={"epochs": 4}))

    def command(out):
        method = ["--method-dir", str(METHODS_DIR / "moco"), "--config-json", cfg, "--seed", "0"]
        return [
            sys.executable,
            "-m",
            "sslbench.cli",
            "pretrain",
            *method,
            "--out",
            str(out),
            "--device",
            "cpu",
        ]

    env = {**os.environ, "SSLBENCH_WARM": "0"}
    subprocess.run(command(tmp_path / "whole"), env=env, check=True, capture_output=True, timeout=600)
    job = subprocess.Popen(
        command(tmp_path / "stopped"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for line in job.stdout:  # after the first epoch: the signal lands within a later one
        if line.startswith("[sslbench] epoch 1/4"):
            job.send_signal(signal.SIGTERM)
            break
    out, err = job.communicate(timeout=600)
    assert job.returncode == 1, out + err
    assert "told to stop (SIGTERM)" in err and "Traceback" not in err
    rerun = subprocess.run(
        command(tmp_path / "stopped"), env=env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0 and "going on from step" in rerun.stdout, rerun.stdout + rerun.stderr
    assert_same_checkpoint(tmp_path / "whole" / "checkpoint.pt", tmp_path / "stopped" / "checkpoint.pt")
    assert_same_losses(tmp_path / "whole", tmp_path / "stopped")
    (stop,) = json.loads((tmp_path / "stopped" / "run.json").read_text())["meta"]["interruptions"]
    assert stop["signal"] == "SIGTERM" and stop["epoch"] >= 2
