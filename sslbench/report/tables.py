"""The report's inputs and tables: ``results/table.csv``, the run folders and failures.csv read
and checked, and every table the page shows computed (summary, comparisons, margins over the floors,
reproduced vs reported, cost, environment) and written as CSV beside the page, with the leaderboards
and the headline tables as Markdown.

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
from sslbench.plan.paths import REPORT_TABLES
from sslbench.plan.runs import flatten, method_slug
from sslbench.plan.settings import METHOD_SECTIONS
from sslbench.report.stats import (
    ALPHA,
    BAR_LOW,
    BAR_MARGIN,
    MARKS,
    MISSING,
    PAIR,
    RECORD_COLUMNS,
    SAME_MARK,
    SAME_NOTE,
    STALE_MARK,
    Leaderboard,
    TableError,
    ablation_table,
    absent_headline,
    best_methods,
    check_table,
    display_cells,
    headline_comparisons,
    headline_stats,
    headline_table,
    leaderboards,
    margins,
    matrix_metrics,
    mean_pm_std,
    pair_name,
    pairs,
    percent,
    reproduced_vs_reported,
    run_floors,
    stale_methods,
    summarise,
    target_matrix,
)

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

    @property
    def notes(self) -> list[str]:
        return [MATRIX_NOTE, *marks_notes(self.cells)]


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
    margins: pd.DataFrame
    reproduced: pd.DataFrame
    cost: pd.DataFrame
    environment: pd.DataFrame
    ablations: pd.DataFrame
    failures: pd.DataFrame
    footnotes: dict[tuple[str, str], str] = field(default_factory=dict)
    matrices: list[Matrix] = field(default_factory=list)
    leaderboards: list[Leaderboard] = field(default_factory=list)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(self.footnotes)

    def stale(self, pair: tuple[str, str]) -> set[str]:
        return stale_methods(self.table, pair)


def compute_tables(
    table: pd.DataFrame,
    runs: list[Run],
    results_dir: Path,
    methods_dir: str | Path,
    config_dir: str | Path,
    record: pd.DataFrame | None = None,
) -> Tables:
    summary = summarise(table)
    margin_rows = margins(table)
    return Tables(
        table=table,
        summary=summary,
        comparisons=headline_comparisons(table),
        margins=margin_rows,
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
        leaderboards=leaderboards(table, summary, margin_rows, run_floors(table), record),
    )


def write_tables(tables: Tables, out_dir: Path) -> None:
    """summary.csv, comparisons.csv, margins.csv, reproduced.csv, cost.csv, environment.csv,
    ablations.csv and table.md: the leaderboards first (``leaderboards_markdown``), then the headline
    tables and the methods × targets matrices."""
    for name in REPORT_TABLES:
        atomic.write_text(out_dir / f"{name}.csv", getattr(tables, name).to_csv(index=False))
    markdown = leaderboards_markdown(tables.leaderboards, tables.table) + HEADLINE_HEADING
    markdown += "\n".join(
        (f"### {pair_name(*pair)}\n\n" if len(tables.pairs) > 1 else "")
        + headline_markdown(tables.summary, pair, tables.footnotes[pair], tables.stale(pair))
        for pair in tables.pairs
    )
    for matrix in tables.matrices:
        cells = mark_stale(matrix.cells, tables.stale((matrix.pretrain, matrix.pretrain)))
        notes = "\n\n".join(matrix.notes)
        markdown += f"\n### {matrix.title}\n\n{markdown_table(cells, matrix.best)}\n{notes}\n"
    if any(tables.stale(pair) for pair in tables.pairs):
        markdown += f"\n{STALE_NOTE}\n"
    if len(tables.failures):  # broken method folders left out (broken_methods): never silently absent
        markdown += "\n\nFailed (not run): " + "; ".join(f"{m}: {why}" for m, why in tables.failures.values)
    atomic.write_text(out_dir / "table.md", markdown)


HEADLINE_HEADING = "\n## Headline tables\n\n"  # where the leaderboards end in table.md


def leaderboards_markdown(boards: list[Leaderboard], table: pd.DataFrame) -> str:
    """Every dataset pair's leaderboard as Markdown: a heading, the table and its legend each."""
    return "\n".join(leaderboard_markdown(board, stale_methods(table, board.pair)) for board in boards)


def leaderboard_text(table: pd.DataFrame, record: pd.DataFrame | None = None) -> str:
    """The leaderboards of ``results/table.csv`` (as ``read_table`` reads it) and the ``record`` on
    many seeds alone, the text that opens table.md: what the end of a run prints."""
    table = check_table(table)
    summary, margin_rows = summarise(table), margins(table)
    boards = leaderboards(table, summary, margin_rows, run_floors(table), record)
    return leaderboards_markdown(boards, table)


def read_floor_record(path: Path | None) -> pd.DataFrame | None:
    """The record on many seeds (``stats.floor_record``, written by benchmarks/margins.py), or None
    where there is none: a workflow without one shows no record column."""
    if path is None or not Path(path).is_file():
        return None
    record = read_csv_file(Path(path), "floor record", dtype={"run_settings": str, "seeds": str})
    missing = [c for c in RECORD_COLUMNS if c not in record]
    if missing:
        raise ReportInputError(
            f"{path}: missing column(s) {missing}; write it again with `python benchmarks/margins.py "
            "<table> --write-record`"
        )
    return record


def leaderboard_markdown(board: Leaderboard, stale: set[str]) -> str:
    cells = leaderboard_display(board, stale)
    numeric = {"#", "mean ± std (n)", "floor mean ± std (n)", "margin [95% CI] (% points)"}
    return (
        f"## Leaderboard: {pair_name(*board.pair)}, {board.label}\n\n"
        + markdown_rows(cells, numeric)
        + "\n"
        + "\n\n".join(leaderboard_notes(board))
        + "\n"
    )


def with_seeds(mean: float, std: float, n: float) -> str:
    """ "mean ± std (n=…)" in %; one seed "mean (n=1)", missing "—"."""
    cell = mean_pm_std(mean, std, n)
    return f"{cell} (n={int(n)})" if n >= 2 else cell


def margin_text(margin: float, low: float, high: float) -> str:
    """A margin in % points with its 95% interval: "+12.00 [+6.96, +17.04]"; without one, alone."""
    if not math.isfinite(margin):
        return MISSING
    interval = f" [{fmt_points(low)}, {fmt_points(high)}]" if math.isfinite(low) else ""
    return fmt_points(margin) + interval


def floor_text(row) -> str:
    """Which floor a leaderboard row is measured against, or what it is itself."""
    if row.role == "floor":
        return f"the floor of {row.backbone}"
    if row.floor:
        return row.floor
    return f"none: {row.no_floor}" if row.no_floor else MISSING  # pixels has no network


def leaderboard_display(board: Leaderboard, stale: set[str] = frozenset()) -> pd.DataFrame:
    """A leaderboard's display strings: rank ("reference" for the unranked), method (stale ones marked),
    mean ± std (n), its floor, the floor's mean ± std (n), the margin [95% CI] and the verdict's mark
    (MARKS; other verdicts in words)."""
    rows = board.rows
    return pd.DataFrame(
        {
            "#": [str(int(r)) if math.isfinite(r) else "reference" for r in rows["rank"]],
            "method": [f"{m} {STALE_MARK}" if m in stale else m for m in rows["method"]],
            "mean ± std (n)": [with_seeds(*v) for v in zip(rows["mean"], rows["std"], rows["n"])],
            "floor": [floor_text(row) for row in rows.itertuples(index=False)],
            "floor mean ± std (n)": [
                with_seeds(m, s, n) if n > 0 else MISSING
                for m, s, n in zip(rows["floor_mean"], rows["floor_std"], rows["floor_n"].fillna(0))
            ],
            "margin [95% CI] (% points)": [
                margin_text(*v) for v in zip(rows["margin"], rows["ci_low"], rows["ci_high"])
            ],
            "above its floor": [MARKS.get(v, v) or MISSING for v in rows["verdict"]],
            "seeds under its floor's mean": [
                f"{int(u)} of {int(n)}" if math.isfinite(u) and r == "learned" else MISSING
                for u, n, r in zip(rows["seeds_under_floor_mean"].astype(float), rows["n"], rows["role"])
            ],
            **(
                {RECORD_HEADER: [record_text(row) for row in rows.itertuples(index=False)]}
                if has_record(board)
                else {}
            ),
        }
    )


RECORD_HEADER = "on many seeds, the same settings (benchmarks/floor_record.csv)"


def has_record(board: Leaderboard) -> bool:
    return bool(board.rows["record_verdict"].notna().any())


def record_text(row) -> str:
    """What the record on many seeds says of a leaderboard row: its verdict, margin [95% CI] and seeds
    under the floor's mean; — where the record has no run of these settings."""
    if not isinstance(row.record_verdict, str):
        return MISSING
    margin = margin_text(row.record_margin, row.record_ci_low, row.record_ci_high)
    return (
        f"{row.record_verdict}: {margin}, {int(row.record_seeds_under_floor_mean)} of "
        f"{int(row.record_n)} seeds under (seeds {row.record_seeds})"
    )


def seed_counts(n: pd.Series) -> str:
    counts = sorted({int(v) for v in n.dropna()})
    return ", ".join(map(str, counts)) if counts else MISSING


def leaderboard_notes(board: Leaderboard) -> list[str]:
    """The legend under a leaderboard: what is ranked, the floors, the margin and its interval, the
    test and its correction, the seed counts, and what a mark claims."""
    rows = board.rows
    learned, floors = rows[rows["role"] == "learned"], rows[rows["role"] == "floor"]
    tests = int(learned["p_value"].notna().sum())
    untrained = "; ".join(f"{m} is the floor of {b}" for m, b in zip(floors["method"], floors["backbone"]))
    notes = [
        f"Learned methods ranked by their mean {board.label} over seeds (in %), best first. Below them, "
        "unranked, the references: the floors (random: the untrained network of a backbone), supervised "
        "(it uses the labels) and pixels (no network).",
        "Floor: each method is measured against the untrained network of its own backbone on the same "
        "pretraining set (the same backbone, stem, backbone arguments and features read), never another "
        "backbone's; " + (f"here {untrained}." if untrained else "this table has none."),
        "Margin: the method's mean minus its floor's mean, in % points, each over all its own seeds. "
        "95% interval: Welch's, with se = √(s²/n + s_f²/n_f), the Welch–Satterthwaite degrees of "
        "freedom and the Student t quantile, so it carries the method's and the floor's seed spreads.",
        f"✓: above its floor beyond the seed noise: the one-sided Welch two-sample test (the method's mean "
        f"above its floor's) gives p < {ALPHA} after Holm's correction within the {tests} learned "
        f"{'method' if tests == 1 else 'methods'} tested here; ·: not resolved at these seed counts; ✗: "
        "its mean is below its floor's mean. supervised is tested on its own, outside that family. A "
        "method marked ·, ✗ or n < 2 is not claimed to learn anything at this budget, whatever the sign "
        "of its margin.",
        f"Seeds: learned methods n = {seed_counts(learned['n'])}; floors n = {seed_counts(floors['n'])}. "
        "n < 2: one seed on a side, so no interval and no test. Seeds under its floor's mean: how many of "
        "the method's seeds fall under its floor's mean, each on its own; a method above its floor on "
        "average may still lose to it on one seed.",
    ]
    verdicts = set(rows["verdict"])
    if verdicts & {"no floor", "floor not evaluated"}:
        notes.append(
            "none: no random run on the method's backbone in this table (the floor column says which "
            "backbone); floor not evaluated: its floor has no result on this metric. Either way no margin."
        )
    if any(v.endswith("(exact)") or v.startswith("tie") for v in verdicts):
        notes.append(
            "exact: the method and its floor are each the same on every seed, so their difference has no "
            "spread and no test."
        )
    if has_record(board):
        notes.append(
            "On many seeds: what the record measured for the runs whose settings are these runs' "
            "(benchmarks/floor_record.csv, written by benchmarks/margins.py; its commit and processor in the "
            "file: another processor gives other numbers). A method beats its floor there when its mean "
            f"margin is at least {BAR_MARGIN * 100:g} points with the interval's lower end at least "
            f"{BAR_LOW * 100:g}, on every seed when none of its seeds falls under the floor's mean. One that "
            "does not beat it at this budget is not claimed to learn at this budget, whatever its mark "
            f"here. {MISSING}: not measured with these settings."
        )
    notes.append(
        "Whether two learned methods differ: the paired comparisons (comparisons.csv). Every margin, on "
        "every headline metric: margins.csv."
    )
    return notes


def markdown_rows(cells: pd.DataFrame, numeric: set[str] = frozenset()) -> str:
    """A frame of display strings as a Markdown table, the ``numeric`` columns right-aligned."""
    lines = ["| " + " | ".join(cells.columns) + " |"]
    lines.append("|" + "".join("---:|" if c in numeric else "---|" for c in cells.columns))
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in cells.itertuples(index=False)]
    return "\n".join(lines) + "\n"


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
    cells = headline_table(summary, pair)
    table = markdown_table(mark_stale(cells, stale), best_methods(headline_stats(summary, pair)["mean"]))
    return table + "\n" + "\n\n".join(headline_notes(summary, pair, footnote, cells)) + "\n"


def headline_notes(
    summary: pd.DataFrame, pair: tuple[str, str], footnote: str, cells: pd.DataFrame
) -> list[str]:
    """The lines under a headline table: its settings, the headline columns it lacks, its marks."""
    absent = absent_headline(summary, pair)
    lacking = (
        ["No data in this table for: " + "; ".join(f"{label} ({p} {m})" for label, p, m in absent) + "."]
        if absent
        else []
    )
    return [footnote, *lacking, *marks_notes(cells)]


def marks_notes(cells: pd.DataFrame) -> list[str]:
    """What the marks in these display cells mean, once: SAME_NOTE where a cell carries SAME_MARK."""
    marked = cells.map(lambda cell: str(cell).endswith(SAME_MARK)).to_numpy().any()
    return [SAME_NOTE] if marked else []


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


def fmt_points(diff, decimals: int = 2) -> str:
    """A difference of fractions in % points, signed; exactly 0 (a tie, stats.paired_test) as "0"."""
    if diff is None or not math.isfinite(diff):
        return MISSING
    return "0" if diff == 0 else f"{100 * diff:+.{decimals}f}".replace("-", "−")


def summary_display(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary[[*PAIR, "method", "protocol", "metric"]].copy()
    same = (summary["n"] >= 2) & (summary["std"] == 0)  # stats.seed_std: the same on every seed
    for column in ("mean", "std", "ci95"):
        out[f"{column} (%)"] = summary[column].map(fmt_percent)
        if column != "mean":
            out.loc[same, f"{column} (%)"] = f"0 {SAME_MARK}"
    out["n"] = summary["n"].astype(str)
    return out


def comparisons_display(comparisons: pd.DataFrame) -> pd.DataFrame:
    out = comparisons[[*PAIR, "protocol", "metric", "method_a", "method_b"]].copy()
    out["mean A − B (% points)"] = comparisons["mean_diff"].map(fmt_points)
    out["95% CI of A − B (% points)"] = [
        MISSING if not math.isfinite(low) else f"{fmt_points(low)} to {fmt_points(high)}"
        for low, high in zip(comparisons["ci_low"], comparisons["ci_high"])
    ]
    out["p (paired t)"] = comparisons["p_value"].map(lambda p: fmt(p, ".3g"))
    out["p (Holm)"] = comparisons["p_adjusted"].map(lambda p: fmt(p, ".3g"))
    out["tests in family"] = comparisons["family_size"].astype(str)
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


def finished_message(results: Path, record: Path | None = None) -> str:
    """What a finished DAG prints (the Snakefile's onsuccess): the leaderboards (beside the ``record``
    on many seeds) where the report is as new as the table, else the command that writes the report."""
    table, html, md = results / "table.csv", results / "report.html", results / "table.md"
    if not table.is_file():
        return ""
    if not html.is_file() or html.stat().st_mtime < table.stat().st_mtime:
        return f"sslbench: the table is {table}; `snakemake --cores all` writes the report ({html})."
    text = leaderboard_text(read_table(results), read_floor_record(record))
    return f"{text.rstrip()}\n\nThe whole report: {html} (its tables: {md})"
