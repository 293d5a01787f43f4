"""A run's checkpoints: one per epoch to resume from (the newest ``KEEP_CHECKPOINTS`` kept), one
within an epoch where a job was told to stop (preempted: ``epoch_<e>_step_<k>.pt``, the state after
step k of epoch e + 1, until the epoch's own checkpoint replaces it), and the final checkpoint.pt with
run.json, which extraction and the report read.

An epoch checkpoint of other settings is never resumed: it is set aside under
checkpoints/superseded/ before this run writes its own. One whose state does not fit the method's
code stops the run before anything is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from sslbench import atomic
from sslbench.errors import SslbenchError, UnreadableFileError

CHECKPOINT_DIR = "checkpoints"
KEEP_CHECKPOINTS = 2
SUPERSEDED_DIR = "superseded"  # under CHECKPOINT_DIR: checkpoints of other settings, kept, never resumed
WITHIN_PATTERN = "epoch_*_step_*.pt"  # checkpoints within an epoch, written when a job is told to stop


class CheckpointMismatch(SslbenchError, ValueError):
    """An epoch checkpoint written by other method code than the one running (its keys or shapes differ)."""


def key_differences(expected: Mapping, found: Mapping) -> tuple[list, list, list]:
    """(keys ``found`` lacks, keys it has beyond ``expected``, (key, found shape, expected shape) of the
    keys both have with other shapes): what keeps one state dict from loading into another's place."""
    shape = lambda value: tuple(getattr(value, "shape", ()))
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [(k, shape(found[k]), shape(expected[k])) for k in expected if k in found]
    return missing, unexpected, [(k, a, b) for k, a, b in shapes if a != b]


def state_differences(expected: dict, found: dict) -> list[str]:
    """How the state dict `found` differs from `expected` in keys and shapes (empty: it loads)."""
    missing, unexpected, shapes = key_differences(expected, found)
    return [
        f"{what}: {', '.join(keys)}"
        for what, keys in [
            ("keys the code has and the checkpoint lacks", missing),
            ("keys the checkpoint has and the code lacks", unexpected),
            ("shapes that differ", [f"{k} {a} instead of {b}" for k, a, b in shapes]),
        ]
        if keys
    ]


class EpochCheckpoints:
    """The epoch checkpoints of one run, in ``out_dir/checkpoints``."""

    def __init__(self, out_dir: str | Path):
        self.folder = Path(out_dir) / CHECKPOINT_DIR
        self.superseded: list[Path] = []  # checkpoints of other settings found by newest()

    def save(self, epoch: int, checkpoint: dict) -> None:
        """Write epoch ``epoch``'s checkpoint atomically and prune all but the newest ones, and every
        checkpoint within an epoch (this one holds more)."""
        self.set_aside_superseded()
        atomic.save_torch(self.folder / f"epoch_{epoch:04d}.pt", checkpoint, record_digest=True)
        for old in self.epoch_files()[:-KEEP_CHECKPOINTS] + sorted(self.folder.glob(WITHIN_PATTERN)):
            old.unlink()
            atomic.digest_file(old).unlink(missing_ok=True)

    def save_within(self, epoch: int, batch: int, checkpoint: dict) -> Path:
        """Write the checkpoint after step ``batch`` of the epoch that follows ``epoch`` completed ones."""
        self.set_aside_superseded()
        path = self.folder / f"epoch_{epoch:04d}_step_{batch:06d}.pt"
        atomic.save_torch(path, checkpoint, record_digest=True)
        return path

    def epoch_files(self) -> list[Path]:
        return sorted(p for p in self.folder.glob("epoch_*.pt") if not p.match(WITHIN_PATTERN))

    def within(self, epoch: int, cfg: dict, seed: int, device) -> tuple[Path, dict] | None:
        """(path, contents) of the newest readable checkpoint within the epoch after ``epoch`` completed
        ones, of these settings; None where there is none."""
        for path in sorted(self.folder.glob(f"epoch_{epoch:04d}_step_*.pt"), reverse=True):
            try:
                ckpt = atomic.load_torch(path, "checkpoint within an epoch", device)
            except UnreadableFileError as err:
                print(f"[sslbench] ignoring unreadable checkpoint {path}: {err.problem}")
                continue
            if ckpt.get("cfg") == cfg and ckpt.get("seed") == seed:
                return path, ckpt
        return None

    def set_aside_superseded(self) -> None:
        """Move the checkpoints of other settings into checkpoints/superseded/ before this run writes
        its own: pruning keeps the newest epoch numbers, which would otherwise be theirs."""
        if not self.superseded:
            return
        aside = self.folder / SUPERSEDED_DIR
        aside.mkdir(exist_ok=True)
        for path in self.superseded:
            for moved in (path, atomic.digest_file(path)):  # its digest goes with it, to stay checked
                if moved.exists():
                    moved.replace(aside / moved.name)
        print(f"[sslbench] moved {len(self.superseded)} checkpoint(s) of other settings to {aside}")
        self.superseded = []

    def newest(
        self, cfg: dict, seed: int, state: dict, device, method_file: Path
    ) -> tuple[Path, dict] | None:
        """(path, contents) of the newest checkpoint of these settings that loads, or None. A corrupt
        one (or one whose recorded digest differs) is skipped with a warning; one whose method state
        differs from ``state`` in keys or shapes (another version of ``method_file`` wrote it) raises
        CheckpointMismatch."""
        for path in reversed(self.epoch_files()):
            try:
                ckpt = atomic.load_torch(path, "epoch checkpoint", device)
            except UnreadableFileError as err:  # an older one (or a fresh start) loses less than stopping
                print(f"[sslbench] ignoring unreadable checkpoint {path}: {err.problem}")
                continue
            if ckpt.get("cfg") != cfg or ckpt.get("seed") != seed:
                print(f"[sslbench] ignoring {path}: written with other settings")
                self.superseded.append(path)
                continue
            # Checked first: load_state_dict copies the matching tensors before it raises on the others.
            differences = state_differences(state, ckpt["method_state"])
            if differences:
                raise CheckpointMismatch(
                    f"{path} does not fit the code of {method_file} ({'; '.join(differences)}): another "
                    f"version of the method wrote it. Nothing was loaded. To train from scratch, delete "
                    f"{path.parent}; to resume it, restore the method code that wrote it."
                )
            return path, ckpt
        return None


def save_final(out_dir: Path, checkpoint: dict) -> Path:
    """checkpoint.pt (the encoder and everything extraction needs) and run.json (its settings and meta)."""
    path = out_dir / "checkpoint.pt"
    atomic.save_torch(path, checkpoint, record_digest=True)
    atomic.write_json(out_dir / "run.json", {"cfg": checkpoint["cfg"], "meta": checkpoint["meta"]})
    return path


def finished_run(
    out_dir: str | Path,
    cfg: dict,
    seed: int,
    method_dir: str | Path,
    features: str | Path,
    prepared=None,
    monitor: dict | None = None,
) -> bool:
    """Whether ``out_dir`` already holds this very run, finished: run.json records the same settings,
    seed, code (``code_record``), dataset file (``prepared_digest``) and ``monitor`` settings (the
    training would be the same, its log would not), and the checkpoint and the pretraining set's
    ``features`` read back as written. The DAG keeps a run's files in place while its
    job reruns and puts them back when it fails (Snakemake's update()), so a setting changed and then
    set back finds its run here, and the job keeps it instead of training again."""
    from sslbench.provenance import code_record

    out_dir = Path(out_dir)
    files = [out_dir / name for name in ("run.json", "checkpoint.pt", "train_log.csv")] + [Path(features)]
    if not all(path.is_file() for path in files):
        return False
    try:
        recorded = json.loads(files[0].read_text())
        same = (
            json.dumps(recorded["cfg"], sort_keys=True) == json.dumps(cfg, sort_keys=True)
            and recorded["meta"]["seed"] == seed
            and recorded["meta"]["code"] == code_record("pretrain", method_dir)
            and recorded["meta"]["prepared_sha256"] == prepared_digest(prepared)
            and recorded["meta"].get("monitor", {}).get("settings", {}) == (monitor or {})
        )
    except (ValueError, KeyError, TypeError):
        return False
    if not same:
        return False
    try:
        atomic.check_digest(files[1], "checkpoint")
        atomic.check_digest(files[3], "features file")
    except UnreadableFileError as err:
        print(f"[sslbench] training again: {err.problem}")
        return False
    return True


def prepared_digest(prepared: str | Path | None) -> str | None:
    """The sha256 of the prepared dataset file a run trains on (run.json records it), None without one."""
    from sslbench.provenance import sha256_file

    return sha256_file(prepared) if prepared is not None else None
