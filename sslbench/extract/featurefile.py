"""The features file every protocol reads: a plain ``.npz`` (arrays + the run's metadata as
JSON), so that protocols on cached features load it without importing torch. Its sha256 is recorded
when it is written and checked when its arrays are read (``sslbench.atomic.check_digest``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from sslbench import atomic
from sslbench.errors import unreadable


def save_features(path: str | Path, features: dict) -> Path:
    arrays = {k: np.asarray(v) for k, v in features.items() if k != "meta"}
    buffer = io.BytesIO()
    np.savez(buffer, meta_json=np.array(json.dumps(features["meta"])), **arrays)
    return atomic.write_bytes(path, buffer.getvalue(), record_digest=True)


def load_features(path: str | Path) -> dict:
    """The dict every protocol takes: numpy arrays, ``num_classes`` and ``meta``."""
    atomic.check_digest(path, "features file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            out = {k: npz[k] for k in npz.files if k != "meta_json"}
            out["meta"] = json.loads(str(npz["meta_json"]))
    except Exception as err:  # a truncated zip raises BadZipFile, EOFError, ValueError, ...
        raise unreadable(path, "features file", err) from err
    out["num_classes"] = int(out["num_classes"])
    return out


def load_meta(path: str | Path) -> dict:
    """Only the metadata of a features file (the arrays are not read, nor its digest checked: planning
    reads every file's metadata at each invocation, and whoever uses the numbers checks it)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return json.loads(str(npz["meta_json"]))
    except Exception as err:
        raise unreadable(path, "features file", err) from err
