"""Linear probe on cached features: the numpy fit, the held-out weight-decay choice, known answers."""

import functools
import math
import subprocess
import sys

import numpy as np
import pytest
from support import REPO, feature_dict, independent_features

from evaluation import linear

SMALL_GRID = {"weight_decay_grid": [1e-4, 1e-2, 1.0], "max_iter": 100}
numpy_features = functools.partial(feature_dict, array=np.asarray)  # the cached mode needs no torch


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


def softmax(logits):
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("chunk_rows", [linear.CHUNK_ROWS, 7])  # 7: 30 rows in 5 chunks, the last short
def test_the_gradient_is_the_loss_gradient_by_finite_differences(monkeypatch, chunk_rows):
    monkeypatch.setattr(linear, "CHUNK_ROWS", chunk_rows)
    rng = np.random.default_rng(0)
    c, d, wd = 3, 4, 0.3
    x, y = rng.normal(size=(30, d)), rng.integers(0, c, 30)
    params = rng.normal(size=c * (d + 1))
    loss, grad = linear.loss_and_gradient(params, x, y, c, wd)
    weight, bias = params[: c * d].reshape(c, d), params[c * d :]
    p = softmax(x @ weight.T + bias)
    assert loss == pytest.approx(-np.log(p[np.arange(30), y]).mean() + wd / 2 * np.sum(weight**2), rel=1e-12)
    eps = 1e-6
    numeric = [
        (
            linear.loss_and_gradient(params + step, x, y, c, wd)[0]
            - linear.loss_and_gradient(params - step, x, y, c, wd)[0]
        )
        / (2 * eps)
        for step in np.eye(len(params)) * eps
    ]
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)


def test_the_fit_is_a_stationary_point_of_the_penalised_loss():
    # KKT of mean CE + wd/2 ||W||^2: wd W = -(P - Y)^T X / n, and the unpenalised bias: sum(P - Y) / n = 0
    # (each class's mean predicted probability is its frequency).
    x, y, _, _, c = blobs(1)
    n, wd = len(x), 1e-2
    weight, bias = linear.fit_linear(x, y, c, wd, max_iter=300)
    residual = softmax(x @ weight.T + bias) - np.eye(c)[y]
    assert np.abs(weight).max() > 0.05  # not the zero start
    np.testing.assert_allclose(wd * weight, -residual.T @ x / n, atol=1e-6)
    np.testing.assert_allclose(residual.sum(0) / n, 0, atol=1e-6)


def test_without_weight_decay_separable_train_data_is_fitted_exactly():
    # 40 points in general position in 50 dimensions: any labelling is linearly separable. A penalised
    # fit misses some (the check can fail); wd 0 must separate them all.
    rng = np.random.default_rng(2)
    x, y, c = rng.normal(size=(40, 50)), np.repeat(np.arange(4), 10), 4
    train_top1 = lambda probe: float((np.argmax(linear.predict(probe, x), 1) == y).mean())
    assert train_top1(linear.fit_linear(x, y, c, 0.0, max_iter=300)) == 1.0
    assert train_top1(linear.fit_linear(x, y, c, 30.0, max_iter=300)) < 1.0


def test_two_symmetric_points_have_the_hand_computed_probe():
    # x = -1 (class 0), x = +1 (class 1). By symmetry b = 0 and W = [-w, w]; each point's loss is
    # log(1 + e^{-2w}) and the penalty wd w^2, so the optimum has wd w = sigmoid(-2w). With
    # wd = 1 / (2 ln 3): w = ln(3) / 2, and each point gets probability 3/4 for its own class.
    wd = 1 / (2 * math.log(3))
    weight, bias = linear.fit_linear(np.array([[-1.0], [1.0]]), np.array([0, 1]), 2, wd, max_iter=100)
    np.testing.assert_allclose(weight, [[-math.log(3) / 2], [math.log(3) / 2]], atol=1e-7)
    np.testing.assert_allclose(bias, [0, 0], atol=1e-9)
    np.testing.assert_allclose(
        softmax(np.array([[-1.0], [1.0]]) @ weight.T + bias), [[0.75, 0.25], [0.25, 0.75]], atol=1e-7
    )


def test_the_fit_equals_sklearn_multinomial_logistic_regression():
    # mean CE + wd/2 ||W||^2 with a free bias is sklearn's 1/2 ||W||^2 + C * sum CE, C = 1 / (n wd)
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(150, 6)), rng.integers(0, 4, 150)
    wd = 1e-2
    weight, bias = linear.fit_linear(x, y, 4, wd, max_iter=500)
    reference = LogisticRegression(C=1 / (len(x) * wd), tol=1e-10, max_iter=5000).fit(x, y)
    np.testing.assert_allclose(weight, reference.coef_, atol=1e-4)
    # the biases are defined up to a common shift (softmax ignores it): compare them centred
    np.testing.assert_allclose(
        bias - bias.mean(), reference.intercept_ - reference.intercept_.mean(), atol=1e-4
    )
    np.testing.assert_allclose(softmax(x @ weight.T + bias), reference.predict_proba(x), atol=1e-5)


def test_standardise_uses_the_train_mean_and_unbiased_std_and_leaves_constant_columns_unscaled():
    train = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0], [6.0, 5.0]], dtype=np.float32)
    test = np.array([[3.0, 7.0]], dtype=np.float32)
    scaled_train, scaled_test = linear.standardise(train, test)
    assert scaled_train.dtype == np.float32
    np.testing.assert_allclose(scaled_train.mean(0), 0, atol=1e-7)
    np.testing.assert_allclose(scaled_train[:, 0].std(ddof=1), 1, rtol=1e-6)  # ddof 1, like torch.std
    np.testing.assert_allclose(scaled_test, [[0.0, 2.0]], atol=1e-6)  # column 1: shifted by 5, std 1


def test_the_cached_mode_loads_neither_torch_nor_sklearn():
    # a whole cached-mode evaluation in a fresh process, not only the import
    code = """
import sys
import numpy as np
from evaluation import linear
rng = np.random.default_rng(0)
features = {"train": rng.normal(size=(60, 4)), "train_labels": np.arange(60) % 3,
            "test": rng.normal(size=(9, 4)), "test_labels": np.arange(9) % 3, "num_classes": 3, "meta": {}}
linear.evaluate(features, {"max_iter": 20}, 0)
print(sorted(m for m in ("torch", "sklearn", "timm", "torchvision", "sslbench.optim") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_device_setting_is_accepted_and_the_cached_mode_runs_on_the_cpu():
    train, ytr, test, yte, c = blobs(8, n_train=60, n_test=20)
    features = numpy_features(train, ytr, test, yte, c)
    metrics, used = linear.evaluate(features, {**SMALL_GRID, "device": "cuda:0"}, seed=0)
    default_metrics, default_used = linear.evaluate(features, SMALL_GRID, seed=0)
    assert used["device"] == default_used["device"] == "cpu"
    assert metrics == default_metrics and used["weight_decay"] == default_used["weight_decay"]


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
    features = numpy_features(
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
    c, m = 10, 2000
    features = independent_features(2, n_train=500, n_test=m, dim=16, num_classes=c, array=np.asarray)
    metrics, _ = linear.evaluate(features, SMALL_GRID, seed=0)
    for name, p in [("top1", 0.1), ("top5", 0.5)]:
        assert abs(metrics[name] - p) < 4.5 * math.sqrt(p * (1 - p) / m), (name, metrics[name])


def test_weight_decay_choice_never_sees_the_test_split():
    train, ytr, test, yte, c = blobs(3)
    clean, used = linear.evaluate(numpy_features(train, ytr, test, yte, c), SMALL_GRID, seed=0)
    rng = np.random.default_rng(9)
    corrupt = numpy_features(train, ytr, rng.normal(size=test.shape) * 100, rng.integers(0, c, len(yte)), c)
    _, used_corrupt = linear.evaluate(corrupt, SMALL_GRID, seed=0)
    assert used_corrupt["weight_decay"] == used["weight_decay"]
    assert used_corrupt["val_top1_per_weight_decay"] == used["val_top1_per_weight_decay"]
    # ...while the held-out scores do depend on the train split (the choice is not a constant)
    assert len(set(used["val_top1_per_weight_decay"])) > 1
    assert 0.3 < clean["top1"] < 1.0


def test_deterministic_for_a_seed_and_the_seed_moves_the_holdout():
    train, ytr, test, yte, c = blobs(4)
    features = numpy_features(train, ytr, test, yte, c)
    first, used_first = linear.evaluate(features, SMALL_GRID, seed=5)
    second, used_second = linear.evaluate(features, SMALL_GRID, seed=5)
    assert first == second and used_first == used_second
    _, used_other = linear.evaluate(features, SMALL_GRID, seed=6)
    assert used_other["val_top1_per_weight_decay"] != used_first["val_top1_per_weight_decay"]


def test_modes_and_settings_errors():
    train, ytr, test, yte, c = blobs(5, n_train=40, n_test=10)
    features = numpy_features(train, ytr, test, yte, c)
    with pytest.raises(ValueError, match="needs the checkpoint"):
        linear.evaluate(features, {"mode": "paper"}, seed=0)
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        linear.evaluate(features, {"mode": "fast"}, seed=0)
    with pytest.raises(ValueError, match=r"'lr'.*known settings are"):
        linear.evaluate(features, {"lr": 30}, seed=0)
    with pytest.raises(ValueError, match="ids outside"):
        linear.evaluate(numpy_features(train, ytr + c, test, yte, c), SMALL_GRID, seed=0)


def test_the_same_affine_map_of_every_feature_on_both_splits_changes_nothing():
    # Standardised with the train statistics, a feature scaled by a and shifted by b on both splits is
    # the same probe input: an unstandardised L2-penalised fit would change with a and b.
    train, ytr, test, yte, c = blobs(6)
    rng = np.random.default_rng(1)
    scale, shift = 2.0 ** rng.integers(-6, 7, train.shape[1]), rng.normal(0, 50, train.shape[1])
    metrics, used = linear.evaluate(numpy_features(train, ytr, test, yte, c), SMALL_GRID, seed=0)
    moved = numpy_features(train * scale + shift, ytr, test * scale + shift, yte, c)
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
        numpy_features(train, ytr, np.concatenate([test, parts[1][0]]), np.concatenate([yte, yte]), c),
        SMALL_GRID,
        seed=0,
    )
    scored = [linear.evaluate(numpy_features(train, ytr, x, y, c), SMALL_GRID, seed=0)[0] for x, y in parts]
    for name in ("top1", "top5"):
        hits = sum(metrics[name] * len(yte) for metrics in scored)
        assert hits == pytest.approx(whole[name] * 2 * len(yte), abs=1e-9), name
