"""Low-shot SVM protocol: the sampler, the AP definitions, the OvR reduction, known answers."""

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import LinearSVC
from support import feature_dict

from evaluation import lowshot_svm as ls
from evaluation.common import sample_lowshot, seed_for

FAST = {"ks": [1, 2, 4, 8], "num_draws": 3, "cost_grid": [0.1, 1.0, 10.0]}


def one_hot_problem(seed, num_classes=5, per_class=12, n_test=60, noise=0.02):
    rng = np.random.default_rng(seed)
    ytr, yte = np.repeat(np.arange(num_classes), per_class), rng.integers(0, num_classes, n_test)
    train = np.eye(num_classes)[ytr] + noise * rng.normal(size=(len(ytr), num_classes))
    test = np.eye(num_classes)[yte] + noise * rng.normal(size=(len(yte), num_classes))
    return feature_dict(train, ytr, test, yte, num_classes)


# ---------------------------------------------------------------- sampler
def test_sampler_draws_exactly_k_per_class_reproducibly_and_only_from_the_given_labels():
    labels = np.random.default_rng(0).integers(0, 6, 300)
    draws = sample_lowshot(labels, 4, num_draws=5, seed=11)
    assert len(draws) == 5
    for draw in draws:
        assert len(set(draw.tolist())) == len(draw) == 24  # no repeats
        assert draw.min() >= 0 and draw.max() < len(labels)  # indexes the train split only
        assert np.bincount(labels[draw], minlength=6).tolist() == [4] * 6
    assert len({tuple(d) for d in draws}) == 5  # independent draws differ
    again, other = sample_lowshot(labels, 4, 5, seed=11), sample_lowshot(labels, 4, 5, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(draws, again))
    assert not any(np.array_equal(a, b) for a, b in zip(draws, other))
    with pytest.raises(ValueError, match="smallest class"):
        sample_lowshot(labels, 1000, 1, seed=0)


def test_training_and_cost_choice_never_touch_the_test_split():
    features = one_hot_problem(1, noise=0.6)  # overlapping classes: the chosen cost varies
    rng = np.random.default_rng(0)
    corrupt = features | {
        "test": torch.as_tensor(rng.normal(size=(60, 5)), dtype=torch.float32),
        "test_labels": torch.as_tensor(rng.integers(0, 5, 60)),
    }
    clean_metrics, clean = ls.evaluate(features, FAST, seed=0)
    corrupt_metrics, corrupted = ls.evaluate(corrupt, FAST, seed=0)
    assert corrupted["chosen_costs"] == clean["chosen_costs"]
    assert len({c["cost"] for draws in clean["chosen_costs"].values() for c in draws}) > 1
    assert corrupt_metrics["map_k8_mean"] < clean_metrics["map_k8_mean"]


def test_multilabel_sampler_takes_k_positives_and_c_minus_1_times_k_negatives_never_difficult():
    rng = np.random.default_rng(1)
    targets = rng.choice([ls.POSITIVE, ls.NEGATIVE, ls.DIFFICULT], p=[0.3, 0.6, 0.1], size=(400, 4))
    draws = ls.sample_lowshot_multilabel(targets, 3, num_draws=2, seed=5)
    for draw in draws:
        for c, rows in enumerate(draw):
            assert len(set(rows.tolist())) == len(rows) == 3 + 3 * 3
            assert (targets[rows[:3], c] == ls.POSITIVE).all() and (targets[rows[3:], c] == ls.NEGATIVE).all()
    assert all(
        np.array_equal(a, b) for a, b in zip(draws[0], ls.sample_lowshot_multilabel(targets, 3, 2, 5)[0])
    )


# ---------------------------------------------------------------- AP and the SVMs
def test_average_precision_equals_sklearn_with_and_without_ties():
    rng = np.random.default_rng(2)
    for trial in range(20):
        positive = rng.random(50) < 0.3
        positive[0] = True
        scores = rng.normal(size=50) if trial % 2 else rng.integers(0, 4, 50).astype(float)  # many ties
        assert ls.average_precision(positive, scores) == pytest.approx(
            average_precision_score(positive, scores)
        )


def test_voc_ap_hand_computed():
    # ranking + - - + +: precision 1, .5, .33, .5, .6 at recall 1/3, 1/3, 1/3, 2/3, 1; the
    # interpolated precision at recall 2/3 is max(.5, .6) = .6, so AP = (1 + .6 + .6) / 3
    is_positive, scores = np.array([1, 0, 0, 1, 1]), np.array([5.0, 4, 3, 2, 1])
    assert ls.voc_ap(is_positive, scores) == pytest.approx(2.2 / 3)
    assert ls.average_precision(is_positive, scores) == pytest.approx(2.1 / 3)  # not interpolated
    assert ls.voc_ap(np.array([0, 1, 1, 0]), np.array([0.1, 0.9, 0.8, 0.2])) == 1.0


def test_difficult_samples_are_left_out_of_their_class_ap():
    labels = np.array([[ls.DIFFICULT], [ls.POSITIVE], [ls.NEGATIVE], [ls.DIFFICULT]])
    scores = np.array([[9.0], [5.0], [1.0], [8.0]])  # the difficult ones rank first
    assert ls.class_mean_ap(scores, labels, ap=ls.voc_ap) == 1.0


def test_one_liblinear_call_equals_vissl_per_class_binary_svms():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 20))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y, x_eval = np.repeat(np.arange(4), 15), rng.normal(size=(30, 20))
    for cost in [0.1, 10.0]:
        got = ls.ovr_scores(x, y, x_eval, cost, 2.0, seed=0, counter={"fits": 0, "not_converged": 0})
        binary = [
            LinearSVC(C=cost, class_weight={1: 2, -1: 1}, dual=False, tol=1e-4)
            .fit(x, np.where(y == c, 1, -1))
            .decision_function(x_eval)
            for c in range(4)
        ]
        np.testing.assert_allclose(got, np.stack(binary, 1), atol=1e-6)
    two = ls.ovr_scores(x[:30], y[:30], x_eval, 1.0, 2.0, 0, {"fits": 0, "not_converged": 0})
    assert two.shape == (30, 2)  # two classes still give one SVM per class


# ---------------------------------------------------------------- the protocol
def test_separable_features_give_perfect_map_and_top1_at_every_k():
    metrics, used = ls.evaluate(one_hot_problem(4), FAST, seed=0)
    expected = {
        f"{stat}_k{k}_{agg}"
        for k in FAST["ks"]
        for stat, agg in [("map", "mean"), ("map", "std"), ("map", "min"), ("map", "max"), ("top1", "mean")]
    }
    assert set(metrics) == expected
    for k in FAST["ks"]:
        assert metrics[f"map_k{k}_mean"] == metrics[f"map_k{k}_min"] == 1.0
        assert metrics[f"top1_k{k}_mean"] == 1.0
    assert [c["rule"] for c in used["chosen_costs"]["k1"]] == ["fallback"] * 3
    assert [c["rule"] for c in used["chosen_costs"]["k2"]] == ["cv"] * 3
    assert all(c["cost"] in FAST["cost_grid"] for c in used["chosen_costs"]["k8"])


def test_features_independent_of_labels_give_chance_map():
    # Scores independent of the test labels rank the positives at random. The reference is
    # the mAP of random rankings of the same test labels: its mean and spread come from 300
    # permutations; the protocol's mean over 3 draws must lie within 4 spreads of it.
    rng = np.random.default_rng(5)
    c = 4
    ytr, yte = rng.integers(0, c, 200), rng.integers(0, c, 400)
    features = feature_dict(rng.normal(size=(200, 8)), ytr, rng.normal(size=(400, 8)), yte, c)
    metrics, _ = ls.evaluate(features, {**FAST, "ks": [4, 16]}, seed=0)
    null = [ls.class_mean_ap(rng.normal(size=(400, c)), yte) for _ in range(300)]
    for k in (4, 16):
        assert abs(metrics[f"map_k{k}_mean"] - np.mean(null)) < 4 * np.std(null), metrics
        assert abs(metrics[f"top1_k{k}_mean"] - 1 / c) < 4 * np.sqrt(0.25 * 0.75 / 400)


def test_k_beyond_the_smallest_class_is_skipped_and_same_seed_same_numbers():
    features = one_hot_problem(6, per_class=5)
    settings = {**FAST, "ks": [1, 4, 8], "num_draws": 2}
    metrics, used = ls.evaluate(features, settings, seed=3)
    assert used["ks_run"] == [1, 4] and used["ks_skipped"] == [8]
    assert not any("k8" in name for name in metrics)
    assert ls.evaluate(features, settings, seed=3) == (metrics, used)


def test_multilabel_separable_features_give_perfect_map():
    rng = np.random.default_rng(7)
    c, n = 3, 240
    present = np.eye(c, dtype=bool)[rng.integers(0, c, n)] | (rng.random((n, c)) < 0.15)
    targets = np.where(present, ls.POSITIVE, ls.NEGATIVE)
    targets[rng.random((n, c)) < 0.03] = ls.DIFFICULT
    x = present + 0.02 * rng.normal(size=(n, c))  # one coordinate per class: each class separable
    features = feature_dict(x[:160], targets[:160], x[160:], targets[160:], c)
    metrics, used = ls.evaluate(features, {**FAST, "ks": [2, 4], "num_draws": 2}, seed=0)
    assert metrics["map_k2_mean"] == metrics["map_k4_mean"] == 1.0
    assert not any(name.startswith("top1") for name in metrics) and used["labels"].startswith("multilabel")


def test_settings_errors():
    features = one_hot_problem(8)
    with pytest.raises(ValueError, match=r"'C'.*known settings are \['cost_grid'"):
        ls.evaluate(features, {"C": 1.0}, seed=0)
    with pytest.raises(ValueError, match="no k in"):
        ls.evaluate(features, {**FAST, "ks": [64]}, seed=0)
    swapped = features | {
        "train_labels": torch.zeros(60, 5, dtype=torch.int64),
        "test_labels": torch.zeros(60, 5, dtype=torch.int64),
    }
    with pytest.raises(ValueError, match="difficult"):
        ls.evaluate(swapped, FAST, seed=0)


def test_cost_choice_and_spread_over_draws_recomputed_independently():
    """Each draw's cost redone with VISSL's per-class binary SVMs and sklearn's AP on the same folds
    (stratified, seeded by the draw), then the test mAP of each draw and its spread with numpy."""
    features = one_hot_problem(1, noise=0.6)  # overlapping classes: costs and mAPs vary over draws
    settings = {**FAST, "ks": [2, 4], "num_draws": 4}
    metrics, used = ls.evaluate(features, settings, seed=2)
    train = ls.l2_normalise_like_vissl(features["train"].double().numpy())
    test = ls.l2_normalise_like_vissl(features["test"].double().numpy())
    ytr, yte = features["train_labels"].numpy(), features["test_labels"].numpy()
    grid = FAST["cost_grid"]

    def scores(x_fit, y_fit, x_eval, cost):
        return np.stack(
            [
                LinearSVC(C=cost, class_weight={1: 2.0, -1: 1.0}, dual=False, tol=1e-4, max_iter=2000)
                .fit(x_fit, np.where(y_fit == c, 1, -1))
                .decision_function(x_eval)
                for c in range(5)
            ],
            axis=1,
        )

    def class_mean_ap(s, y):
        return np.mean([average_precision_score(y == c, s[:, c]) for c in range(5) if (y == c).any()])

    costs_seen = set()
    for k in settings["ks"]:
        maps = []
        for d, draw in enumerate(sample_lowshot(ytr, k, settings["num_draws"], seed=2)):
            folds = StratifiedKFold(
                n_splits=min(3, k), shuffle=True, random_state=seed_for(seed_for(2, k, d), 0)
            )
            cv = np.zeros(len(grid))
            for fit, val in folds.split(draw, ytr[draw]):
                for i, cost in enumerate(grid):
                    s = scores(train[draw[fit]], ytr[draw[fit]], train[draw[val]], cost)
                    cv[i] += class_mean_ap(s, ytr[draw[val]])
            best = grid[int(np.flatnonzero(cv >= cv.max() - 1e-9)[0])]  # the smallest of the best
            assert used["chosen_costs"][f"k{k}"][d] == {"cost": best, "rule": "cv"}, (k, d, cv)
            costs_seen.add(best)
            maps.append(class_mean_ap(scores(train[draw], ytr[draw], test, best), yte))
        expected = {"mean": np.mean(maps), "std": np.std(maps), "min": np.min(maps), "max": np.max(maps)}
        for stat, value in expected.items():
            assert metrics[f"map_k{k}_{stat}"] == pytest.approx(value, abs=1e-6), (k, stat)
        assert np.std(maps) > 0.01  # the draws differ: the spread is not trivially zero
    assert len(costs_seen) > 1  # the choice is not a constant
