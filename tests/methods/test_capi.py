"""CAPI (methods/capi): the loss against train_capi.py's step written out image by image and query by query
(the teacher's tokens, the online clustering's positionwise Sinkhorn-Knopp written as model.py's
sinkhorn_knopp, its own cross-entropy, the visible patches encoded alone, each predicted patch decoded alone),
the masks collate_data_and_cast draws, the gradients each loss sends, the parameter groups of
get_params_groups and the settings refused. The inverse rolled blocks are pinned in tests/kit/test_vit.py;
under 2 processes everything is one process's on the whole batch: tests/methods/test_distributed.py."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR

from sslbench.errors import ConfigError
from sslbench.kit.vit import masked_tokens, sincos_pos_embed
from sslbench.plugins import load_method_class

capi = inspect.getmodule(load_method_class(METHODS_DIR / "capi"))

BATCH = 6
SMALL = {"num_clusters": 16}


@pytest.fixture
def method(build):
    torch.manual_seed(0)
    return build("capi", 0, **SMALL).eval()


def sinkhorn_knopp(logits, temperature, iterations):
    """model.py's sinkhorn_knopp on logits [L, B, K] (positionwise): exp after each cluster's column is
    shifted to a largest entry of 50, then `iterations` times the columns over the images and the rows over
    the clusters normalised."""
    m = logits / temperature
    m = (m - m.max(dim=1, keepdim=True).values + 50.0).exp()
    for _ in range(iterations):
        m = m / m.sum(dim=1, keepdim=True)
        m = m / m.sum(dim=2, keepdim=True)
    return m


def test_the_targets_are_model_py_s_sinkhorn_knopp_at_each_position_over_the_images():
    logits = 3 * torch.randn(BATCH, 5, 16, generator=torch.Generator().manual_seed(0))  # [B, L, K]
    targets = capi.positionwise_sinkhorn(logits, 0.06, 3)
    by_hand = sinkhorn_knopp(logits.transpose(0, 1), 0.06, 3).transpose(0, 1)
    torch.testing.assert_close(targets, by_hand)
    torch.testing.assert_close(targets.sum(dim=-1), torch.ones(BATCH, 5))
    # a constant per (position, cluster) leaves them as they are; a position's images are its problem alone
    shifted = logits + 5 * torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(capi.positionwise_sinkhorn(shifted, 0.06, 3), targets)
    other = logits.clone()
    other[:, 0] = torch.randn(BATCH, 16)
    assert torch.equal(capi.positionwise_sinkhorn(other, 0.06, 3)[:, 1:], targets[:, 1:])


def test_each_image_hides_int_0_65_of_its_patches_and_predicts_a_drawn_share_of_them(build):
    method = build("capi", 0, prediction_subsampling=0.5, **SMALL)
    patches = method.grid[0] * method.grid[1]  # 4 x 4 on the tiny suite's 8-px digits
    assert (method.num_masked, method.num_predicted) == (int(patches * 0.65), int(int(patches * 0.65) * 0.5))
    torch.manual_seed(0)
    visible, predicted = method.draw_masks(BATCH, torch.device("cpu"))
    assert visible.shape == (BATCH, patches - method.num_masked)
    assert predicted.shape == (BATCH, method.num_predicted)
    for v, p in zip(visible, predicted):
        assert len(set(p.tolist())) == len(p) and not set(p.tolist()) & set(v.tolist())
    assert len({tuple(v.tolist()) for v in visible}) > 1  # each image its own block
    torch.manual_seed(0)
    again = method.draw_masks(BATCH, torch.device("cpu"))
    assert torch.equal(again[0], visible) and torch.equal(again[1], predicted)


def loss_by_the_formula(method, images, visible, predicted):
    """train_capi.py's step: the teacher's normed tokens of every patch; the clustering layer's logits on
    them L2-normed; targets by sinkhorn_knopp at 0.06 per position over the images; the clustering loss
    their cross-entropy with its softmax at 0.12, the mean over every token; the student's visible patches
    (positions added) through the blocks and the norm; each predicted patch's query (mask token + its
    position) decoded alone against them; L2NormLinear; the cross-entropy at 0.12, the mean over them."""
    vit, dec, layer = method.backbone, method.decoder, method.clustering.layer
    tokens = masked_tokens(method.target_encoder[0], images)
    logits = layer(F.normalize(tokens, dim=-1))
    targets = sinkhorn_knopp(logits.transpose(0, 1), 0.06, 3).transpose(0, 1)
    clustering = -(targets * F.log_softmax(logits / 0.12, dim=-1)).sum(-1).mean()
    pos = sincos_pos_embed(method.feature_dim, method.grid, cls_token=False)
    terms = []
    for b in range(len(images)):
        x = vit.patch_embed(images[b : b + 1]).flatten(1, -2) + vit.pos_embed
        z = vit.norm(vit.blocks(x[:, visible[b]]))
        for patch in predicted[b]:
            q = dec.mask_token + pos[patch]
            for block in dec.blocks:
                q = block(q, z)
            p = method.head(dec.out_norm(q))[0, 0]
            terms.append(-(targets[b, patch] * F.log_softmax(p / 0.12, dim=-1)).sum())
    return torch.stack(terms).mean() + clustering


def test_the_loss_is_train_capi_s_step_written_out_image_by_image_and_query_by_query(method):
    images = torch.randn(BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # a teacher apart from the student, as after some momentum steps
        for p in method.target_encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    torch.manual_seed(3)
    visible, predicted = method.draw_masks(BATCH, images.device)
    torch.manual_seed(3)
    loss = method.training_loss([images], None, None)
    torch.testing.assert_close(loss, loss_by_the_formula(method, images, visible, predicted))


def test_the_clustering_layer_learns_from_its_own_loss_alone_and_the_teacher_from_none(method):
    images = torch.randn(BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    method.training_loss([images], None, None).backward()
    total = [p.grad.clone() for p in method.clustering.parameters()]
    assert all(p.grad is None for p in method.target_encoder.parameters())
    assert method.backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    method.zero_grad()
    tokens = masked_tokens(method.target_encoder[0], images)
    method.clustering(tokens)[1].backward()
    for alone, mixed in zip(method.clustering.parameters(), total):
        torch.testing.assert_close(alone.grad, mixed)


def test_the_groups_are_get_params_groups_and_the_clustering_layer_s_own_optimiser(method):
    wd = method.cfg["train"]["weight_decay"]
    groups = method.param_groups()
    setting = {id(p): (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}
    named = dict(method.named_parameters())
    assert setting[id(named["backbone.patch_embed.proj.weight"])] == (0.2, wd)
    assert setting[id(named["backbone.patch_embed.proj.bias"])] == (0.2, 0.0)
    assert setting[id(named["backbone.blocks.0.norm1.weight"])] == (1.0, pytest.approx(0.1 * wd))
    assert setting[id(named["backbone.blocks.0.norm1.bias"])] == (1.0, 0.0)
    assert setting[id(named["decoder.blocks.0.norm1.weight"])] == (1.0, pytest.approx(0.1 * wd))
    assert setting[id(named["decoder.mask_token"])] == (1.0, wd)
    assert setting[id(named["clustering.layer.bias"])] == (0.5, 0.01)
    assert setting[id(named["clustering.layer.weight"])] == (0.5, 0.01)
    trainable = [p for p in method.parameters() if p.requires_grad]
    assert sorted(map(id, trainable)) == sorted(setting)
    assert not method.backbone.pos_embed.requires_grad  # the fixed sin-cos table


@pytest.mark.parametrize(
    "overrides,key",
    [
        ({"mask_ratio": 0.01}, "mask_ratio"),
        ({"prediction_subsampling": 0.05}, "prediction_subsampling"),
        ({"backbone": {"args": {"class_token": True, "global_pool": "token"}}}, "no class token"),
    ],
)
def test_settings_it_cannot_run_are_config_errors_naming_the_key(build, overrides, key):
    with pytest.raises(ConfigError, match=key):
        build("capi", 0, **overrides)
