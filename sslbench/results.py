"""Result files and the long-format table built from them.

One JSON per (dataset, method, seed, protocol) under
``results/{dataset}/{method}/seed{seed}/eval/{protocol}.json``; ``collect`` turns
them into ``results/table.csv`` with one row per metric and every setting that
produced it.
"""

from __future__ import annotations

import importlib
import json
import math
import time
from pathlib import Path

import pandas as pd

from . import atomic
from .errors import SslbenchError, unreadable
from .provenance import provenance

PROTOCOL_PACKAGE = "evaluation"

# Columns first in the table; the rest follow in alphabetical order.
KEY_COLUMNS = ["dataset", "method", "seed", "protocol", "metric", "value"]


class ResultError(SslbenchError, ValueError):
    pass


def protocol_module(name: str):
    try:
        return importlib.import_module(f"{PROTOCOL_PACKAGE}.{name}")
    except ModuleNotFoundError as err:
        raise ResultError(f"unknown protocol {name!r}: no module evaluation/{name}.py") from err


def side_file(result_path: str | Path) -> Path:
    """Where a protocol writes the arrays behind its numbers, beside its result JSON
    (eval/<protocol>.npz, the features-file format): the report draws from them."""
    return Path(result_path).with_suffix(".npz")


def run_protocol(
    protocol: str,
    features_path: str | Path,
    settings: dict,
    seed: int,
    out_path: str | Path,
    checkpoint_path: str | Path | None = None,
) -> Path:
    """Run one protocol on cached features and write its result JSON atomically (a protocol with
    WRITES_SIDE_FILE writes its side file first, beside it)."""
    module = protocol_module(protocol)
    from .featurefile import load_features

    features = load_features(features_path)
    extra = {}
    if getattr(module, "NEEDS_CHECKPOINT", False):
        extra["checkpoint_path"] = checkpoint_path
    if getattr(module, "WRITES_SIDE_FILE", False):
        extra["side_file"] = side_file(out_path)
    start = time.perf_counter()
    metrics, used = module.evaluate(features, settings, seed, **extra)
    wall = time.perf_counter() - start
    bad = {k: v for k, v in metrics.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
    if bad:
        raise ResultError(
            f"protocol {protocol} on {features_path} produced non-finite metrics {bad}; nothing was written"
        )
    meta = dict(features["meta"])
    cfg = meta.pop("cfg")
    result = {
        "dataset": meta["dataset"],
        "method": meta["method"],
        "seed": meta["seed"],
        "protocol": protocol,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "settings": used,
        "wall_time_s": wall,
        # Protocols that run torch record their device in `used`; the rest (numpy, faiss) run on the CPU.
        "run": meta,
        "cfg": cfg,
        "evaluated_with": provenance(used.get("device") or "cpu"),
    }
    return atomic.write_json(out_path, result)


def result_rows(result: dict) -> list[dict]:
    run, cfg = result["run"], result["cfg"]
    common = {
        "dataset": result["dataset"],
        "method": result["method"],
        "seed": result["seed"],
        "protocol": result["protocol"],
        "protocol_settings": json.dumps(result["settings"], sort_keys=True),
        "eval_wall_time_s": result["wall_time_s"],
        "backbone": run["backbone"],
        "small_stem": run["small_stem"],
        "image_size": run["image_size"],
        "epochs": cfg["train"]["epochs"],
        "epochs_trained": run["epochs_trained"],
        "batch_size": cfg["train"]["batch_size"],
        "lr": cfg["train"]["lr"],
        "method_params": json.dumps(cfg["params"], sort_keys=True),
        "augment": json.dumps(cfg.get("augment", {}), sort_keys=True),
        "train_wall_time_s": run["train_wall_time_s"],
        "images_per_s": run["images_per_s"],
        "device": run["device"],
        "git_commit": run["git_commit"],
        "git_dirty": run["git_dirty"],
        **{f"version_{k}": v for k, v in run["versions"].items()},
    }
    return [
        {**common, "metric": metric, "value": value} for metric, value in sorted(result["metrics"].items())
    ]


def read_result(path: str | Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:  # ValueError: cut-off JSON, or bytes that are not text
        raise unreadable(path, "result", err) from err


def read_result_rows(path: str | Path) -> list[dict]:
    try:
        return result_rows(read_result(path))
    except (KeyError, TypeError, AttributeError) as err:  # valid JSON, but not a result of this code
        raise unreadable(path, "result", err) from err


def collect(result_paths: list[str | Path], out_path: str | Path) -> pd.DataFrame:
    rows = [row for path in sorted(map(str, result_paths)) for row in read_result_rows(path)]
    table = pd.DataFrame(rows)
    if not table.empty:
        rest = sorted(c for c in table.columns if c not in KEY_COLUMNS)
        table = table[KEY_COLUMNS + rest].sort_values(["dataset", "method", "seed", "protocol", "metric"])
    atomic.write_text(out_path, table.to_csv(index=False))
    return table


def write_failures(path: str | Path, failed: dict[str, str]) -> Path:
    """``results/failures.csv``: the method folders skipped (with --keep-going) and why."""
    frame = pd.DataFrame(sorted(failed.items()), columns=["method", "problem"])
    return atomic.write_text(path, frame.to_csv(index=False))
