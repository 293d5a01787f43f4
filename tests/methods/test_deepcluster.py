"""DeepCluster (methods/deepcluster): the sampler uniform over clusters, the reassignment (PCA-whitening,
k-means, a fresh top layer), the top layer's optimiser without momentum, the Sobel filter, on tiny inputs."""

import faiss
import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR

from sslbench.backbones import SobelFilter
from sslbench.errors import ConfigError
from sslbench.extract.features import embed, load_encoder, read_checkpoint
from sslbench.kit.clustering import kmeans, pca_whiten, uniform_over_clusters
from sslbench.pretrain.trainer import Trainer, pretrain


def trainer(tmp_path, method_config, **overrides) -> Trainer:
    return Trainer(
        METHODS_DIR / "deepcluster", method_config("deepcluster", **overrides), 0, tmp_path, progress=False
    )


def reassign(t: Trainer) -> dict:
    """The method's epoch hook as the engine runs it, on the real training set."""
    ctx = t.epoch_context()
    t.method.on_epoch_start(ctx)
    return ctx.log


# --- the sampler ---------------------------------------------------------------------------


def test_the_sampler_draws_every_non_empty_cluster_equally_often():
    # Clusters of 1, 2, 100 and 500 images (and an empty one, id 3): s = 603 // 4 + 1 = 151 per cluster before
    # the shuffled pool of 604 is cut to 603, so each cluster gets 150 or 151 however small or large it is.
    labels = torch.cat([torch.full((n,), c) for c, n in [(0, 1), (1, 2), (2, 100), (4, 500)]])
    labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]
    drawn = uniform_over_clusters(labels, 603, torch.Generator().manual_seed(1))
    counts = torch.bincount(labels[drawn], minlength=5)
    assert len(drawn) == 603 and counts[3] == 0
    assert sorted(counts[[0, 1, 2, 4]].tolist())[0] >= 150 and counts.max() <= 151
    # A cluster larger than s gives s distinct images (no replacement), a smaller one repeats its images.
    big = drawn[labels[drawn] == 4]
    assert len(big.unique()) == len(big)
    assert set(drawn[labels[drawn] == 0].tolist()) == set(torch.nonzero(labels == 0).flatten().tolist())
    # The generator is the only randomness (the same order on every rank).
    assert torch.equal(drawn, uniform_over_clusters(labels, 603, torch.Generator().manual_seed(1)))


def test_the_engine_batches_the_method_s_order_uniform_over_the_clusters(tmp_path, method_config):
    t = trainer(tmp_path, method_config, num_clusters=20)
    reassign(t)
    labels = t.method.labels
    batches = t.epoch_batches(torch.Generator().manual_seed(0))
    assert len(batches) == t.steps_per_epoch and all(len(b) == t.batch_size for b in batches)
    counts = torch.bincount(labels[torch.cat(batches)], minlength=20)
    sizes = torch.bincount(labels, minlength=20)
    per_cluster = len(labels) // int((sizes > 0).sum()) + 1  # s of UnifLabelSampler
    # Every cluster drawn s times into the pool, cut to N, of which the engine keeps 21 full batches of 64:
    # the largest cluster too (a random permutation would draw it as often as it is large).
    assert counts.max() <= per_cluster < sizes.max()
    truncated, dropped = int((sizes > 0).sum()) * per_cluster - len(labels), len(labels) - 21 * 64
    assert (counts[sizes > 0] >= per_cluster - truncated - dropped).all()


# --- the reassignment ------------------------------------------------------------------------


def test_pca_whitening_is_faiss_s_pca_matrix_with_eigen_power_minus_a_half():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 12, generator=g) @ torch.randn(12, 12, generator=g) + 3.0  # correlated, off-centre
    ours = pca_whiten(x, 5)
    pca = faiss.PCAMatrix(12, 5, -0.5)
    pca.train(x.numpy())
    theirs = torch.from_numpy(pca.apply_py(x.numpy()))
    signs = torch.sign((ours * theirs).sum(0))  # each principal axis is defined up to its sign
    # faiss whitens with the scatter matrix (N x the covariance): the same axes, scaled by 1 / sqrt(N)
    torch.testing.assert_close(ours / 500**0.5, theirs * signs, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(ours.T @ ours / 500, torch.eye(5), rtol=0, atol=1e-4)  # whitened


def test_pca_whitening_leaves_axes_of_no_variance_at_zero_with_a_warning():
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(0)) @ torch.randn(3, 6)  # rank 3 in 6 dims
    with pytest.warns(RuntimeWarning, match="2 of the 5 principal axes have no variance"):
        out = pca_whiten(x, 5)
    assert out.isfinite().all() and (out[:, 3:] == 0).all()
    torch.testing.assert_close(out[:, :3].T @ out[:, :3] / 50, torch.eye(3), rtol=0, atol=1e-4)


def test_each_reassignment_clusters_and_gives_a_fresh_top_layer(tmp_path, method_config):
    t = trainer(tmp_path, method_config, num_clusters=20)
    method, top = t.method, t.method.top_layer
    log = reassign(t)
    first, initial = method.labels.clone(), top.weight.detach().clone()
    assert first.min() >= 0 and first.max() < 20 and log["reassign_seconds"] > 0
    assert log["clusters_empty"] == 0 and log["cluster_size_max"] < len(first)
    # clustering.py's order on the evaluation features: PCA-whitening, L2 normalisation, then faiss k-means
    # (20 iterations, every point) with a seed drawn anew from the epoch's RNG
    features = t.forward_train_set(method.backbone)
    torch.manual_seed(7)
    labels = method.cluster(features)
    torch.manual_seed(7)
    seed = int(torch.randint(2**31 - 1, ()))
    x = F.normalize(pca_whiten(features, method.pca_dim), dim=1)
    expected = kmeans(x, 20, seed=seed, niter=20, nredo=1, max_points_per_centroid=None).assignments
    assert torch.equal(labels, expected)
    assert top.bias.abs().max() == 0 and abs(initial.std().item() - 0.01) < 0.001  # main.py's init
    for seed in range(3):
        t.train_step(*views_and_indices(t, seed), t.epoch_context())
    trained = top.weight.detach().clone()
    assert top.bias.abs().max() > 0  # training moved the top layer
    reassign(t)  # a new clustering of the new features (and seed), and a top layer drawn anew
    assert not torch.equal(method.labels, first)
    assert not torch.equal(top.weight, trained) and not torch.equal(top.weight, initial)
    assert top.bias.abs().max() == 0 and abs(top.weight.std().item() - 0.01) < 0.001


def test_between_reassignments_the_clusters_and_the_top_layer_stay(tmp_path, method_config):
    t = trainer(tmp_path, method_config, num_clusters=20, reassign=2)  # main.py --reassign 2
    assert "reassign_seconds" in reassign(t)  # epoch 0
    labels, top = t.method.labels.clone(), t.method.top_layer.weight.detach().clone()
    t.train_step(*views_and_indices(t), t.epoch_context())
    trained = t.method.top_layer.weight.detach().clone()
    assert not torch.equal(trained, top)
    t.state.epoch = 1
    assert "reassign_seconds" not in reassign(t)  # epoch 1: no reassignment
    assert torch.equal(t.method.labels, labels) and torch.equal(t.method.top_layer.weight, trained)
    t.state.epoch = 2
    assert "reassign_seconds" in reassign(t)
    assert not torch.equal(t.method.top_layer.weight, trained)


def views_and_indices(t: Trainer, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(t.labels), generator=g)[: t.batch_size]
    return t.make_views(t.data.train.images[idx], g), idx


def test_the_top_layer_trains_without_momentum_the_rest_with_it(tmp_path, method_config):
    t = trainer(tmp_path, method_config)
    network, top = t.optimizer.param_groups
    assert {id(p) for p in top["params"]} == {id(p) for p in t.method.top_layer.parameters()}
    assert (network["momentum"], top["momentum"]) == (0.9, 0.0)
    assert network["weight_decay"] == top["weight_decay"] == 1e-5
    reassign(t)
    for seed in range(2):
        weight = t.method.top_layer.weight.detach().clone()
        t.train_step(*views_and_indices(t, seed), t.epoch_context())
        grad = t.method.top_layer.weight.grad
        # plain SGD: w <- w - lr (g + wd w), whatever the previous step did
        torch.testing.assert_close(t.method.top_layer.weight, weight - 0.05 * (grad + 1e-5 * weight))


def test_a_pca_dimension_above_the_feature_width_is_a_config_error(tmp_path, method_config):
    with pytest.raises(ConfigError, match="pca_dim <= 96"):
        trainer(tmp_path, method_config, pca_dim=256)
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\) \['sobel'\] under `backbone`; known: .*'input_filter'"
    ):
        method_config("deepcluster", backbone={"sobel": True})


# --- the Sobel filter ------------------------------------------------------------------------


def test_sobel_filter_by_hand():
    ramp = torch.arange(5.0).expand(5, 5)[None, None]  # x[i, j] = j: a horizontal ramp
    out = SobelFilter(1)(ramp)
    assert out.shape == (1, 2, 5, 5)
    # Gx = [[1, 0, -1], [2, 0, -2], [1, 0, -1]] (cross-correlation): (1 + 2 + 1)(x[j-1] - x[j+1]) = -8 inside
    assert (out[0, 0, 1:-1, 1:-1] == -8).all() and (out[0, 1, 1:-1, 1:-1] == 0).all()
    constant = torch.full((2, 3, 6, 6), 0.7)
    assert SobelFilter(3)(constant)[:, :, 1:-1, 1:-1].abs().max() < 1e-6  # no edges inside a constant image
    rgb = torch.rand(2, 3, 6, 6)
    torch.testing.assert_close(SobelFilter(3)(rgb), SobelFilter(1)(rgb.mean(1, keepdim=True)))  # grey = mean


def test_the_sobel_filter_is_fixed_and_travels_with_the_encoder(tmp_path, method_config):
    cfg = method_config("deepcluster")
    assert cfg["backbone"]["input_filter"] == "sobel"
    checkpoint = pretrain(METHODS_DIR / "deepcluster", cfg, 0, tmp_path, progress=False)
    ckpt = read_checkpoint(checkpoint)
    encoder = load_encoder(ckpt)  # what extract, the linear probe and the fine-tune evaluate
    assert isinstance(encoder.input_filter, SobelFilter)
    assert encoder.net.conv1[0].in_channels == 2  # test_resnet's deep stem takes the two gradients
    assert not any("input_filter" in name for name, _ in encoder.named_parameters())  # nothing trains it
    t = trainer(tmp_path / "again", method_config)
    t.method.load_state_dict(ckpt["method_state"])
    images = t.data.train.images[:16]
    torch.testing.assert_close(
        embed(encoder, images, t.eval_transform, "cpu"),
        embed(t.method.backbone, images, t.eval_transform, "cpu"),
    )
    plain = method_config("deepcluster", backbone={"input_filter": None})
    assert (
        Trainer(METHODS_DIR / "deepcluster", plain, 0, tmp_path / "plain", progress=False)
        .method.backbone.conv1[0]
        .in_channels
        == 1
    )
