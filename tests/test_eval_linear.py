"""Linear probe on cached features: the fit, the held-out weight-decay choice, known answers."""

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from evaluation import linear

SMALL_GRID = {"weight_decay_grid": [1e-4, 1e-2, 1.0], "max_iter": 100}


@pytest.fixture(autouse=True)
def one_torch_thread():
    # tiny problems: threads only add contention on a shared machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def feature_dict(train, train_labels, test, test_labels, num_classes):
    return {
        "train": torch.as_tensor(train, dtype=torch.float32),
        "train_labels": torch.as_tensor(train_labels),
        "test": torch.as_tensor(test, dtype=torch.float32),
        "test_labels": torch.as_tensor(test_labels),
        "num_classes": num_classes,
        "meta": {},
    }


def blobs(seed, num_classes=5, dim=12, n_train=200, n_test=300, spread=1.5):
    """Overlapping Gaussian classes: the weight decay matters and test top-1 < 1."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim))
    ytr, yte = rng.integers(0, num_classes, n_train), rng.integers(0, num_classes, n_test)
    return (
        centres[ytr] + spread * rng.normal(size=(n_train, dim)),
        ytr,
        centres[yte] + spread * rng.normal(size=(n_test, dim)),
        yte,
        num_classes,
    )


def test_fit_equals_sklearn_multinomial_logistic_regression():
    # mean CE + wd/2 ||W||^2 with a free bias is sklearn's 1/2 ||W||^2 + C * sum CE, C = 1 / (n wd)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(150, 6)), rng.integers(0, 4, 150)
    wd = 1e-2
    layer = linear.fit_linear(torch.tensor(x, dtype=torch.float64), torch.tensor(y), 4, wd, max_iter=500)
    with torch.no_grad():
        ours = torch.softmax(layer(torch.tensor(x, dtype=torch.float64)), 1).numpy()
    reference = LogisticRegression(C=1 / (len(x) * wd), tol=1e-10, max_iter=5000).fit(x, y).predict_proba(x)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_stratified_holdout_is_a_partition_holding_out_a_fifth_of_each_class():
    labels = np.repeat([0, 1, 2, 3], [50, 20, 7, 1])
    fit, val = linear.stratified_holdout(labels, 0.2, seed=3)
    assert sorted(np.concatenate([fit, val]).tolist()) == list(range(len(labels)))
    assert np.bincount(labels[val], minlength=4).tolist() == [
        10,
        4,
        1,
        0,
    ]  # round(0.2 n), none from a singleton
    again, other = (
        linear.stratified_holdout(labels, 0.2, seed=3),
        linear.stratified_holdout(labels, 0.2, seed=4),
    )
    assert np.array_equal(again[1], val) and not np.array_equal(other[1], val)


def test_separable_features_give_perfect_accuracy():
    rng = np.random.default_rng(1)
    c = 8
    ytr, yte = np.repeat(np.arange(c), 15), rng.integers(0, c, 100)
    features = feature_dict(
        np.eye(c)[ytr] + 0.01 * rng.normal(size=(len(ytr), c)),
        ytr,
        np.eye(c)[yte] + 0.01 * rng.normal(size=(len(yte), c)),
        yte,
        c,
    )
    metrics, used = linear.evaluate(features, SMALL_GRID, seed=0)
    assert metrics == {"top1": 1.0, "top5": 1.0}
    assert used["weight_decay"] in used["weight_decay_grid"] and used["mode"] == "cached"


def test_features_independent_of_labels_give_chance_accuracy():
    # The probe never sees the test labels, drawn independently of everything: each
    # prediction is right with probability exactly 1/C, so top-1 ~ Binomial(M, 1/C) / M.
    rng = np.random.default_rng(2)
    c, m = 10, 2000
    features = feature_dict(
        rng.normal(size=(500, 16)),
        rng.integers(0, c, 500),
        rng.normal(size=(m, 16)),
        rng.integers(0, c, m),
        c,
    )
    metrics, _ = linear.evaluate(features, SMALL_GRID, seed=0)
    for name, p in [("top1", 0.1), ("top5", 0.5)]:
        assert abs(metrics[name] - p) < 4.5 * math.sqrt(p * (1 - p) / m), (name, metrics[name])


def test_weight_decay_choice_never_sees_the_test_split():
    train, ytr, test, yte, c = blobs(3)
    clean, used = linear.evaluate(feature_dict(train, ytr, test, yte, c), SMALL_GRID, seed=0)
    rng = np.random.default_rng(9)
    corrupt = feature_dict(train, ytr, rng.normal(size=test.shape) * 100, rng.integers(0, c, len(yte)), c)
    _, used_corrupt = linear.evaluate(corrupt, SMALL_GRID, seed=0)
    assert used_corrupt["weight_decay"] == used["weight_decay"]
    assert used_corrupt["val_top1_per_weight_decay"] == used["val_top1_per_weight_decay"]
    # ...while the held-out scores do depend on the train split (the choice is not a constant)
    assert len(set(used["val_top1_per_weight_decay"])) > 1
    assert 0.3 < clean["top1"] < 1.0


def test_deterministic_for_a_seed_and_the_seed_moves_the_holdout():
    train, ytr, test, yte, c = blobs(4)
    features = feature_dict(train, ytr, test, yte, c)
    first, used_first = linear.evaluate(features, SMALL_GRID, seed=5)
    second, used_second = linear.evaluate(features, SMALL_GRID, seed=5)
    assert first == second and used_first == used_second
    _, used_other = linear.evaluate(features, SMALL_GRID, seed=6)
    assert used_other["val_top1_per_weight_decay"] != used_first["val_top1_per_weight_decay"]


def test_modes_and_settings_errors():
    train, ytr, test, yte, c = blobs(5, n_train=40, n_test=10)
    features = feature_dict(train, ytr, test, yte, c)
    with pytest.raises(ValueError, match="needs the checkpoint"):
        linear.evaluate(features, {"mode": "paper"}, seed=0)
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        linear.evaluate(features, {"mode": "fast"}, seed=0)
    with pytest.raises(ValueError, match=r"'lr'.*known settings are"):
        linear.evaluate(features, {"lr": 30}, seed=0)
    with pytest.raises(ValueError, match="ids outside"):
        linear.evaluate(feature_dict(train, ytr + c, test, yte, c), SMALL_GRID, seed=0)


def test_the_same_affine_map_of_every_feature_on_both_splits_changes_nothing():
    # Standardised with the train statistics, a feature scaled by a and shifted by b on both splits is
    # the same probe input: an unstandardised L2-penalised fit would change with a and b.
    train, ytr, test, yte, c = blobs(6)
    rng = np.random.default_rng(1)
    scale, shift = 2.0 ** rng.integers(-6, 7, train.shape[1]), rng.normal(0, 50, train.shape[1])
    metrics, used = linear.evaluate(feature_dict(train, ytr, test, yte, c), SMALL_GRID, seed=0)
    moved = feature_dict(train * scale + shift, ytr, test * scale + shift, yte, c)
    moved_metrics, moved_used = linear.evaluate(moved, SMALL_GRID, seed=0)
    assert moved_metrics == metrics and moved_used["weight_decay"] == used["weight_decay"]
    assert moved_used["val_top1_per_weight_decay"] == used["val_top1_per_weight_decay"]
    assert 0.3 < metrics["top1"] < 1.0


def test_a_test_image_is_scored_without_the_statistics_of_the_other_test_images():
    # The test split scored whole must count the hits of its parts scored one by one. The parts have
    # very different statistics (the second is the first scaled and shifted), so a standardisation that
    # looked at test features (alone, or pooled with the train split) would move the first part's scores.
    train, ytr, test, yte, c = blobs(7)
    parts = [(test, yte), (40 * test + 25, yte)]
    whole, _ = linear.evaluate(
        feature_dict(train, ytr, np.concatenate([test, parts[1][0]]), np.concatenate([yte, yte]), c),
        SMALL_GRID,
        seed=0,
    )
    scored = [linear.evaluate(feature_dict(train, ytr, x, y, c), SMALL_GRID, seed=0)[0] for x, y in parts]
    for name in ("top1", "top5"):
        hits = sum(metrics[name] * len(yte) for metrics in scored)
        assert hits == pytest.approx(whole[name] * 2 * len(yte), abs=1e-9), name
