"""Clustering protocol: faiss k-means on the test split scored with AMI / NMI / ARI."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score
from support import feature_dict

from evaluation import clustering
from evaluation.common import seed_for
from sslbench.extract.featurefile import load_features
from sslbench.kmeans import kmeans
from sslbench.knn import l2_normalize


def with_random_train(test, test_labels, num_classes):
    """Features of the test split ``test`` beside a random train split of 20 (the protocol clusters the
    test split alone)."""
    rng = np.random.default_rng(0)
    train = rng.normal(size=(20, test.shape[1]))
    return feature_dict(train, rng.integers(0, num_classes, 20), test, test_labels, num_classes)


def one_hot(seed, num_classes=6, n=300, noise=0.02):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    return np.eye(num_classes)[labels] + noise * rng.normal(size=(n, num_classes)), labels


def test_kmeans_recovers_well_separated_classes():
    x, labels = one_hot(0)
    clusters = kmeans(l2_normalize(x), 6, niter=20, nredo=3, seed=1, max_points_per_centroid=None).assignments
    assert adjusted_mutual_info_score(labels, clusters) == pytest.approx(1.0)


def test_separable_features_give_perfect_scores():
    x, labels = one_hot(1)
    metrics, used = clustering.evaluate(with_random_train(x, labels, 6), {"nredo": 3}, seed=0)
    assert set(metrics) == {"ami", "nmi", "ari", "ami_k2x", "ami_k5x"}
    assert metrics["ami"] == pytest.approx(1.0) and metrics["nmi"] == pytest.approx(1.0)
    assert metrics["ari"] == pytest.approx(1.0)
    assert 0 < metrics["ami_k5x"] < metrics["ami"]  # over-clustering splits classes
    assert used["k"] == {"ami": 6, "ami_k2x": 12, "ami_k5x": 30}


def test_features_independent_of_labels_give_chance_scores():
    # AMI and ARI are adjusted for chance: expectation 0 for labels independent of the clusters;
    # their spread at n = 2000 and 10 clusters is about 0.002 (measured over random labelings),
    # so 0.02 is a wide bound that still fails any real signal.
    rng = np.random.default_rng(2)
    metrics, _ = clustering.evaluate(
        with_random_train(rng.normal(size=(2000, 16)), rng.integers(0, 10, 2000), 10),
        {"restarts": 3, "overcluster": [2]},
        seed=0,
    )
    for name in ("ami", "ari", "ami_k2x"):
        assert abs(metrics[name]) < 0.02, (name, metrics[name])


def test_metrics_are_sklearns_on_each_restart_averaged_with_seeds_derived_from_the_run_seed():
    rng = np.random.default_rng(3)
    x, labels = rng.normal(size=(200, 5)), rng.integers(0, 4, 200)  # no structure: restarts disagree
    settings = {"restarts": 3, "niter": 10, "overcluster": [2]}
    metrics, _ = clustering.evaluate(with_random_train(x, labels, 4), settings, seed=7)

    def restarts(k):  # the assignments of each restart, from the seed (seed, k, restart)
        found = [
            kmeans(l2_normalize(x), k, niter=10, seed=seed_for(7, k, r), max_points_per_centroid=None)
            for r in range(3)
        ]
        return [f.assignments for f in found]

    per_restart = {
        "ami": [adjusted_mutual_info_score(labels, a) for a in restarts(4)],
        "nmi": [normalized_mutual_info_score(labels, a, average_method="arithmetic") for a in restarts(4)],
        "ari": [adjusted_rand_score(labels, a) for a in restarts(4)],
        "ami_k2x": [adjusted_mutual_info_score(labels, a) for a in restarts(8)],
    }
    assert metrics.keys() == per_restart.keys()
    for name, values in per_restart.items():
        assert len(set(values)) == 3, name  # the restarts differ, so the mean is a real average
        assert metrics[name] == pytest.approx(np.mean(values), rel=1e-12, abs=1e-12), name
    assert clustering.evaluate(with_random_train(x, labels, 4), settings, seed=7)[0] == metrics
    assert clustering.evaluate(with_random_train(x, labels, 4), settings, seed=8)[0] != metrics


def test_k_is_capped_at_the_number_of_test_samples():
    x, labels = one_hot(4, num_classes=6, n=20)
    metrics, used = clustering.evaluate(with_random_train(x, labels, 6), {"restarts": 1}, seed=0)
    assert used["k"]["ami_k5x"] == 20 and np.isfinite(list(metrics.values())).all()


def test_settings_errors():
    x, labels = one_hot(5)
    with pytest.raises(ValueError, match=r"'k'.*known settings are"):
        clustering.evaluate(with_random_train(x, labels, 6), {"k": 5}, seed=0)
    with pytest.raises(ValueError, match="restarts"):
        clustering.evaluate(with_random_train(x, labels, 6), {"restarts": 0}, seed=0)


def test_side_file_holds_the_assignments_it_scored_and_a_tsne_of_a_fixed_subset(tmp_path, monkeypatch):
    monkeypatch.setattr(clustering, "TSNE_POINTS", 100)  # the cap, lowered: t-SNE of 500 takes seconds
    x, labels = one_hot(6, num_classes=4, n=90, noise=0.5)
    features = with_random_train(x, labels, 4)
    metrics, used = clustering.evaluate(features, {"restarts": 3}, seed=2, side_file=tmp_path / "c.npz")
    # writing the side file changes no number
    assert (metrics, used) == clustering.evaluate(features, {"restarts": 3}, seed=2)
    side = load_features(tmp_path / "c.npz")
    assert side["assignments"].shape == (3, 90) and side["meta"]["kmeans"]["k"] == 4
    # the report's k-means picture is the protocol's own: these are the clusterings it scored
    scored = [adjusted_mutual_info_score(labels, a) for a in side["assignments"]]
    assert np.mean(scored) == pytest.approx(metrics["ami"]) and len(set(scored)) > 1
    assert side["tsne"].shape == (90, 2) and np.isfinite(side["tsne"]).all()
    assert np.array_equal(side["tsne_labels"], labels[side["tsne_index"]])
    # at most TSNE_POINTS test points, the same subset whatever the run seed
    many = with_random_train(*one_hot(7, num_classes=4, n=clustering.TSNE_POINTS + 50), 4)
    subsets = []
    for seed in (0, 1):
        path = tmp_path / f"{seed}.npz"
        clustering.evaluate(many, {"restarts": 1, "overcluster": []}, seed=seed, side_file=path)
        subsets.append(load_features(path)["tsne_index"])
    assert len(subsets[0]) == clustering.TSNE_POINTS and np.array_equal(*subsets)


def test_without_maps_the_side_file_keeps_its_assignments_and_leaves_out_the_tsne(tmp_path):
    x, labels = one_hot(6, num_classes=4, n=60, noise=0.5)
    features = with_random_train(x, labels, 4)
    with_maps, without = tmp_path / "with.npz", tmp_path / "without.npz"
    assert clustering.evaluate(features, {"restarts": 2}, seed=1, side_file=with_maps) == clustering.evaluate(
        features, {"restarts": 2}, seed=1, side_file=without, maps=False
    )
    full, lean = load_features(with_maps), load_features(without)
    assert np.array_equal(full["assignments"], lean["assignments"])
    assert "tsne" in full and full["meta"]["tsne"]["method"] == "barnes_hut"
    assert not {"tsne", "tsne_index", "tsne_labels"} & set(lean) and lean["meta"]["tsne"] is None


def test_only_the_first_seed_of_a_run_computes_the_maps_the_report_draws():
    from sslbench.plan.protocols import MAP_PROTOCOLS, maps_argument

    assert [maps_argument("clustering", s, [2, 0, 1]) for s in (0, 1, 2)] == ["", "--no-maps", "--no-maps"]
    assert maps_argument("knn", 1, [0, 1]) == ""  # no maps: nothing to leave out
    # the protocols named there are those whose evaluate() takes `maps`
    import inspect

    from sslbench.evaluate import protocol_module

    for name in ("clustering", "knn", "linear", "lowshot_svm", "lowshot_logreg", "semisup"):
        takes = "maps" in inspect.signature(protocol_module(name).evaluate).parameters
        assert takes == (name in MAP_PROTOCOLS), name
