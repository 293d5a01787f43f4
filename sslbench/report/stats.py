"""Statistics over seeds: summaries, paired method comparisons, the headline table,
and our numbers beside the papers'.

Every function takes the long-format ``results/table.csv`` (one row per pretraining
dataset, evaluation dataset, method, seed, protocol, metric) or its summary, and returns
a DataFrame. Methods are compared within one (pretraining dataset, evaluation dataset)
pair: a number means something only beside numbers of the same pair.

Undefined statistics stay missing, never invented: with one seed the standard
deviation and the confidence interval do not exist, so ``std`` and ``ci95`` are
NaN in the DataFrame, an empty cell in a CSV, and "—" / "(n=1)" on display. A
zero would claim a certainty that one seed cannot give.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from sslbench.errors import ConfigError, SslbenchError
from sslbench.plan.paper import PAPER_FIELDS, paper_entries
from sslbench.plan.runs import plan_runs
from sslbench.plan.settings import DEFAULT_FILE, SCHEMA_FILE, load_config

ALPHA = 0.05
MISSING = "—"
PAIR = ["pretrain_dataset", "eval_dataset"]
GROUP = [*PAIR, "method", "protocol", "metric"]
KEY = [*PAIR, "method", "seed", "protocol", "metric"]

# The headline: (column label, protocol, metric). Higher is better for all of them.
HEADLINE = [
    ("kNN top-1 (k200_t0.1)", "knn", "top1_k200_t0.1"),
    ("linear top-1", "linear", "top1"),
    ("low-shot mAP k=1", "lowshot_svm", "map_k1_mean"),
    ("low-shot mAP k=8", "lowshot_svm", "map_k8_mean"),
    ("semi-sup 1% top-1", "semisup", "top1_1pct"),
    ("semi-sup 10% top-1", "semisup", "top1_10pct"),
    ("fine-tune top-1", "finetune", "top1"),
    ("AMI", "clustering", "ami"),
]
TOP1 = HEADLINE[:2]  # kNN and linear top-1: the methods × targets matrices' and the ablations' metrics


class TableError(SslbenchError, ValueError):
    pass


def pair_name(pretrain: str, target: str) -> str:
    """How a (pretraining, evaluation) pair is shown: ``digits``, or ``digits → fashion_mnist``."""
    return pretrain if pretrain == target else f"{pretrain} → {target}"


def pair_id(pretrain: str, target: str) -> str:
    """The pair in file names and HTML ids: ``digits``, or ``digits_to_fashion_mnist``."""
    return pretrain if pretrain == target else f"{pretrain}_to_{target}"


def pairs(table: pd.DataFrame) -> list[tuple[str, str]]:
    """The (pretraining, evaluation) dataset pairs of a table or summary, each dataset's own first."""
    found = table[PAIR].drop_duplicates().itertuples(index=False, name=None)
    return sorted(found, key=lambda pair: (pair[0], pair[0] != pair[1], pair[1]))


def check_table(table: pd.DataFrame, where: str = "results/table.csv") -> pd.DataFrame:
    required = [*KEY, "value"]
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise TableError(
            f"{where}: missing column(s) {missing}; rebuild it with `sslbench collect` "
            "(snakemake results/table.csv)"
        )
    values = pd.to_numeric(table["value"], errors="coerce")
    bad = table[~np.isfinite(values)]
    if len(bad):
        row = bad.iloc[0]
        raise TableError(
            f"{where}: non-numeric or non-finite value {row['value']!r} for {row['method']} seed "
            f"{row['seed']} {row['protocol']}/{row['metric']}; delete that result JSON and rerun"
        )
    duplicated = table.duplicated(KEY)
    if duplicated.any():
        row = table[duplicated].iloc[0]
        pair = pair_name(row["pretrain_dataset"], row["eval_dataset"])
        raise TableError(
            f"{where}: two rows for {pair}/{row['method']} "
            f"seed {row['seed']} {row['protocol']}/{row['metric']}; rebuild the table with `sslbench collect`"
        )
    return table.assign(value=values.astype(float))


def ci95_halfwidth(std: float, n: int) -> float:
    """Half-width of the two-sided 95% Student-t interval for a mean of n values (NaN for n < 2)."""
    if n < 2 or not math.isfinite(std):
        return math.nan
    return float(scipy_stats.t.ppf(0.975, n - 1) * std / math.sqrt(n))


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pretraining dataset, evaluation dataset, method, protocol, metric): mean, std (ddof=1),
    ci95 half-width, n seeds."""
    table = check_table(table)
    grouped = table.groupby(GROUP, sort=True)["value"]
    out = grouped.agg(mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else math.nan, n="count")
    out = out.reset_index()
    out["n"] = out["n"].astype(int)
    out["ci95"] = [ci95_halfwidth(s, n) for s, n in zip(out["std"], out["n"])]
    return out[GROUP + ["mean", "std", "ci95", "n"]]


def paired_test(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired t-test p-value of a vs b (NaN for fewer than 2 pairs).

    Identical differences have no spread: p is 1 when they are all zero and 0 otherwise
    (the t statistic's limit), where scipy would warn and return NaN.
    """
    diff = np.asarray(a, float) - np.asarray(b, float)
    if len(diff) < 2:
        return math.nan
    if np.allclose(diff, diff[0], rtol=0, atol=1e-15):
        return 1.0 if abs(diff[0]) <= 1e-15 else 0.0
    return float(scipy_stats.ttest_rel(a, b).pvalue)


def verdict(
    method_a: str, method_b: str, mean_diff: float, p_value: float, n: int, alpha: float = ALPHA
) -> str:
    if n < 2:
        return "untested (n < 2)"
    if p_value < alpha:
        return f"{method_a} > {method_b}" if mean_diff > 0 else f"{method_b} > {method_a}"
    return "within noise"


def paired_comparison(table: pd.DataFrame, protocol: str, metric: str, alpha: float = ALPHA) -> pd.DataFrame:
    """Every pair of methods on one metric, per (pretraining, evaluation) dataset pair, paired by seed.

    mean_diff = mean over shared seeds of (A - B); p_value from scipy.stats.ttest_rel; the verdict
    names the better method when p < alpha, else "within noise" ("untested (n < 2)" with one seed).
    p-values are per pair, not corrected for the number of pairs.
    """
    table = check_table(table)
    rows = []
    subset = table[(table["protocol"] == protocol) & (table["metric"] == metric)]
    for (pretrain, target), data in subset.groupby(PAIR, sort=True):
        wide = data.pivot(index="seed", columns="method", values="value")
        for a, b in itertools.combinations(sorted(wide.columns), 2):
            pair = wide[[a, b]].dropna()
            n = len(pair)
            if n == 0:
                continue
            diff = float((pair[a] - pair[b]).mean())
            p = paired_test(pair[a].to_numpy(), pair[b].to_numpy())
            rows.append(
                {
                    "pretrain_dataset": pretrain,
                    "eval_dataset": target,
                    "protocol": protocol,
                    "metric": metric,
                    "method_a": a,
                    "method_b": b,
                    "mean_diff": diff,
                    "p_value": p,
                    "n": n,
                    "verdict": verdict(a, b, diff, p, n, alpha),
                }
            )
    columns = [
        *PAIR,
        "protocol",
        "metric",
        "method_a",
        "method_b",
        "mean_diff",
        "p_value",
        "n",
        "verdict",
    ]
    return pd.DataFrame(rows, columns=columns)


def headline_comparisons(table: pd.DataFrame) -> pd.DataFrame:
    """paired_comparison for every headline metric present in the table."""
    present = set(zip(table["protocol"], table["metric"]))
    frames = [paired_comparison(table, p, m) for _, p, m in HEADLINE if (p, m) in present]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else paired_comparison(table.iloc[:0], "", "")


# --------------------------------------------------------------------------- headline
def headline_stats(summary: pd.DataFrame, pair: tuple[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """mean, std and n as (method × headline column) frames of one (pretraining, evaluation) dataset
    pair; NaN where a method lacks the metric."""
    if pair is not None:
        summary = summary[(summary["pretrain_dataset"] == pair[0]) & (summary["eval_dataset"] == pair[1])]
    found = pairs(summary)
    if len(found) > 1:
        raise TableError(
            f"the summary holds several dataset pairs {[pair_name(*p) for p in found]}; pass pair= to "
            "pick one"
        )
    methods = sorted(summary["method"].unique())
    labels = [label for label, _, _ in HEADLINE]
    out = {
        k: pd.DataFrame(np.nan, index=pd.Index(methods, name="method"), columns=labels)
        for k in ("mean", "std", "n")
    }
    keyed = summary.set_index(["method", "protocol", "metric"])
    for label, protocol, metric in HEADLINE:
        for method in methods:
            if (method, protocol, metric) in keyed.index:
                row = keyed.loc[(method, protocol, metric)]
                for k in out:
                    out[k].loc[method, label] = row[k]
    return out


def percent(value: float) -> str:
    """Fractions are displayed in percent with two decimals."""
    return f"{100 * value:.2f}"


def mean_pm_std(mean: float, std: float, n: float) -> str:
    if not math.isfinite(mean):
        return MISSING
    if n < 2 or not math.isfinite(std):
        return f"{percent(mean)} (n=1)"
    return f"{percent(mean)} ± {percent(std)}"


def best_methods(means: pd.DataFrame) -> dict[str, set[str]]:
    """Per column, the method(s) with the highest mean, as displayed (ties at display precision share it)."""
    best = {}
    for column in means.columns:
        shown = means[column].dropna().map(percent).astype(float)
        best[column] = set(shown.index[shown == shown.max()]) if len(shown) else set()
    return best


def headline_table(summary: pd.DataFrame, pair: tuple[str, str] | None = None) -> pd.DataFrame:
    """Methods × the headline columns evaluated for some method of the pair, as "mean ± std" strings
    (percent); a method without the metric shows "—"."""
    parts = headline_stats(summary, pair)
    present = [c for c in parts["mean"].columns if parts["mean"][c].notna().any()]
    return display_cells({k: frame[present] for k, frame in parts.items()})


# --------------------------------------------------------------------------- methods x targets
def matrix_metrics(summary: pd.DataFrame, pretrain: str) -> list[tuple[str, str, str]]:
    """The (label, protocol, metric) of each methods × targets matrix of runs pretrained on
    ``pretrain``: kNN and linear top-1 (TOP1), each where it was evaluated on more than one target."""
    rows = summary[summary["pretrain_dataset"] == pretrain]
    return [
        (label, protocol, metric)
        for label, protocol, metric in TOP1
        if rows[(rows["protocol"] == protocol) & (rows["metric"] == metric)]["eval_dataset"].nunique() > 1
    ]


def target_matrix(
    summary: pd.DataFrame, pretrain: str, protocol: str, metric: str
) -> dict[str, pd.DataFrame]:
    """mean, std and n as (method × evaluation target) frames of one protocol metric for the runs
    pretrained on ``pretrain``: the pretraining set's own column first, then the transfer targets;
    NaN where a method lacks a target."""
    rows = summary[
        (summary["pretrain_dataset"] == pretrain)
        & (summary["protocol"] == protocol)
        & (summary["metric"] == metric)
    ]
    targets = [t for _, t in pairs(rows)]
    return {
        k: rows.pivot(index="method", columns="eval_dataset", values=k).reindex(columns=targets).sort_index()
        for k in ("mean", "std", "n")
    }


def display_cells(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """ "mean ± std" strings (percent) of mean, std and n frames of one shape; missing cells are "—"."""
    mean, std, n = parts["mean"], parts["std"], parts["n"]
    cells = {c: [mean_pm_std(mean.loc[m, c], std.loc[m, c], n.loc[m, c]) for m in mean.index] for c in mean}
    return pd.DataFrame(cells, index=mean.index)


# --------------------------------------------------------------------------- reproduced vs reported
def read_paper_results(methods_dir: str | Path, methods: set[str] | None = None) -> pd.DataFrame:
    """Every methods/<name>/paper.yaml entry of ``methods`` (default: every folder; those starting
    with _ or . are templates, skipped)."""
    rows = []
    required = list(PAPER_FIELDS)
    for path in sorted(Path(methods_dir).glob("*/paper.yaml")):
        method = path.parent.name
        if method.startswith(("_", ".")) or (methods is not None and method not in methods):
            continue
        rows += [{"method": method, **{k: entry[k] for k in required}} for entry in paper_entries(path)]
    frame = pd.DataFrame(rows, columns=["method"] + required)
    return frame.rename(columns={"value": "reported", "epochs": "paper_epochs", "backbone": "paper_backbone"})


def preset_settings(config_dir: str | Path, methods_dir: str | Path, method: str) -> list[dict]:
    """(preset file, pretraining dataset, its evaluation targets per protocol, backbone, epochs) that
    each config/*.yaml gives this method.

    Each preset is loaded as the Snakefile loads it (config.load_config: merged over
    config/default.yaml), and the method's own config.yaml may change its epochs, so the run's
    settings are resolved.
    """
    config_dir = Path(config_dir)
    out = []
    for path in sorted(config_dir.glob("*.yaml")):
        if path.name == SCHEMA_FILE:
            continue
        # Only read for its datasets, backbone and epochs: not checked against the schema here.
        cfg = load_config(config_dir, [] if path.name == DEFAULT_FILE else [path], validate=False)
        try:
            plan = plan_runs(cfg, methods_dir, [method], check_files=False)
        except (ConfigError, KeyError):
            continue  # a preset that cannot run this method cannot reproduce its numbers
        out += [
            {
                "preset": f"{config_dir.name}/{path.name}",
                "pretrain_dataset": pretrain,
                "targets": {
                    protocol: plan.targets[pretrain, protocol]
                    for protocol in cfg["protocols"]
                    if plan.evaluates(protocol, pretrain, label)
                },
                "backbone": resolved["backbone"].get("name"),
                "epochs": resolved["train"].get("epochs"),
            }
            for (pretrain, label), resolved in plan.runs.items()
            if resolved["method_base"] == method and "released" not in resolved  # a named recipe too
        ]
    return out


def reproduce_hint(entry: pd.Series, presets: list[dict]) -> str:
    """Which preset (pretraining dataset and evaluation target) would reproduce a reported number, or
    what one would need."""

    def same_pair(p):
        return p["pretrain_dataset"] == entry["pretrain_dataset"] and entry["eval_dataset"] in p[
            "targets"
        ].get(entry["protocol"], [])

    pair = pair_name(entry["pretrain_dataset"], entry["eval_dataset"])
    exact = [
        p["preset"]
        for p in presets
        if same_pair(p) and p["backbone"] == entry["paper_backbone"] and p["epochs"] == entry["paper_epochs"]
    ]
    if exact:
        return f"run with --configfile {' or '.join(exact)} ({pair}, {entry['protocol']})"
    close = [p for p in presets if same_pair(p) and p["backbone"] == entry["paper_backbone"]]
    if close:
        p = close[0]
        return (
            f"closest preset {p['preset']} ({pair}, {entry['protocol']}) trains {p['epochs']} epochs (paper: "
            f"{entry['paper_epochs']}); set train.epochs: {entry['paper_epochs']}"
        )
    return (
        f"no preset: needs pretraining on {entry['pretrain_dataset']} and {entry['protocol']} on "
        f"{entry['eval_dataset']}, backbone {entry['paper_backbone']}, {entry['paper_epochs']} epochs"
    )


def ours_label(rows: pd.DataFrame, method: str, released: pd.Series | None) -> str:
    """Which of our runs stands beside a paper's number, among ``rows`` (its dataset, protocol, backbone
    and epochs): the method's base run, else its one trained variant with those settings (a preset's
    named recipe, ``dino[vit_s16]``); several variants would be ambiguous, none is chosen."""
    if "method_base" not in rows:
        return method
    trained = rows if released is None else rows[~released.reindex(rows.index, fill_value=False)]
    labels = set(trained.loc[trained["method_base"] == method, "method"])
    return method if method in labels or len(labels) != 1 else labels.pop()


def reproduced_vs_reported(
    table: pd.DataFrame, methods_dir: str | Path, config_dir: str | Path
) -> pd.DataFrame:
    """Each paper.yaml number beside ours under the same dataset, backbone and epochs: the paper's own
    weights through our protocol (``released``), and our training (``ours``).

    released/released_n: the mean and seed count of our protocol on the method's released weights
    (runs with a ``released_name``), released_gap = released - reported; it separates "our evaluation
    differs from the paper's" from "our training does". ours/std/n are the mean, std and seed count of
    our trained runs with the paper's settings, gap = ours - reported; where we have no such run,
    ``reproduce`` names the preset that would produce one.
    """
    table = check_table(table)
    # the method folders this table has results of: a folder skipped as broken (--keep-going) is not read
    paper = read_paper_results(methods_dir, set(table["method_base" if "method_base" in table else "method"]))
    rows = []
    released_runs = table["released_name"].fillna("").astype(str) != "" if "released_name" in table else None
    for _, entry in paper.iterrows():
        same = (
            (table["pretrain_dataset"] == entry["pretrain_dataset"])
            & (table["eval_dataset"] == entry["eval_dataset"])
            & (table["protocol"] == entry["protocol"])
            & (table["metric"] == entry["metric"])
        )
        if "backbone" in table:
            same &= table["backbone"].astype(str) == str(entry["paper_backbone"])
        if "epochs" in table:
            same &= pd.to_numeric(table["epochs"], errors="coerce") == float(entry["paper_epochs"])
        ours = table[same & (table["method"] == ours_label(table[same], entry["method"], released_runs))]
        row = entry.to_dict()
        released = (
            table[same & released_runs & (table["method_base"] == entry["method"])]
            if (released_runs is not None)
            else table.iloc[:0]
        )
        row.update(
            released=released["value"].mean() if len(released) else math.nan,
            released_n=len(released),
            released_gap=released["value"].mean() - float(entry["reported"]) if len(released) else math.nan,
        )
        if len(ours):
            values = ours["value"]
            std = values.std(ddof=1) if len(values) > 1 else math.nan
            row.update(
                ours=values.mean(),
                std=std,
                n=len(values),
                gap=values.mean() - float(entry["reported"]),
                reproduce="",
            )
        else:
            row.update(
                ours=math.nan,
                std=math.nan,
                n=0,
                gap=math.nan,
                reproduce=reproduce_hint(entry, preset_settings(config_dir, methods_dir, entry["method"])),
            )
        rows.append(row)
    columns = [
        "method",
        "pretrain_dataset",
        "eval_dataset",
        "paper_backbone",
        "paper_epochs",
        "protocol",
        "metric",
        "reported",
        "released",
        "released_n",
        "released_gap",
        "ours",
        "std",
        "n",
        "gap",
        "source",
        "reproduce",
    ]
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- methods x methods
def comparison_matrix(comparisons: pd.DataFrame, pair: tuple[str, str], protocol: str, metric: str) -> dict:
    """The paired comparisons of one metric and dataset pair as method × method frames: ``diff`` (mean
    over shared seeds of row − column), ``p`` and ``n``; each pair's mirror has the opposite difference
    and the same p. NaN on the diagonal and where two methods share no seed."""
    rows = comparisons[
        (comparisons["pretrain_dataset"] == pair[0])
        & (comparisons["eval_dataset"] == pair[1])
        & (comparisons["protocol"] == protocol)
        & (comparisons["metric"] == metric)
    ]
    methods = sorted(set(rows["method_a"]) | set(rows["method_b"]))
    index = pd.Index(methods, name="method")
    out = {k: pd.DataFrame(np.nan, index=index, columns=methods) for k in ("diff", "p", "n")}
    for a, b, diff, p, n in rows[["method_a", "method_b", "mean_diff", "p_value", "n"]].itertuples(
        index=False
    ):
        for (row, column), sign in (((a, b), 1.0), ((b, a), -1.0)):
            out["diff"].loc[row, column] = sign * diff
            out["p"].loc[row, column] = p
            out["n"].loc[row, column] = n
    return out


def significant(p: float, n: float, alpha: float = ALPHA) -> bool:
    """Whether a paired difference clears the noise: tested (n ≥ 2) and p < alpha."""
    return bool(n >= 2 and math.isfinite(p) and p < alpha)


# --------------------------------------------------------------------------- ablations


def ablation_table(summary: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The summary (mean, std, ci95, n over seeds) of the ablation metrics of every sweep point.

    ``points``: one row per (setting, method label) with method_base and the setting's ``value`` (its
    text) and ``order`` (its place on the axis). Sorted by setting, dataset pair, method base, order."""
    metrics = pd.DataFrame([(label, p, m) for label, p, m in TOP1], columns=["label", "protocol", "metric"])
    chosen = summary.merge(metrics[["protocol", "metric"]], on=["protocol", "metric"])
    out = points.merge(chosen, on="method")
    columns = [
        "setting",
        *PAIR,
        "method_base",
        "value",
        "method",
        "protocol",
        "metric",
        "mean",
        "std",
        "ci95",
        "n",
    ]
    out = out.sort_values(["setting", *PAIR, "method_base", "protocol", "metric", "order"])
    return out[columns].reset_index(drop=True)


# --------------------------------------------------------------------------- stale rows
STALE_MARK = "†"


def stale_methods(table: pd.DataFrame, pair: tuple[str, str]) -> set[str]:
    """Methods of a dataset pair with at least one row computed by code that has changed since
    (``stale``; a table without the column has none)."""
    if "stale" not in table:
        return set()
    rows = table[(table["pretrain_dataset"] == pair[0]) & (table["eval_dataset"] == pair[1])]
    return set(rows.loc[rows["stale"].astype(str).str.lower() == "true", "method"])
