"""Clustering shared by the methods and the clustering protocol: pure functions.

- kmeans:               sslbench.kmeans (faiss, CPU or GPU, seeded) on torch tensors.
- concentration:        PCL's per-cluster concentration phi (Li et al., 2021).
- sinkhorn:             SeLa's optimal-transport pseudo-labelling (Asano et
                        al., 2020): matrix-vector scaling, log domain where
                        float64 would underflow.
- sinkhorn_labels:      argmax of the Sinkhorn plan's rows.
- equipartition_labels: SeLa's initial labels, an exact random equipartition.
- swav_sinkhorn:        SwAV's online codes (Caron et al., 2020): a few Sinkhorn
                        iterations on a batch (and queue), sums over ranks.
- balanced_assignment:  those iterations on any non-negative weights: SwAV's on
                        exp(cosine / epsilon), MSN's on its sharpened targets.

SeLa's and SwAV's Sinkhorn solve the same problem: the plan Q [N, K] closest, in
entropy-regularised transport, to the kernel exp(lam * score) (SwAV: score = the
cosine to a prototype, lam = 1 / epsilon; SeLa: score = log P), with equal mass
per sample and per cluster, found by scaling the kernel's rows and columns in
turn. Where they differ: SeLa iterates to a tolerance (its plan does not depend
on where it started), in float64 with a log-domain fallback, and takes each
sample's argmax as a hard label for an epoch; SwAV runs a fixed 3 iterations from
the raw kernel, sample sums last (each code sums to exactly 1, the clusters'
mass is only near-equal), in float32 on the batch, and trains on the soft codes
at every step. Under torch.distributed SwAV's sums over samples are all-reduced,
so the ranks' batches form one problem. With many iterations SwAV's codes are
SeLa's plan times N (tests/methods/test_swav.py checks it).
- pca_whiten:           DeepCluster's PCA-whitening of features before k-means (Caron et al., 2018).
- uniform_over_clusters: DeepCluster's sampler: every non-empty cluster drawn equally often.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from sslbench import distributed as dist
from sslbench.kmeans import KMeansResult
from sslbench.kmeans import kmeans as faiss_kmeans

__all__ = [
    "KMeansResult",
    "kmeans",
    "concentration",
    "SinkhornResult",
    "sinkhorn",
    "sinkhorn_labels",
    "equipartition_labels",
    "swav_sinkhorn",
    "balanced_assignment",
    "pca_whiten",
    "uniform_over_clusters",
]


def _faiss_num_gpus() -> int:
    import faiss

    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    return int(get_num_gpus()) if get_num_gpus is not None else 0


def kmeans(features: torch.Tensor, k: int, use_gpu: bool | None = None, **settings) -> KMeansResult:
    """``sslbench.kmeans.kmeans`` on a tensor (``settings``: its niter, nredo, seed, spherical and
    max_points_per_centroid, faiss's subsampling switch); the result's arrays are tensors on the
    features' device.

    use_gpu=None runs on the GPU when faiss was built with GPUs and `features`
    is a CUDA tensor; True demands a GPU; False forces the CPU.
    """
    if features.dim() != 2:
        raise ValueError(f"kmeans needs features [N, D], got shape {tuple(features.shape)}")
    num_gpus = _faiss_num_gpus()
    if use_gpu is None:
        use_gpu = features.is_cuda and num_gpus > 0
    elif use_gpu and num_gpus == 0:
        raise ValueError("use_gpu=True but this faiss has no GPU (install faiss-gpu, or pass use_gpu=False)")
    found = faiss_kmeans(features.detach().float().cpu().numpy(), k, gpu=bool(use_gpu), **settings)
    device = features.device
    return KMeansResult(
        torch.from_numpy(found.centroids).to(device),
        torch.from_numpy(found.assignments).to(device),
        torch.from_numpy(found.distances).to(device),
        found.inertia,
    )


def concentration(
    features: torch.Tensor,
    centroids: torch.Tensor,
    assignments: torch.Tensor,
    temperature: float,
    alpha: float = 10.0,
) -> torch.Tensor:
    """PCL's concentration phi of each of the k clusters (main_pcl.py run_kmeans).

    phi_j = mean_{z in j} ||z - c_j|| / log(Z_j + alpha), with the
    un-normalised centroid c_j and cluster size Z_j. Clusters with at most
    one member get the largest phi of the others; all phi are then clipped
    to their 10th-90th percentiles and rescaled so their mean is
    `temperature`. If every phi is 0 (each cluster a single point or fully
    collapsed) all clusters are equally concentrated: phi = temperature.
    Returns a float32 tensor [k] on the features' device.
    """
    if features.dim() != 2 or centroids.dim() != 2 or features.shape[1] != centroids.shape[1]:
        raise ValueError(
            f"concentration needs features [N, D] and centroids [k, D], got "
            f"{tuple(features.shape)} and {tuple(centroids.shape)}"
        )
    num_clusters = centroids.shape[0]
    assignments = assignments.reshape(-1).long().to(features.device)
    if assignments.shape[0] != features.shape[0]:
        raise ValueError(f"assignments has {assignments.shape[0]} entries, features {features.shape[0]} rows")
    if assignments.numel() and (assignments.min() < 0 or assignments.max() >= num_clusters):
        raise ValueError(f"assignments must lie in [0, {num_clusters}), the centroid ids")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    features = features.detach().double()
    centroids = centroids.detach().double().to(features.device)
    distances = (features - centroids[assignments]).norm(dim=1)
    sizes = torch.bincount(assignments, minlength=num_clusters).double()
    distance_sums = torch.zeros(num_clusters, dtype=torch.float64, device=features.device)
    distance_sums.index_add_(0, assignments, distances)

    has_spread = sizes > 1
    phi = torch.zeros(num_clusters, dtype=torch.float64, device=features.device)
    phi[has_spread] = distance_sums[has_spread] / sizes[has_spread] / torch.log(sizes[has_spread] + alpha)
    # phi is 0 wherever size <= 1, so the max over all clusters is the max of the others.
    phi[~has_spread] = phi.max()

    low, high = torch.quantile(phi, torch.tensor([0.1, 0.9], dtype=torch.float64, device=phi.device))
    phi = phi.clamp(low, high)  # extreme values would destabilise the loss
    if phi.mean() == 0:
        return torch.full((num_clusters,), float(temperature), dtype=torch.float32, device=features.device)
    return (temperature * phi / phi.mean()).float()


def _sinkhorn_log_scalings(
    log_kernel: torch.Tensor, tol: float, max_iters: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Find log a [N] and log b [K] so that exp(log a + log_kernel + log b)
    has row sums 1/N and column sums 1/K. Each iteration sets b exactly (the
    columns), then checks the rows before correcting a."""
    num_rows, num_cols = log_kernel.shape
    log_row_target = -math.log(num_rows)
    log_col_target = -math.log(num_cols)
    log_a = torch.full((num_rows,), log_row_target, dtype=log_kernel.dtype, device=log_kernel.device)
    log_b = torch.zeros(num_cols, dtype=log_kernel.dtype, device=log_kernel.device)
    iterations, row_error = 0, math.inf
    while iterations < max_iters:
        iterations += 1
        log_b = log_col_target - torch.logsumexp(log_kernel + log_a[:, None], dim=0)
        log_row_sums_without_a = torch.logsumexp(log_kernel + log_b[None, :], dim=1)
        # Relative error of the row marginals, N * row_sum - 1 (columns are exact now).
        row_error = (torch.exp(log_a + log_row_sums_without_a - log_row_target) - 1).abs().max()
        if row_error <= tol:
            break
        log_a = log_row_target - log_row_sums_without_a
    _warn_if_unconverged(iterations, max_iters, row_error, tol)
    return log_a, log_b, iterations


# The matrix-vector form drops kernel entries below ~1e-308 (float64 underflow). That is harmless
# while every column keeps an entry far above them: the dropped mass is then < N * 1e-308 / 1e-250
# of the column's. Columns without one (a cluster every image finds ~e^-575 times less likely than
# its favourite) go to the log domain.
_SMALLEST_COLUMN_MAX = 1e-250


def _sinkhorn_scalings(
    kernel: torch.Tensor, tol: float, max_iters: int
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """Sinkhorn's updates and stopping rule of _sinkhorn_log_scalings as matrix-vector products
    (SeLa's own form) on kernel = exp(log_kernel - row max), from a = 1/N: a [N], b [K] with
    diag(a) kernel diag(b) the plan (the same unique plan the log domain converges to). None when
    a scaling leaves the float64 range (the caller then works in the log domain)."""
    num_rows, num_cols = kernel.shape
    a = torch.full((num_rows,), 1.0 / num_rows, dtype=kernel.dtype, device=kernel.device)
    iterations, row_error = 0, math.inf
    while iterations < max_iters:
        iterations += 1
        b = (1.0 / num_cols) / (a @ kernel)
        row_sums_without_a = kernel @ b
        if not (
            torch.isfinite(b).all()
            and (row_sums_without_a > 0).all()
            and torch.isfinite(row_sums_without_a).all()
        ):
            return None
        row_error = (a * row_sums_without_a * num_rows - 1).abs().max()
        if row_error <= tol:
            break
        a = (1.0 / num_rows) / row_sums_without_a
    _warn_if_unconverged(iterations, max_iters, row_error, tol)
    return a, b, iterations


def _warn_if_unconverged(iterations: int, max_iters: int, row_error, tol: float) -> None:
    if iterations >= max_iters and not row_error <= tol:
        warnings.warn(
            f"sinkhorn stopped after max_iters={max_iters} with row marginals off by {float(row_error):.2e} "
            f"(relative; tol={tol}): raise max_iters or tol, or lower lam",
            RuntimeWarning,
            stacklevel=4,
        )


@dataclass
class SinkhornResult:
    """plan [N, K] in probs' dtype on probs' device; the iterations run; the domain they ran in:
    "matrix-vector" (SeLa's scaling) or "log" (logsumexp)."""

    plan: torch.Tensor
    iterations: int
    domain: str


SINKHORN_DOMAINS = ("auto", "log")


def sinkhorn(
    probs: torch.Tensor, lam: float, tol: float = 1e-6, max_iters: int = 1000, domain: str = "auto"
) -> SinkhornResult:
    """SeLa's pseudo-labelling plan (yukimasano/self-label).

    probs [N, K] has softmax rows. The plan is Q = diag(a) P^lam diag(b) [N, K]
    with row sums 1/N and column sums 1/K: the column sums are exact, the row
    sums within a relative `tol` (|N * row_sum - 1| <= tol), unless max_iters
    ran out first (then a RuntimeWarning says so and the row sums are exact
    instead). Peaked probs with a large lam converge slowly: Sinkhorn's rate
    falls with the spread of lam * log P.

    The kernel P^lam is formed as exp(lam * log P - row max), so no row
    underflows, and scaled by matrix-vector products (two passes over N x K
    per iteration, as SeLa's code). Where that would lose mass to float64
    underflow (a column with no entry above 1e-250) or a scaling overflows,
    Sinkhorn runs in the log domain instead (logsumexp: ~18x slower per
    iteration at 50k x 3000, never underflows); both converge to the same
    unique plan. domain="log" asks for the log domain from the start (the
    benchmark times it). The work is in float64: in float32 the
    rounding of lam * log P alone exceeds tol = 1e-6. Peak memory is two
    N x K float64 arrays (four in the log domain). Entries of probs equal to
    0 count as the smallest positive float64. The plan comes back in probs'
    dtype (float64 for integer input) on probs' device.
    """
    if probs.dim() != 2 or probs.shape[0] == 0 or probs.shape[1] == 0:
        raise ValueError(f"sinkhorn needs probs [N, K] with N, K >= 1, got shape {tuple(probs.shape)}")
    if not lam > 0:
        raise ValueError(f"sinkhorn needs lam > 0, got {lam}")
    if max_iters < 1:
        raise ValueError(f"sinkhorn needs max_iters >= 1, got {max_iters}")
    if domain not in SINKHORN_DOMAINS:
        raise ValueError(f"sinkhorn: unknown domain {domain!r}; known: {list(SINKHORN_DOMAINS)}")
    out_dtype = probs.dtype if probs.is_floating_point() else torch.float64
    probs = probs.detach().double()
    if not torch.isfinite(probs).all() or (probs < 0).any():
        raise ValueError("sinkhorn needs finite, non-negative probs (softmax outputs)")

    def log_kernel() -> torch.Tensor:
        return torch.log(probs.clamp_min(torch.finfo(torch.float64).tiny)).mul_(lam)

    found = None
    if domain == "auto":
        kernel = log_kernel()
        kernel.sub_(kernel.amax(dim=1, keepdim=True)).exp_()  # row max 1: P^lam up to a factor per row
        if kernel.amax(dim=0).min() >= _SMALLEST_COLUMN_MAX:
            found = _sinkhorn_scalings(kernel, tol, max_iters)
    if found is not None:
        a, b, iterations = found
        plan, domain = kernel.mul_(a[:, None]).mul_(b[None, :]), "matrix-vector"
    else:
        kernel = None  # free the matrix-vector kernel before forming the log one
        kernel = log_kernel()
        log_a, log_b, iterations = _sinkhorn_log_scalings(kernel, tol, max_iters)
        plan, domain = kernel.add_(log_a[:, None]).add_(log_b[None, :]).exp_(), "log"
    return SinkhornResult(plan.to(out_dtype), iterations, domain)


def sinkhorn_labels(
    probs: torch.Tensor, lam: float, tol: float = 1e-6, max_iters: int = 1000
) -> torch.Tensor:
    """SeLa's pseudo-labels: the argmax of each row of the Sinkhorn plan, LongTensor [N]."""
    return sinkhorn(probs, lam, tol=tol, max_iters=max_iters).plan.argmax(dim=1)


def equipartition_labels(n: int, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """n labels in [0, k), each used floor(n/k) or ceil(n/k) times, in random
    order (SeLa's initial labels). `generator` is a CPU generator."""
    if n < 0 or k < 1:
        raise ValueError(f"equipartition_labels needs n >= 0 and k >= 1, got n={n}, k={k}")
    balanced = torch.arange(n) % k
    return balanced[torch.randperm(n, generator=generator)]


@torch.no_grad()
def swav_sinkhorn(scores: torch.Tensor, epsilon: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """SwAV's codes (facebookresearch/swav main_swav.py distributed_sinkhorn) of scores [B, K]:
    the cosines of B embeddings to K prototypes; returns codes [B, K] in float32, without gradient:
    ``balanced_assignment`` of exp(scores / epsilon).

    No max is subtracted before exp, as in the official code: a per-sample shift would change what
    a finite number of iterations returns, and cosines in [-1, 1] keep exp(score / epsilon) and its
    sums inside float32 (at epsilon 0.05, e^20 times B K; at 0.02, e^50 times up to e^30 entries).
    """
    if scores.dim() != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"swav_sinkhorn needs scores [B, K] with B, K >= 1, got {tuple(scores.shape)}")
    if not epsilon > 0:
        raise ValueError(f"swav_sinkhorn needs epsilon > 0, got {epsilon}")
    return balanced_assignment(torch.exp(scores.detach().float() / epsilon), iterations)


@torch.no_grad()
def balanced_assignment(
    weights: torch.Tensor, iterations: int = 3, num_samples: int | None = None
) -> torch.Tensor:
    """A few Sinkhorn iterations on non-negative weights [B, K] (B samples, K prototypes), as SwAV's and
    MSN's distributed_sinkhorn: returns [B, K] in float32, without gradient.

    In the paper's K x B layout, Q = weights^T is scaled to total mass 1, then ``iterations`` times each
    prototype's row to 1/K and each sample's column to 1/B; finally Q x B. Each sample's row of the result
    therefore sums to exactly 1 and each prototype holds about B/K of the mass, closer to it with every
    iteration. Under torch.distributed the ranks' rows together are one problem: the total and the
    per-prototype sums are all-reduced, B counts every rank's rows (by default B/world on every rank;
    ``num_samples`` gives the total where the ranks hold different numbers, as DINOv2's masked patches), and
    each rank gets its own rows. Weights [..., B, K] are independent problems, one per leading index (CAPI's
    positionwise Sinkhorn-Knopp: one per patch position, over the batch's images).
    """
    # a rank may hold no rows of a problem whose total it is given (num_samples)
    if weights.dim() < 2 or weights.shape[-1] == 0 or (weights.shape[-2] == 0 and num_samples is None):
        raise ValueError(
            f"balanced_assignment needs weights [..., B, K] with B, K >= 1, got {tuple(weights.shape)}"
        )
    if iterations < 1:
        raise ValueError(f"balanced_assignment needs iterations >= 1, got {iterations}")
    q = weights.detach().float().transpose(-2, -1).clone()  # [..., K, B]
    num_prototypes = q.shape[-2]
    if num_samples is None:
        num_samples = q.shape[-1] * dist.world_size()
    q /= dist.all_reduce_sum(q.sum(dim=(-2, -1), keepdim=True))
    for _ in range(iterations):
        q /= dist.all_reduce_sum(q.sum(dim=-1, keepdim=True))  # every prototype: mass 1/K
        q /= num_prototypes
        q /= q.sum(dim=-2, keepdim=True)  # every sample (local): mass 1/B
        q /= num_samples
    return (q * num_samples).transpose(-2, -1)


def pca_whiten(features: torch.Tensor, dim: int) -> torch.Tensor:
    """DeepCluster's PCA-whitening (clustering.py preprocess_features: faiss.PCAMatrix(D, dim,
    eigen_power=-0.5), trained and applied on the same features): the centred rows [N, D] projected
    on the ``dim`` principal axes of largest variance, each divided by the square root of its
    variance, so every output column has variance 1 (faiss divides by the eigenvalues of the scatter
    matrix, N times the covariance: its output is this one / sqrt(N), a factor the L2 normalisation
    that follows in DeepCluster removes). Float64
    inside; float32 [N, dim] out, on the features' device. An axis of (numerically) no variance
    cannot be whitened (faiss divides by zero): its column is 0, with a RuntimeWarning."""
    if features.dim() != 2:
        raise ValueError(f"pca_whiten needs features [N, D], got shape {tuple(features.shape)}")
    if not 1 <= dim <= features.shape[1]:
        raise ValueError(f"pca_whiten needs 1 <= dim <= {features.shape[1]} (the feature width), got {dim}")
    x = features.detach().double()
    x = x - x.mean(dim=0)
    variances, axes = torch.linalg.eigh(x.T @ x / x.shape[0])  # ascending
    variances, axes = variances.flip(0)[:dim], axes.flip(1)[:, :dim]
    flat = variances <= 1e-12 * variances[0].clamp_min(torch.finfo(torch.float64).tiny)
    if flat.any():
        warnings.warn(
            f"pca_whiten: {int(flat.sum())} of the {dim} principal axes have no variance (the features span "
            f"{dim - int(flat.sum())} dimensions); their columns are 0",
            RuntimeWarning,
            stacklevel=2,
        )
    scale = torch.where(flat, torch.zeros_like(variances), variances.clamp_min(1e-300).rsqrt())
    return (x @ axes * scale).float()


def uniform_over_clusters(labels: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` image indices drawn uniformly over the non-empty clusters (DeepCluster's
    util.py UnifLabelSampler): with k' non-empty clusters, s = floor(count / k') + 1 indices from
    each (with replacement where the cluster holds at most s images, else without), all k' s of
    them shuffled and the first ``count`` kept. So each cluster gets at most s and at least
    s - (k' s - count) of the ``count``. ``labels`` [N]: the cluster of every image; ``generator``
    a CPU generator (the only randomness). LongTensor [count] on the CPU."""
    labels = labels.reshape(-1).cpu()
    by_cluster = torch.argsort(labels, stable=True)
    sizes = torch.unique_consecutive(labels[by_cluster], return_counts=True)[1]
    members = by_cluster.split(sizes.tolist())  # the images of each non-empty cluster
    per_cluster = count // len(members) + 1
    draws = []
    for images in members:
        if len(images) <= per_cluster:
            draws.append(images[torch.randint(len(images), (per_cluster,), generator=generator)])
        else:
            draws.append(images[torch.randperm(len(images), generator=generator)[:per_cluster]])
    pool = torch.cat(draws)
    return pool[torch.randperm(len(pool), generator=generator)[:count]]
