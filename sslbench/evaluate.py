"""Run one protocol on one features file and write its result JSON: the evaluate stage.

A protocol is a module ``evaluation/<name>.py``, loaded by name. It provides:

- ``DEFAULTS``: a literal dict of its settings (``<MODE>_DEFAULTS`` for a mode's own), which
  planning reads from the source unimported and checks every setting against;
- ``evaluate(features, settings, seed, **extra) -> (metrics, settings used)``: ``features`` is the
  dict of ``sslbench.extract.featurefile.load_features``; ``metrics`` maps a name to a finite number;
- optional flags asking for ``extra``: ``NEEDS_CHECKPOINT`` (``checkpoint_path``),
  ``READS_IMAGES`` (``prepared``: the target's images, not only its features), ``WRITES_SIDE_FILE``
  (``side_file``, ``maps``: arrays the report draws), ``NEEDS_RESULT_DIR`` (``result_dir``);
- optional literals for planning: ``RULES``, ``{setting: JSON-schema keywords}`` over the type of each
  default (the settings' ranges, judged by the plan and by ``evaluation.common.resolve_settings`` with
  one function, ``sslbench.plan.protocols.setting_problems``), and ``DROPS_LAST_BATCH`` (True, or the
  modes that do: its ``batch_size`` must fit the target's train split, ``sslbench.plan.limits``).

A new protocol is a new file there and its name under ``protocols`` in the config.
"""

from __future__ import annotations

import importlib
import math
import time
from pathlib import Path

from sslbench import atomic
from sslbench.errors import SslbenchError
from sslbench.plan.protocols import PROTOCOL_PACKAGE
from sslbench.provenance import code_record, provenance


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
    maps: bool = True,
    prepared: str | Path | None = None,
) -> Path:
    """Run one protocol on cached features and write its result JSON atomically (a protocol with
    WRITES_SIDE_FILE writes its side file first, beside it; ``maps``: with what only the report's
    figures need, which it draws for a run's first seed; ``prepared``: the target's prepared file,
    for a protocol that READS_IMAGES, which a protocol on the cached features alone never opens)."""
    module = protocol_module(protocol)
    from sslbench.extract.featurefile import load_features

    features = load_features(features_path)
    extra = {}
    if getattr(module, "NEEDS_CHECKPOINT", False):
        extra["checkpoint_path"] = checkpoint_path
    if getattr(module, "READS_IMAGES", False):
        extra["prepared"] = prepared
    if getattr(module, "WRITES_SIDE_FILE", False):
        extra["side_file"] = side_file(out_path)
        extra["maps"] = maps
    if getattr(module, "NEEDS_RESULT_DIR", False):
        extra["result_dir"] = Path(out_path).parent
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
        "pretrain_dataset": meta["dataset"],
        "eval_dataset": meta["eval"]["dataset"],
        "method": meta["method"],
        "method_base": cfg["method_base"],
        "variant": cfg["variant"],
        "seed": meta["seed"],
        "protocol": protocol,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "settings": used,
        "wall_time_s": wall,
        # Protocols that run torch record their device in `used`; the rest (numpy, faiss) run on the CPU.
        "run": meta,
        "cfg": cfg,
        "evaluated_with": provenance(used.get("device") or "cpu"),
        "code": code_record("evaluate", protocol=protocol),
    }
    return atomic.write_json(out_path, result)
