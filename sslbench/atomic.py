"""Atomic writes: a temporary file in the same folder, fsync, then rename.

A reader (or a killed job) therefore sees either the old file or the new one,
never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


class OutputError(OSError):
    pass


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise OutputError(
            f"cannot write {path}: {err.strerror}. Check that {path.parent} exists, is writable "
            "and has free space."
        ) from err
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        _remove_quietly(tmp)
        raise OutputError(
            f"cannot write {path}: {err.strerror}. Check free space and permissions of {path.parent}."
        ) from err
    except BaseException:
        _remove_quietly(tmp)
        raise
    return path


def _remove_quietly(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def write_bytes(path: str | Path, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data), "wb")


def write_text(path: str | Path, text: str) -> Path:
    return _atomic(path, lambda f: f.write(text), "w")


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def save_torch(path: str | Path, obj: Any) -> Path:
    import torch

    return _atomic(path, lambda f: torch.save(obj, f), "wb")
