"""What a pure function made of some text, kept on disk for the next process.

Every job is a fresh process (the warm server's children import the project afresh), so a cache in
memory lasts one job. What each job works out from source text alone can cost more than a kNN job's
own work: the project modules its source files import (`provenance.file_imports`, parsing ~40
files: about 0.2 s on the 2-core development machine, where the kNN vote takes 0.06 s). It is kept
here under the sha256 of everything it is computed from (the caller puts the computing code's own
source in the key), so an edit makes a new entry and never reads an old one.

An entry is JSON, written atomically. An entry that cannot be read is computed again, and a folder
that cannot be written to only costs the time: neither is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLDER_VARIABLE = "SSLBENCH_CACHE_DIR"


def folder() -> Path:
    """``$SSLBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/sslbench``, else ``~/.cache/sslbench``."""
    if os.environ.get(FOLDER_VARIABLE):
        return Path(os.environ[FOLDER_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sslbench"


def remembered(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()``, or what it returned for the same ``kind`` and ``key`` before (JSON values only:
    a tuple comes back as a list)."""
    path = folder() / kind / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = compute()
    from sslbench import atomic  # here: atomic imports provenance, which imports this module

    try:
        atomic.write_text(path, json.dumps(value))
    except OSError:
        pass
    return value
