"""The report's inputs and tables: ``results/table.csv``, the run folders and failures.csv read
and checked, and every table the page shows computed (summary, comparisons, reproduced vs reported,
cost, environment) and written as CSV beside the page, with the headline table as Markdown.

Displayed numbers: metrics are fractions shown in percent with two decimals.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sslbench import atomic
from sslbench.errors import SslbenchError, unreadable
from sslbench.plan.runs import flatten, method_slug
from sslbench.plan.settings import METHOD_SECTIONS
from sslbench.report.stats import (
    MISSING,
    PAIR,
    STALE_MARK,
    TableError,
    ablation_table,
    best_methods,
    check_table,
    display_cells,
    headline_comparisons,
    headline_stats,
    headline_table,
    matrix_metrics,
    pair_name,
    pairs,
    percent,
    reproduced_vs_reported,
    stale_methods,
    summarise,
    target_matrix,
)

CSV_TABLES = ("summary", "comparisons", "reproduced", "cost", "environment", "ablations")
UNKNOWN = "unknown"  # what provenance.git_state says outside a git checkout


class ReportInputError(SslbenchError, FileNotFoundError):
    pass


# --------------------------------------------------------------------------- inputs
@dataclass
class Run:
    dataset: str  # the pretraining dataset
    method: str  # its label
    seed: int
    folder: Path
    cfg: dict
    meta: dict
    log: pd.DataFrame = field(repr=False)


def read_csv_file(path: Path, what: str, **options) -> pd.DataFrame:
    """A CSV this project wrote (each ends with a newline, so a cut-off last line means truncated)."""
    try:
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            raise ValueError("the last line is cut off")
        return pd.read_csv(io.BytesIO(data), **options)
    except (OSError, ValueError, pd.errors.ParserError) as err:  # EmptyDataError is a ValueError
        raise unreadable(path, what, err) from err


def read_table(results_dir: Path) -> pd.DataFrame:
    path = results_dir / "table.csv"
    if not path.is_file():
        raise ReportInputError(f"{path}: not found; build it first with `snakemake results/table.csv`")
    table = read_csv_file(path, "table")
    if table.empty:
        raise TableError(f"{path}: holds no results; run at least one method and protocol first")
    return check_table(table, str(path))


def run_folder(results_dir: Path, dataset: str, method: str, seed: int) -> Path:
    return results_dir / dataset / method_slug(method) / f"seed{seed}"


def read_run(results_dir: Path, dataset: str, method: str, seed: int) -> Run:
    folder = run_folder(results_dir, dataset, method, seed)
    run_json, log_csv = folder / "run.json", folder / "train_log.csv"
    for path in (run_json, log_csv):
        if not path.is_file():
            raise ReportInputError(
                f"{path}: not found, but table.csv has results of this run; rerun snakemake to retrain it"
            )
    try:
        record = json.loads(run_json.read_text())
        cfg, meta = record["cfg"], record["meta"]
    except (OSError, ValueError, KeyError, TypeError) as err:  # ValueError: cut-off JSON, not text
        raise unreadable(run_json, "run record", err) from err
    log = read_csv_file(log_csv, "training log")
    return Run(dataset, method, seed, folder, cfg, meta, log)


def read_runs(results_dir: Path, table: pd.DataFrame) -> list[Run]:
    columns = ["pretrain_dataset", "method", "seed"]
    keys = table[columns].drop_duplicates().sort_values(columns)
    return [read_run(results_dir, d, m, int(s)) for d, m, s in keys.itertuples(index=False)]


def first_seed_runs(runs: list[Run], dataset: str) -> list[Run]:
    """One run per method (its smallest seed, normally seed 0) for the per-method pictures."""
    chosen: dict[str, Run] = {}
    for run in runs:
        if run.dataset == dataset and (run.method not in chosen or run.seed < chosen[run.method].seed):
            chosen[run.method] = run
    return [chosen[m] for m in sorted(chosen)]


def read_failures(path: Path) -> pd.DataFrame:
    """results/failures.csv (method, problem), or an empty frame where there is none."""
    if path.exists() and path.stat().st_size:
        return read_csv_file(path, "failures list", dtype=str)
    return pd.DataFrame(columns=["method", "problem"])


# --------------------------------------------------------------------------- tables
@dataclass
class Matrix:
    """Methods × evaluation targets of one headline metric, for the runs of one pretraining dataset."""

    pretrain: str
    label: str  # the headline column it shows (stats.matrix_metrics)
    protocol: str
    parts: dict[str, pd.DataFrame]  # mean, std, n (stats.target_matrix)

    @property
    def title(self) -> str:
        return f"{self.label}, pretrained on {self.pretrain}, on every target"

    @property
    def cells(self) -> pd.DataFrame:
        return display_cells(self.parts)

    @property
    def best(self) -> dict[str, set[str]]:
        return best_methods(self.parts["mean"])


MATRIX_NOTE = (
    "Columns: the evaluation targets (the pretraining set's own first; the others frozen-encoder "
    f"transfer). Cells: mean ± std over seeds, in %; best of each column in bold; {MISSING}: not evaluated."
)
STALE_NOTE = (
    f"{STALE_MARK}: some of this method's results were computed by code that has changed since (the "
    "table's `stale` column); `sslbench status` lists them and prints the one command that refreshes them."
)


@dataclass
class Tables:
    """Everything the page shows as a table, per (pretraining, evaluation) dataset pair where it says so."""

    table: pd.DataFrame
    summary: pd.DataFrame
    comparisons: pd.DataFrame
    reproduced: pd.DataFrame
    cost: pd.DataFrame
    environment: pd.DataFrame
    ablations: pd.DataFrame
    failures: pd.DataFrame
    footnotes: dict[tuple[str, str], str] = field(default_factory=dict)
    matrices: list[Matrix] = field(default_factory=list)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(self.footnotes)

    def stale(self, pair: tuple[str, str]) -> set[str]:
        return stale_methods(self.table, pair)


def compute_tables(
    table: pd.DataFrame, runs: list[Run], results_dir: Path, methods_dir: str | Path, config_dir: str | Path
) -> Tables:
    summary = summarise(table)
    return Tables(
        table=table,
        summary=summary,
        comparisons=headline_comparisons(table),
        reproduced=reproduced_vs_reported(table, methods_dir, config_dir),
        cost=cost_table(runs, table),
        environment=environment_table(runs),
        ablations=ablation_table(summary, sweep_points(runs)),
        failures=read_failures(results_dir / "failures.csv"),
        footnotes={pair: settings_footnote(table, pair) for pair in pairs(table)},
        matrices=[
            Matrix(pretrain, label, protocol, target_matrix(summary, pretrain, protocol, metric))
            for pretrain in sorted(table["pretrain_dataset"].unique())
            for label, protocol, metric in matrix_metrics(summary, pretrain)
        ],
    )


def write_tables(tables: Tables, out_dir: Path) -> None:
    """summary.csv, comparisons.csv, reproduced.csv, cost.csv, environment.csv, ablations.csv and
    table.md."""
    for name in CSV_TABLES:
        atomic.write_text(out_dir / f"{name}.csv", getattr(tables, name).to_csv(index=False))
    markdown = "\n".join(
        (f"### {pair_name(*pair)}\n\n" if len(tables.pairs) > 1 else "")
        + headline_markdown(tables.summary, pair, tables.footnotes[pair], tables.stale(pair))
        for pair in tables.pairs
    )
    for matrix in tables.matrices:
        cells = mark_stale(matrix.cells, tables.stale((matrix.pretrain, matrix.pretrain)))
        markdown += f"\n### {matrix.title}\n\n{markdown_table(cells, matrix.best)}\n{MATRIX_NOTE}\n"
    if any(tables.stale(pair) for pair in tables.pairs):
        markdown += f"\n{STALE_NOTE}\n"
    if len(tables.failures):  # method folders skipped with --keep-going: never silently absent
        markdown += "\n\nFailed (not run): " + "; ".join(f"{m}: {why}" for m, why in tables.failures.values)
    atomic.write_text(out_dir / "table.md", markdown)


def mark_stale(cells: pd.DataFrame, stale: set[str]) -> pd.DataFrame:
    """Display cells with STALE_MARK after the name of each method that has stale results."""
    return cells.rename(index=lambda m: f"{m} {STALE_MARK}" if m in stale else m)


def settings_footnote(table: pd.DataFrame, pair: tuple[str, str]) -> str:
    rows = table[(table["pretrain_dataset"] == pair[0]) & (table["eval_dataset"] == pair[1])]
    parts = [
        f"dataset {pair[0]}" if pair[0] == pair[1] else f"pretrained on {pair[0]}, evaluated on {pair[1]}"
    ]
    if pair[0] != pair[1]:  # how a transfer target was evaluated (the same in every row of the pair)
        for column, label in (("eval_image_size", "image size"), ("transfer_channels", "channel conversion")):
            if column in rows:
                parts.append(f"{label} {', '.join(sorted(map(str, rows[column].unique())))}")
        parts.append("normalised with the pretraining set's mean and std")
    for column, label in (("backbone", "backbone"), ("epochs", "epochs")):
        if column not in rows:
            continue
        per_method = rows.groupby("method")[column].agg(lambda v: ", ".join(sorted(map(str, v.unique()))))
        if per_method.nunique() == 1:
            parts.append(f"{label} {per_method.iloc[0]}")
        else:
            parts.append(f"{label} " + ", ".join(f"{m}: {v}" for m, v in per_method.items()))
    seeds = sorted(int(s) for s in rows["seed"].unique())
    parts.append("seeds " + ", ".join(map(str, seeds)))
    return (
        "Settings: " + "; ".join(parts) + ". Cells: mean ± std over seeds, in %; best of each column "
        f"in bold; {MISSING}: not evaluated."
    )


def headline_markdown(summary: pd.DataFrame, pair: tuple[str, str], footnote: str, stale: set[str]) -> str:
    cells = mark_stale(headline_table(summary, pair), stale)
    return markdown_table(cells, best_methods(headline_stats(summary, pair)["mean"])) + f"\n{footnote}\n"


def markdown_table(cells: pd.DataFrame, best: dict[str, set[str]]) -> str:
    """Methods × columns of display strings, the best of each column in bold."""
    header = "| method | " + " | ".join(cells.columns) + " |"
    rule = "|---|" + "---:|" * len(cells.columns)
    lines = [header, rule]
    for method, row in cells.iterrows():
        name = method.removesuffix(f" {STALE_MARK}")
        shown = [f"**{row[c]}**" if name in best[c] else row[c] for c in cells.columns]
        lines.append(f"| {method} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def fmt(value, spec: str) -> str:
    """A number for display; missing (None/NaN) as "—"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return format(value, spec)


def fmt_percent(value) -> str:
    return MISSING if value is None or not math.isfinite(value) else percent(value)


def summary_display(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary[[*PAIR, "method", "protocol", "metric"]].copy()
    for column in ("mean", "std", "ci95"):
        out[f"{column} (%)"] = summary[column].map(fmt_percent)
    out["n"] = summary["n"].astype(str)
    return out


def comparisons_display(comparisons: pd.DataFrame) -> pd.DataFrame:
    out = comparisons[[*PAIR, "protocol", "metric", "method_a", "method_b"]].copy()
    out["mean A − B (% points)"] = comparisons["mean_diff"].map(fmt_percent)
    out["p (paired t)"] = comparisons["p_value"].map(lambda p: fmt(p, ".3g"))
    out["n"] = comparisons["n"].astype(str)
    out["verdict"] = comparisons["verdict"]
    return out


def reproduced_display(reproduced: pd.DataFrame) -> pd.DataFrame:
    out = reproduced[["method", *PAIR, "paper_backbone", "paper_epochs", "protocol", "metric"]].copy()
    out = out.rename(columns={"paper_backbone": "backbone", "paper_epochs": "epochs"})
    out["reported (%)"] = reproduced["reported"].map(fmt_percent)
    out["released weights, our protocol (%)"] = reproduced["released"].map(fmt_percent)
    out["released gap (% points)"] = reproduced["released_gap"].map(fmt_percent)
    out["ours (%)"] = reproduced["ours"].map(fmt_percent)
    out["std (%)"] = reproduced["std"].map(fmt_percent)
    out["n"] = reproduced["n"].astype(str)
    out["gap (% points)"] = reproduced["gap"].map(fmt_percent)
    out["source"] = reproduced["source"]
    out["how to reproduce"] = reproduced["reproduce"].replace("", MISSING)
    return out


def cost_table(runs: list[Run], table: pd.DataFrame) -> pd.DataFrame:
    """Per (pretraining dataset, method): mean over seeds of training time and throughput, peak GPU
    memory, devices, and evaluation time (every target's protocols)."""
    per_run = pd.DataFrame(
        [
            {
                "pretrain_dataset": r.dataset,
                "method": r.method,
                "seed": r.seed,
                "train_wall_time_s": r.meta.get("train_wall_time_s"),
                "images_per_s": r.meta.get("images_per_s"),
                "peak_gpu_memory_mib": (
                    r.meta["peak_gpu_memory_bytes"] / 2**20
                    if r.meta.get("peak_gpu_memory_bytes") is not None
                    else None
                ),
                "device": r.meta.get("device", "unknown"),
            }
            for r in runs
        ]
    )
    numeric = ["train_wall_time_s", "images_per_s", "peak_gpu_memory_mib"]
    per_run[numeric] = per_run[numeric].apply(pd.to_numeric, errors="coerce")
    grouped = per_run.groupby(["pretrain_dataset", "method"], sort=True)
    out = grouped.agg(
        seeds=("seed", "count"),
        train_wall_time_s=("train_wall_time_s", "mean"),
        images_per_s=("images_per_s", "mean"),
        peak_gpu_memory_mib=("peak_gpu_memory_mib", "max"),
        device=("device", lambda v: ", ".join(sorted(set(map(str, v))))),
    ).reset_index()
    if "eval_wall_time_s" in table:
        # table.csv repeats a protocol's wall time on each of its metric rows: one per (run, target, protocol)
        per_protocol = table.drop_duplicates([*PAIR, "method", "seed", "protocol"])
        per_seed = per_protocol.groupby(["pretrain_dataset", "method", "seed"])["eval_wall_time_s"].sum()
        per_run = per_seed.groupby(["pretrain_dataset", "method"]).mean().rename("eval_wall_time_s")
        out = out.merge(per_run.reset_index(), on=["pretrain_dataset", "method"], how="left")
    return out


def cost_display(cost: pd.DataFrame) -> pd.DataFrame:
    out = cost[["pretrain_dataset", "method"]].copy()
    out["seeds"] = cost["seeds"].astype(str)
    out["training wall time (s)"] = cost["train_wall_time_s"].map(lambda v: fmt(v, ".1f"))
    out["images/s"] = cost["images_per_s"].map(lambda v: fmt(v, ".0f"))
    out["peak GPU memory (MiB)"] = cost["peak_gpu_memory_mib"].map(lambda v: fmt(v, ".0f"))
    if "eval_wall_time_s" in cost:
        out["evaluation wall time (s)"] = cost["eval_wall_time_s"].map(lambda v: fmt(v, ".1f"))
    out["device"] = cost["device"]
    return out


def environment_table(runs: list[Run]) -> pd.DataFrame:
    """One row per run: where and with what code it was trained."""
    rows = []
    for r in runs:
        versions = r.meta.get("versions", {}) or {}
        rows.append(
            {
                "pretrain_dataset": r.dataset,
                "method": r.method,
                "seed": r.seed,
                "device": r.meta.get("device", "unknown"),
                "git_commit": r.meta.get("git_commit", "unknown"),
                "git_dirty": r.meta.get("git_dirty"),
                **{f"version_{k}": v for k, v in sorted(versions.items())},
            }
        )
    return pd.DataFrame(rows)


def known_text(value) -> str:
    """A provenance value as text; missing (git_dirty is None outside a git checkout, NaN once in a
    frame) as "unknown". Never astype(str) on such a column: pandas 3 keeps NaN there."""
    return UNKNOWN if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def versions_display(environment: pd.DataFrame) -> pd.DataFrame:
    """Each package's version(s) over all runs; more than one means the runs are not comparable."""
    columns = [c for c in environment.columns if c.startswith("version_")]
    rows = [
        {
            "package": c.removeprefix("version_"),
            "version(s)": ", ".join(sorted(map(str, environment[c].dropna().unique()))),
        }
        for c in columns
    ]
    for key in ("git_commit", "git_dirty", "device"):
        values = {known_text(v) for v in environment[key]}
        rows.append({"package": key, "version(s)": ", ".join(sorted(values))})
    return pd.DataFrame(rows, columns=["package", "version(s)"])


def setting_value(cfg: dict, key: str):
    """A run's value of a swept setting: ``train.lr`` in its section, a method's own setting in its
    params (where config.resolve_method_config puts them)."""
    node = cfg if key.split(".")[0] in METHOD_SECTIONS else cfg["params"]
    for part in key.split("."):
        node = node[part]
    return node


def setting_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def used_value(run: Run, key: str, value):
    """The value a run trained with: the last one its training log records under the setting's name
    where it does (MoCo logs the queue size it shrank to fit the data), else the configured one."""
    if key in run.log.columns and len(run.log) and pd.notna(run.log[key].iloc[-1]):
        used = run.log[key].iloc[-1]
        return int(used) if isinstance(value, int) and float(used).is_integer() else used
    return value


def sweep_points(runs: list[Run]) -> pd.DataFrame:
    """setting, method (label), method_base, value (text), order: each run that changes one setting of
    its method (a sweep's value or a one-setting variant), and the base run on each of its axes, at the
    value it trained with (``used_value``). ``order``: the value itself where every value of the axis
    is a number, else its rank as text."""
    by_label = {r.method: r for r in runs}  # a label's settings are the same on every dataset and seed
    rows = []
    for label, run in by_label.items():
        variant = flatten(run.cfg.get("variant") or {})
        if len(variant) == 1:
            ((key, value),) = variant.items()
            value = used_value(run, key, value)
            rows.append(
                {"setting": key, "method": label, "method_base": run.cfg["method_base"], "raw": value}
            )
    for key, base in sorted({(r["setting"], r["method_base"]) for r in rows}):
        if base in by_label:
            try:
                value = used_value(by_label[base], key, setting_value(by_label[base].cfg, key))
            except (KeyError, TypeError):  # the base run does not say (a setting its method lacks by default)
                continue
            rows.append({"setting": key, "method": base, "method_base": base, "raw": value})
    for row in rows:  # as text here: in one frame pandas would turn a column of ints and floats to floats
        raw = row.pop("raw")
        row["value"] = setting_text(raw)
        row["number"] = (
            float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
        )
    points = pd.DataFrame(rows, columns=["setting", "method", "method_base", "value", "number"])
    points["order"] = math.nan
    for _, axis in points.groupby("setting"):
        numeric = axis["number"].notna().all()
        points.loc[axis.index, "order"] = axis["number"] if numeric else axis["value"].rank(method="dense")
    return points.drop(columns="number")
