"""The weighted kNN vote (InstDisc, Wu et al. 2018; MoCo's kNN monitor), shared by the kNN protocol
(evaluation/knn.py) and the monitor of a run in training (pretrain/monitors.py).

Features are L2-normalised, so the inner product is the cosine similarity. The k most similar
train samples vote for their class with weight exp(similarity / temperature); the class scores are
the summed votes. Neighbours come from an exact faiss IndexFlatIP.
"""

from __future__ import annotations

import faiss
import numpy as np


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit Euclidean norm (all-zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)


def nearest_neighbours(
    train_features: np.ndarray, test_features: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(cosine similarities, train indices) [n_test, min(k, n_train)] of each test point's nearest
    train points, most similar first (exact search: faiss IndexFlatIP on L2-normalised features)."""
    train = np.ascontiguousarray(l2_normalize(train_features))
    test = np.ascontiguousarray(l2_normalize(test_features))
    index = faiss.IndexFlatIP(train.shape[1])
    index.add(train)
    return index.search(test, min(int(k), len(train)))


def vote(
    similarities: np.ndarray,
    neighbours: np.ndarray,
    train_labels: np.ndarray,
    temperature: float,
    num_classes: int,
) -> np.ndarray:
    """Class scores [n_test, num_classes]: every listed neighbour votes exp(sim / T) for its class."""
    weights = np.exp(similarities.astype(np.float64) / temperature)
    neighbour_labels = np.asarray(train_labels, dtype=np.int64)[neighbours]
    scores = np.zeros((len(similarities), num_classes), dtype=np.float64)
    rows = np.arange(len(similarities))
    for j in range(neighbours.shape[1]):  # each column touches every row once: no colliding += here
        scores[rows, neighbour_labels[:, j]] += weights[:, j]
    return scores
