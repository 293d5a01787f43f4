"""Statistics over seeds: hand-computed summaries, the paired test's verdicts, the headline table,
and our numbers beside the papers'."""

import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from support import METHODS_DIR, REPO, preset_config

from evaluation.knn import variant_name
from sslbench.errors import ConfigError
from sslbench.plan.protocols import protocol_settings
from sslbench.report.stats import (
    HEADLINE,
    TableError,
    ablation_table,
    best_methods,
    comparison_matrix,
    headline_stats,
    headline_table,
    matrix_metrics,
    paired_comparison,
    read_paper_results,
    reproduced_vs_reported,
    stale_methods,
    summarise,
)

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
    assert list(out["verdict"]) == [
        "untested (n < 2)",
        "a > c",
        "untested (n < 2)",
    ]  # a - c = 0.1 on every seed
    assert out.loc[1, "p_value"] == 0.0 and math.isnan(out.loc[0, "p_value"])
    same = paired_comparison(long_table({"a": [0.2, 0.3], "b": [0.2, 0.3]}), "knn", "top1_k200_t0.1")
    assert same.loc[0, "p_value"] == 1.0 and same.loc[0, "verdict"] == "within noise"


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


def test_headline_table_leaves_out_columns_no_method_has():
    summary = headline_summary()
    out = headline_table(summary[summary["protocol"].isin(["knn", "linear"])])
    assert list(out.columns) == ["kNN top-1 (k200_t0.1)", "linear top-1"]


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
    """A broken folder skipped with --keep-going has no rows: its paper.yaml cannot stop the report."""
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
