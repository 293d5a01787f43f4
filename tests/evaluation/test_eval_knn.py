"""Weighted kNN protocol: exact agreement with naive and sklearn votes, known answers."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors
from support import REPO, feature_dict, independent_features

from evaluation import knn


def naive_scores(train, train_labels, test, k, temperature, num_classes):
    """The weighted vote written out plainly: every test row, its k most similar train rows."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    scores = np.zeros((len(test), num_classes))
    for i, row in enumerate(test):
        similarity = train @ row
        for j in np.argsort(-similarity)[:k]:
            scores[i, train_labels[j]] += math.exp(similarity[j] / temperature)
    return scores


def random_problem(seed, n_train=300, n_test=40, dim=16, num_classes=7):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n_train, dim)).astype(np.float32),
        rng.integers(0, num_classes, n_train),
        rng.normal(size=(n_test, dim)).astype(np.float32),
        num_classes,
    )


@pytest.mark.parametrize("k,temperature", [(1, 0.1), (20, 0.07), (200, 0.1), (50, 1.0)])
def test_scores_equal_naive_weighted_vote(k, temperature):
    train, labels, test, c = random_problem(k)
    got = knn.knn_classify(train, labels, test, k, temperature, c)
    assert got.shape == (len(test), c)
    np.testing.assert_allclose(got, naive_scores(train, labels, test, k, temperature, c), rtol=1e-5)


def test_hand_computed_scores():
    # unit vectors at 0, 90 and 180 degrees; the query at 0 degrees: cosines 1, 0, -1
    train = np.array([[1.0, 0.0], [0.0, 3.0], [-2.0, 0.0]], dtype=np.float32)
    labels = np.array([0, 1, 1])
    scores = knn.knn_classify(train, labels, np.array([[5.0, 0.0]], dtype=np.float32), 2, 0.5, 3)
    np.testing.assert_allclose(scores, [[math.exp(2.0), math.exp(0.0), 0.0]], rtol=1e-6)


def test_prediction_equals_sklearn_brute_force_cosine_vote():
    train, labels, test, c = random_problem(3, n_train=500, n_test=100)
    k, temperature = 15, 0.07
    distance, neighbours = (
        NearestNeighbors(n_neighbors=k, metric="cosine", algorithm="brute").fit(train).kneighbors(test)
    )
    reference = np.zeros((len(test), c))
    for i in range(len(test)):
        np.add.at(reference[i], labels[neighbours[i]], np.exp((1.0 - distance[i]) / temperature))
    got = knn.knn_classify(train, labels, test, k, temperature, c)
    np.testing.assert_array_equal(got.argmax(1), reference.argmax(1))
    np.testing.assert_allclose(got, reference, rtol=1e-4)


def test_k_is_capped_at_train_size_and_cosine_ignores_scale():
    train, labels, test, c = random_problem(4, n_train=30)
    capped = knn.knn_classify(train, labels, test, 1000, 0.1, c)
    np.testing.assert_allclose(capped, knn.knn_classify(train, labels, test, 30, 0.1, c), rtol=1e-6)
    # with every train row voting, the class scores sum to the sum of all weights
    t = test / np.linalg.norm(test, axis=1, keepdims=True)
    s = train / np.linalg.norm(train, axis=1, keepdims=True)
    np.testing.assert_allclose(capped.sum(1), np.exp(t @ s.T / 0.1).sum(1), rtol=1e-5)
    row_scale = np.random.default_rng(0).uniform(0.1, 10, size=(len(train), 1)).astype(np.float32)
    np.testing.assert_allclose(
        knn.knn_classify(train * row_scale, labels, test, 10, 0.1, c),
        knn.knn_classify(train, labels, test, 10, 0.1, c),
        rtol=1e-5,
    )


def test_separable_features_give_perfect_accuracy_and_names_follow_requested_k():
    rng = np.random.default_rng(0)
    c, dim = 6, 6
    train_labels, test_labels = np.repeat(np.arange(c), 20), rng.integers(0, c, 50)
    train = np.eye(c, dim)[train_labels] + 0.01 * rng.normal(size=(len(train_labels), dim))
    test = np.eye(c, dim)[test_labels] + 0.01 * rng.normal(size=(len(test_labels), dim))
    # k=20 reaches only same-class neighbours; k=200 (capped at 120) outvotes other classes by exp(sim/T)
    metrics, used = knn.evaluate(feature_dict(train, train_labels, test, test_labels, c), {}, seed=0)
    assert set(metrics) == {"top1_k200_t0.1", "top5_k200_t0.1", "top1_k20_t0.07", "top5_k20_t0.07"}
    assert all(v == 1.0 for v in metrics.values())
    assert [v["effective_k"] for v in used["variants"]] == [120, 20]
    assert [v["k"] for v in used["variants"]] == [200, 20]


def test_features_independent_of_labels_give_chance_accuracy():
    # Test labels drawn independently of everything else: each prediction is right with
    # probability exactly 1/C (top-5: 5/C), so the accuracy is Binomial(M, p) / M.
    c, m = 10, 2000
    features = independent_features(1, n_train=1000, n_test=m, dim=32, num_classes=c)
    metrics, _ = knn.evaluate(features, {"variants": [{"k": 20, "temperature": 0.07}]}, seed=0)
    for name, p in [("top1_k20_t0.07", 0.1), ("top5_k20_t0.07", 0.5)]:
        sigma = math.sqrt(p * (1 - p) / m)
        assert abs(metrics[name] - p) < 4.5 * sigma, (name, metrics[name])


def test_unknown_setting_and_bad_variant_are_errors():
    train, labels, test, c = random_problem(5)
    features = feature_dict(train, labels, test, labels[: len(test)], c)
    with pytest.raises(
        ValueError, match=r"'neighbours'.*known settings are \['n_per_class', 'n_tries', 'variants'\]"
    ):
        knn.evaluate(features, {"neighbours": 5}, seed=0)
    with pytest.raises(ValueError, match=r"`evaluation\.knn\.variants\.0`: 'temperature' is a required"):
        knn.evaluate(features, {"variants": [{"k": 5}]}, seed=0)
    with pytest.raises(ValueError, match=r"`evaluation\.knn\.variants`: \[\] should be non-empty"):
        knn.evaluate(features, {"variants": []}, seed=0)
    with pytest.raises(ValueError, match="missing key"):
        knn.evaluate({"train": features["train"]}, {}, seed=0)


@pytest.mark.parametrize(
    "variant, key, rule",
    [
        ({"k": 0, "temperature": 0.1}, "variants.0.k", "0 is less than the minimum of 1"),
        (
            {"k": 5, "temperature": 0.0},
            "variants.0.temperature",
            "0.0 is less than or equal to the minimum of 0",
        ),
    ],
)
def test_a_variant_out_of_its_range_is_refused_in_the_plans_words(variant, key, rule):
    """The job judges by the plan's rules (the module's RULES), naming the key as the plan does; a value at
    the rule's edge runs."""
    from evaluation.common import ProtocolError

    train, labels, test, c = random_problem(5)
    features = feature_dict(train, labels, test, labels[: len(test)], c)
    with pytest.raises(ProtocolError) as err:
        knn.evaluate(features, {"variants": [variant]}, seed=0)
    assert f"`evaluation.knn.{key}`: {rule}" in str(err.value) and "RULES" in str(err.value)
    with pytest.raises(ProtocolError, match=f"`evaluation.knn.{key}`"):
        knn.knn_classify(train, labels, test, variant["k"], variant["temperature"], c)
    metrics, _ = knn.evaluate(features, {"variants": [{"k": 1, "temperature": 0.01}]}, seed=0)
    assert set(metrics) == {"top1_k1_t0.01", "top5_k1_t0.01"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_search_at_the_largest_k_scores_every_variant_as_its_own_search(seed):
    train, labels, test, c = random_problem(seed, n_train=500, n_test=200)
    test_labels = np.random.default_rng(seed + 10).integers(0, c, len(test))
    variants = [{"k": 3, "temperature": 0.05}, {"k": 200, "temperature": 0.1}, {"k": 20, "temperature": 0.07}]
    metrics, _ = knn.evaluate(
        feature_dict(train, labels, test, test_labels, c), {"variants": variants}, seed=0
    )
    for v in variants:
        alone = knn.knn_classify(train, labels, test, v["k"], v["temperature"], c)
        name = knn.variant_name(v["k"], v["temperature"])
        assert metrics[f"top1_{name}"] == float(np.mean(alone.argmax(axis=1) == test_labels))


def test_a_knn_or_clustering_job_imports_neither_torch_nor_scikit_learn(tmp_path):
    """The whole job, as the DAG runs it (`sslbench evaluate`, a fresh process): numpy and faiss only."""
    from sslbench.extract.featurefile import save_features

    rng = np.random.default_rng(0)
    meta = {
        "cfg": {"method_base": "m", "variant": {}},
        "dataset": "d",
        "eval": {"dataset": "d"},
        "method": "m",
    }
    features = {
        "train": rng.normal(size=(60, 8)),
        "train_labels": np.arange(60) % 3,
        "test": rng.normal(size=(9, 8)),
    }
    features |= {"test_labels": np.arange(9) % 3, "num_classes": 3, "meta": {**meta, "seed": 0}}
    save_features(tmp_path / "features.npz", features)
    code = """
import sys
from sslbench.cli import main
for protocol, extra in (("knn", []), ("clustering", ["--no-maps"])):
    main(["evaluate", "--protocol", protocol, "--features", sys.argv[1], "--settings-json", "{}",
          "--seed", "0", "--out", sys.argv[2] + protocol + ".json", "--threads", "1", *extra])
print(sorted(m for m in ("torch", "timm", "torchvision", "sklearn", "pandas") if m in sys.modules))
"""
    env = {**os.environ, "SSLBENCH_WARM": "0"}
    args = [sys.executable, "-c", code, str(tmp_path / "features.npz"), str(tmp_path / "result_")]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "result_knn.json").exists() and (tmp_path / "result_clustering.json").exists()
