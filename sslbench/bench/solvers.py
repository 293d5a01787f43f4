"""The knn, kmeans and sinkhorn sections: our solvers against scikit-learn on random data (each
with the time of the bare matrix product it cannot avoid, its floor), Sinkhorn with SeLa's settings."""

from __future__ import annotations

import functools

import numpy as np
import torch

from sslbench.bench.core import METHODS_DIR, Bench, interleaved, median, row, sync, timed
from sslbench.plan.settings import resolve_method_config

KNN_SPEEDUP_TARGET = (">=", 10.0)
KNN_AGREEMENT_TARGET = (">=", 1.0)
KMEANS_SPEEDUP_TARGET = (">=", 5.0)
KMEANS_GAP_TARGET = ("<=", 0.01)  # |relative inertia gap|


def random_features(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((n, dim), dtype=np.float32)


def exp_vote_weights(cosine_distances: np.ndarray, temperature: float) -> np.ndarray:
    """knn_classify's vote weight exp(similarity / T), from scikit-learn's cosine distance 1 - sim."""
    return np.exp((1.0 - cosine_distances.astype(np.float64)) / temperature)


def bench_knn(bench: Bench) -> list[dict]:
    from sslbench.evaluate import protocol_module

    knn = protocol_module("knn")
    s = bench.sizes
    rng = np.random.default_rng(bench.seed)
    train, test = random_features(s.knn_train, s.dim, rng), random_features(s.knn_test, s.dim, rng)
    labels = rng.integers(0, s.classes, s.knn_train)
    data = (train, labels, test)
    variants = bench.config.get("evaluation", {}).get("knn", {}).get("variants", knn.DEFAULTS["variants"])
    rows = []
    for variant in variants:
        rows += knn_variant_rows(
            knn.knn_classify, int(variant["k"]), float(variant["temperature"]), data, bench
        )
    floor = gemm_seconds(test, train)
    rows.append(
        row(
            "knn",
            "similarity GEMM floor",
            floor,
            "s",
            reference=rows[0]["value"],
            ratio=rows[0]["value"] / floor,
            ratio_is="faiss knn s / test @ train.T s",
            notes=f"the matmul every exact kNN does, alone: no exact method beats sklearn by more than "
            f"{rows[0]['reference'] / floor:.2g}x here; a ratio near 1: faiss is GEMM-bound",
        )
    )
    return rows


def knn_variant_rows(knn_classify, k: int, temperature: float, data: tuple, bench: Bench) -> list[dict]:
    """Speed-up and prediction agreement of one (k, T) variant, faiss against scikit-learn."""
    from sklearn.neighbors import KNeighborsClassifier

    train, labels, test = data
    s = bench.sizes
    out: dict = {}

    def ours(_):
        seconds, scores = timed(lambda: knn_classify(train, labels, test, k, temperature, s.classes))
        out["ours"] = scores.argmax(axis=1)
        return seconds

    def sklearn(_):
        weights = functools.partial(exp_vote_weights, temperature=temperature)
        clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute", weights=weights)
        seconds, out["sklearn"] = timed(lambda: clf.fit(train, labels).predict(test))
        return seconds

    pairs = interleaved(ours, sklearn, 0, bench.repeats.solvers)
    name = f"k{k} T{temperature:g}"
    faiss_s, sklearn_s = median(a for a, _ in pairs), median(b for _, b in pairs)
    agreement = float(np.mean(out["ours"] == out["sklearn"]))
    shape = f"{s.knn_train} train x {s.knn_test} test x {s.dim}-d, {s.classes} classes, random float32"
    return [
        row(
            "knn",
            f"{name} speed-up",
            faiss_s,
            "s",
            reference=sklearn_s,
            ratio=sklearn_s / faiss_s,
            ratio_is="sklearn brute s / faiss s",
            target=KNN_SPEEDUP_TARGET,
            notes=f"{shape}; fit+predict vs knn_classify+argmax",
        ),
        row(
            "knn",
            f"{name} agreement",
            agreement,
            "fraction",
            ratio=agreement,
            ratio_is="equal predictions / test points",
            target=KNN_AGREEMENT_TARGET,
            notes=f"{int(round((1 - agreement) * s.knn_test))} of {s.knn_test} predictions differ",
        ),
    ]


def gemm_seconds(a: np.ndarray, b: np.ndarray) -> float:
    """Best of two: a @ b.T in float32 (numpy's BLAS), the floor of an exact search or assignment."""
    return min(timed(lambda: a @ b.T)[0] for _ in range(2))


def inertia(points: np.ndarray, centroids: np.ndarray) -> float:
    """Sum of squared distances to the nearest centroid: nearest by float32 GEMM, distance in float64."""
    x, c = torch.from_numpy(points), torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    total = 0.0
    for chunk in x.split(8192):
        nearest = (c.square().sum(1) - 2 * chunk @ c.T).argmin(dim=1)  # ||x||^2 is the same for every c
        total += float((chunk.double() - c[nearest].double()).square().sum())
    return total


def bench_kmeans(bench: Bench) -> list[dict]:
    from sklearn.cluster import KMeans

    from sslbench.kit.clustering import kmeans

    s = bench.sizes
    points = random_features(s.kmeans_points, s.dim, np.random.default_rng(bench.seed + 1))
    out: dict = {}

    def ours(_):
        seconds, found = timed(
            lambda: kmeans(
                torch.from_numpy(points),
                s.kmeans_k,
                niter=s.kmeans_iters,
                seed=bench.seed,
                max_points_per_centroid=None,  # every point, as scikit-learn
            )
        )
        out["ours"] = found.centroids.numpy()
        return seconds

    def sklearn(_):
        model = KMeans(
            n_clusters=s.kmeans_k,
            init="random",
            n_init=1,
            max_iter=s.kmeans_iters,
            tol=0.0,
            algorithm="lloyd",
            random_state=bench.seed,
        )
        seconds, fitted = timed(lambda: model.fit(points))
        out["sklearn"], out["sklearn_iters"] = fitted.cluster_centers_, fitted.n_iter_
        return seconds

    pairs = interleaved(ours, sklearn, 0, bench.repeats.solvers)
    faiss_s, sklearn_s = median(a for a, _ in pairs), median(b for _, b in pairs)
    ours_inertia, sklearn_inertia = inertia(points, out["ours"]), inertia(points, out["sklearn"])
    gap = (ours_inertia - sklearn_inertia) / sklearn_inertia
    shape = (
        f"{s.kmeans_points} x {s.dim}-d random float32, k {s.kmeans_k}, {s.kmeans_iters} iterations "
        f"(sklearn ran {out['sklearn_iters']}), random init, every point used by both"
    )
    floor = s.kmeans_iters * gemm_seconds(points, out["ours"])
    return [
        row(
            "kmeans",
            f"k{s.kmeans_k} speed-up",
            faiss_s,
            "s",
            reference=sklearn_s,
            ratio=sklearn_s / faiss_s,
            ratio_is="sklearn lloyd s / faiss s",
            target=KMEANS_SPEEDUP_TARGET,
            notes=shape,
        ),
        row(
            "kmeans",
            "assignment GEMM floor",
            floor,
            "s",
            reference=faiss_s,
            ratio=faiss_s / floor,
            ratio_is="faiss s / iterations x points @ centroids.T s",
            notes=f"the matmul of every Lloyd iteration, alone: no exact Lloyd beats sklearn by more than "
            f"{sklearn_s / floor:.2g}x here; a ratio near 1: faiss is GEMM-bound",
        ),
        row(
            "kmeans",
            f"k{s.kmeans_k} inertia gap",
            ours_inertia,
            "sum sq. dist.",
            reference=sklearn_inertia,
            ratio=abs(gap),
            ratio_is="|faiss - sklearn| / sklearn inertia",
            target=KMEANS_GAP_TARGET,
            notes=f"faiss is {gap:+.3%} against sklearn; both inertias by bench.inertia()",
        ),
    ]


def sela_settings(config: dict) -> dict:
    """lam, sinkhorn_tol and sinkhorn_max_iters as SeLa's resolved config sets them."""
    params = (
        resolve_method_config(config, METHODS_DIR, "sela")["params"]
        if (METHODS_DIR / "sela").is_dir()
        else {}
    )
    return {
        "lam": float(params.get("lam", 10)),
        "tol": float(params.get("sinkhorn_tol", 1e-4)),
        "max_iters": int(params.get("sinkhorn_max_iters", 1000)),
    }


def bench_sinkhorn(bench: Bench) -> list[dict]:
    import warnings

    from sslbench.distributed import select_device
    from sslbench.kit.clustering import sinkhorn

    s, settings = bench.sizes, sela_settings(bench.config)
    generator = torch.Generator().manual_seed(bench.seed + 2)
    logits = torch.randn(s.sinkhorn_points, s.sinkhorn_clusters, generator=generator, dtype=torch.float64)
    probs = torch.softmax(logits.to(select_device(bench.device)), dim=1)  # on the device SeLa trains on
    del logits
    device = probs.device

    def solve(**kw) -> tuple[float, int]:
        seconds, found = timed(lambda: (sinkhorn(probs, settings["lam"], **kw), sync(device))[0])
        return seconds, found.iterations

    # One run: there is no rival to interleave with (at 50k x 3000 the arrays take ~2.4 GB).
    seconds, iterations = solve(tol=settings["tol"], max_iters=settings["max_iters"])
    full_pass = min(timed(lambda: (torch.exp(probs), sync(device)))[0] for _ in range(3))
    # The log-domain form (the fallback) against the matrix-vector form, the same few iterations each
    # on the same probs, both forming their kernel and plan.
    few = min(3, iterations)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # tol 0: they run out of iterations on purpose
        log_seconds, _ = solve(tol=0.0, max_iters=few, domain="log")
        few_seconds, _ = solve(tol=0.0, max_iters=few)
    per_iteration = seconds / iterations
    name = f"{s.sinkhorn_points}x{s.sinkhorn_clusters}"
    notes = (
        f"SeLa's settings: lam {settings['lam']:g}, tol {settings['tol']:g}, max_iters "
        f"{settings['max_iters']}; probs = softmax of standard normal logits, float64, on {device}"
    )
    return [
        row(
            "sinkhorn",
            f"{name} seconds",
            seconds,
            "s",
            reference=full_pass,
            ratio=per_iteration / full_pass,
            ratio_is="one iteration / one exp over the N x K matrix",
            notes=notes + "; seconds include forming the kernel and the plan",
        ),
        row(
            "sinkhorn",
            f"{name} iterations",
            iterations,
            "iterations",
            notes=f"{per_iteration:.3g} s per iteration",
        ),
        row(
            "sinkhorn",
            f"{name} log-domain iteration",
            log_seconds / few,
            "s/iteration",
            reference=few_seconds / few,
            ratio=log_seconds / few_seconds,
            ratio_is="log-domain s / matrix-vector s, the same iterations",
            notes=f"the fallback form (logsumexp) against SeLa's matrix-vector form, {few} iterations each "
            "on the same probs, each including forming its kernel and plan",
        ),
    ]
