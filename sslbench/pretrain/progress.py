"""How far a pretrain job has come: the line its log gets after each epoch, and what `sslbench status`
reads from a run folder while the DAG runs (its train_log.csv, rewritten after every epoch, and
run.json, written when the job ends).

The time left is the epochs left times the mean wall time of the epochs logged so far, their
monitors included. A run has finished when its run.json was written from this very log (the same
epochs and the same summed epoch seconds): file dates would not tell, as a failed job's files put back
by Snakemake get new ones. An unfinished run whose log is older than ``STALLED_AFTER`` epochs (at least
``STALLED_MIN_S`` seconds) is said to have stopped (killed, preempted or failed).
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

STALLED_AFTER, STALLED_MIN_S = 3, 60.0


def epoch_seconds(rows: list[dict]) -> float | None:
    """The mean wall time of the logged epochs, their monitors included; None before the first."""
    times = [float(r["seconds"]) + float(r.get("monitor_seconds") or 0.0) for r in rows]
    times = [t for t in times if math.isfinite(t)]
    return sum(times) / len(times) if times else None


def seconds_left(rows: list[dict], epochs: int) -> float | None:
    """Epochs left x ``epoch_seconds``; None before the first epoch."""
    mean = epoch_seconds(rows)
    return None if mean is None or not rows else max(0, epochs - int(rows[-1]["epoch"])) * mean


def duration(seconds: float | None) -> str:
    """12 s, 3 min 5 s, 2 h 4 min; "?" where unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


SHOWN_MONITORS = (("knn_top1", "kNN", ".3f"), ("rankme", "RankMe", ".1f"))


def monitors_of(row: dict) -> str:
    """The row's monitors as a line shows them, "kNN 0.712 RankMe 45.1"; "" where it has none."""
    parts = []
    for key, name, fmt in SHOWN_MONITORS:
        value = row.get(key)
        if value not in (None, "") and math.isfinite(float(value)):
            parts.append(f"{name} {float(value):{fmt}}")
    return " ".join(parts)


def measured(row: dict) -> str:
    """The row's loss and monitors, as a log line shows them: "loss 4.1234 kNN 0.712 RankMe 45.1"."""
    return " ".join(filter(None, [f"loss {float(row['loss']):.4f}", monitors_of(row)]))


def latest(rows: list[dict]) -> str:
    """The last epoch's loss, and the monitors last measured, with their epoch where it is an earlier
    one (they are measured every few epochs): "loss 4.1234 kNN 0.712 RankMe 45.1 (epoch 4)"."""
    shown = measured(rows[-1])
    if monitors_of(rows[-1]):
        return shown
    earlier = next((r for r in reversed(rows) if monitors_of(r)), None)
    return shown if earlier is None else f"{shown} {monitors_of(earlier)} (epoch {earlier['epoch']})"


def epoch_line(rows: list[dict], epochs: int) -> str:
    """The job log's line after the last of ``rows``."""
    row = rows[-1]
    return (
        f"[sslbench] epoch {row['epoch']}/{epochs} {measured(row)} {float(row['images_per_s']):.0f} img/s "
        f"{float(row['seconds']):.1f} s, {duration(seconds_left(rows, epochs))} left"
    )


def logged_rows(run_dir: str | Path) -> list[dict]:
    """The rows of a run folder's train_log.csv, as strings (none where it has no log)."""
    try:
        with open(Path(run_dir) / "train_log.csv", newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class RunProgress:
    """A run folder's state: ``rows`` of its train_log.csv, ``finished`` when its run.json was written
    from them (``written_from``), ``age_s`` since the log was last written."""

    folder: Path
    epochs: int
    rows: list[dict]
    finished: bool
    age_s: float

    @property
    def epoch(self) -> int:
        return int(self.rows[-1]["epoch"]) if self.rows else 0

    @property
    def stopped(self) -> bool:
        mean = epoch_seconds(self.rows) or 0.0
        return not self.finished and self.age_s > max(STALLED_MIN_S, STALLED_AFTER * mean)

    def line(self) -> str:
        head = f"{self.folder}  epoch {self.epoch}/{self.epochs}"
        shown = f"  {latest(self.rows)}" if self.rows else ""
        if self.finished:
            return f"{head}{shown}  finished"
        if self.stopped:
            return f"{head}{shown}  stopped: no epoch for {duration(self.age_s)}, and no run.json"
        return f"{head}{shown}  {duration(seconds_left(self.rows, self.epochs))} left"


def run_progress(folder: str | Path, epochs: int, now: float | None = None) -> RunProgress | None:
    """The state of a run folder, or None where its job has not written a log yet."""
    folder = Path(folder)
    log, run = folder / "train_log.csv", folder / "run.json"
    try:
        written = log.stat().st_mtime
        rows = logged_rows(folder)
    except (OSError, csv.Error):
        return None
    return RunProgress(
        folder, epochs, rows, written_from(run, rows), (time.time() if now is None else now) - written
    )


def written_from(run_json: Path, rows: list[dict]) -> bool:
    """Whether ``run_json`` records the end of the training that logged ``rows``: its epochs and its
    training time, the sum of their seconds (the trainer's ``train_wall_time_s``)."""
    try:
        meta = json.loads(run_json.read_text())["meta"]
        seconds = sum(float(row["seconds"]) for row in rows)
        return meta["epochs_trained"] == len(rows) and math.isclose(
            meta["train_wall_time_s"], seconds, rel_tol=1e-9
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def progress_lines(runs: list[tuple[str, int]]) -> list[str]:
    """`sslbench status`'s lines on pretraining, from the (run folder, epochs) of a plan's runs, while
    one is not finished (in progress or stopped): those first, then the finished ones. Nothing where
    every run that trained an epoch has finished (the plan's lines say the rest)."""
    states = [s for folder, epochs in runs if (s := run_progress(folder, epochs)) is not None and s.rows]
    if all(s.finished for s in states):
        return []
    states.sort(key=lambda s: s.finished)
    going = sum(not s.finished for s in states)
    head = f"pretraining: {going} not finished, {len(states) - going} finished (runs that trained an epoch)"
    return [head] + [f"  {s.line()}" for s in states]
