"""Statistics over seeds: hand-computed summaries, the paired test's verdicts, each method's margin
over the floor of its own backbone, the leaderboard, the headline table, and our numbers beside the
papers'."""

import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as scipy_stats
from support import METHODS_DIR, REPO, preset_config

from evaluation.knn import variant_name
from sslbench.errors import ConfigError
from sslbench.plan.protocols import protocol_settings
from sslbench.plan.runs import plan_runs, selected_methods
from sslbench.plan.settings import load_config
from sslbench.provenance import code_digest
from sslbench.report.stats import (
    BEATS,
    HEADLINE,
    NOT_EVERY_SEED,
    NOT_SHOWN,
    SAME_MARK,
    TableError,
    ablation_table,
    absent_headline,
    best_methods,
    comparison_matrix,
    floor_record,
    headline_stats,
    headline_table,
    holm,
    leaderboard,
    margins,
    matrix_metrics,
    paired_comparison,
    paired_test,
    read_paper_results,
    record_verdict,
    reproduced_vs_reported,
    resolution_note,
    run_floors,
    seed_list,
    stale_methods,
    summarise,
    welch_margin,
)
from sslbench.report.tables import ReportInputError, leaderboard_display, leaderboard_text, read_floor_record

T975 = {2: 4.302652729911275, 4: 2.7764451051977987}  # Student t 0.975 quantiles (tables)


def long_table(
    values: dict, dataset="digits", protocol="knn", metric="top1_k200_t0.1", target=None
) -> pd.DataFrame:
    """{method: [value per seed]} as table.csv rows, pretrained on ``dataset`` and evaluated on
    ``target`` (default: the same dataset)."""
    return pd.DataFrame(
        [
            {
                "pretrain_dataset": dataset,
                "eval_dataset": target or dataset,
                "method": m,
                "seed": s,
                "protocol": protocol,
                "metric": metric,
                "value": v,
            }
            for m, vs in values.items()
            for s, v in enumerate(vs)
        ]
    )


# --------------------------------------------------------------------------- summarise
def test_a_value_the_same_on_every_seed_has_std_zero_and_no_plus_minus():
    """0.1 + 0.2 and 0.3 differ by round-off only: the same value, std exactly 0, shown with the mark."""
    summary = summarise(long_table({"pixels": [0.1 + 0.2, 0.3, 0.3], "a": [0.3, 0.3, 0.3 + 1e-9]}))
    row = summary.set_index("method").loc["pixels"]
    assert row["std"] == 0 and row["ci95"] == 0 and row["n"] == 3
    assert summary.set_index("method").loc["a", "std"] > 0  # a billionth apart is a spread
    cells = headline_table(summary)
    assert cells.loc["pixels", HEADLINE[0][0]] == f"30.00 {SAME_MARK}"
    assert "±" in cells.loc["a", HEADLINE[0][0]]


def test_summary_by_hand():
    summary = summarise(long_table({"a": [0.1, 0.2, 0.4], "b": [0.5]})).set_index("method")
    a = summary.loc["a"]
    assert math.isclose(a["mean"], 0.7 / 3)
    assert math.isclose(a["std"], math.sqrt(0.14 / 6))  # squared deviations sum to 0.14/3, over n-1 = 2
    assert math.isclose(a["ci95"], T975[2] * math.sqrt(0.14 / 6) / math.sqrt(3))
    assert a["n"] == 3
    b = summary.loc["b"]  # one seed: no spread, and none is invented
    assert b["mean"] == 0.5 and b["n"] == 1 and math.isnan(b["std"]) and math.isnan(b["ci95"])
    # a CSV shows the missing std and ci95 as empty cells, never "nan"
    assert "digits,digits,b,knn,top1_k200_t0.1,0.5,,,1" in summarise(long_table({"b": [0.5]})).to_csv(
        index=False
    )


def test_summary_groups_on_random_tables():
    rng = np.random.default_rng(0)
    table = pd.concat(
        [
            long_table({m: rng.random(rng.integers(1, 6)) for m in "abc"}, protocol=p, metric=k)
            for p, k in [("knn", "top1_k200_t0.1"), ("linear", "top1"), ("linear", "top5")]
        ]
    )
    summary = summarise(table)
    assert len(summary) == 9
    for _, row in summary.iterrows():
        values = table[
            (table["method"] == row["method"])
            & (table["metric"] == row["metric"])
            & (table["protocol"] == row["protocol"])
        ]["value"].to_numpy()
        assert row["n"] == len(values) and math.isclose(row["mean"], values.mean())
        if len(values) > 1:
            assert math.isclose(row["std"], values.std(ddof=1))


def test_ci95_covers_the_true_mean_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    groups, seeds = 2000, 5
    values = rng.normal(0.7, 0.05, size=(groups, seeds))
    table = pd.DataFrame(
        {
            "pretrain_dataset": "d",
            "eval_dataset": "d",
            "method": np.repeat([f"m{i}" for i in range(groups)], seeds),
            "seed": np.tile(np.arange(seeds), groups),
            "protocol": "knn",
            "metric": "top1",
            "value": values.ravel(),
        }
    )
    summary = summarise(table)
    assert np.allclose(summary["ci95"], T975[4] * summary["std"] / math.sqrt(seeds))
    covered = (summary["mean"] - 0.7).abs() <= summary["ci95"]
    assert 0.93 <= covered.mean() <= 0.97


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.drop(columns="seed"), "missing column"),
        (lambda t: t.assign(value=[0.1, float("nan"), 0.2]), "non-finite"),
        (lambda t: t.assign(value=["0.1", "x", "0.2"]), "non-numeric"),
        (lambda t: t.assign(seed=[0, 0, 1]), "two rows"),
    ],
)
def test_bad_tables_are_named(change, message):
    table = long_table({"a": [0.1, 0.3, 0.2]})
    with pytest.raises(TableError, match=message):
        summarise(change(table))


# --------------------------------------------------------------------------- paired comparisons
def test_consistent_difference_is_detected_even_below_the_seed_spread():
    # seeds move both methods together by ±0.1; a beats b by 0.01 on every seed: pairing exposes it
    seed_effect = np.array([0.1, -0.08, 0.05, -0.12, 0.02])
    jitter = np.array([0.001, -0.001, 0.0005, 0.0, -0.0005])
    table = long_table({"a": 0.6 + seed_effect + 0.01 + jitter, "b": 0.6 + seed_effect})
    row = paired_comparison(table, "knn", "top1_k200_t0.1").iloc[0]
    assert (row["method_a"], row["method_b"], row["n"]) == ("a", "b", 5)
    assert math.isclose(row["mean_diff"], 0.01) and row["p_value"] < 1e-4 and row["verdict"] == "a > b"
    flipped = paired_comparison(
        long_table({"a": 0.6 + seed_effect, "b": 0.61 + seed_effect + jitter}), "knn", "top1_k200_t0.1"
    ).iloc[0]
    assert flipped["verdict"] == "b > a"


def test_difference_smaller_than_the_noise_is_within_noise_and_p_is_the_paired_t():
    diffs = np.array([0.03, -0.03, 0.02, -0.025, 0.01])
    b = np.array([0.5, 0.52, 0.49, 0.51, 0.5])
    row = paired_comparison(long_table({"a": b + diffs, "b": b}), "knn", "top1_k200_t0.1").iloc[0]
    t = diffs.mean() / (diffs.std(ddof=1) / math.sqrt(5))
    # Student t with 4 degrees of freedom has a closed-form CDF
    cdf = 0.5 + 3 / 8 * t / math.sqrt(1 + t * t / 4) * (1 - t * t / (12 * (1 + t * t / 4)))
    assert math.isclose(row["mean_diff"], diffs.mean(), abs_tol=1e-12)
    assert math.isclose(row["p_value"], 2 * (1 - cdf), rel_tol=1e-9)
    assert row["verdict"] == "within noise"


def test_every_pair_once_on_shared_seeds_only():
    table = long_table({"c": [0.1, 0.2, 0.3], "a": [0.2, 0.3, 0.4], "b": [0.5]})
    out = paired_comparison(table, "knn", "top1_k200_t0.1")
    assert list(zip(out["method_a"], out["method_b"])) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert list(out["n"]) == [1, 3, 1]
    assert list(out["verdict"]) == ["untested (n < 2)", "a > c (exact)", "untested (n < 2)"]
    assert math.isnan(out.loc[0, "p_value"]) and math.isnan(out.loc[0, "ci_low"])


def test_a_difference_the_same_on_every_seed_is_exact_not_p_zero():
    """sd 0: no t-test (p and its adjustment NaN, outside the family), the interval the point itself,
    and the verdict says exact; identical values are a tie."""
    # a − c is 0.1 up to round-off on every seed (0.3 − 0.2 is 0.09999999999999998)
    table = long_table({"a": [0.2, 0.3, 0.4], "c": [0.1, 0.2, 0.3], "d": [0.5, 0.1, 0.2]})
    out = paired_comparison(table, "knn", "top1_k200_t0.1").set_index(["method_a", "method_b"])
    exact = out.loc[("a", "c")]
    assert math.isnan(exact["p_value"]) and math.isnan(exact["p_adjusted"])
    assert exact["verdict"] == "a > c (exact)"
    assert math.isclose(exact["mean_diff"], 0.1) and exact["ci_low"] == exact["ci_high"] == exact["mean_diff"]
    assert set(out["family_size"]) == {2}  # a − d and c − d are tested; a − c is not
    same = paired_comparison(long_table({"a": [0.2, 0.3], "b": [0.2, 0.3]}), "knn", "top1_k200_t0.1")
    assert same.loc[0, "mean_diff"] == 0 and math.isnan(same.loc[0, "p_value"])
    assert same.loc[0, "verdict"] == "tie (equal on every seed)"


def test_a_mean_difference_within_roundoff_is_a_tie():
    """0.3 − (0.1 + 0.2) is −5.6e-17: with ±0.1 on the other seeds the mean is round-off, exactly 0,
    while the differences still vary, so the test runs (t ≈ 0, p ≈ 1)."""
    a, b = np.array([0.3, 0.5, 0.7]), np.array([0.1 + 0.2, 0.6, 0.6])
    assert (a - b).mean() != 0
    test = paired_test(a, b)
    assert test["mean_diff"] == 0.0 and test["p_value"] > 0.99
    assert math.isclose(test["ci_high"], -test["ci_low"])
    assert paired_test(a + 1e-9, b)["mean_diff"] > 0  # a billionth is a difference, not round-off


def test_holm_by_hand():
    """Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 is 0.02, 0.03, 0.06, 0.04; the running maximum
    makes the last 0.06. NaN is no test: m counts the others."""
    assert np.allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    adjusted = holm([0.3, np.nan, 0.9])
    assert np.isnan(adjusted[1]) and np.allclose(adjusted[[0, 2]], [0.6, 0.9])
    assert list(holm([0.7, 0.8])) == [1.0, 1.0]  # 1.4 capped at 1
    p = np.random.default_rng(2).random(50) ** 3
    adjusted = holm(p)
    order = np.argsort(p)
    assert (adjusted >= p).all() and (adjusted <= 1).all() and (np.diff(adjusted[order]) >= 0).all()


def p_two_dof(t: float) -> float:
    """Two-sided p of Student t with 2 degrees of freedom: its CDF is 1/2 + t / (2 √(2 + t²))."""
    return 1 - abs(t) / math.sqrt(2 + t * t)


def test_verdicts_use_holm_within_each_dataset_pair():
    """Three methods on three seeds, the differences in % points: a − b = 9, 10, 11 (t = 10√3),
    a − c = 5, 7, 9 (t = 3.5√3), b − c = −4, −3, −2 (|t| = 3√3). Raw p 0.0033, 0.026, 0.035 all
    under 0.05; Holm multiplies them by 3, 2, 1 (running maximum): 0.0099, 0.052, 0.052, so only
    a > b stands. The same numbers on a second target form their own family of three."""
    b = np.array([0.5, 0.6, 0.7])
    values = {"a": b + [0.09, 0.10, 0.11], "b": b, "c": b + [0.04, 0.03, 0.02]}
    table = pd.concat([long_table(values), long_table(values, target="fashion_mnist")])
    out = paired_comparison(table, "knn", "top1_k200_t0.1")
    raw = [p_two_dof(10 * math.sqrt(3)), p_two_dof(3.5 * math.sqrt(3)), p_two_dof(3 * math.sqrt(3))]
    adjusted = [3 * raw[0], 2 * raw[1], max(2 * raw[1], raw[2])]
    for _, family in out.groupby("eval_dataset"):
        assert np.allclose(family["p_value"], raw, rtol=1e-9) and max(raw) < 0.05
        assert np.allclose(family["p_adjusted"], adjusted, rtol=1e-9) and set(family["family_size"]) == {3}
        assert list(family["verdict"]) == ["a > b", "within noise", "within noise"]


def test_paired_interval_and_p_by_hand_and_as_scipy_computes_them():
    """a − b = 1, 2, 3 % points: mean 2, sd 1, so 2 ± t(0.975, 2)·1/√3, and t = 2√3."""
    test = paired_test(np.array([0.51, 0.62, 0.73]), np.array([0.5, 0.6, 0.7]))
    half = T975[2] * 0.01 / math.sqrt(3)
    assert math.isclose(test["mean_diff"], 0.02) and math.isclose(test["ci_low"], 0.02 - half)
    assert math.isclose(test["ci_high"], 0.02 + half)
    assert math.isclose(test["p_value"], p_two_dof(2 * math.sqrt(3)), rel_tol=1e-9)
    rng = np.random.default_rng(4)
    for n in (2, 3, 5):
        a, b = rng.random(n), rng.random(n)
        assert math.isclose(paired_test(a, b)["p_value"], scipy_stats.ttest_rel(a, b).pvalue, rel_tol=1e-9)


def test_resolution_note_gives_the_effect_holm_needs():
    """n = 3, m = 153: Holm's first step needs p < 0.05/153. Two degrees of freedom invert by hand
    (c = 1 − 0.05/153, t = c √(2 / (1 − c²)) ≈ 55.3), so the mean difference must exceed t/√3 ≈ 31.9
    times its sd; differences of exactly that size give exactly that p."""
    c = 1 - 0.05 / 153
    t = c * math.sqrt(2 / (1 - c * c))
    text = resolution_note(3, 153)
    assert "3 seeds and 153 paired tests" in text and "p < 0.05/153 = 0.00033" in text
    assert (f"{t:.3g}", f"{t / math.sqrt(3):.3g}") == ("55.3", "31.9")
    assert "exceeds 31.9 times" in text and "|t| > 55.3, 2 degrees of freedom" in text
    ratio = t / math.sqrt(3)
    sd = 0.001
    diff = ratio * sd + sd * np.array([-1.0, 0.0, 1.0])  # mean ratio·sd, sd exactly sd
    assert math.isclose(paired_test(0.5 + diff, np.full(3, 0.5))["p_value"], 0.05 / 153, rel_tol=1e-6)
    assert "the next" not in resolution_note(3, 1) and "1 paired test in" in resolution_note(3, 1)
    assert "No paired t-test" in resolution_note(3, 0)


def test_comparison_matrix_mirrors_each_pair():
    """Row − column: a − b on one side, b − a on the other, the same p and n; the diagonal and methods
    sharing no seed stay empty."""
    table = pd.concat(
        [
            long_table({"a": [0.3, 0.4, 0.5], "b": [0.1, 0.25, 0.3], "c": [0.9]}),
            long_table({"a": [0.1, 0.1]}, target="fashion_mnist"),  # another pair: not mixed in
        ]
    )
    comparisons = paired_comparison(table, "knn", "top1_k200_t0.1")
    m = comparison_matrix(comparisons, ("digits", "digits"), "knn", "top1_k200_t0.1")
    assert list(m["diff"].index) == list(m["diff"].columns) == ["a", "b", "c"]
    assert math.isclose(m["diff"].loc["a", "b"], 0.55 / 3) and math.isclose(
        m["diff"].loc["b", "a"], -0.55 / 3
    )
    assert m["p"].loc["a", "b"] == m["p"].loc["b", "a"] == comparisons.loc[0, "p_value"]
    assert m["n"].loc["b", "a"] == 3 and m["n"].loc["a", "c"] == 1
    assert math.isclose(m["diff"].loc["c", "a"], 0.6) and np.isnan(np.diag(m["diff"].to_numpy())).all()


def test_stale_methods_per_pair():
    table = long_table({"a": [0.1, 0.2], "b": [0.3, 0.4]}).assign(stale=[False, True, False, False])
    transfer = long_table({"b": [0.2]}, target="fashion_mnist").assign(stale=[True])
    table = pd.concat([table, transfer])
    assert stale_methods(table, ("digits", "digits")) == {"a"}
    assert stale_methods(table, ("digits", "fashion_mnist")) == {"b"}
    assert stale_methods(table.drop(columns="stale"), ("digits", "digits")) == set()  # an older table


def test_matrix_metrics_need_two_targets():
    own = long_table({"a": [0.1]})
    knn_both = pd.concat([own, long_table({"a": [0.2]}, target="fashion_mnist")])
    linear_own = long_table({"a": [0.3]}, protocol="linear", metric="top1")
    summary = summarise(pd.concat([knn_both, linear_own]))
    assert matrix_metrics(summary, "digits") == [HEADLINE[0]]
    linear_both = long_table({"a": [0.3]}, protocol="linear", metric="top1", target="fashion_mnist")
    summary = summarise(pd.concat([knn_both, linear_own, linear_both]))
    assert matrix_metrics(summary, "digits") == HEADLINE[:2] and matrix_metrics(summary, "cifar10") == []


def test_ablation_table_joins_points_to_their_summary_in_axis_order():
    table = pd.concat(
        [
            long_table({"m": [0.5, 0.6], "m[k=1]": [0.1, 0.2], "m[k=10]": [0.3, 0.3], "other": [0.9, 0.9]}),
            long_table({"m": [0.7, 0.7]}, protocol="clustering", metric="ami"),  # not an ablation metric
        ]
    )
    points = pd.DataFrame(
        {
            "setting": ["k"] * 3,
            "method": ["m[k=10]", "m", "m[k=1]"],
            "method_base": ["m"] * 3,
            "value": ["10", "4", "1"],
            "order": [10.0, 4.0, 1.0],
        }
    )
    out = ablation_table(summarise(table), points)
    assert list(out["value"]) == ["1", "4", "10"] and set(out["metric"]) == {"top1_k200_t0.1"}
    assert list(out["mean"].round(6)) == [0.15, 0.55, 0.3] and list(out["n"]) == [2, 2, 2]


# --------------------------------------------------------------------------- floors and margins
RESNET, VIT = "resnet18", "vit_tiny_patch16_224"
FLOOR = [0.50, 0.55, 0.45, 0.52, 0.48]  # mean 0.50, squared deviations summing to 0.0058


def backbone_table(runs: dict, dataset="digits", target=None, metric="top1_k200_t0.1") -> pd.DataFrame:
    """{label: (method_base, backbone, [value per seed])} as table.csv rows with the backbone columns;
    a "resnet" backbone has the small stem, as the suite's default does."""
    return pd.concat(
        long_table({label: values}, dataset=dataset, target=target, metric=metric).assign(
            method_base=base,
            backbone=backbone,
            small_stem=backbone.startswith("resnet"),
            backbone_args="{}",
            features="pooled",
        )
        for label, (base, backbone, values) in runs.items()
    )


def test_each_run_is_measured_against_the_floor_of_its_own_backbone():
    """A ResNet floor and a ViT floor on digits, another ResNet floor on cifar10: each learned method
    (and supervised) gets the untrained run of its own backbone on its own pretraining set; a method on
    a backbone without one (a ViT-S, a ResNet without the small stem) has none, and no margin; the
    floors, supervised and pixels are references."""
    vit_floor = [0.30, 0.31, 0.29, 0.30]
    runs = {
        "random": ("random", RESNET, FLOOR),
        f"random[{VIT}]": ("random", VIT, vit_floor),
        "simclr": ("simclr", RESNET, [0.60, 0.62, 0.64]),
        "deepcluster": ("deepcluster", RESNET, [0.55, 0.56, 0.57]),  # its Sobel filter is its method's
        "mae": ("mae", VIT, [0.35, 0.36, 0.34]),
        "dino[vit_s16]": ("dino", "vit_small_patch16_224", [0.40, 0.41, 0.42]),
        "supervised": ("supervised", RESNET, [0.90, 0.91, 0.92]),
        "pixels": ("pixels", "pixels", [0.40, 0.40, 0.40]),
    }
    other = {"random": ("random", RESNET, [0.2, 0.25]), "simclr": ("simclr", RESNET, [0.3, 0.35])}
    table = pd.concat(
        [
            backbone_table(runs),
            backbone_table({"big": ("big", RESNET, [0.7, 0.8])}).assign(small_stem=False),
            backbone_table(other, dataset="cifar10"),
        ]
    )
    floors = run_floors(table).set_index(["pretrain_dataset", "method"])
    digits = floors.loc["digits"]
    assert dict(digits["floor"]) == {
        "big": "",
        "deepcluster": "random",
        "dino[vit_s16]": "",
        "mae": f"random[{VIT}]",
        "pixels": "",
        "random": "",
        f"random[{VIT}]": "",
        "simclr": "random",
        "supervised": "random",
    }
    assert dict(digits["role"]) == {
        "big": "learned",
        "deepcluster": "learned",
        "dino[vit_s16]": "learned",
        "mae": "learned",
        "pixels": "reference",
        "random": "floor",
        f"random[{VIT}]": "floor",
        "simclr": "learned",
        "supervised": "reference",
    }
    assert digits.loc["dino[vit_s16]", "no_floor"] == "no random run on its backbone vit_small_patch16_224"
    assert digits.loc["big", "no_floor"] == "no random run on its backbone resnet18"  # no small stem
    assert digits.loc["random", "backbone"] == "resnet18 (small stem)"
    assert floors.loc[("cifar10", "simclr"), "floor"] == "random"

    out = margins(table).set_index(["pretrain_dataset", "method"])
    assert set(out.loc["digits"].index) == {
        "big",
        "deepcluster",
        "dino[vit_s16]",
        "mae",
        "simclr",
        "supervised",
    }
    mae, simclr = out.loc[("digits", "mae")], out.loc[("digits", "simclr")]
    assert (mae["floor"], mae["floor_n"]) == (f"random[{VIT}]", 4) and math.isclose(mae["floor_mean"], 0.30)
    assert math.isclose(mae["margin"], 0.05) and mae["verdict"] == "above its floor"
    assert (simclr["floor"], simclr["floor_n"]) == ("random", 5) and math.isclose(simclr["margin"], 0.12)
    cifar = out.loc[("cifar10", "simclr")]  # cifar10's own floor, not digits'
    assert math.isclose(cifar["floor_mean"], 0.225) and math.isclose(cifar["margin"], 0.1)
    for method in ("dino[vit_s16]", "big"):
        row = out.loc[("digits", method)]
        assert row["verdict"] == "no floor" and row["floor"] == "" and row["floor_n"] == 0
        assert all(math.isnan(row[k]) for k in ("floor_mean", "margin", "ci_low", "p_value", "p_adjusted"))
    assert out.loc[("digits", "supervised"), "role"] == "reference"
    assert set(out.loc["digits", "family_size"]) == {3, 1}  # simclr, deepcluster, mae; supervised alone


def test_a_floor_not_evaluated_on_a_target_gives_no_margin_there():
    table = pd.concat(
        [
            backbone_table({"random": ("random", RESNET, FLOOR), "a": ("a", RESNET, [0.60, 0.62, 0.64])}),
            backbone_table({"a": ("a", RESNET, [0.3, 0.4])}, target="fashion_mnist"),
        ]
    )
    out = margins(table).set_index("eval_dataset")
    assert out.loc["digits", "verdict"] == "above its floor"
    assert out.loc["fashion_mnist", "verdict"] == "floor not evaluated"
    assert out.loc["fashion_mnist", "floor"] == "random" and math.isnan(out.loc["fashion_mnist", "margin"])


def test_margin_interval_and_p_by_hand_and_as_scipy_computes_them():
    """Method 0.60, 0.62, 0.64 (mean 0.62, s² = 0.0004) against its floor FLOOR (mean 0.50, s² =
    0.0058/4 = 0.00145), in units of 1e-4: s²/n = 4/3 and 2.9, se² = 12.7/3, Welch–Satterthwaite
    df = (12.7/3)² / ((4/3)²/2 + 2.9²/4) = 5.9909; margin 0.12 ± t(0.975, df)·se; one-sided p of
    t = 0.12/se."""
    out = welch_margin(np.array([0.60, 0.62, 0.64]), np.array(FLOOR))
    se = math.sqrt(12.7 / 3) * 1e-2
    df = (12.7 / 3) ** 2 / ((4 / 3) ** 2 / 2 + 2.9**2 / 4)
    assert round(df, 4) == 5.9909 and math.isclose(out["df"], df, rel_tol=1e-12)
    assert (out["n"], out["floor_n"]) == (3, 5) and math.isclose(out["margin"], 0.12)
    assert math.isclose(out["mean"], 0.62) and math.isclose(out["floor_mean"], 0.50)
    assert math.isclose(out["std"], 0.02) and math.isclose(out["floor_std"], math.sqrt(0.00145))
    half = scipy_stats.t.ppf(0.975, df) * se
    assert math.isclose(out["ci_low"], 0.12 - half) and math.isclose(out["ci_high"], 0.12 + half)
    assert round(out["ci_low"], 4) == 0.0696 and round(out["ci_high"], 4) == 0.1704
    assert math.isclose(out["p_value"], scipy_stats.t.sf(0.12 / se, df), rel_tol=1e-9)
    welch = scipy_stats.ttest_ind([0.60, 0.62, 0.64], FLOOR, equal_var=False, alternative="greater")
    assert math.isclose(out["p_value"], welch.pvalue, rel_tol=1e-9) and math.isclose(out["df"], welch.df)
    rng = np.random.default_rng(5)
    for n, floor_n in ((2, 2), (3, 30), (10, 4)):
        a, b = rng.normal(0.6, 0.05, n), rng.normal(0.55, 0.01, floor_n)
        expected = scipy_stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
        assert math.isclose(welch_margin(a, b)["p_value"], expected, rel_tol=1e-9)


def test_margins_are_holm_adjusted_within_the_learned_methods_of_each_family():
    """Four learned methods on one floor, one-sided Welch p 0.00056, 0.0041, 0.028, 0.22 (scipy):
    Holm multiplies them by 4, 3, 2, 1 with a running maximum, so c's 0.028 becomes 0.056 and is not
    resolved. supervised is a family of its own (its p unadjusted), and a second target is another
    family."""
    methods = {
        "a": [0.60, 0.62, 0.64],
        "b": [0.56, 0.60, 0.58],
        "c": [0.53, 0.58, 0.55],
        "d": [0.52, 0.49, 0.55],
    }
    runs = {"random": ("random", RESNET, FLOOR), "supervised": ("supervised", RESNET, [0.9, 0.95])}
    runs |= {m: (m, RESNET, v) for m, v in methods.items()}
    table = pd.concat([backbone_table(runs), backbone_table(runs, target="fashion_mnist")])
    raw = [
        scipy_stats.ttest_ind(v, FLOOR, equal_var=False, alternative="greater").pvalue
        for v in methods.values()
    ]
    assert [round(p, 4) for p in raw] == [0.0006, 0.0041, 0.0280, 0.2230]
    adjusted = [4 * raw[0], 3 * raw[1], 2 * raw[2], max(2 * raw[2], raw[3])]
    out = margins(table)
    for _, family in out.groupby("eval_dataset"):
        learned = family[family["role"] == "learned"].set_index("method")
        assert list(learned.index) == list(methods)
        assert np.allclose(learned["p_value"], raw, rtol=1e-9)
        assert np.allclose(learned["p_adjusted"], adjusted, rtol=1e-9) and set(learned["family_size"]) == {4}
        assert list(learned["verdict"]) == [
            "above its floor",
            "above its floor",
            "not resolved",
            "not resolved",
        ]
        supervised = family[family["role"] == "reference"].iloc[0]
        assert supervised["p_adjusted"] == supervised["p_value"] and supervised["family_size"] == 1


def test_margin_verdicts_below_one_seed_and_the_same_on_every_seed():
    """Below its floor's mean: "below its floor mean", with its p (above 0.5 for "method > floor").
    One seed on either side: "n < 2", the margin but no interval or test. A floor the same on every
    seed adds no spread (df = n − 1); both the same on every seed: exact,
    no test, outside the family."""
    runs = {
        "random": ("random", RESNET, [0.5, 0.5, 0.5]),
        "low": ("low", RESNET, [0.45, 0.47, 0.46]),
        "one": ("one", RESNET, [0.9]),
        "up": ("up", RESNET, [0.6, 0.62, 0.64]),
        "flat": ("flat", RESNET, [0.1 + 0.2 + 0.3, 0.6, 0.6]),  # the same up to round-off
        "even": ("even", RESNET, [0.5, 0.5, 0.5]),
        f"random[{VIT}]": ("random", VIT, [0.3]),
        "mae": ("mae", VIT, [0.4, 0.5]),
    }
    out = margins(backbone_table(runs)).set_index("method")
    low = out.loc["low"]
    assert low["verdict"] == "below its floor mean" and low["p_value"] > 0.5 and low["margin"] < 0
    for method in ("one", "mae"):
        row = out.loc[method]
        assert row["verdict"] == "n < 2" and math.isfinite(row["margin"])
        assert math.isnan(row["ci_low"]) and math.isnan(row["p_value"])
    up = out.loc["up"]  # se = 0.02/√3 from its own spread alone, df = 3 − 1
    assert up["df"] == 2 and math.isclose(up["p_value"], scipy_stats.t.sf(0.12 / (0.02 / math.sqrt(3)), 2))
    flat, even = out.loc["flat"], out.loc["even"]
    assert flat["verdict"] == "above its floor (exact)" and math.isnan(flat["p_value"])
    assert flat["ci_low"] == flat["ci_high"] == flat["margin"] and math.isclose(flat["margin"], 0.1)
    assert even["verdict"] == "tie (equal on every seed)" and even["margin"] == 0
    assert set(out.loc[["low", "up"], "family_size"]) == {2}  # flat and even are not tested


def test_leaderboard_ranks_learned_methods_by_mean_and_lists_the_references_after():
    """mae's margin over its ViT floor (+5) beats byol's over the ResNet floor (+1.3), but byol's mean
    is higher: the rank is by mean. Marks from known inputs: simclr and mae above their floors, byol
    not resolved, moco below; dino has no floor; the floors, supervised and pixels follow, unranked."""
    runs = {
        "random": ("random", RESNET, FLOOR),
        f"random[{VIT}]": ("random", VIT, [0.30, 0.31, 0.29, 0.30]),
        "simclr": ("simclr", RESNET, [0.60, 0.62, 0.64]),
        "byol": ("byol", RESNET, [0.50, 0.55, 0.49]),
        "moco": ("moco", RESNET, [0.45, 0.42, 0.47]),
        "mae": ("mae", VIT, [0.35, 0.36, 0.34]),
        "dino[vit_s16]": ("dino", "vit_small_patch16_224", [0.40, 0.41, 0.42]),
        "supervised": ("supervised", RESNET, [0.90, 0.91, 0.92]),
        "pixels": ("pixels", "pixels", [0.40, 0.40, 0.40]),
    }
    linear = backbone_table({"simclr": ("simclr", RESNET, [0.99, 0.98])}, metric="top1").assign(
        protocol="linear"
    )
    table = pd.concat([backbone_table(runs), linear])
    board = leaderboard(summarise(table), margins(table), run_floors(table), ("digits", "digits"))
    assert board.label == HEADLINE[0][0]  # kNN: the first headline metric, though simclr has linear too
    rows = board.rows.set_index("method")
    assert list(rows.index) == [
        "simclr",
        "byol",
        "moco",
        "dino[vit_s16]",
        "mae",
        "random",
        f"random[{VIT}]",
        "supervised",
        "pixels",
    ]
    assert list(rows["rank"].iloc[:5]) == [1, 2, 3, 4, 5] and rows["rank"].iloc[5:].isna().all()
    assert list(rows["role"].iloc[5:]) == ["floor", "floor", "reference", "reference"]
    assert dict(rows["verdict"].iloc[:5]) == {
        "simclr": "above its floor",
        "byol": "not resolved",
        "moco": "below its floor mean",
        "dino[vit_s16]": "no floor",
        "mae": "above its floor",
    }
    assert rows.loc["mae", "floor"] == f"random[{VIT}]" and rows.loc["byol", "floor"] == "random"
    assert rows.loc["supervised", "verdict"] == "above its floor" and rows.loc["pixels", "verdict"] == ""
    assert math.isclose(rows.loc["simclr", "margin"], 0.12) and math.isclose(rows.loc["random", "mean"], 0.5)
    assert leaderboard(summarise(table), margins(table), run_floors(table), ("digits", "x")) is None


# --------------------------------------------------------------------------- the record on many seeds
def test_record_verdict_on_the_bar_by_hand():
    """The bar: a mean margin of at least 5 points with the interval's lower end at least 2; on every
    seed when none falls under the floor's mean."""
    assert record_verdict(0.05, 0.02, 0) == BEATS
    assert record_verdict(0.09, 0.03, 2) == NOT_EVERY_SEED
    assert record_verdict(0.049, 0.03, 0) == NOT_SHOWN  # the margin under 5 points
    assert record_verdict(0.08, 0.019, 0) == NOT_SHOWN  # the interval's lower end under 2
    assert record_verdict(0.032, 0.004, 5) == NOT_SHOWN
    assert seed_list([3, 0, 1, 2, 7, 9, 8]) == "0-3, 7-9" and seed_list([5]) == "5"


def recorded_table(settings: dict) -> pd.DataFrame:
    """simclr clearly above its floor on every seed, moco above on average with one seed under the
    floor's mean (0.50), byol not beating it; each run's settings digest from ``settings``."""
    runs = {
        "random": ("random", RESNET, FLOOR),
        "simclr": ("simclr", RESNET, [0.60, 0.62, 0.64, 0.61]),
        "moco": ("moco", RESNET, [0.62, 0.64, 0.49, 0.63, 0.65, 0.61]),
        "byol": ("byol", RESNET, [0.52, 0.53, 0.51]),
    }
    table = backbone_table(runs)
    return table.assign(
        run_settings=table["method"].map(settings),
        git_commit="abc",
        cpu_kernels='{"cpu": "AMD EPYC", "level": "avx512"}',
    )


SETTINGS = {"random": "r0", "simclr": "s0", "moco": "m0", "byol": "b0"}


def test_floor_record_by_hand():
    """Each learned method's margin over its floor's mean with the seeds named, its verdict, the
    settings it ran and where: moco's mean 0.6067 - 0.50 = +10.67 points on 6 seeds, one of them (0.49)
    under the floor's mean."""
    record = floor_record(recorded_table(SETTINGS)).set_index("method")
    assert list(record.index) == ["byol", "moco", "simclr"]
    moco = record.loc["moco"]
    assert math.isclose(moco["margin"], np.mean([0.62, 0.64, 0.49, 0.63, 0.65, 0.61]) - 0.50)
    assert moco["seeds"] == "0-5" and moco["n"] == 6 and moco["floor_n"] == 5
    assert moco["seeds_under_floor_mean"] == 1 and moco["verdict"] == NOT_EVERY_SEED
    assert record.loc["simclr", "verdict"] == BEATS and record.loc["byol", "verdict"] == NOT_SHOWN
    assert moco["run_settings"] == "m0" and moco["git_commit"] == "abc" and moco["processor"] == "AMD EPYC"


def test_the_leaderboard_names_the_record_only_for_runs_of_the_recorded_settings(tmp_path):
    """A three-seed run of the recorded settings shows the record's verdict beside its own mark; a run
    of other settings (moco's lr changed, say) is not named by it; the legend says what the record is.
    Written and read back as the CSV benchmarks/margins.py writes."""
    path = tmp_path / "floor_record.csv"
    path.write_text(floor_record(recorded_table(SETTINGS)).to_csv(index=False))
    record = read_floor_record(path)
    short = recorded_table({**SETTINGS, "moco": "m1"})
    short = short[short["seed"] < 3]
    board = leaderboard(summarise(short), margins(short), run_floors(short), ("digits", "digits"))
    assert "record_verdict" in board.rows and board.rows["record_verdict"].isna().all()  # no record given
    text = leaderboard_text(short, record)
    row = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ")}
    assert f"{BEATS}: +11.75 [" in row["simclr"] and "0 of 4 seeds under (seeds 0-3)" in row["simclr"]
    assert f"{NOT_SHOWN}: +2.00 [" in row["byol"]
    assert row["moco"].rstrip(" |").endswith("—")  # other settings than the recorded ones
    assert "On many seeds: what the record measured" in text
    assert "On many seeds" not in leaderboard_text(short)  # no record: no column, no note
    transfer = short.assign(eval_dataset="fashion_mnist")  # a pair the record has nothing of
    assert (
        "On many seeds"
        not in leaderboard_text(pd.concat([short, transfer]), record).split("## Leaderboard")[2]
    )


def test_the_shipped_record_holds_the_settings_the_default_trains():
    """benchmarks/floor_record.csv names each learned method of the default (and each the default leaves
    out, `methods_excluded`, at the default's settings) by the digest of the settings its runs train with
    (collect's `run_settings`): a change to a method's default settings must come with a new measurement,
    or the leaderboard silently shows no record for it."""
    config = load_config(REPO / "config") | {"methods_excluded": []}
    record = read_floor_record(REPO / "benchmarks" / "floor_record.csv").set_index("method")
    plan = plan_runs(config, METHODS_DIR, selected_methods(config, METHODS_DIR), check_files=False)
    planned = {label: code_digest(run) for (dataset, label), run in plan.runs.items() if dataset == "digits"}
    assert set(record.index) <= set(planned)
    stale = {
        m: (record.loc[m, "run_settings"], planned[m])
        for m in record.index
        if record.loc[m, "run_settings"] != planned[m]
    }
    assert not stale, f"measure these again (benchmarks/margins.md): {stale}"


def test_a_record_without_its_columns_is_named(tmp_path):
    path = tmp_path / "floor_record.csv"
    path.write_text("method,margin\nmoco,0.1\n")
    with pytest.raises(ReportInputError, match="floor_record.csv: missing column"):
        read_floor_record(path)
    assert read_floor_record(tmp_path / "absent.csv") is None


# --------------------------------------------------------------------------- headline
def headline_summary():
    rows = []
    for method, offset in (("moco", 0.0), ("pcl", 0.02)):
        for _label, protocol, metric in HEADLINE:
            if method == "moco" and protocol == "semisup":
                continue  # moco lacks semisup: "—"
            seeds = [0] if protocol == "clustering" else [0, 1]
            rows += [
                {
                    "pretrain_dataset": "digits",
                    "eval_dataset": "digits",
                    "method": method,
                    "seed": s,
                    "protocol": protocol,
                    "metric": metric,
                    "value": 0.5 + offset + 0.01 * s,
                }
                for s in seeds
            ]
    return summarise(pd.DataFrame(rows))


def test_headline_table_strings_and_missing_columns():
    out = headline_table(headline_summary())
    assert list(out.columns) == [label for label, _, _ in HEADLINE] and list(out.index) == ["moco", "pcl"]
    std = 100 * np.std([0.52, 0.53], ddof=1)
    assert out.loc["pcl", "linear top-1"] == f"52.50 ± {std:.2f}" == "52.50 ± 0.71"
    assert (
        out.loc["moco", "semi-sup 1% top-1"] == "—" and out.loc["pcl", "semi-sup 1% top-1"] == "52.50 ± 0.71"
    )
    assert out.loc["moco", "AMI"] == "50.00 (n=1)"


def test_headline_table_leaves_out_columns_no_method_has_and_names_them():
    summary = headline_summary()
    assert absent_headline(summary) == []
    knn_linear = summary[summary["protocol"].isin(["knn", "linear"])]
    out = headline_table(knn_linear)
    assert list(out.columns) == ["kNN top-1 (k200_t0.1)", "linear top-1"]
    assert absent_headline(knn_linear) == HEADLINE[2:]
    without_k8 = summary[summary["metric"] != "map_k8_mean"]
    assert absent_headline(without_k8) == [("low-shot mAP k=8", "lowshot_svm", "map_k8_mean")]


def test_best_per_column_ties_at_display_precision():
    means = pd.DataFrame(
        {"x": [0.5, 0.6, 0.6000001], "y": [0.9, np.nan, 0.1], "z": [np.nan] * 3}, index=["a", "b", "c"]
    )
    assert best_methods(means) == {"x": {"b", "c"}, "y": {"a"}, "z": set()}
    assert best_methods(headline_stats(headline_summary())["mean"])["kNN top-1 (k200_t0.1)"] == {"pcl"}


def test_headline_refuses_to_mix_dataset_pairs():
    transfer = headline_summary().assign(eval_dataset="fashion_mnist", mean=lambda s: s["mean"] - 0.3)
    summary = pd.concat([headline_summary(), transfer])
    with pytest.raises(TableError, match=r"several dataset pairs \['digits', 'digits → fashion_mnist'\]"):
        headline_table(summary)
    assert headline_table(summary, pair=("digits", "fashion_mnist")).loc["moco", "AMI"] == "20.00 (n=1)"
    assert headline_table(summary, pair=("digits", "digits")).loc["moco", "AMI"] == "50.00 (n=1)"


def test_a_method_is_summarised_and_compared_within_each_dataset_pair():
    """The same (method, seed, protocol, metric) on two targets and two pretraining sets: four groups,
    and the paired test pairs seeds within a pair only."""
    table = pd.concat(
        [
            long_table({"a": [0.5, 0.6], "b": [0.4, 0.45]}),
            long_table({"a": [0.2, 0.3], "b": [0.3, 0.41]}, target="fashion_mnist"),
            long_table({"a": [0.7, 0.8], "b": [0.1, 0.1]}, dataset="fashion_mnist"),
            long_table({"a": [0.1, 0.1]}, dataset="fashion_mnist", target="digits"),
        ]
    )
    summary = summarise(table).set_index(["pretrain_dataset", "eval_dataset", "method"])["mean"]
    assert math.isclose(summary["digits", "digits", "a"], 0.55)
    assert math.isclose(summary["digits", "fashion_mnist", "a"], 0.25)
    assert math.isclose(summary["fashion_mnist", "fashion_mnist", "a"], 0.75)
    assert len(summary) == 7
    out = paired_comparison(table, "knn", "top1_k200_t0.1").set_index(["pretrain_dataset", "eval_dataset"])
    assert len(out) == 3  # fashion_mnist -> digits has one method: no pair
    assert math.isclose(out.loc[("digits", "fashion_mnist"), "mean_diff"], -0.105)
    assert math.isclose(out.loc[("digits", "digits"), "mean_diff"], 0.125)


# --------------------------------------------------------------------------- reproduced vs reported
@pytest.fixture
def dirs(tmp_path):
    methods, config = tmp_path / "methods", tmp_path / "config"
    (methods / "moco").mkdir(parents=True)
    (methods / "moco" / "config.yaml").write_text(yaml.safe_dump({"train": {"epochs": 200}}))
    entries = [
        ("digits", "digits", "test_resnet", 200, "linear", 0.8),
        ("cifar10", "cifar10", "resnet18", 200, "linear", 0.9),
        ("cifar10", "cifar10", "resnet18", 800, "linear", 0.92),
        ("stl10", "stl10", "resnet50", 100, "linear", 0.7),
        ("cifar10", "voc07", "resnet18", 200, "lowshot_svm", 0.5),
        ("cifar10", "voc07", "resnet18", 200, "linear", 0.6),  # the preset runs only lowshot_svm on voc07
    ]
    (methods / "moco" / "paper.yaml").write_text(
        yaml.safe_dump(
            {
                "results": [
                    {
                        "pretrain_dataset": d,
                        "eval_dataset": t,
                        "backbone": b,
                        "epochs": e,
                        "protocol": p,
                        "metric": "top1",
                        "value": v,
                        "source": f"Table {i}",
                    }
                    for i, (d, t, b, e, p, v) in enumerate(entries)
                ]
            }
        )
    )
    config.mkdir()
    shutil.copy(REPO / "config" / "default.yaml", config / "default.yaml")
    shutil.copy(REPO / "config" / "schema.yaml", config / "schema.yaml")
    (config / "cifar10.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": {"cifar10": {"name": "cifar10"}, "voc07": {"name": "voc07", "optional": True}},
                "pretrain": ["cifar10"],
                "evaluation": {"targets": ["pretrain"], "lowshot_svm": {"targets": ["pretrain", "voc07"]}},
                "backbone": {"name": "resnet18"},
            }
        )
    )
    return methods, config


def test_reproduced_vs_reported(dirs):
    methods, config = dirs
    table = long_table({"moco": [0.7, 0.74]}, protocol="linear", metric="top1").assign(
        backbone="test_resnet", epochs=200
    )
    other_epochs = long_table({"moco": [0.1]}, dataset="stl10", protocol="linear", metric="top1").assign(
        backbone="resnet50", epochs=5
    )  # not the paper's 100 epochs: not comparable
    out = reproduced_vs_reported(pd.concat([table, other_epochs]), methods, config)
    assert list(out["source"]) == [f"Table {i}" for i in range(6)]
    digits = out.iloc[0]
    assert math.isclose(digits["ours"], 0.72) and math.isclose(digits["gap"], 0.72 - 0.8) and digits["n"] == 2
    assert math.isclose(digits["std"], np.std([0.7, 0.74], ddof=1)) and digits["reproduce"] == ""
    # the method's own config.yaml sets 200 epochs, so config/cifar10.yaml reproduces the 200-epoch number
    assert out.iloc[1]["reproduce"] == "run with --configfile config/cifar10.yaml (cifar10, linear)"
    assert out.iloc[1]["n"] == 0
    assert out.iloc[2]["reproduce"] == (
        "closest preset config/cifar10.yaml (cifar10, linear) trains 200 epochs (paper: 800); "
        "set train.epochs: 800"
    )
    assert out.iloc[3]["reproduce"].startswith("no preset") and math.isnan(out.iloc[3]["ours"])
    # a transfer number: the preset that pretrains on cifar10 and runs the protocol on voc07
    assert (
        out.iloc[4]["reproduce"] == "run with --configfile config/cifar10.yaml (cifar10 → voc07, lowshot_svm)"
    )
    assert out.iloc[5]["reproduce"] == (
        "no preset: needs pretraining on cifar10 and linear on voc07, backbone resnet18, 200 epochs"
    )


def test_paper_yaml_entry_without_a_key_is_named(dirs):
    methods, config = dirs
    (methods / "moco" / "paper.yaml").write_text(
        yaml.safe_dump({"results": [{"pretrain_dataset": "digits"}]})
    )
    with pytest.raises(ConfigError, match=r"moco/paper.yaml: results\[0\] lacks"):
        reproduced_vs_reported(long_table({"moco": [0.7]}), methods, config)


def test_a_named_variant_with_the_papers_settings_stands_beside_its_number(dirs):
    """A preset's ViT recipe runs as a variant (``moco[vit]``): with the paper's backbone and epochs it is
    ours; beside a second such variant, neither is (which would it be?)."""
    methods, config = dirs
    rows = lambda label, values: long_table({label: values}, protocol="linear", metric="top1").assign(
        method_base="moco", backbone="test_resnet", epochs=200
    )
    variant = rows("moco[vit]", [0.6, 0.64])
    sweep = long_table({"moco[queue_size=16]": [0.1]}, dataset="stl10").assign(method_base="moco")
    out = reproduced_vs_reported(pd.concat([variant, sweep]), methods, config).iloc[0]
    assert math.isclose(out["ours"], 0.62) and out["n"] == 2
    two = reproduced_vs_reported(pd.concat([variant, rows("moco[other]", [0.3])]), methods, config).iloc[0]
    assert two["n"] == 0 and math.isnan(two["ours"])


def test_paper_yaml_of_a_method_without_results_is_not_read(dirs):
    """A broken folder left out of the plan (broken_methods: leave_out) has no rows: its paper.yaml
    cannot stop the report."""
    methods, config = dirs
    (methods / "broken").mkdir()
    (methods / "broken" / "paper.yaml").write_text(yaml.safe_dump({"results": [{"value": 1}]}))
    table = long_table({"moco": [0.7]}, protocol="linear", metric="top1").assign(method_base="moco")
    assert set(reproduced_vs_reported(table, methods, config)["method"]) == {"moco"}


def test_every_paper_yaml_knn_row_names_a_metric_some_preset_computes():
    """A reported kNN number stands beside ours only under the knn protocol's own metric name, which
    carries k and T (top1_k200_t0.1): a bare `top1` would never meet a row of ours."""
    names = [p.stem for p in (REPO / "config").glob("*.yaml") if p.stem != "schema"]
    written = {
        f"{top}_{variant_name(v['k'], v['temperature'])}"
        for name in names
        for v in protocol_settings(preset_config(name), "knn")["variants"]
        for top in ("top1", "top5")
    }
    paper = read_paper_results(METHODS_DIR)
    knn = paper[paper["protocol"] == "knn"]
    assert {"moco", "dino", "instdisc"} <= set(knn["method"])
    assert set(knn["metric"]) <= written, knn[~knn["metric"].isin(written)][["method", "metric"]]


def test_seeds_under_the_floor_mean_are_counted_seed_by_seed_against_the_floor_s_mean():
    """Floor 0.50, 0.60, 0.70 (mean 0.60): of a's 0.55, 0.60, 0.65, 0.90 only 0.55 is under it (0.60 is
    not), though a's mean margin is +0.075."""
    floor = [0.50, 0.60, 0.70]
    seeds = [0.55, 0.60, 0.65, 0.90]
    table = backbone_table({"random": ("random", RESNET, floor), "a": ("a", RESNET, seeds)})
    row = margins(table).set_index("method").loc["a"]
    assert row["seeds_under_floor_mean"] == 1 and math.isclose(row["margin"], 0.075)
    board = leaderboard(summarise(table), margins(table), run_floors(table), ("digits", "digits"))
    shown = leaderboard_display(board)
    assert dict(zip(shown["method"], shown["seeds under its floor's mean"])) == {"a": "1 of 4", "random": "—"}
