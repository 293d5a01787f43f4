"""Low-shot logistic regression (MSN, DINOv2) and few-shot kNN (DINOv2): the per-class draws, the
regulariser's scaling against MSN's objective computed by hand, the preprocessing, known answers."""

import json
import subprocess
import sys

import numpy as np
import pytest
from support import feature_dict

from evaluation import knn
from evaluation import lowshot_logreg as lr
from evaluation.common import ProtocolError, sample_lowshot

CLASSES, DIM = 5, 16
CENTRES = np.random.default_rng(0).normal(size=(CLASSES, DIM))


def offset_problem(per_class: int, seed: int, offset: float = 30.0, noise: float = 0.3):
    """Images near their class centre, each shifted along the all-ones direction by its own random
    amount: what a row's own centring removes and an L2 normalisation alone does not."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(CLASSES), per_class)
    x = CENTRES[y] + noise * rng.normal(size=(len(y), DIM)) + rng.uniform(-offset, offset, (len(y), 1))
    return x, y


def problem(train_per_class=20, test_per_class=40, offset=30.0, noise=0.3):
    xtr, ytr = offset_problem(train_per_class, 1, offset, noise)
    xte, yte = offset_problem(test_per_class, 2, offset, noise)
    return feature_dict(xtr, ytr, xte, yte, CLASSES, np.asarray)


# ---------------------------------------------------------------- the draws
def test_draws_hold_exact_counts_per_class_fixed_by_seed_and_index_the_train_split_only():
    labels = np.random.default_rng(3).integers(0, 4, 400)
    counts = np.bincount(labels)
    for k, per_class in [(2, [2] * 4), (0.05, [max(1, round(0.05 * c)) for c in counts])]:
        draws = sample_lowshot(labels, k, num_draws=3, seed=7)
        for draw in draws:
            assert len(set(draw.tolist())) == len(draw)  # without replacement
            assert 0 <= draw.min() and draw.max() < len(labels)  # train indices: the test split is apart
            assert np.bincount(labels[draw], minlength=4).tolist() == per_class
        assert len({tuple(d) for d in draws}) == 3  # the draws differ
        assert all(np.array_equal(a, b) for a, b in zip(draws, sample_lowshot(labels, k, 3, seed=7)))
        assert not np.array_equal(draws[0], sample_lowshot(labels, k, 1, seed=8)[0])
    with pytest.raises(ValueError, match="fraction"):
        sample_lowshot(labels, 1.5, 1, seed=0)


def test_the_test_split_never_trains_a_draw():
    features = problem()
    other = {
        **features,
        "test": np.random.default_rng(9).normal(size=features["test"].shape).astype(np.float32),
    }
    settings = {"shots": [1, 2], "fractions": [], "regulariser": "holdout", "c_steps": 7}
    # the C chosen on each draw (from train images alone) stays when the test images change
    assert lr.evaluate(features, settings, 0)[1]["subsets"] == lr.evaluate(other, settings, 0)[1]["subsets"]


# ---------------------------------------------------------------- the regulariser
def msn_objective_gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray, lambd: float) -> np.ndarray:
    """The gradient of MSN's objective (1/n) sum_i softmax-CE(W x_i, y_i) + (lambd / n) / 2 ||W||^2 (cyanure,
    its lambda divided by n), written out by hand: (1/n) (P - Y)^T X + (lambd / n) W."""
    n = len(y)
    logits = x @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    onehot = np.eye(w.shape[0])[y]
    return (p - onehot).T @ x / n + (lambd / n) * w


@pytest.mark.parametrize("lambd", [0.5, 0.05])
def test_the_fitted_weights_minimise_msns_objective_with_lambda_over_n(lambd):
    x, y = offset_problem(6, seed=4)
    x = lr.preprocess(x, "centre_l2")
    counter = {"fits": 0, "not_converged": 0}
    model = lr.fit(x, y, lr.fixed_c(lambd), max_iter=5000, counter=counter, tol=1e-10)
    gradient = msn_objective_gradient(model.coef_, x, y, lambd)
    assert np.abs(gradient).max() < 1e-6, np.abs(gradient).max()
    # the same weights do not minimise it with the penalty lambd (not divided by n)
    assert np.abs(msn_objective_gradient(model.coef_, x, y, lambd * len(y))).max() > 1e-3


def test_holdout_picks_a_c_of_dinov2s_grid_per_draw():
    used = lr.evaluate(problem(), {"shots": [5], "fractions": [], "regulariser": "holdout"}, 0)[1]
    grid = 10.0 ** np.linspace(-6, 5, 45)
    chosen = used["subsets"]["n5"]["C"]
    assert len(chosen) == 3 and all(np.isclose(grid, c).any() for c in chosen), chosen
    assert used["fits"] == 3 * (45 + 1)  # every C on the held-out part, then the refit on the draw


CYANURE_RUN = """
import json, sys
import numpy as np
from evaluation import lowshot_logreg
arrays = dict(np.load(sys.argv[1]))
features = {**arrays, "num_classes": int(arrays["num_classes"])}
print(json.dumps(lowshot_logreg.evaluate(features, json.loads(sys.argv[2]), 0)[0]))
"""


def test_cyanure_msns_solver_reaches_the_same_minimiser(tmp_path):
    """MSN fits with cyanure; solved to the same tolerance, its predictions are scikit-learn's. It runs in
    a process of its own: cyanure's OpenBLAS and OpenMP, loaded beside torch's and faiss's in this one,
    can leave a later torch training spinning forever (seen here in test_eval_semisup's fixture)."""
    pytest.importorskip("cyanure", reason="the cyanure extra (in `test`) is not installed")
    features = problem(noise=1.5)
    np.savez(tmp_path / "features.npz", **{k: np.asarray(v) for k, v in features.items() if k != "meta"})
    settings = {"shots": [1, 5], "fractions": [0.1]}
    ours = lr.evaluate(features, settings, 0)[0]
    run = [sys.executable, "-c", CYANURE_RUN, str(tmp_path / "features.npz")]
    out = subprocess.run(
        [*run, json.dumps({**settings, "solver": "cyanure"})], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    msns = json.loads(out.stdout)
    assert ours.keys() == msns.keys()
    assert max(abs(ours[k] - msns[k]) for k in ours) <= 0.01, (ours, msns)


# ---------------------------------------------------------------- preprocessing and known answers
def test_each_row_is_centred_then_l2_normalised():
    x = np.array([[1.0, 2.0, 3.0], [10.0, 10.0, 13.0]])
    out = lr.preprocess(x, "centre_l2")
    assert np.allclose(out, [[-1, 0, 1] / np.sqrt(2), [-1, -1, 2] / np.sqrt(6)])


def test_without_the_centring_the_one_shot_accuracy_falls():
    features = problem()
    centred = lr.evaluate(features, {"shots": [1], "fractions": []}, 0)[0]
    uncentred = lr.evaluate(features, {"shots": [1], "fractions": [], "preprocess": "l2"}, 0)[0]
    assert centred["top1_n1_mean"] == 1.0
    assert uncentred["top1_n1_mean"] < 0.7, uncentred


def test_metrics_name_every_draw_and_their_mean_and_spread():
    metrics, used = lr.evaluate(problem(), {"shots": [1, 2, 50], "fractions": [0.1], "num_draws": 2}, 3)
    for name in ("n1", "n2", "10pct"):
        draws = [metrics[f"top1_{name}_draw{d}"] for d in range(2)]
        assert metrics[f"top1_{name}_mean"] == pytest.approx(np.mean(draws))
        assert metrics[f"top1_{name}_std"] == pytest.approx(np.std(draws))
    assert used["shots_skipped"] == [50] and used["subsets"]["10pct"]["images"] == 10
    with pytest.raises(ProtocolError, match=r"evaluation\.lowshot_logreg\.shots"):
        lr.evaluate(problem(), {"shots": [50], "fractions": []}, 0)


# ---------------------------------------------------------------- few-shot kNN
def test_few_shot_knn_on_a_train_split_of_exactly_n_per_class_is_the_plain_knn():
    features = problem(train_per_class=3)
    settings = {"variants": [{"k": 3, "temperature": 0.07}], "n_per_class": [3], "n_tries": 2}
    metrics, _ = knn.evaluate(features, settings, seed=0)
    assert metrics["top1_k3_t0.07_n3_mean"] == metrics["top1_k3_t0.07"]
    assert metrics["top1_k3_t0.07_n3_std"] == 0.0


def test_few_shot_knn_votes_with_at_most_n_neighbours_and_its_draws_follow_the_seed():
    features = problem(offset=0.0, noise=1.5)  # hard enough that the draw matters
    settings = {"variants": [{"k": 20, "temperature": 0.07}], "n_per_class": [1, 2], "n_tries": 4}
    metrics, _ = knn.evaluate(features, settings, seed=0)
    assert {"top1_k1_t0.07_n1_mean", "top1_k2_t0.07_n2_std", "top5_k2_t0.07_n2_mean"} <= set(metrics)
    assert metrics == knn.evaluate(features, settings, seed=0)[0]
    assert metrics != knn.evaluate(features, settings, seed=1)[0]
    with pytest.raises(ProtocolError, match=r"evaluation\.knn\.n_per_class"):
        knn.evaluate(features, {**settings, "n_per_class": [21]}, seed=0)
