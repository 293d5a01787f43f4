"""Atomic writes: a temporary file in the same folder, fsync, then rename.

A reader (or a killed job, or a full disk) therefore sees either the old file or the new one,
never half of one. The file gets the permissions a plain ``open()`` would give it (0666 less the
umask), so collaborators on shared storage can read what a run wrote.
"""

from __future__ import annotations

import io
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sslbench.errors import SslbenchError


class OutputError(SslbenchError, OSError):
    pass


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        # Not tempfile.mkstemp: it creates mode 0600 whatever the umask.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
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


def _remove_quietly(tmp: Path) -> None:
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

    # Serialised in memory first: torch's zip writer turns a failed write (a full disk) into a
    # RuntimeError that names no file, where a plain write raises the OSError handled above.
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return write_bytes(path, buffer.getvalue())
