"""Properties of sslbench.kit.clustering on random inputs, with real faiss."""

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_mutual_info_score

from sslbench.kit.clustering import (
    KMeansResult,
    _sinkhorn_log_scalings,
    _sinkhorn_scalings,
    balanced_assignment,
    concentration,
    equipartition_labels,
    kmeans,
    sinkhorn,
    sinkhorn_labels,
)
from sslbench.kmeans import kmeans as faiss_kmeans

SEEDS = [0, 1, 2]


def blobs(seed, num_blobs=4, per_blob=40, dim=8):
    g = torch.Generator().manual_seed(seed)
    centers = 10 * torch.randn(num_blobs, dim, generator=g)
    labels = torch.arange(num_blobs).repeat_interleave(per_blob)
    points = centers[labels] + 0.1 * torch.randn(len(labels), dim, generator=g)
    return points, labels


# --------------------------------------------------------------------------- kmeans


@pytest.mark.parametrize("seed", SEEDS)
def test_kmeans_recovers_well_separated_blobs(seed):
    points, labels = blobs(seed)
    result = kmeans(points, 4, nredo=10, seed=seed)
    assert isinstance(result, KMeansResult)
    assert result.centroids.shape == (4, 8) and result.centroids.dtype == torch.float32
    assert result.assignments.shape == (160,) and result.assignments.dtype == torch.long
    assert adjusted_mutual_info_score(labels.numpy(), result.assignments.numpy()) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spherical", [False, True])
def test_kmeans_distances_are_euclidean_distances_to_the_nearest_centroid(seed, spherical):
    g = torch.Generator().manual_seed(seed)
    points = torch.nn.functional.normalize(torch.randn(200, 6, generator=g), dim=1)
    result = kmeans(points, 7, seed=seed, spherical=spherical)
    all_distances = torch.cdist(points.double(), result.centroids.double())
    true_distances = all_distances[torch.arange(200), result.assignments]
    torch.testing.assert_close(result.distances.double(), true_distances, rtol=1e-5, atol=1e-6)
    # Every point sits at its nearest centroid (for unit vectors and unit
    # centroids, largest inner product is smallest distance too).
    assert torch.all(true_distances <= all_distances.min(dim=1).values + 1e-5)
    assert result.inertia == pytest.approx(float((true_distances**2).sum()), rel=1e-5)
    if spherical:
        torch.testing.assert_close(result.centroids.norm(dim=1), torch.ones(7))


@pytest.mark.parametrize("seed", SEEDS)
def test_kmeans_same_seed_same_result(seed):
    g = torch.Generator().manual_seed(seed)
    points = torch.randn(300, 5, generator=g)
    first, second = kmeans(points, 6, seed=seed), kmeans(points, 6, seed=seed)
    assert torch.equal(first.centroids, second.centroids)
    assert torch.equal(first.assignments, second.assignments)
    assert first.inertia == second.inertia


@pytest.mark.parametrize("seed", SEEDS)
def test_kmeans_subsamples_only_when_asked(seed):
    """Converged Lloyd on every point puts each centroid at the mean of the points assigned to it;
    trained on a sample of k x 10 points (max_points_per_centroid=10) it does not."""
    rng = np.random.default_rng(seed)
    x = (8 * rng.normal(size=(4, 3))[np.arange(2000) % 4] + rng.normal(size=(2000, 3))).astype(np.float32)

    def worst_gap(found):
        means = np.stack([x[found.assignments == c].mean(0) for c in range(4)])
        return np.abs(means - found.centroids).max()

    every = faiss_kmeans(x, 4, niter=50, nredo=5, seed=seed, max_points_per_centroid=None)
    assert worst_gap(every) < 1e-4
    assert worst_gap(faiss_kmeans(x, 4, niter=50, nredo=5, seed=seed, max_points_per_centroid=10)) > 1e-2
    # faiss's default, 256 per centroid, covers 1024 points at k = 4: there it trains on every point
    default, every = (faiss_kmeans(x[:1024], 4, seed=seed, max_points_per_centroid=m) for m in (256, None))
    assert np.array_equal(default.centroids, every.centroids)


def test_kmeans_with_more_clusters_than_points_is_a_clear_error():
    with pytest.raises(ValueError, match="k=11 for N=10"):
        kmeans(torch.randn(10, 3), 11)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_kmeans_demanding_a_gpu_without_one_is_a_clear_error():
    import faiss

    if getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
        pytest.skip("this faiss has GPUs")
    with pytest.raises(ValueError, match="use_gpu=True"):
        kmeans(torch.randn(20, 3), 2, use_gpu=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kmeans_on_cuda_input_returns_cuda_tensors_and_recovers_blobs():
    points, labels = blobs(0)
    result = kmeans(points.cuda(), 4, nredo=10)
    assert result.assignments.is_cuda and result.centroids.is_cuda and result.distances.is_cuda
    assert adjusted_mutual_info_score(labels.numpy(), result.assignments.cpu().numpy()) == pytest.approx(1.0)


# --------------------------------------------------------------------------- concentration


def naive_raw_phi(features, centroids, assignments, alpha=10.0):
    """PCL's run_kmeans phi before clipping, one cluster at a time with numpy."""
    x, c, a = features.double().numpy(), centroids.double().numpy(), assignments.numpy()
    phi = np.zeros(len(c))
    for j in range(len(c)):
        members = x[a == j]
        if len(members) > 1:
            phi[j] = np.linalg.norm(members - c[j], axis=1).mean() / np.log(len(members) + alpha)
    phi[[j for j in range(len(c)) if (a == j).sum() <= 1]] = phi.max()
    return phi


def rescaled_band(raw, temperature):
    low, high = np.percentile(raw, 10), np.percentile(raw, 90)
    scale = temperature / raw.clip(low, high).mean()
    return low * scale, high * scale, scale


def random_clustering(seed, num_points=120, k=15, dim=6):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(num_points, dim, generator=g)
    # Uneven cluster sizes, with a few singletons and an empty cluster.
    assignments = torch.randint(0, k - 4, (num_points,), generator=g)
    assignments[:3] = torch.tensor([k - 4, k - 3, k - 2])
    centroids = torch.randn(k, dim, generator=g)
    return features, centroids, assignments


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("temperature", [0.1, 0.2])
def test_concentration_matches_pcl_and_has_mean_temperature(seed, temperature):
    features, centroids, assignments = random_clustering(seed)
    phi = concentration(features, centroids, assignments, temperature)
    assert phi.shape == (15,) and phi.dtype == torch.float32
    assert phi.mean().item() == pytest.approx(temperature, rel=1e-6)
    raw = naive_raw_phi(features, centroids, assignments)
    low, high, scale = rescaled_band(raw, temperature)
    np.testing.assert_allclose(phi.numpy(), raw.clip(low / scale, high / scale) * scale, rtol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("alpha", [1.0, 10.0])
def test_concentration_stays_inside_the_rescaled_percentile_band(seed, alpha):
    features, centroids, assignments = random_clustering(seed)
    phi = concentration(features, centroids, assignments, 0.1, alpha=alpha).double().numpy()
    low, high, _ = rescaled_band(naive_raw_phi(features, centroids, assignments, alpha), 0.1)
    assert np.all(phi >= low * (1 - 1e-6)) and np.all(phi <= high * (1 + 1e-6))
    # The clipping bites: both edges of the band are reached.
    assert np.isclose(phi.min(), low, rtol=1e-6) and np.isclose(phi.max(), high, rtol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_singleton_and_empty_clusters_get_the_largest_concentration(seed):
    features, centroids, assignments = random_clustering(seed)
    phi = concentration(features, centroids, assignments, 0.1)
    sizes = torch.bincount(assignments, minlength=15)
    assert (sizes <= 1).sum() == 4  # three singletons, one empty cluster
    assert torch.all(phi[sizes <= 1] == phi.max())


def test_concentration_hand_computed_tiny_example():
    # 1-D clusters: {0, 2} around 1, {10, 12, 14} around 12, and the singleton {30}.
    features = torch.tensor([[0.0], [2.0], [10.0], [12.0], [14.0], [30.0]])
    centroids = torch.tensor([[1.0], [12.0], [30.0]])
    assignments = torch.tensor([0, 0, 1, 1, 1, 2])
    raw = [1.0 / math.log(2 + 10), (4.0 / 3.0) / math.log(3 + 10)]
    raw.append(max(raw))  # the singleton
    ordered = sorted(raw)
    # numpy's linear percentiles of three values: positions 0.2 and 1.8.
    low = ordered[0] + 0.2 * (ordered[1] - ordered[0])
    high = ordered[1] + 0.8 * (ordered[2] - ordered[1])
    clipped = [min(max(v, low), high) for v in raw]
    expected = [0.1 * v / (sum(clipped) / 3) for v in clipped]
    phi = concentration(features, centroids, assignments, temperature=0.1)
    np.testing.assert_allclose(phi.numpy(), expected, rtol=1e-6)


def test_concentration_of_fully_collapsed_clusters_is_the_temperature():
    features = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    phi = concentration(features, features[[0, 2]], torch.tensor([0, 0, 1, 1]), 0.3)
    torch.testing.assert_close(phi, torch.full((2,), 0.3))


def test_concentration_rejects_out_of_range_assignments():
    with pytest.raises(ValueError, match="centroid ids"):
        concentration(torch.zeros(3, 2), torch.zeros(2, 2), torch.tensor([0, 1, 2]), 0.1)


# --------------------------------------------------------------------------- sinkhorn


def softmax_rows(seed, n, k, scale=3.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(n, k, generator=g, dtype=dtype), dim=1)


def assert_marginals(plan, tol):
    n, k = plan.shape
    assert torch.all((plan.sum(dim=1).double() * n - 1).abs() <= tol)
    assert torch.all((plan.sum(dim=0).double() * k - 1).abs() <= tol)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lam,scale", [(1.0, 3.0), (10.0, 3.0), (10.0, 1.0), (25.0, 1.0)])
def test_sinkhorn_plan_has_uniform_marginals(seed, lam, scale):
    probs = softmax_rows(seed, 300, 12, scale=scale)
    found = sinkhorn(probs, lam)
    plan, iterations = found.plan, found.iterations
    assert iterations < 1000  # converged, not stopped by max_iters
    assert found.domain == "matrix-vector"  # no column near underflow here
    assert torch.all(plan >= 0)
    assert_marginals(plan, tol=1e-6 * 1.01)


@pytest.mark.parametrize("seed", SEEDS)
def test_sinkhorn_on_float32_input_returns_float32_with_the_same_marginals(seed):
    probs = softmax_rows(seed, 200, 10, scale=1.0, dtype=torch.float32)
    plan = sinkhorn(probs, 25.0).plan
    assert plan.dtype == torch.float32
    assert_marginals(plan, tol=2e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_sinkhorn_is_invariant_to_rescaling_rows(seed):
    probs = softmax_rows(seed, 100, 8, scale=1.0)
    factors = torch.exp(
        torch.randn(100, 1, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64)
    )
    torch.testing.assert_close(
        sinkhorn(probs * factors, 10.0, tol=1e-10).plan,
        sinkhorn(probs, 10.0, tol=1e-10).plan,
        rtol=1e-6,
        atol=0,
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_sinkhorn_with_lam_25_on_near_one_hot_probs_stays_finite(seed):
    probs = softmax_rows(seed, 200, 10, scale=30.0)  # many entries far below 1e-13
    assert (probs.pow(25) == 0).any()  # the naive P^lam underflows here
    # Such peaked kernels converge slowly; finiteness is the point here.
    with pytest.warns(RuntimeWarning, match="max_iters=50"):
        plan = sinkhorn(probs, 25.0, max_iters=50).plan
    assert torch.isfinite(plan).all() and torch.all(plan >= 0)
    assert plan.sum().item() == pytest.approx(1.0, rel=1e-9)
    torch.testing.assert_close(plan.sum(dim=1) * 200, torch.ones(200, dtype=torch.float64))  # rows set last


def naive_sinkhorn(probs, lam, iterations=3000):
    """SeLa's scaling iterations on P^lam directly (no logs)."""
    kernel = probs.pow(lam)
    n, k = kernel.shape
    a, b = torch.ones(n, dtype=kernel.dtype), torch.ones(k, dtype=kernel.dtype)
    for _ in range(iterations):
        a = (1.0 / n) / (kernel @ b)
        b = (1.0 / k) / (kernel.T @ a)
    return a[:, None] * kernel * b[None, :]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lam", [0.5, 1.0, 3.0])
def test_sinkhorn_agrees_with_naive_sinkhorn_at_small_lam(seed, lam):
    probs = softmax_rows(seed, 60, 6, scale=1.0)
    torch.testing.assert_close(
        sinkhorn(probs, lam, tol=1e-12).plan, naive_sinkhorn(probs, lam), rtol=1e-8, atol=0
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lam,scale", [(1.0, 3.0), (10.0, 3.0), (25.0, 1.0)])
def test_sinkhorn_matrix_vector_and_log_domain_forms_reach_the_same_plan(seed, lam, scale):
    # The plan with given marginals is unique, so both forms must converge to it (they start
    # from different scalings: the matrix-vector form's kernel is divided by each row's max).
    log_kernel = lam * softmax_rows(seed, 300, 12, scale=scale).log()
    kernel = (log_kernel - log_kernel.amax(dim=1, keepdim=True)).exp()
    a, b, iterations = _sinkhorn_scalings(kernel, 1e-11, 5000)
    log_a, log_b, log_iterations = _sinkhorn_log_scalings(log_kernel, 1e-11, 5000)
    assert 1 < iterations < 5000 and 1 < log_iterations < 5000
    torch.testing.assert_close(
        a[:, None] * kernel * b[None, :], (log_a[:, None] + log_kernel + log_b).exp(), rtol=1e-9, atol=0
    )
    # The public switch: domain="log" runs the log domain from the start, to the same plan.
    probs = softmax_rows(seed, 300, 12, scale=scale)
    auto, log = sinkhorn(probs, lam, tol=1e-11, max_iters=5000), sinkhorn(probs, lam, 1e-11, 5000, "log")
    assert (auto.domain, log.domain) == ("matrix-vector", "log")
    assert (auto.iterations, log.iterations) == (iterations, log_iterations)
    torch.testing.assert_close(auto.plan, log.plan, rtol=1e-9, atol=0)


def test_sinkhorn_works_in_the_log_domain_when_a_column_would_underflow():
    probs = softmax_rows(0, 200, 10, scale=1.0)
    probs[:, 0] = 1e-30  # a cluster nobody likes: (1e-30)^25 underflows float64
    probs /= probs.sum(dim=1, keepdim=True)
    log_kernel = 25.0 * probs.log()
    kernel = (log_kernel - log_kernel.amax(dim=1, keepdim=True)).exp()
    assert (kernel[:, 0] == 0).all()
    with np.errstate(all="ignore"):
        assert (
            _sinkhorn_scalings(kernel, 1e-6, 1000) is None
        )  # the matrix-vector form cannot give column 0 mass
    found = sinkhorn(probs, 25.0)
    plan = found.plan
    assert found.domain == "log"
    assert_marginals(plan, tol=1e-6 * 1.01)  # column 0 gets its 1/K all the same
    log_a, log_b, _ = _sinkhorn_log_scalings(log_kernel, 1e-6, 1000)
    torch.testing.assert_close(plan, (log_a[:, None] + log_kernel + log_b).exp(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_sinkhorn_labels_are_balanced_when_predictions_collapse_to_one_class(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(600, 6, generator=g, dtype=torch.float64)
    logits[:, 0] += 5.0  # the network puts (almost) everything in class 0
    probs = torch.softmax(logits, dim=1)
    assert torch.bincount(probs.argmax(dim=1), minlength=6)[0] >= 540
    labels = sinkhorn_labels(probs, 25.0)
    assert labels.dtype == torch.long and labels.shape == (600,)
    counts = torch.bincount(labels, minlength=6)
    assert torch.all((counts - 100).abs() <= 10), counts


def test_sinkhorn_labels_of_exactly_uniform_probs_follow_a_uniform_plan():
    plan = sinkhorn(torch.full((40, 5), 0.2, dtype=torch.float64), 25.0).plan
    torch.testing.assert_close(plan, torch.full((40, 5), 1 / 200, dtype=torch.float64))


def test_sinkhorn_stops_at_max_iters():
    with pytest.warns(RuntimeWarning, match="max_iters=7"):
        iterations = sinkhorn(softmax_rows(0, 50, 5), 25.0, tol=0.0, max_iters=7).iterations
    assert iterations == 7


def test_sinkhorn_rejects_bad_input():
    with pytest.raises(ValueError, match="non-negative"):
        sinkhorn(torch.tensor([[0.5, -0.5]]), 1.0)
    with pytest.raises(ValueError, match="lam"):
        sinkhorn(torch.full((2, 2), 0.5), 0.0)
    with pytest.raises(ValueError, match="unknown domain 'float32'"):
        sinkhorn(torch.full((2, 2), 0.5), 1.0, domain="float32")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sinkhorn_on_cuda_matches_cpu():
    probs = softmax_rows(0, 300, 12)
    on_gpu = sinkhorn(probs.cuda(), 25.0).plan
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), sinkhorn(probs, 25.0).plan, rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- equipartition


@pytest.mark.parametrize("n,k", [(0, 3), (7, 7), (10, 3), (101, 10), (5, 8)])
@pytest.mark.parametrize("seed", SEEDS)
def test_equipartition_counts_differ_by_at_most_one(n, k, seed):
    labels = equipartition_labels(n, k, torch.Generator().manual_seed(seed))
    assert labels.dtype == torch.long and labels.shape == (n,)
    counts = torch.bincount(labels, minlength=k)
    assert len(counts) == k and counts.sum() == n
    assert counts.max() - counts.min() <= 1


def test_equipartition_is_a_seeded_random_permutation():
    first = equipartition_labels(200, 10, torch.Generator().manual_seed(0))
    again = equipartition_labels(200, 10, torch.Generator().manual_seed(0))
    other = equipartition_labels(200, 10, torch.Generator().manual_seed(1))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert not torch.equal(first, torch.arange(200) % 10)


def test_the_number_of_samples_scales_every_column_alike_so_one_process_s_assignment_ignores_it():
    # B only rescales the whole matrix between the normalisations; under DDP it must be the same on every
    # rank (DINOv2's masked patches, whose counts differ between ranks: tests/methods/test_distributed.py)
    weights = torch.rand(7, 5, generator=torch.Generator().manual_seed(0)) + 0.1
    torch.testing.assert_close(
        balanced_assignment(weights, 3, num_samples=40), balanced_assignment(weights, 3)
    )
    torch.testing.assert_close(balanced_assignment(weights, 3).sum(dim=1), torch.ones(7))


def test_leading_dimensions_are_independent_problems_each_as_if_alone():
    # CAPI's positionwise Sinkhorn-Knopp: one problem per patch position over the batch's images
    weights = torch.rand(4, 7, 5, generator=torch.Generator().manual_seed(0)) + 0.1
    alone = torch.stack([balanced_assignment(w, 3) for w in weights])
    assert torch.equal(balanced_assignment(weights, 3), alone)
    assert not torch.allclose(alone[0], alone[1])
