"""Clustering quality of frozen features: faiss k-means (sslbench.kmeans, on every point: no
subsampling) on the L2-normalised test split, scored against the true classes with AMI, NMI and ARI
(evaluation.cluster_scores: sklearn's definitions in numpy, without sklearn's second of import).

Each of `restarts` independent k-means runs gets its own seed derived from the run seed;
metrics are the mean over runs. "ami", "nmi", "ari" use k = number of classes; "ami_k{m}x"
over-clusters with k = m x classes (capped at the number of test samples).

Beside its result JSON (``side_file``: eval/clustering.npz) the protocol writes what the report
draws: the k = classes cluster id of every test point in each restart and, for the runs whose maps the
report draws (``maps``: the first seed; the Snakefile passes --no-maps to the others), a t-SNE map of
a fixed subset of at most TSNE_POINTS test points (the same subset for every run of a dataset). The
map is not a metric: computing it for every seed would cost most of the protocol's time for figures
nobody draws.
"""

from __future__ import annotations

import numpy as np

from sslbench.kmeans import kmeans
from sslbench.knn import l2_normalize

from .cluster_scores import adjusted_mutual_info, adjusted_rand, normalized_mutual_info
from .common import check_metrics, resolve_settings, seed_for, unpack_features

PROTOCOL = "clustering"
WRITES_SIDE_FILE = True  # sslbench.evaluate.run_protocol passes side_file
TSNE_POINTS = 500
DEFAULTS: dict = {
    "restarts": 5,  # independent k-means runs, each with its own seed; metrics averaged
    "nredo": 1,  # faiss: best-of-nredo (lowest objective) inside one run
    "niter": 50,  # Lloyd iterations
    "spherical": False,  # faiss: renormalise centroids after each iteration
    "overcluster": [2, 5],  # extra k = m x classes, reported as ami_k{m}x
}
RULES: dict = {  # over the types of DEFAULTS: what the plan and the job judge the settings by
    "restarts": {"minimum": 1},
    "nredo": {"minimum": 1},
    "niter": {"minimum": 1},
}


def evaluate(
    features: dict, settings: dict, seed: int, side_file=None, maps: bool = True
) -> tuple[dict[str, float], dict]:
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
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
    assignments = []
    for restart in restarts:
        clusters = run(num_classes, restart)
        assignments.append(clusters)
        scores["ami"].append(adjusted_mutual_info(labels, clusters))
        scores["nmi"].append(normalized_mutual_info(labels, clusters))
        scores["ari"].append(adjusted_rand(labels, clusters))
    for multiple in used["overcluster"]:
        scores[f"ami_k{multiple:g}x"] = [
            adjusted_mutual_info(labels, run(int(round(multiple * num_classes)), restart))
            for restart in restarts
        ]
    metrics = {name: float(np.mean(values)) for name, values in scores.items()}

    used["k"] = {
        name: min(int(round(m * num_classes)), len(x))
        for name, m in [("ami", 1)] + [(f"ami_k{m:g}x", m) for m in used["overcluster"]]
    }
    used["split"] = "test"
    used["mi_average_method"] = "arithmetic"
    metrics = check_metrics(metrics, PROTOCOL)
    if side_file is not None:
        how = {k: used[k] for k in ("restarts", "nredo", "niter", "spherical")}
        kmeans_settings = {**how, "k": used["k"]["ami"], "seed": seed}
        write_side_file(side_file, data, np.stack(assignments), kmeans_settings, maps)
    return metrics, used


def write_side_file(path, data: dict, assignments: np.ndarray, kmeans_settings: dict, maps: bool) -> None:
    """The k = classes cluster ids [restarts, test points] and, with ``maps``, a t-SNE map of a fixed
    test subset."""
    from sslbench.extract.featurefile import save_features

    arrays = {"assignments": assignments.astype(np.int64), "num_classes": data["num_classes"]}
    meta = {"kmeans": {**kmeans_settings, "points": "every test point (no subsampling)"}, "tsne": None}
    if maps:
        tsne, arrays["tsne"], arrays["tsne_index"] = tsne_map(data["test"])
        arrays["tsne_labels"] = data["test_labels"][arrays["tsne_index"]]
        meta["tsne"] = tsne
    save_features(path, {**arrays, "meta": meta})


def tsne_map(test: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
    """(settings, 2-d map, indices) of a t-SNE of the L2-normalised features of a fixed test subset."""
    from sklearn.manifold import TSNE

    # the same subset for every method of a dataset (same test set, fixed seed): the maps show the same images
    pick = np.sort(
        np.random.default_rng(0).choice(len(test), size=min(len(test), TSNE_POINTS), replace=False)
    )
    perplexity = min(30.0, (len(pick) - 1) / 3)
    # Barnes-Hut (sklearn's default, angle 0.5) approximates the exact gradients; at 500 points it takes
    # 2/5 of their time; 500 iterations settle the map (sklearn's minimum is 250)
    tsne = dict(
        n_components=2, perplexity=perplexity, init="pca", method="barnes_hut", max_iter=500, random_state=0
    )
    xy = TSNE(**tsne).fit_transform(l2_normalize(test[pick]).astype(np.float64))
    return tsne, xy.astype(np.float32), pick.astype(np.int64)
