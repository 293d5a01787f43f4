"""Result files and the long-format table built from them.

``collect`` turns every result JSON under results/ into ``results/table.csv``, one row per metric
with every setting that produced it and whether the code it ran has changed since (``stale``);
``result_states`` says which stage of each result is out of date (``sslbench status``)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sslbench import atomic
from sslbench.errors import SslbenchError, unreadable
from sslbench.plan.paths import RESULT_FILE, RESULTS_DIR
from sslbench.provenance import changed_files, code_digest

if TYPE_CHECKING:
    import pandas as pd


# Columns first in the table; the rest follow in alphabetical order.
KEY_COLUMNS = [
    "pretrain_dataset",
    "eval_dataset",
    "method",
    "method_base",
    "variant",
    "seed",
    "protocol",
    "metric",
    "value",
]


SORT_COLUMNS = ["pretrain_dataset", "eval_dataset", "method", "seed", "protocol", "metric"]


# The code each stage ran, as recorded: (table column, where in a result).
RELEASED_COLUMNS = ("name", "file", "format", "sha256")  # released_name, ...: empty for a trained run
CODE_STAGES = {
    "code_pretrain": lambda result: result["run"]["code"],
    "code_extract": lambda result: result["run"]["code_extract"],
    "code_evaluate": lambda result: result["code"],
}


def result_rows(result: dict, methods_dir: str | Path | None = None) -> list[dict]:
    """One row per metric. With ``methods_dir``, ``stale`` and ``stale_files`` say whether a file the
    result was computed from (in any stage) differs from the current tree, and which."""
    run, cfg, target = result["run"], result["cfg"], result["run"]["eval"]
    released = run.get("released") or {}  # the imported file of a released run
    records = {column: record(result) for column, record in CODE_STAGES.items()}
    common = {
        "pretrain_dataset": result["pretrain_dataset"],
        "eval_dataset": result["eval_dataset"],
        "method": result["method"],
        "method_base": result["method_base"],
        "variant": json.dumps(result["variant"], sort_keys=True),
        "seed": result["seed"],
        "protocol": result["protocol"],
        "protocol_settings": json.dumps(result["settings"], sort_keys=True),
        "eval_wall_time_s": result["wall_time_s"],
        "backbone": run["backbone"],
        "small_stem": run["small_stem"],
        # timm's arguments and what the features are (backbones.FEATURES): a ViT's are a setting
        "backbone_args": json.dumps(cfg["backbone"].get("args") or {}, sort_keys=True),
        "features": cfg["backbone"].get("features", "pooled"),
        "image_size": run["image_size"],
        "eval_image_size": target["image_size"],
        "eval_dataset_settings": json.dumps(target["settings"], sort_keys=True),
        "transfer_channels": target["transfer_channels"],
        "eval_normalisation": target["normalisation"],
        # a released run's: the epochs its release states, no batch size or lr of ours
        "epochs": cfg["train"].get("epochs"),
        "epochs_trained": run["epochs_trained"],
        "batch_size": cfg["train"].get("batch_size"),
        "lr": cfg["train"].get("lr"),
        **{f"released_{k}": released.get(k, "") for k in RELEASED_COLUMNS},
        "method_params": json.dumps(cfg["params"], sort_keys=True),
        "augment": json.dumps(cfg.get("augment", {}), sort_keys=True),
        # every setting the run trained with, as one name: rows of equal settings share it
        "run_settings": code_digest(cfg),
        "train_wall_time_s": run["train_wall_time_s"],
        "images_per_s": run["images_per_s"],
        "device": run["device"],
        # the CPU kernels training ran (sslbench.kernels); a run.json without the record gives null
        "cpu_kernels": json.dumps(run.get("cpu_kernels"), sort_keys=True),
        "git_commit": run["git_commit"],
        "git_dirty": run["git_dirty"],
        **{f"version_{k}": v for k, v in run["versions"].items()},
        **{column: code_digest(record) for column, record in records.items()},
    }
    if methods_dir is not None:
        changed = sorted({f for record in records.values() for f in changed_files(record, methods_dir)})
        common.update(stale=bool(changed), stale_files=" ".join(changed))
    return [
        {**common, "metric": metric, "value": value} for metric, value in sorted(result["metrics"].items())
    ]


def read_result(path: str | Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:  # ValueError: cut-off JSON, or bytes that are not text
        raise unreadable(path, "result", err) from err


def read_result_rows(path: str | Path, methods_dir: str | Path | None = None) -> list[dict]:
    try:
        return result_rows(read_result(path), methods_dir)
    except (KeyError, TypeError, AttributeError) as err:  # valid JSON, but not a result of this code
        raise unreadable(path, "result", err) from err


def result_files(results_dir: str | Path = RESULTS_DIR) -> list[Path]:
    """Every result JSON under ``results_dir``, whichever configuration wrote it."""
    relative = RESULT_FILE.removeprefix(f"{RESULTS_DIR}/")
    pattern = relative.format(pretrain="*", method="*", seed="*", target="*", protocol="*")
    return sorted(Path(results_dir).glob(pattern))


def collect(
    result_paths: list[str | Path],
    out_path: str | Path,
    results_dir: str | Path | None = None,
    methods_dir: str | Path | None = None,
) -> pd.DataFrame:
    """``table.csv`` from ``result_paths`` and, with ``results_dir``, every other result JSON under
    it: a second configuration adds its rows and never removes the first one's."""
    import pandas as pd  # here, not at the top: an evaluate job imports this module too

    found = [*result_paths, *(result_files(results_dir) if results_dir else [])]
    paths = {Path(p).resolve(): p for p in found}  # one read per file, however it was named
    rows = [row for key in sorted(paths) for row in read_result_rows(paths[key], methods_dir)]
    table = pd.DataFrame(rows)
    if not table.empty:
        rest = sorted(c for c in table.columns if c not in KEY_COLUMNS)
        table = table[KEY_COLUMNS + rest].sort_values(SORT_COLUMNS)
    atomic.write_text(out_path, table.to_csv(index=False))
    return table


def write_failures(path: str | Path, failed: dict[str, str]) -> Path:
    """``results/failures.csv``: the method folders left out as broken (broken_methods: leave_out) and why."""
    import pandas as pd

    frame = pd.DataFrame(sorted(failed.items()), columns=["method", "problem"])
    return atomic.write_text(path, frame.to_csv(index=False))


# --------------------------------------------------------------------------- status
STAGES = ("pretrain", "extract", "evaluate")


@dataclass
class ResultState:
    """A result that is not up to date: missing, unreadable, or computed by code that has changed."""

    path: str
    state: str  # missing | unreadable | stale
    rerun: str | None = None  # the output to --forcerun: the first stale stage's (None: missing)
    changed: dict[str, list[str]] = field(default_factory=dict)  # stage: its changed files


def stage_outputs(result_path: str | Path) -> dict[str, str]:
    """The file each stage wrote for a result at RESULT_FILE: the checkpoint, the features of its
    target, the result itself."""
    path = Path(result_path)
    run, target = path.parents[2], path.parent.name
    return {
        "pretrain": str(run / "checkpoint.pt"),
        "extract": str(run / "features" / f"{target}.npz"),
        "evaluate": str(path),
    }


def result_states(result_paths: list[str | Path], methods_dir: str | Path) -> list[ResultState]:
    """Every result of ``result_paths`` that is not up to date, and why."""
    out = []
    for path in map(str, result_paths):
        if not Path(path).exists():
            out.append(ResultState(path, "missing"))
            continue
        try:
            result = read_result(path)
            records = dict(zip(STAGES, (record(result) for record in CODE_STAGES.values())))
        except (SslbenchError, KeyError, TypeError, AttributeError):
            out.append(ResultState(path, "unreadable", rerun=path))
            continue
        changed = {stage: changed_files(records[stage], methods_dir) for stage in STAGES}
        changed = {stage: files for stage, files in changed.items() if files}
        if changed:
            out.append(ResultState(path, "stale", stage_outputs(path)[next(iter(changed))], changed))
    return out


def prepared_states(paths, methods_dir: str | Path) -> list[ResultState]:
    """The prepared dataset files among ``paths`` that are unreadable or were written by code that has
    changed since. A refresh must rebuild them (and so everything that read them): the jobs it reruns
    would otherwise load the images the old code made. A missing one the DAG makes anyway."""
    from sslbench.extract.featurefile import load_meta

    out = []
    for path in map(str, paths):
        if not Path(path).exists():
            continue
        try:
            record = load_meta(path)["code"]
        except (SslbenchError, KeyError, TypeError):
            out.append(ResultState(path, "unreadable", rerun=path))
            continue
        changed = changed_files(record, methods_dir)
        if changed:
            out.append(ResultState(path, "stale", path, {"prepare": changed}))
    return out


def refresh_command(states: list[ResultState], config_files: list[str]) -> str:
    """The one snakemake call that brings every result of ``states`` up to date."""
    command = ["snakemake", "--cores", "all"]
    if config_files:
        command += ["--configfile", *config_files]
    if any(s.state == "stale" for s in states):
        # The code params then take each job's code now: a forced job records what it ran, and the
        # next plain plan finds the param it last stored (the code record the job wrote), not the old one.
        command += ["--config", "rerun_on_code_change=True"]
    reruns = sorted({s.rerun for s in states if s.rerun})
    if reruns:
        command += ["--forcerun", *reruns]  # last: it takes every argument after it
    return shlex.join(command)
