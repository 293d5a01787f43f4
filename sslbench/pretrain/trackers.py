"""Where a pretrain job also sends its train_log.csv rows: experiment trackers, each optional and off by
default (the config's ``logging``, not a training setting). A tracker gets every numeric column of a
row under its train_log.csv name, at step = the epoch, so what it shows is the log.

- ``tensorboard``: event files in the run folder's ``tensorboard/`` (``torch.utils.tensorboard``; needs
  the ``tensorboard`` package: ``pip install -e '.[track]'``). Open them with ``tensorboard --logdir
  results``.
- ``wandb``: a Weights & Biases run per job, named by its run folder (``digits/moco/seed0``), grouped
  by dataset and method, with the run's settings as its config; in ``wandb_project``, in
  ``wandb_mode`` ``offline`` (files in the run folder's ``wandb/``, sent later with ``wandb sync``)
  or ``online`` (after ``wandb login``). Needs ``wandb`` (the ``track`` extra).

A tracker's files are a view of the log, so they are rewritten from it whenever a job starts with
rows already logged (a resumed run, or a finished one kept with a tracker newly turned on): a step is
never shown twice, and one logged before a kill is never missing. Online, a resumed job is a new W&B
run holding the whole log; the interrupted one stays in the project.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from sslbench.errors import ConfigError

TENSORBOARD_DIR, WANDB_DIR = "tensorboard", "wandb"


class Trackers:
    """The trackers ``settings`` (the config's ``logging``) turns on, for the run folder ``run_dir`` of a
    run with settings ``run_config`` (a W&B run's config)."""

    def __init__(self, settings: dict | None, run_dir: str | Path, run_config: dict | None = None):
        self.settings, self.run_dir, self.run_config = dict(settings or {}), Path(run_dir), run_config or {}
        self.writers, self.wandb_run = [], None

    def replay(self, rows: list[dict]) -> None:
        """Start afresh with ``rows``: the trackers' old files removed, then every row logged."""
        self.close()
        if self.settings.get("tensorboard"):
            folder = self.run_dir / TENSORBOARD_DIR
            shutil.rmtree(folder, ignore_errors=True)
            self.writers.append(tensorboard_writer(folder))
        if self.settings.get("wandb"):
            shutil.rmtree(self.run_dir / WANDB_DIR, ignore_errors=True)
            self.wandb_run = wandb_run(self.settings, self.run_dir, self.run_config)
        for row in rows:
            self.log(row)

    def log(self, row: dict) -> None:
        values, step = scalars(row), int(row["epoch"])
        for writer in self.writers:
            for key, value in values.items():
                writer.add_scalar(key, value, step)
            writer.flush()  # seen by a TensorBoard watching the run, and safe from a kill
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        self.writers, self.wandb_run = [], None


def scalars(row: dict) -> dict[str, float]:
    """The row's numeric columns but the epoch (the step), NaN (a column not measured this epoch) left out."""
    out = {}
    for key, value in row.items():
        if key == "epoch" or isinstance(value, bool) or value in (None, ""):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isnan(number):
            out[key] = number
    return out


def tensorboard_writer(folder: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "config key `logging.tensorboard` is true, but the tensorboard package is not installed: "
            "`pip install -e '.[track]'` (or `pip install tensorboard`), or set it to false"
        ) from None
    return SummaryWriter(str(folder))


def wandb_run(settings: dict, run_dir: Path, run_config: dict):
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "config key `logging.wandb` is true, but the wandb package is not installed: "
            "`pip install -e '.[track]'` (or `pip install wandb`), or set it to false"
        ) from None
    dataset, method, seed = run_dir.resolve().parts[-3:]
    run_dir.mkdir(parents=True, exist_ok=True)  # wandb writes its files in dir/wandb/
    return wandb.init(
        project=settings["wandb_project"],
        mode=settings["wandb_mode"],
        name=f"{dataset}/{method}/{seed}",
        group=f"{dataset}/{method}",
        config=run_config,
        dir=str(run_dir),
        settings=wandb.Settings(console="off"),  # the job's own log keeps its lines
    )
