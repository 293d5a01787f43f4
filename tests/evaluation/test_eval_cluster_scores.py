"""AMI, NMI and ARI in numpy: sklearn's values, hand-computed tables, invariants and special cases."""

import itertools
import math

import numpy as np
import pytest

from evaluation.cluster_scores import (
    adjusted_mutual_info,
    adjusted_rand,
    contingency,
    expected_mutual_info,
    mutual_info,
    normalized_mutual_info,
)

SCORES = (adjusted_mutual_info, normalized_mutual_info, adjusted_rand)


def labelings(seed: int):
    """(name, labels_true, labels_pred) pairs of many kinds: independent, agreeing up to noise, k above
    and below the classes, singleton clusters, one cluster, identical, renamed, odd label values."""
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 7, 30, 450, 2000):
        for classes, clusters in ((1, 1), (1, 5), (4, 1), (2, 2), (10, 10), (10, 20), (10, 50), (3, n)):
            y = rng.integers(0, classes, n)
            z = rng.integers(0, clusters, n)
            noisy = np.where(rng.random(n) < 0.3, z, y * 7 + 3)  # mostly the classes, renamed, some noise
            yield f"independent n={n} {classes}x{clusters}", y, z
            yield f"noisy n={n} {classes}x{clusters}", y, noisy
            yield f"identical n={n} {classes}", y, y
            yield f"renamed n={n} {classes}", y, rng.permutation(classes * 3)[y] - 5  # negative ids too
            yield f"singletons n={n} {classes}", y, rng.permutation(n)
    yield "both singletons", np.arange(40), np.arange(40)[::-1]
    yield "strings", np.array(list("aabbbcc")), np.array(["x", "y", "y", "y", "x", "z", "z"])
    yield "empty", np.array([], dtype=int), np.array([], dtype=int)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_equal_sklearns_on_many_labelings(seed):
    from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score

    theirs = (adjusted_mutual_info_score, normalized_mutual_info_score, adjusted_rand_score)
    worst = 0.0
    for name, y, z in labelings(seed):
        for ours, reference in zip(SCORES, theirs):
            expected = reference(y, z)
            got = ours(y, z)
            assert type(got) is float, (name, ours.__name__)
            assert got == pytest.approx(expected, rel=0, abs=1e-10), (name, ours.__name__, got, expected)
            worst = max(worst, abs(got - expected))
    assert worst > 0  # not one code path by accident: sklearn's summation order differs from ours


def test_expected_mutual_info_equals_sklearns_at_the_protocols_sizes():
    from scipy.sparse import csr_matrix
    from sklearn.metrics.cluster import expected_mutual_information

    rng = np.random.default_rng(3)
    for n, classes, clusters in ((1000, 10, 10), (1000, 10, 50), (10000, 10, 20), (10000, 10, 50)):
        y, z = rng.integers(0, classes, n), rng.integers(0, clusters, n)
        true_sizes, pred_sizes, cells, (rows, cols) = contingency(y, z)
        table = csr_matrix((cells, (rows, cols)), shape=(classes, clusters))
        ours = expected_mutual_info(true_sizes, pred_sizes)
        assert ours == pytest.approx(expected_mutual_information(table, n), rel=1e-9, abs=0)


def test_expected_mutual_info_is_the_mean_mi_over_every_relabeling_with_the_same_sizes():
    # the hypergeometric model: clusters of fixed sizes drawn uniformly, i.e. every permutation of the
    # cluster ids equally likely; 7 points: all 5040 permutations, the mean exact
    y, z = np.array([0, 0, 0, 1, 1, 2, 2]), np.array([0, 0, 1, 1, 1, 1, 2])
    true_sizes, pred_sizes, _, _ = contingency(y, z)
    mis = []
    for order in itertools.permutations(range(7)):
        t, p, cells, index = contingency(y, z[list(order)])
        mis.append(mutual_info(t, p, cells, index))
    assert expected_mutual_info(true_sizes, pred_sizes) == pytest.approx(np.mean(mis), rel=1e-12)


def test_scores_of_a_table_computed_by_hand():
    # classes  0 0 0 1 1 1          contingency  cluster 0  1  2   class sizes a = (3, 3)
    # clusters 0 0 1 1 2 2          class 0          2  1  0   cluster sizes b = (2, 2, 2), n = 6
    #                               class 1          0  1  2
    y, z = [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]
    log2, log3 = math.log(2), math.log(3)
    # MI = sum n_ij/n log(n n_ij / (a_i b_j)): the 2-cells give 2/6 log(12/6), the 1-cells log(6/6) = 0
    mi = 2 * (2 / 6) * log2
    # H_true = log 2, H_pred = log 3; NMI = MI / mean = (2/3 log 2) / (log 6 / 2)
    assert normalized_mutual_info(y, z) == pytest.approx(mi / ((log2 + log3) / 2), rel=1e-14)
    assert normalized_mutual_info(y, z) == pytest.approx(4 * log2 / (3 * math.log(6)), rel=1e-14)
    # E[MI]: each of the 6 (class, cluster) pairs draws b = 2 of n = 6 points, a = 3 of them in the
    # class: P(m = 2) = C(3,2) / C(6,2) = 1/5 gives 2/6 log(6 * 2 / 6); m = 1 gives log 1 = 0.
    # E[MI] = 6 x 1/5 x 1/3 log 2 = 2/5 log 2
    emi = 6 * (1 / 5) * (1 / 3) * log2
    assert expected_mutual_info(*contingency(y, z)[:2]) == pytest.approx(emi, rel=1e-14)
    # AMI = (2/3 - 2/5) log 2 / (log 6 / 2 - 2/5 log 2) = 8 log 2 / (3 log 2 + 15 log 3)
    assert adjusted_mutual_info(y, z) == pytest.approx(8 * log2 / (3 * log2 + 15 * log3), rel=1e-13)
    # pairs: within cells C(2,2) + C(2,2) = 2; within classes 2 C(3,2) = 6; within clusters 3 C(2,2) = 3;
    # all C(6,2) = 15. E = 6 x 3 / 15 = 6/5; ARI = (2 - 6/5) / ((6 + 3)/2 - 6/5) = (4/5) / (33/10) = 8/33
    assert adjusted_rand(y, z) == 8 / 33
    # perfectly discordant: every cell one point, so no pair shares a cell: (0 - 2/3) / (2 - 2/3) = -1/2
    assert adjusted_rand([0, 0, 1, 1], [0, 1, 0, 1]) == -0.5


def test_scores_ignore_the_names_of_the_clusters_and_the_order_of_the_arguments():
    rng = np.random.default_rng(4)
    for _ in range(20):
        y = rng.integers(0, 10, 500)
        z = np.where(rng.random(500) < 0.5, y, rng.integers(0, 20, 500))
        renamed = rng.permutation(20)[z] * 3 + 100
        for score in SCORES:
            value = score(y, z)
            assert score(y, renamed) == pytest.approx(value, rel=1e-12, abs=1e-15), score.__name__
            # the arithmetic mean of the entropies makes AMI and NMI symmetric, as ARI is
            assert score(z, y) == pytest.approx(value, rel=1e-12, abs=1e-15), score.__name__


def test_identical_labelings_score_one():
    rng = np.random.default_rng(5)
    for y in (rng.integers(0, 10, 450), np.arange(30), np.zeros(9, int), np.array([4, 4, 1]), np.array([1])):
        for score in SCORES:
            assert score(y, y) == pytest.approx(1.0, rel=0, abs=1e-12), (score.__name__, y)
            assert score(y, 5 - 2 * y) == pytest.approx(1.0, rel=0, abs=1e-12), (score.__name__, y)


def test_adjusted_scores_of_independent_labelings_average_zero_where_nmi_does_not():
    # 200 independent pairs, n = 300, 10 classes x 20 clusters: AMI's and ARI's means are 0 to within
    # 4.4 and 5 standard errors (their spreads 0.013 and 0.0043, measured on these draws); NMI's is 0.13
    rng = np.random.default_rng(6)
    draws = [(rng.integers(0, 10, 300), rng.integers(0, 20, 300)) for _ in range(200)]
    assert abs(np.mean([adjusted_mutual_info(y, z) for y, z in draws])) < 0.004
    assert abs(np.mean([adjusted_rand(y, z) for y, z in draws])) < 0.0015
    assert np.mean([normalized_mutual_info(y, z) for y, z in draws]) > 0.1


def test_special_cases_are_sklearns():
    split, one = np.array([0, 0, 1, 1, 2]), np.zeros(5, int)
    # neither labeling splits the data: a perfect match
    assert [score(one, one + 3) for score in SCORES] == [1.0, 1.0, 1.0]
    # one labeling a single cluster: no information shared, and none expected (ARI's 0 is its formula's)
    for y, z in ((one, split), (split, one)):
        assert [score(y, z) for score in SCORES] == [0.0, 0.0, 0.0]
    # every point its own cluster in both: E[MI] = MI = mean entropy, AMI's 0/0 is 1; ARI's too
    assert [score(np.arange(6), np.arange(6)[::-1]) for score in SCORES] == [1.0, 1.0, 1.0]
    assert [score([], []) for score in SCORES] == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="of one length"):
        adjusted_mutual_info([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="1-d"):
        adjusted_rand(np.zeros((2, 2)), np.zeros((2, 2)))
