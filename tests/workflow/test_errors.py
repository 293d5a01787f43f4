"""Errors we expect print their message alone with exit status 1; SSLBENCH_DEBUG=1 adds the traceback;
any other exception (a bug) keeps its traceback."""

import os
import subprocess
import sys

import pytest
from support import REPO, pretrain_args

from sslbench import cli
from sslbench.data.files import DatasetError
from sslbench.errors import DEBUG_VARIABLE, ConfigError
from sslbench.optim import TrainingDiverged


@pytest.mark.slow
def test_a_diverged_run_prints_its_message_alone_and_the_traceback_only_when_asked(
    tmp_path, method_config, monkeypatch
):
    cfg = method_config("simclr", train={"epochs": 1, "lr": 1e30})
    command = [sys.executable, "-m", "sslbench.cli", *pretrain_args(cfg, tmp_path / "run"), "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(DEBUG_VARIABLE, None)
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "sslbench pretrain: error: simclr: loss is" in out.stderr and "Lower `train.lr`" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "run" / "checkpoint.pt").exists()

    monkeypatch.setenv(DEBUG_VARIABLE, "1")  # in this process: the exception itself, with its traceback
    with pytest.raises(TrainingDiverged, match="simclr: loss is"):
        cli.main(pretrain_args(cfg, tmp_path / "run"))


def test_a_config_error_prints_its_message_alone(tmp_path, method_config, monkeypatch):
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    cfg = method_config("simclr", train={"batch_size": 100_000})
    with pytest.raises(SystemExit) as exit_:
        cli.main(pretrain_args(cfg, tmp_path / "run"))
    message = str(exit_.value.code)  # what the interpreter prints, alone, with exit status 1
    assert message.startswith("sslbench pretrain: error: config key `train.batch_size` = 100000 exceeds")

    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(ConfigError, match="train.batch_size"):
        cli.main(pretrain_args(cfg, tmp_path / "run"))


def test_a_data_error_prints_its_message_alone(tmp_path, method_config, monkeypatch):
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    cfg = method_config("simclr")
    cfg["dataset"].update(name="cifar10", root=str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(pretrain_args(cfg, tmp_path / "run"))
    message = str(exit_.value.code)
    assert message.startswith("sslbench pretrain: error: ") and "nowhere" in message, message

    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(DatasetError):
        cli.main(pretrain_args(cfg, tmp_path / "run"))


def test_a_bug_keeps_its_traceback(tmp_path, method_config, monkeypatch):
    """A ValueError that is not ours (here from inside a method's loss) is not turned into a message."""
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    folder = tmp_path / "buggy"
    folder.mkdir()
    (folder / "method.py").write_text(
        "from sslbench import Method\n\n\n"
        "class Buggy(Method):\n"
        "    def training_loss(self, views, labels, indices):\n"
        "        raise ValueError('a bug in the loss')\n"
    )
    cfg = method_config("simclr", train={"epochs": 1})
    with pytest.raises(ValueError, match="a bug in the loss"):
        cli.main(pretrain_args(cfg, tmp_path / "run", method_dir=folder))


@pytest.mark.slow
def test_snakemake_prints_our_config_errors_alone(tmp_path):
    """Errors raised while snakemake reads the Snakefile show no frames (the schema check's case is
    in test_bad_input.py); SSLBENCH_DEBUG=1 shows them."""
    (tmp_path / "bad.yaml").write_text("methods: [simclr]\nmethod_overrides: {simclr: {temprature: 0.1}}\n")
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n", "--cores", "1"]
    command += ["--configfile", "bad.yaml"]
    env = {k: v for k, v in os.environ.items() if k != DEBUG_VARIABLE}
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 1
    assert "sslbench: error: config key `method_overrides.simclr.temprature`" in text, text
    assert 'File "' not in text and "InputFunctionException" not in text, text

    (tmp_path / "bad.yaml").write_text("train: {epochs: 0}\n")
    env[DEBUG_VARIABLE] = "1"
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "config key `train.epochs`" in text and 'File "' in text, text
