"""A method's paper.yaml: the numbers its paper reports, beside which the report sets ours."""

from __future__ import annotations

from pathlib import Path

from sslbench.errors import ConfigError
from sslbench.plan.checks import load_yaml

PAPER_FIELDS = (
    "pretrain_dataset",
    "eval_dataset",
    "backbone",
    "epochs",
    "protocol",
    "metric",
    "value",
    "source",
)


def paper_entries(path: str | Path) -> list[dict]:
    """The entries of a method's paper.yaml, each with every field of PAPER_FIELDS."""
    entries = load_yaml(path).get("results", []) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: `results` must be a list of {{{', '.join(PAPER_FIELDS)}}} entries")
    for i, entry in enumerate(entries):
        missing = [k for k in PAPER_FIELDS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise ConfigError(
                f"{path}: results[{i}] lacks {missing}; every entry needs {list(PAPER_FIELDS)} "
                "(see methods/_template/paper.yaml)"
            )
    return entries
