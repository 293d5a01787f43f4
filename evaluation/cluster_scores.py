"""Agreement of a clustering with the true classes: adjusted and normalised mutual information and the
adjusted Rand index, in numpy alone.

The definitions are sklearn's (1.x) ``adjusted_mutual_info_score``, ``normalized_mutual_info_score``
(both with average_method "arithmetic") and ``adjusted_rand_score``, special cases included; the values
agree with sklearn's to 1e-10 (tests/evaluation/test_eval_cluster_scores.py). Importing
sklearn.metrics takes about a second, several times the rest of the clustering protocol's job on
digits; scipy.special (gammaln) would still take a fifth of a second, so the log-factorials come from
math.lgamma.

Mutual information and entropies are in nats. Labels may be any values np.unique sorts (ints, strings);
a cluster or class is a distinct value, whatever its number.
"""

from __future__ import annotations

import math

import numpy as np

EPS = np.finfo(np.float64).eps


def contingency(labels_true, labels_pred) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """(class sizes, cluster sizes, sizes of the non-empty (class, cluster) cells, their (row, column)
    indices), int64. Only the non-empty cells: a dense table of n singleton clusters would hold
    n x classes counts."""
    labels_true, labels_pred = np.asarray(labels_true), np.asarray(labels_pred)
    if labels_true.ndim != 1 or labels_pred.ndim != 1 or len(labels_true) != len(labels_pred):
        raise ValueError(
            f"labelings must be 1-d and of one length, got shapes {labels_true.shape} and {labels_pred.shape}"
        )
    classes = np.unique(labels_true, return_inverse=True)[1].ravel().astype(np.int64)
    clusters = np.unique(labels_pred, return_inverse=True)[1].ravel().astype(np.int64)
    num_clusters = int(clusters.max()) + 1 if len(clusters) else 0
    keys, cells = np.unique(classes * num_clusters + clusters, return_counts=True)
    index = (keys // num_clusters, keys % num_clusters) if num_clusters else (keys, keys)
    return np.bincount(classes), np.bincount(clusters), cells.astype(np.int64), index


def entropy(sizes: np.ndarray) -> float:
    """Entropy of a labeling from its cluster sizes; 0 for one cluster."""
    if len(sizes) <= 1:
        return 0.0
    n = sizes.sum()
    return float(-np.sum(sizes / n * (np.log(sizes) - math.log(n))))


def mutual_info(true_sizes: np.ndarray, pred_sizes: np.ndarray, cells: np.ndarray, cell_index) -> float:
    """MI of the table whose non-empty cells ``cells`` sit at rows/columns ``cell_index``."""
    if len(true_sizes) == 1 or len(pred_sizes) == 1:
        return 0.0  # MI <= min(H_true, H_pred) = 0
    rows, cols = cell_index
    n = cells.sum()
    # sum over cells of p_ij log(p_ij / (p_i p_j)), the counts' logs summed separately
    terms = cells / n * (np.log(cells) + math.log(n) - np.log(true_sizes[rows]) - np.log(pred_sizes[cols]))
    # rounding can leave a tiny negative sum for independent labelings: MI is >= 0
    return float(max(terms.sum(), 0.0))


def expected_mutual_info(true_sizes: np.ndarray, pred_sizes: np.ndarray) -> float:
    """E[MI] over all labelings with these class and cluster sizes (the hypergeometric model of
    Vinh, Epps and Bailey 2010, sklearn's ``expected_mutual_information``).

    E[MI] = sum over (class i, cluster j) and cell count m of
    m/n log(n m / (a_i b_j)) P(m), with P(m) = a! b! (n-a)! (n-b)! / (n! m! (a-m)! (b-m)! (n-a-b+m)!),
    m from max(1, a+b-n) to min(a, b). A pair's sum depends only on its sizes (a, b), so it is computed
    once per distinct pair of sizes and weighted by how many (class, cluster) pairs share it; all its
    terms are evaluated together as one flat array."""
    if len(true_sizes) == 1 or len(pred_sizes) == 1:
        return 0.0
    n = int(true_sizes.sum())
    a_values, a_count = np.unique(true_sizes, return_counts=True)
    b_values, b_count = np.unique(pred_sizes, return_counts=True)
    a = np.repeat(a_values, len(b_values))
    b = np.tile(b_values, len(a_values))
    weight = np.outer(a_count, b_count).ravel()
    first = np.maximum(1, a + b - n)
    length = np.minimum(a, b) - first + 1  # >= 1: a, b >= 1 and a + b - n <= min(a, b)
    pair = np.repeat(np.arange(len(a)), length)
    m = first[pair] + np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
    a, b = a[pair], b[pair]
    # log k! for k = 0..n: n calls of math.lgamma cost a few ms, an import of scipy.special far more
    log_fact = np.fromiter(map(math.lgamma, range(1, n + 2)), dtype=np.float64, count=n + 1)
    log_p = (
        log_fact[a] + log_fact[b] + log_fact[n - a] + log_fact[n - b]
        - log_fact[n] - log_fact[m] - log_fact[a - m] - log_fact[b - m] - log_fact[n - a - b + m]
    )  # fmt: skip
    log_ratio = math.log(n) + np.log(m) - np.log(a) - np.log(b)
    return float(np.sum(weight[pair] * (m / n) * log_ratio * np.exp(log_p)))


def away_from_zero(x: float) -> float:
    """x, or +-eps where |x| < eps (its sign kept, 0 counted positive), as sklearn guards AMI: where E[MI]
    reaches the mean entropy (both labelings all singletons) its numerator and denominator are 0 but for
    rounding, and this makes their ratio 1."""
    return min(x, -EPS) if x < 0 else max(x, EPS)


def adjusted_mutual_info(labels_true, labels_pred) -> float:
    """AMI = (MI - E[MI]) / (mean(H_true, H_pred) - E[MI]): 0 in expectation for independent
    labelings, 1 for identical ones (up to the names of the clusters)."""
    true_sizes, pred_sizes, cells, cell_index = contingency(labels_true, labels_pred)
    if len(true_sizes) == len(pred_sizes) <= 1:
        return 1.0  # neither labeling splits the data: they agree
    if len(true_sizes) == 1 or len(pred_sizes) == 1:
        return 0.0
    mi = mutual_info(true_sizes, pred_sizes, cells, cell_index)
    emi = expected_mutual_info(true_sizes, pred_sizes)
    normalizer = (entropy(true_sizes) + entropy(pred_sizes)) / 2
    return float(away_from_zero(mi - emi) / away_from_zero(normalizer - emi))


def normalized_mutual_info(labels_true, labels_pred) -> float:
    """NMI = MI / mean(H_true, H_pred)."""
    true_sizes, pred_sizes, cells, cell_index = contingency(labels_true, labels_pred)
    if len(true_sizes) == len(pred_sizes) <= 1:
        return 1.0  # neither labeling splits the data: they agree
    mi = mutual_info(true_sizes, pred_sizes, cells, cell_index)
    if mi == 0:
        return 0.0  # also where one labeling is a single cluster (its entropy, so the mean, may be 0)
    return float(mi / ((entropy(true_sizes) + entropy(pred_sizes)) / 2))


def adjusted_rand(labels_true, labels_pred) -> float:
    """ARI: the Rand index adjusted for chance (Hubert and Arabie 1985), from the numbers of pairs of
    points that share a cell, a class, a cluster, and all pairs:
    (pairs_cells - E) / (mean(pairs_classes, pairs_clusters) - E), E = pairs_classes pairs_clusters / pairs.
    1.0 where that is 0 / 0 (both labelings one cluster, or both all singletons)."""
    true_sizes, pred_sizes, cells, _ = contingency(labels_true, labels_pred)

    def pairs(sizes) -> int:
        # Python ints: the products below pass 2**63 from n ~ 8 x 10**4 points
        return int(np.sum(sizes * (sizes - 1))) // 2

    n = int(true_sizes.sum())
    together, classes, clusters, every = pairs(cells), pairs(true_sizes), pairs(pred_sizes), n * (n - 1) // 2
    # the formula above times 2 x pairs: exact integers, one correctly rounded division
    numerator = 2 * (together * every - classes * clusters)
    denominator = (classes + clusters) * every - 2 * classes * clusters
    return 1.0 if denominator == 0 else numerator / denominator
