"""k-means (faiss): the one implementation, used by PCL's E-step (through
``sslbench.kit.clustering.kmeans``, which takes and returns torch tensors), the clustering protocol and
the benchmark. numpy in and out, without torch, so that a clustering job never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FAISS_MAX_POINTS_PER_CENTROID = 256  # faiss's own default


@dataclass
class KMeansResult:
    """centroids [k, D] float32; assignments [N] int64; distances [N] float32 = Euclidean distance of
    each point to its assigned centroid; inertia = sum of squared distances. numpy arrays here;
    torch tensors on the input's device from ``sslbench.kit.clustering.kmeans``."""

    centroids: np.ndarray | torch.Tensor  # noqa: F821 (torch only in the annotation)
    assignments: np.ndarray | torch.Tensor  # noqa: F821
    distances: np.ndarray | torch.Tensor  # noqa: F821
    inertia: float


def kmeans(
    x: np.ndarray,
    k: int,
    niter: int = 20,
    nredo: int = 1,
    seed: int = 0,
    spherical: bool = False,
    gpu: bool = False,
    max_points_per_centroid: int | None = FAISS_MAX_POINTS_PER_CENTROID,
) -> KMeansResult:
    """faiss.Kmeans on the rows of ``x`` [N, D]; the same inputs and seed give the same result.

    Subsampling is explicit: with more than k * ``max_points_per_centroid`` points, faiss trains on
    a random sample of that many (256 is faiss's default; PCL sets 1000); None trains on every point
    (the clustering protocol). Every point is then assigned to its nearest centroid (by inner
    product when spherical, as faiss trains it). ``nredo`` runs keep the lowest objective.
    """
    import faiss

    if x.ndim != 2:
        raise ValueError(f"kmeans needs features [N, D], got shape {tuple(x.shape)}")
    num_points, dim = x.shape
    if not 1 <= k <= num_points:
        raise ValueError(f"kmeans needs 1 <= k <= N, got k={k} for N={num_points} points; lower k")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("kmeans features contain NaN or inf")
    clusterer = faiss.Kmeans(
        dim,
        k,
        niter=niter,
        nredo=nredo,
        seed=seed,
        spherical=spherical,
        gpu=gpu,
        verbose=False,
        min_points_per_centroid=1,  # faiss would warn below 39 points per centroid: small sets are expected
        max_points_per_centroid=num_points
        if max_points_per_centroid is None
        else int(max_points_per_centroid),
    )
    clusterer.train(x)
    _, nearest = clusterer.index.search(x, 1)
    centroids = np.ascontiguousarray(clusterer.centroids, dtype=np.float32)
    assignments = nearest[:, 0].astype(np.int64)
    # Exact distances from the points themselves: faiss's search distances are squared, computed
    # through ||x||^2 + ||c||^2 - 2x·c, and lose precision.
    distances = np.linalg.norm(x - centroids[assignments], axis=1)
    return KMeansResult(
        centroids, assignments, distances, float(np.square(distances, dtype=np.float64).sum())
    )
