"""Statistics over seeds: summaries, paired method comparisons, each method's margin over the
floor of its own backbone, the leaderboard, the headline table, and our numbers beside the papers'.

Every function takes the long-format ``results/table.csv`` (one row per pretraining
dataset, evaluation dataset, method, seed, protocol, metric) or its summary, and returns
a DataFrame. Methods are compared within one (pretraining dataset, evaluation dataset)
pair: a number means something only beside numbers of the same pair.

Undefined statistics stay missing, never invented: with one seed the standard
deviation and the confidence interval do not exist, so ``std`` and ``ci95`` are
NaN in the DataFrame, an empty cell in a CSV, and "—" / "(n=1)" on display. A
zero would claim a certainty that one seed cannot give.

Differences within floating-point round-off (``within_roundoff``) are no differences:
a value the same on every seed has std exactly 0 (shown with SAME_MARK, not "± 0.00"),
and a mean paired difference that small is exactly 0 (a tie, never "+0.0").
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
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
ROUNDOFF = 1e-12  # relative: float64 sums of a few values of one magnitude differ by far less
SAME_MARK = "‡"  # after a value that is the same on every seed
SAME_NOTE = (
    f"{SAME_MARK}: the same value on every seed (it does not depend on the seed), so it has no spread."
)
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
    return float(ci95_halfwidths(np.array([std]), np.array([n]))[0])


def ci95_halfwidths(std: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``ci95_halfwidth`` of each (std, n >= 2), in one scipy call (a call costs far more than its
    arithmetic)."""
    return scipy_stats.t.ppf(0.975, n - 1) * std / np.sqrt(n)


def within_roundoff(spread: float, *values: np.ndarray) -> bool:
    """Whether ``spread`` (a difference, a range) is floating-point round-off of numbers of the
    magnitude of ``values``: |spread| ≤ ROUNDOFF · max(1, |values|)."""
    scale = max([1.0, *(float(np.max(np.abs(v))) for v in values if np.size(v))])
    return abs(spread) <= ROUNDOFF * scale


def seed_std(values: pd.Series) -> float:
    """std over seeds (ddof=1): NaN for one seed, exactly 0 for a value the same on every seed."""
    if len(values) < 2:
        return math.nan
    if within_roundoff(np.ptp(values.to_numpy()), values.to_numpy()):
        return 0.0
    return float(values.std(ddof=1))


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pretraining dataset, evaluation dataset, method, protocol, metric): mean, std (ddof=1;
    exactly 0 where the value is the same on every seed), ci95 half-width, n seeds."""
    table = check_table(table)
    grouped = table.groupby(GROUP, sort=True)["value"]
    out = grouped.agg(mean="mean", std=seed_std, n="count")
    out = out.reset_index()
    out["n"] = out["n"].astype(int)
    out["ci95"] = [ci95_halfwidth(s, n) for s, n in zip(out["std"], out["n"])]
    return out[GROUP + ["mean", "std", "ci95", "n"]]


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error rate) of one family of tests.

    The k-th smallest of m p-values becomes max over j ≤ k of (m − j + 1)·p_(j), capped at 1, so
    the adjusted values keep the raw ones' order. NaN (no test) stays NaN and is not counted in m.
    """
    p = np.asarray(p_values, float)
    out = np.full(p.shape, math.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


def paired_test(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """mean_diff (mean over seeds of a − b), its 95% Student-t interval (ci_low, ci_high) and the
    two-sided paired t-test p_value (the same as scipy.stats.ttest_rel).

    Fewer than 2 pairs: every statistic but the mean is NaN. A mean within round-off of the
    values is exactly 0 (a tie). Differences the same on every seed (sd 0 up to round-off) have
    no spread to test against: t = d / 0 is undefined, and p = 0 would claim a certainty that a few
    seeds cannot give, so p is NaN, the interval is the point itself, and the verdict calls such a
    difference exact ("A > B (exact)": A is above B on every seed, with no probability attached);
    it enters no multiple-testing family.
    """
    return paired_tests([(a, b)])[0]


def paired_tests(pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[dict[str, float]]:
    """``paired_test`` of each (a, b): each pair's differences in numpy, then Student's t quantiles and
    tails of all of them in one scipy call each (a call costs far more than its arithmetic); every
    value the same bits as one pair at a time."""
    out, tested = [], []
    for a, b in pairs:
        a, b = np.asarray(a, float), np.asarray(b, float)
        diff = a - b
        n = len(diff)
        mean = float(diff.mean())
        if within_roundoff(mean, a, b):
            mean = 0.0
        if n < 2:
            out.append({"mean_diff": mean, "ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan})
        elif within_roundoff(np.ptp(diff), a, b):
            out.append({"mean_diff": mean, "ci_low": mean, "ci_high": mean, "p_value": math.nan})
        else:
            sd = float(diff.std(ddof=1))
            t = float(diff.mean()) / (sd / math.sqrt(n))
            tested.append((len(out), mean, sd, n, t))
            out.append({})
    if tested:
        at, mean, sd, n, t = (np.array(column) for column in zip(*tested))
        halves = ci95_halfwidths(sd, n)
        tails = scipy_stats.t.sf(np.abs(t), n - 1)
        for i, m, half, tail in zip(at, mean.tolist(), halves.tolist(), tails):
            out[i] = {"mean_diff": m, "ci_low": m - half, "ci_high": m + half, "p_value": float(2 * tail)}
    return out


def comparison_kind(n: float, p_adjusted: float, alpha: float = ALPHA) -> str:
    """What a paired comparison can say: "untested" (n < 2), "exact" (the same difference on every
    seed: no test), "resolved" (Holm-adjusted p < alpha) or "noise"."""
    if not n >= 2:
        return "untested"
    if not math.isfinite(p_adjusted):
        return "exact"
    return "resolved" if p_adjusted < alpha else "noise"


def verdict(method_a: str, method_b: str, mean_diff: float, kind: str) -> str:
    better = f"{method_a} > {method_b}" if mean_diff > 0 else f"{method_b} > {method_a}"
    if kind == "untested":
        return "untested (n < 2)"
    if kind == "exact":
        return "tie (equal on every seed)" if mean_diff == 0 else f"{better} (exact)"
    return better if kind == "resolved" else "within noise"


COMPARISON_COLUMNS = [
    *PAIR,
    "protocol",
    "metric",
    "method_a",
    "method_b",
    "mean_diff",
    "ci_low",
    "ci_high",
    "p_value",
    "p_adjusted",
    "family_size",
    "n",
    "verdict",
]


def paired_comparison(table: pd.DataFrame, protocol: str, metric: str, alpha: float = ALPHA) -> pd.DataFrame:
    """Every pair of methods on one metric, per (pretraining, evaluation) dataset pair, paired by seed.

    mean_diff, ci_low, ci_high, p_value: ``paired_test`` on the seeds the two methods share. One
    family of tests is one methods × methods matrix: one (pretraining dataset, evaluation dataset,
    protocol, metric). p_adjusted is Holm's (``holm``) within it and family_size its number of tests;
    the verdict names the better method where p_adjusted < alpha, else "within noise" ("untested
    (n < 2)" with one shared seed, "(exact)" where the difference is the same on every seed).
    """
    table = check_table(table)
    subset = table[(table["protocol"] == protocol) & (table["metric"] == metric)]
    families = [
        compare_family(data, alpha).assign(protocol=protocol, metric=metric)
        for _, data in subset.groupby(PAIR, sort=True)
    ]
    families = [f for f in families if len(f)]
    if not families:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    return pd.concat(families, ignore_index=True)[COMPARISON_COLUMNS]


def compare_family(data: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """The paired tests of every two methods in the rows of one (dataset pair, protocol, metric),
    Holm-adjusted together."""
    wide = data.pivot(index="seed", columns="method", values="value")
    pretrain, target = data[PAIR].iloc[0]
    methods = sorted(wide.columns)
    values = wide[methods].to_numpy(float)  # seeds × methods, NaN where a method lacks a seed
    present = ~np.isnan(values)
    names, pairs = [], []
    for i, j in itertools.combinations(range(len(methods)), 2):
        shared = present[:, i] & present[:, j]  # the seeds both have
        if shared.any():
            names.append((methods[i], methods[j]))
            pairs.append((values[shared, i], values[shared, j]))
    rows = [
        {"method_a": a, "method_b": b, **test, "n": len(x)}
        for (a, b), (x, _), test in zip(names, pairs, paired_tests(pairs))
    ]
    family = pd.DataFrame(
        rows, columns=["method_a", "method_b", "mean_diff", "ci_low", "ci_high", "p_value", "n"]
    )
    family["p_adjusted"] = holm(family["p_value"])
    family["family_size"] = int(family["p_value"].notna().sum())
    family["verdict"] = [
        verdict(a, b, d, comparison_kind(n, p, alpha))
        for a, b, d, n, p in family[["method_a", "method_b", "mean_diff", "n", "p_adjusted"]].itertuples(
            index=False
        )
    ]
    return family.assign(pretrain_dataset=pretrain, eval_dataset=target)


def resolution_note(n: int, m: int, alpha: float = ALPHA) -> str:
    """What a family of m paired t-tests on n seeds can resolve under Holm's correction, in words."""
    if m == 0:
        return (
            "No paired t-test in this matrix: no two methods share two seeds with differences that vary "
            "from seed to seed."
        )
    threshold = alpha / m  # Holm's first step: nothing is called unless the smallest p is below it
    t = float(scipy_stats.t.isf(threshold / 2, n - 1))
    steps = f" (the next at p < {alpha}/{m - 1}, and so on)" if m > 1 else ""
    tests = "paired test" if m == 1 else "paired tests"
    return (
        f"With {n} seeds and {m} {tests} in this matrix, Holm's correction calls a first difference "
        f"only at p < {alpha}/{m} = {threshold:.2g}{steps}: a paired t-test on {n} seeds gets there only "
        "when the mean difference exceeds "
        f"{t / math.sqrt(n):.3g} times the standard deviation of its per-seed differences (|t| > "
        f"{t:.3g}, {n - 1} degrees of freedom). Within noise means not resolved by {n} seeds, not equal."
    )


def headline_comparisons(table: pd.DataFrame) -> pd.DataFrame:
    """paired_comparison for every headline metric present in the table."""
    present = set(zip(table["protocol"], table["metric"]))
    frames = [paired_comparison(table, p, m) for _, p, m in HEADLINE if (p, m) in present]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else paired_comparison(table.iloc[:0], "", "")


# --------------------------------------------------------------------------- floors and margins
FLOOR_BASE = "random"  # method_base of the untrained network: the floor of each backbone
REFERENCE_BASES = ("supervised", "pixels")  # uses the labels; has no network
# A run's backbone as table.csv records it. DeepCluster's Sobel input filter is part of its method,
# not of its backbone: the untrained network without the filter is still its floor.
BACKBONE_COLUMNS = ["backbone", "small_stem", "backbone_args", "features"]
FLOOR_COLUMNS = ["pretrain_dataset", "method", "method_base", "role", "backbone", "floor", "no_floor"]


def backbone_text(settings: dict[str, str]) -> str:
    """A backbone's settings (BACKBONE_COLUMNS, as text) in words: ``resnet18 (small stem)``; the
    defaults (no small stem, no arguments, pooled features) unsaid."""
    extras = [
        "small stem" if settings.get("small_stem", "").lower() == "true" else "",
        "" if settings.get("backbone_args", "{}") in ("{}", "", "nan") else settings["backbone_args"],
        ""
        if settings.get("features", "pooled") in ("pooled", "", "nan")
        else f"{settings['features']} features",
    ]
    extras = [e for e in extras if e]
    name = settings.get("backbone", "the suite's backbone")
    return f"{name} ({', '.join(extras)})" if extras else name


def run_floors(table: pd.DataFrame) -> pd.DataFrame:
    """Each run label's role and floor: one row per (pretrain_dataset, method) with its method_base,
    role, backbone (in words), floor (the label of its floor, "" where it has none) and no_floor (why
    a learned or supervised run has none, else "").

    role: "floor" (method_base random: the untrained network of a backbone), "reference" (supervised,
    which uses the labels, and pixels, which has no network) or "learned". The floor of a learned or
    supervised run is the run of method_base random on the same pretraining dataset and the same
    backbone settings (BACKBONE_COLUMNS); a backbone without one leaves its runs without a floor,
    never measured against another backbone's. A table without method_base takes each label as its
    own base, one without the backbone columns has one backbone.
    """
    table = check_table(table)
    columns = [c for c in BACKBONE_COLUMNS if c in table]
    runs = table[PAIR[:1] + ["method"]].assign(
        method_base=table["method_base"].astype(str) if "method_base" in table else table["method"],
        settings=[dict(zip(columns, map(str, row))) for row in table[columns].itertuples(index=False)],
    )
    runs["key"] = runs["settings"].map(lambda s: tuple(sorted(s.items())))
    runs = runs.drop_duplicates(["pretrain_dataset", "method", "key"])
    floor_runs = runs[runs["method_base"] == FLOOR_BASE]
    floors: dict[tuple, list[str]] = {}
    for pretrain, method, key in zip(floor_runs["pretrain_dataset"], floor_runs["method"], floor_runs["key"]):
        floors.setdefault((pretrain, key), []).append(method)
    rows = []
    for (pretrain, method), run in runs.groupby(["pretrain_dataset", "method"], sort=True):
        base = run["method_base"].iloc[0]
        role = "floor" if base == FLOOR_BASE else "reference" if base in REFERENCE_BASES else "learned"
        described = sorted({backbone_text(s) for s in run["settings"]})
        floor, no_floor = "", ""
        if role == "learned" or base == "supervised":
            found = floors.get((pretrain, run["key"].iloc[0]), []) if len(run) == 1 else []
            if len(found) == 1:
                (floor,) = found
            elif len(run) > 1:
                no_floor = f"its rows name several backbones: {'; '.join(described)}"
            elif found:
                no_floor = f"several floors on its backbone: {', '.join(sorted(found))}"
            else:
                no_floor = f"no {FLOOR_BASE} run on its backbone {described[0]}"
        rows.append([pretrain, method, base, role, "; ".join(described), floor, no_floor])
    return pd.DataFrame(rows, columns=FLOOR_COLUMNS)


def welch_margin(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """A method's seeds ``a`` against its floor's seeds ``b``: n, floor_n, mean, floor_mean, std,
    floor_std (``seed_std``), margin = mean − floor_mean, its 95% Welch interval (ci_low, ci_high: se =
    √(std²/n + floor_std²/floor_n), Welch–Satterthwaite df, Student t quantile), df, and the one-sided
    Welch two-sample p_value of "the method's mean is above its floor's" (the same as
    scipy.stats.ttest_ind(a, b, equal_var=False, alternative="greater")).

    The floor is not paired with the method by seed: a method's value does not follow the floor of its
    own seed, so pairing would only add the floor's noise. Fewer than 2 values on either side: no
    interval, df or test (NaN). A margin within round-off is exactly 0. A side the same on every seed
    (std exactly 0, as ``seed_std`` says) adds no spread, so df is the other side's n − 1; both so,
    the margin is exact: no test (p NaN, outside every family), the interval the point itself, as
    ``paired_test`` treats a difference the same on every seed.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    std, floor_std = seed_std(pd.Series(a)), seed_std(pd.Series(b))
    mean, floor_mean = (float(v.mean()) if len(v) else math.nan for v in (a, b))
    difference = mean - floor_mean
    margin = 0.0 if within_roundoff(difference, a, b) else difference
    out = {
        "n": len(a),
        "floor_n": len(b),
        "mean": mean,
        "floor_mean": floor_mean,
        "std": std,
        "floor_std": floor_std,
        "margin": margin,
        **dict.fromkeys(("ci_low", "ci_high", "df", "p_value"), math.nan),
    }
    if len(a) < 2 or len(b) < 2:
        return out
    var, floor_var = std**2 / len(a), floor_std**2 / len(b)
    se = math.sqrt(var + floor_var)
    if se == 0:
        return {**out, "ci_low": margin, "ci_high": margin}
    df = (var + floor_var) ** 2 / (var**2 / (len(a) - 1) + floor_var**2 / (len(b) - 1))
    half = float(scipy_stats.t.ppf(0.975, df)) * se
    p = float(scipy_stats.t.sf(difference / se, df))
    return {**out, "ci_low": margin - half, "ci_high": margin + half, "df": df, "p_value": p}


MARGIN_COLUMNS = [
    *PAIR,
    "protocol",
    "metric",
    "method",
    "role",
    "floor",
    "n",
    "floor_n",
    "mean",
    "floor_mean",
    "std",
    "floor_std",
    "margin",
    "ci_low",
    "ci_high",
    "df",
    "p_value",
    "p_adjusted",
    "family_size",
    "verdict",
    "seeds_under_floor_mean",
]
ABOVE, NOT_RESOLVED, BELOW = "above its floor", "not resolved", "below its floor mean"
# the leaderboard's mark of each verdict; the other verdicts are shown in words
MARKS = {ABOVE: "✓", NOT_RESOLVED: "·", BELOW: "✗", f"{ABOVE} (exact)": "✓ (exact)"}


def margin_verdict(
    floor: str, n: int, floor_n: int, margin: float, p_adjusted: float, alpha: float = ALPHA
) -> str:
    if not floor:
        return "no floor"
    if floor_n == 0:
        return "floor not evaluated"
    if n < 2 or floor_n < 2:
        return "n < 2"
    if margin < 0:
        return BELOW
    if not math.isfinite(p_adjusted):  # welch_margin: both the same on every seed, no test
        return f"{ABOVE} (exact)" if margin > 0 else "tie (equal on every seed)"
    return ABOVE if p_adjusted < alpha else NOT_RESOLVED


def margins(table: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """Every learned method's margin over its own floor (``run_floors``), and supervised's as a
    reference, on every headline metric, per (pretraining, evaluation) dataset pair: ``welch_margin``
    of the method's seeds and its floor's, each on every seed it has.

    One family of tests is the learned methods of one (pretraining dataset, evaluation dataset,
    protocol, metric), the references (supervised's runs) another: p_adjusted is Holm's (``holm``)
    within it and family_size its number of tests. The verdict: "above its floor" (p_adjusted < alpha),
    "not resolved", "below its floor mean" (margin < 0, whatever its p), "n < 2" (no test), "no floor"
    (none on its backbone), "floor not evaluated" (its floor lacks this target, protocol or metric),
    "above its floor (exact)" or "tie (equal on every seed)" (both the same on every seed: no test).
    """
    table = check_table(table)
    runs = run_floors(table).set_index(["pretrain_dataset", "method"])
    present = set(zip(table["protocol"], table["metric"]))
    rows = []
    for _, protocol, metric in HEADLINE:
        if (protocol, metric) not in present:
            continue
        subset = table[(table["protocol"] == protocol) & (table["metric"] == metric)]
        for (pretrain, target), data in subset.groupby(PAIR, sort=True):
            values = {m: v["value"].to_numpy() for m, v in data.groupby("method", sort=True)}
            for method, seeds in values.items():
                run = runs.loc[(pretrain, method)]
                if run["role"] != "learned" and run["method_base"] != "supervised":
                    continue
                floor_seeds = values.get(run["floor"], np.empty(0)) if run["floor"] else np.empty(0)
                rows.append(
                    {
                        "pretrain_dataset": pretrain,
                        "eval_dataset": target,
                        "protocol": protocol,
                        "metric": metric,
                        "method": method,
                        "role": run["role"],
                        "floor": run["floor"],
                        **welch_margin(seeds, floor_seeds),
                        # a method above its floor on average may still fall under it on a seed
                        "seeds_under_floor_mean": (
                            int((seeds < floor_seeds.mean()).sum()) if len(floor_seeds) else math.nan
                        ),
                    }
                )
    out = pd.DataFrame(
        rows, columns=[c for c in MARGIN_COLUMNS if c not in ("p_adjusted", "family_size", "verdict")]
    )
    out["p_adjusted"] = math.nan
    out["family_size"] = 0
    for _, family in out.groupby([*PAIR, "protocol", "metric", "role"], sort=False):
        out.loc[family.index, "p_adjusted"] = holm(family["p_value"])
        out.loc[family.index, "family_size"] = int(family["p_value"].notna().sum())
    out["verdict"] = [
        margin_verdict(*row, alpha)
        for row in out[["floor", "n", "floor_n", "margin", "p_adjusted"]].itertuples(index=False)
    ]
    return out[MARGIN_COLUMNS]


# --------------------------------------------------------------------------- the record on many seeds
# A run of three seeds cannot say whether a method beats its floor on every seed. What many seeds of
# the same settings showed is measured once (benchmarks/margins.py writes the record) and shown on the
# leaderboard beside the runs whose settings (`run_settings`, every setting of the run's training) are
# those it was measured with; a run of other settings is not named by it.
RECORD_COLUMNS = [
    *PAIR,
    "protocol",
    "metric",
    "method",
    "run_settings",
    "seeds",
    "n",
    "floor_n",
    "margin",
    "ci_low",
    "ci_high",
    "seeds_under_floor_mean",
    "verdict",
    "git_commit",
    "processor",
]
RECORD_SHOWN = ["seeds", "n", "margin", "ci_low", "ci_high", "seeds_under_floor_mean", "verdict"]
# The bar a method is held to on many seeds: a mean margin of at least 5 points over its floor's mean,
# the interval's lower end at least 2, and no seed under the floor's mean.
BAR_MARGIN, BAR_LOW = 0.05, 0.02
BEATS, NOT_EVERY_SEED, NOT_SHOWN = (
    "beats its floor on every seed",
    "does not beat it on every seed at this budget (beats it on average)",
    "does not beat it at this budget",
)


def record_verdict(margin: float, ci_low: float, seeds_under: int) -> str:
    """What many seeds say of a method against its floor (BAR_MARGIN, BAR_LOW): BEATS,
    NOT_EVERY_SEED (the margin clears the bar but some seed falls under the floor's mean) or NOT_SHOWN."""
    if not (margin >= BAR_MARGIN and ci_low >= BAR_LOW):
        return NOT_SHOWN
    return BEATS if seeds_under == 0 else NOT_EVERY_SEED


def seed_list(seeds) -> str:
    """Seeds as ranges: [0, 1, 2, 5] → "0-2, 5"."""
    ordered, runs = sorted({int(s) for s in seeds}), []
    for seed in ordered:
        if runs and seed == runs[-1][1] + 1:
            runs[-1][1] = seed
        else:
            runs.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def run_settings(table: pd.DataFrame) -> dict[tuple[str, str], str]:
    """{(pretraining dataset, method): its run_settings} where all its rows share one (a table
    written before the column existed, or a method whose seeds ran different settings, has none)."""
    if "run_settings" not in table:
        return {}
    found = table.groupby(["pretrain_dataset", "method"])["run_settings"].unique()
    return {key: str(values[0]) for key, values in found.items() if len(values) == 1}


def processor(cpu_kernels: str) -> str:
    """The processor a row ran on, from its `cpu_kernels` record (sslbench.kernels), else ""."""
    try:
        return str(json.loads(cpu_kernels).get("cpu") or "")
    except (TypeError, ValueError, AttributeError):
        return ""


def floor_record(table: pd.DataFrame) -> pd.DataFrame:
    """The record of a many-seed table: every learned method's margin (``margins``) on its seeds, with
    the seeds named, its verdict on the bar (``record_verdict``), its settings and the commits and
    processors it ran on."""
    rows = margins(table)
    rows = rows[rows["role"] == "learned"]
    settings = run_settings(table)
    by_run = table.assign(processor=table.get("cpu_kernels", pd.Series("", index=table.index)).map(processor))
    by_run = by_run.groupby([*PAIR, "method"])
    keys = list(zip(rows["pretrain_dataset"], rows["eval_dataset"], rows["method"]))
    joined = {
        c: by_run[c].agg(lambda v: " ".join(sorted(set(map(str, v))))) for c in ("git_commit", "processor")
    }
    out = rows.assign(
        run_settings=[settings.get((p, m), "") for p, _, m in keys],
        seeds=[seed_list(by_run["seed"].unique()[k]) for k in keys],
        verdict=[
            record_verdict(*v) for v in zip(rows["margin"], rows["ci_low"], rows["seeds_under_floor_mean"])
        ],
        **{c: [joined[c][k] for k in keys] for c in joined},
    )
    return out[RECORD_COLUMNS].reset_index(drop=True)


def record_of(
    record: pd.DataFrame | None, settings: dict, pair: tuple[str, str], protocol: str, metric: str
) -> pd.DataFrame:
    """The record's rows (RECORD_SHOWN, by method) of one leaderboard: a dataset pair on one metric,
    the methods whose runs here have the settings the record was measured with."""
    if record is None or record.empty:
        return pd.DataFrame(columns=RECORD_SHOWN, index=pd.Index([], name="method"))
    rows = record[
        (record["pretrain_dataset"] == pair[0])
        & (record["eval_dataset"] == pair[1])
        & (record["protocol"] == protocol)
        & (record["metric"] == metric)
    ]
    same = [settings.get((pair[0], m)) == s for m, s in zip(rows["method"], rows["run_settings"])]
    return rows[np.array(same, dtype=bool)].set_index("method")[RECORD_SHOWN]


# --------------------------------------------------------------------------- leaderboard
@dataclass
class Leaderboard:
    """One (pretraining, evaluation) dataset pair on its first headline metric: the learned methods
    ranked by mean (best first), then the references, unranked."""

    pair: tuple[str, str]
    label: str  # the headline column (HEADLINE)
    rows: pd.DataFrame  # rank (learned), role, method, the margin columns; backbone of each floor


LEADERBOARD_COLUMNS = [
    "rank",
    "role",
    "method",
    "mean",
    "std",
    "n",
    "floor",
    "floor_mean",
    "floor_std",
    "floor_n",
    "margin",
    "ci_low",
    "ci_high",
    "p_value",
    "p_adjusted",
    "family_size",
    "verdict",
    "seeds_under_floor_mean",
    "no_floor",
    "backbone",
    *(f"record_{c}" for c in RECORD_SHOWN),
]


def leaderboard(
    summary: pd.DataFrame,
    margin_rows: pd.DataFrame,
    floors: pd.DataFrame,
    pair: tuple[str, str],
    record: pd.DataFrame | None = None,
    settings: dict | None = None,
) -> Leaderboard | None:
    """The leaderboard of a dataset pair on the first headline metric any of its methods has (None
    where it has none): the learned methods by mean (``summary``), best first (ties by label), ranked
    1, 2, …, with their margins (``margins``) and what the record on many seeds says of those with
    the same ``settings`` (``record_of``: record_* columns); then, unranked, the references: each
    floor, supervised's runs (with their margins), pixels."""
    of_pair = summary[(summary["pretrain_dataset"] == pair[0]) & (summary["eval_dataset"] == pair[1])]
    present = set(zip(of_pair["protocol"], of_pair["metric"]))
    chosen = next(((lab, p, m) for lab, p, m in HEADLINE if (p, m) in present), None)
    if chosen is None:
        return None
    label, protocol, metric = chosen
    stats = of_pair[(of_pair["protocol"] == protocol) & (of_pair["metric"] == metric)].set_index("method")
    runs = floors[floors["pretrain_dataset"] == pair[0]].set_index("method")
    tested = family_rows(margin_rows, pair, protocol, metric).set_index("method")
    learned = tested.index[tested["role"] == "learned"]
    ranked = sorted(learned, key=lambda m: (-stats.loc[m, "mean"], m))
    references = (
        [m for m in stats.index if runs.loc[m, "role"] == "floor"]
        + [m for m in tested.index if tested.loc[m, "role"] == "reference"]
        + [m for m in stats.index if runs.loc[m, "method_base"] == "pixels"]
    )
    order = ranked + references
    rows = tested.reindex(order).drop(columns=["mean", "std", "n", "role"])
    rows[["mean", "std", "n"]] = stats.loc[order, ["mean", "std", "n"]]
    rows[["role", "no_floor", "backbone"]] = runs.loc[order, ["role", "no_floor", "backbone"]]
    rows["rank"] = [*range(1, len(ranked) + 1), *[math.nan] * len(references)]
    rows[["floor", "verdict"]] = rows[["floor", "verdict"]].fillna("")
    recorded = record_of(record, settings or {}, pair, protocol, metric).reindex(order)
    rows[[f"record_{c}" for c in RECORD_SHOWN]] = recorded.to_numpy()
    return Leaderboard(pair, label, rows.rename_axis("method").reset_index()[LEADERBOARD_COLUMNS])


def leaderboards(
    table: pd.DataFrame,
    summary: pd.DataFrame,
    margin_rows: pd.DataFrame,
    floors: pd.DataFrame,
    record: pd.DataFrame | None = None,
) -> list[Leaderboard]:
    """The leaderboard of every dataset pair of the table that has a headline metric, each beside
    the ``record`` on many seeds (``floor_record``) where the runs' settings are the recorded ones."""
    settings = run_settings(table)
    boards = (leaderboard(summary, margin_rows, floors, pair, record, settings) for pair in pairs(table))
    return [board for board in boards if board is not None]


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
    if std == 0:  # seed_std: the same on every seed, not measured to ± 0.00
        return f"{percent(mean)} {SAME_MARK}"
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
    (percent); a method without the metric shows "—". ``absent_headline`` names the others."""
    parts = headline_stats(summary, pair)
    present = [c for c in parts["mean"].columns if parts["mean"][c].notna().any()]
    return display_cells({k: frame[present] for k, frame in parts.items()})


def absent_headline(summary: pd.DataFrame, pair: tuple[str, str] | None = None) -> list[tuple[str, str, str]]:
    """The (label, protocol, metric) of each headline column no method of the pair has a result for."""
    shown = set(headline_table(summary, pair).columns)
    return [column for column in HEADLINE if column[0] not in shown]


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


def preset_settings(
    config_dir: str | Path, methods_dir: str | Path, methods: list[str]
) -> dict[str, list[dict]]:
    """{method: [(preset file, pretraining dataset, its evaluation targets per protocol, backbone,
    epochs)]} that each config/*.yaml gives each of ``methods``.

    Each preset is loaded once, as the Snakefile loads it (config.load_config: merged over
    config/default.yaml), and planned once for all the methods (each method's own config.yaml may change
    its epochs, so the runs' settings are resolved); a preset that cannot plan them together is planned
    per method, and one that cannot run a method cannot reproduce its numbers.
    """
    config_dir = Path(config_dir)
    out: dict[str, list[dict]] = {m: [] for m in methods}
    for path in sorted(config_dir.glob("*.yaml")):
        if path.name == SCHEMA_FILE:
            continue
        # Only read for its datasets, backbone and epochs: not checked against the schema here.
        cfg = load_config(config_dir, [] if path.name == DEFAULT_FILE else [path], validate=False)
        try:
            plans = [plan_runs(cfg, methods_dir, list(methods), check_files=False)]
        except (ConfigError, KeyError):
            plans = []
            for method in methods:
                try:
                    plans.append(plan_runs(cfg, methods_dir, [method], check_files=False))
                except (ConfigError, KeyError):
                    continue
        for plan in plans:
            for (pretrain, label), resolved in plan.runs.items():
                if resolved["method_base"] not in out or "released" in resolved:  # a named recipe too
                    continue
                out[resolved["method_base"]].append(
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
                )
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
    # the method folders this table has results of: a folder left out as broken (broken_methods) is not read
    paper = read_paper_results(methods_dir, set(table["method_base" if "method_base" in table else "method"]))
    rows, presets = [], None
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
            if presets is None:  # every preset planned once, for every method with a paper.yaml here
                presets = preset_settings(config_dir, methods_dir, sorted(set(paper["method"])))
            row.update(
                ours=math.nan,
                std=math.nan,
                n=0,
                gap=math.nan,
                reproduce=reproduce_hint(entry, presets[entry["method"]]),
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
def family_rows(comparisons: pd.DataFrame, pair: tuple[str, str], protocol: str, metric: str) -> pd.DataFrame:
    """The rows of comparisons.csv of one family: one (pretraining dataset, evaluation dataset,
    protocol, metric)."""
    return comparisons[
        (comparisons["pretrain_dataset"] == pair[0])
        & (comparisons["eval_dataset"] == pair[1])
        & (comparisons["protocol"] == protocol)
        & (comparisons["metric"] == metric)
    ]


def comparison_matrix(comparisons: pd.DataFrame, pair: tuple[str, str], protocol: str, metric: str) -> dict:
    """The paired comparisons of one metric and dataset pair as method × method frames: ``diff`` (mean
    over shared seeds of row − column) with its 95% interval ``ci_low``, ``ci_high``, ``p``,
    ``p_adjusted`` and ``n``; each pair's mirror has the opposite difference and interval and the same
    p. NaN on the diagonal and where two methods share no seed."""
    rows = family_rows(comparisons, pair, protocol, metric)
    methods = sorted(set(rows["method_a"]) | set(rows["method_b"]))
    place = {method: i for i, method in enumerate(methods)}
    a = rows["method_a"].map(place).to_numpy(int)
    b = rows["method_b"].map(place).to_numpy(int)
    statistics = ("mean_diff", "ci_low", "ci_high", "p_value", "p_adjusted", "n")
    value = {c: rows[c].to_numpy(float) for c in statistics}
    both = {  # (row a, column b; row b, column a)
        "diff": (value["mean_diff"], -value["mean_diff"]),
        "ci_low": (value["ci_low"], -value["ci_high"]),
        "ci_high": (value["ci_high"], -value["ci_low"]),
        "p": (value["p_value"], value["p_value"]),
        "p_adjusted": (value["p_adjusted"], value["p_adjusted"]),
        "n": (value["n"], value["n"]),
    }
    index = pd.Index(methods, name="method")
    out = {}
    for key, (forward, mirror) in both.items():
        grid = np.full((len(methods), len(methods)), np.nan)
        grid[a, b], grid[b, a] = forward, mirror
        grid[np.isnan(grid)] = np.nan  # the negated missing ones too: NaN without a sign bit
        out[key] = pd.DataFrame(grid, index=index, columns=methods)
    return out


def family_resolution(comparisons: pd.DataFrame, pair: tuple[str, str], protocol: str, metric: str) -> str:
    """``resolution_note`` of one family (matrix): its number of tests, at the most seeds two of its
    methods share."""
    rows = family_rows(comparisons, pair, protocol, metric)
    tested = rows[rows["p_value"].notna()]
    return resolution_note(int(tested["n"].max()) if len(tested) else 0, int(rows["family_size"].max()))


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
