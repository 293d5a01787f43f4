"""A run's checkpoints: one per epoch to resume from (the newest ``KEEP_CHECKPOINTS`` kept), and the
final checkpoint.pt with run.json, which extraction and the report read.

An epoch checkpoint of other settings is never resumed: it is set aside under
checkpoints/superseded/ before this run writes its own. One whose state does not fit the method's
code stops the run before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from sslbench import atomic
from sslbench.errors import SslbenchError

CHECKPOINT_DIR = "checkpoints"
KEEP_CHECKPOINTS = 2
SUPERSEDED_DIR = "superseded"  # under CHECKPOINT_DIR: checkpoints of other settings, kept, never resumed


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
        """Write epoch ``epoch``'s checkpoint atomically and prune all but the newest ones."""
        self.set_aside_superseded()
        atomic.save_torch(self.folder / f"epoch_{epoch:04d}.pt", checkpoint)
        for old in sorted(self.folder.glob("epoch_*.pt"))[:-KEEP_CHECKPOINTS]:
            old.unlink()

    def set_aside_superseded(self) -> None:
        """Move the checkpoints of other settings into checkpoints/superseded/ before this run writes
        its own: pruning keeps the newest epoch numbers, which would otherwise be theirs."""
        if not self.superseded:
            return
        aside = self.folder / SUPERSEDED_DIR
        aside.mkdir(exist_ok=True)
        for path in self.superseded:
            if path.exists():
                path.replace(aside / path.name)
        print(f"[sslbench] moved {len(self.superseded)} checkpoint(s) of other settings to {aside}")
        self.superseded = []

    def newest(
        self, cfg: dict, seed: int, state: dict, device, method_file: Path
    ) -> tuple[Path, dict] | None:
        """(path, contents) of the newest checkpoint of these settings that loads, or None. A corrupt
        one is skipped with a warning; one whose method state differs from ``state`` in keys or
        shapes (another version of ``method_file`` wrote it) raises CheckpointMismatch."""
        for path in sorted(self.folder.glob("epoch_*.pt"), reverse=True):
            try:
                ckpt = torch.load(path, map_location=device, weights_only=False)
            except Exception as err:  # truncated or corrupt file: fall back to an older one
                print(f"[sslbench] ignoring unreadable checkpoint {path}: {type(err).__name__}: {err}")
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
    atomic.save_torch(path, checkpoint)
    atomic.write_json(out_dir / "run.json", {"cfg": checkpoint["cfg"], "meta": checkpoint["meta"]})
    return path
