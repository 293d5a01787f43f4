"""Clustering quality of frozen features: faiss k-means (sslbench.kmeans, on every point: no
subsampling) on the L2-normalised test split, scored against the true classes with AMI, NMI and ARI
(sklearn).

Each of `restarts` independent k-means runs gets its own seed derived from the run seed;
metrics are the mean over runs. "ami", "nmi", "ari" use k = number of classes; "ami_k{m}x"
over-clusters with k = m x classes (capped at the number of test samples).
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score

from sslbench.kmeans import kmeans

from .common import check_metrics, l2_normalize, resolve_settings, seed_for, unpack_features

PROTOCOL = "clustering"
DEFAULTS: dict = {
    "restarts": 5,  # independent k-means runs, each with its own seed; metrics averaged
    "nredo": 1,  # faiss: best-of-nredo (lowest objective) inside one run
    "niter": 50,  # Lloyd iterations
    "spherical": False,  # faiss: renormalise centroids after each iteration
    "overcluster": [2, 5],  # extra k = m x classes, reported as ami_k{m}x
}


def evaluate(features: dict, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    if int(used["restarts"]) < 1 or int(used["niter"]) < 1 or int(used["nredo"]) < 1:
        raise ValueError("clustering: restarts, niter and nredo must all be >= 1")
    data = unpack_features(features)
    x = np.ascontiguousarray(l2_normalize(data["test"]))
    labels, num_classes = data["test_labels"], data["num_classes"]

    def run(k: int, restart: int) -> np.ndarray:
        """Cluster ids of the test points: the one k-means, on every point (no subsampling)."""
        return kmeans(
            x,
            min(k, len(x)),
            niter=int(used["niter"]),
            nredo=int(used["nredo"]),
            spherical=bool(used["spherical"]),
            seed=seed_for(seed, k, restart),
            max_points_per_centroid=None,
        ).assignments

    restarts = range(int(used["restarts"]))
    scores = {"ami": [], "nmi": [], "ari": []}
    for restart in restarts:
        clusters = run(num_classes, restart)
        scores["ami"].append(adjusted_mutual_info_score(labels, clusters))
        scores["nmi"].append(normalized_mutual_info_score(labels, clusters))
        scores["ari"].append(adjusted_rand_score(labels, clusters))
    for multiple in used["overcluster"]:
        scores[f"ami_k{multiple:g}x"] = [
            adjusted_mutual_info_score(labels, run(int(round(multiple * num_classes)), restart))
            for restart in restarts
        ]
    metrics = {name: float(np.mean(values)) for name, values in scores.items()}

    used["k"] = {
        name: min(int(round(m * num_classes)), len(x))
        for name, m in [("ami", 1)] + [(f"ami_k{m:g}x", m) for m in used["overcluster"]]
    }
    used["split"] = "test"
    used["mi_average_method"] = "arithmetic"
    return check_metrics(metrics, PROTOCOL), used
