"""DINOv2 (methods/dinov2): the whole loss against ssl_meta_arch.py's forward_backward written out (DINO's
class-token term, iBOT's masked-patch term weighted per image, KoLeo on each global crop's class tokens), the
two centrings (the running means' updates, Sinkhorn-Knopp's marginals), the masks as collate_data_and_cast
draws them, the per-step teacher-temperature warm-up, the layer-decayed parameter groups, the clipping per
module and the evaluated encoder. KoLeo and the balanced assignment are pinned in tests/kit; under 2 processes
everything is one process's on the whole batch: tests/methods/test_distributed.py."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from support import VIT_P2_PADDED, random_views

from sslbench.errors import ConfigError
from sslbench.kit.losses import koleo, masked_patch_cross_entropy
from sslbench.kit.method import EpochContext
from sslbench.kit.vit import mask_share_draws, masked_tokens

BATCH = 8
OUT = 32


@pytest.fixture
def vit(build):
    def make(**overrides):
        small = {"out_dim": OUT, "ibot_out_dim": 24, "hidden_dim": 24, "bottleneck_dim": 12}
        return build("dinov2", 0, backbone=VIT_P2_PADDED, **{**small, **overrides})

    return make


def loss_by_the_formula(method, views, masks):
    """forward_backward written out with the method's networks, its centring 'centering': every pair of
    (teacher global crop, other student crop) for the class token; each masked patch's cross-entropy weighted
    by 1 / its image's masked count, summed over the 2B global crops' patches and divided by 2B; KoLeo summed
    over the two global crops' student class tokens (before the head)."""
    tau = method.teacher_temp
    g = torch.cat(views[:2])
    m = masks.flatten(1)
    t_tokens = masked_tokens(method.teacher[0], g)
    t_cls = method.teacher[1](t_tokens[:, 0])
    t_patch = method.teacher[-1](t_tokens[:, 1:][m])
    s_tokens = masked_tokens(method.backbone, g, masks, method.mask_token)
    s_cls = list(method.dino_head(s_tokens[:, 0]).chunk(2)) + [
        method.dino_head(method.backbone(v)) for v in views[2:]
    ]
    p = F.softmax((t_cls - method.center) / tau, dim=-1).chunk(2)
    q = F.softmax((t_patch - method.center2) / tau, dim=-1)
    pairs = [
        -(p[i] * F.log_softmax(s_cls[v] / 0.1, dim=-1)).sum(dim=-1).mean()
        for i in range(2)
        for v in range(len(s_cls))
        if v != i
    ]
    dino = sum(pairs) / len(pairs)
    s_patch = method.ibot_head(s_tokens[:, 1:][m])
    per_patch = -(q * F.log_softmax(s_patch / 0.1, dim=-1)).sum(dim=-1)
    image = torch.arange(m.shape[0]).unsqueeze(1).expand_as(m)[m]
    ibot = sum(per_patch[k] / m[image[k]].sum() for k in range(len(per_patch))) / m.shape[0]
    kol = sum(koleo(c) for c in s_tokens[:, 0].chunk(2))
    return dino + 0.1 * kol + ibot, t_cls, t_patch


@pytest.mark.parametrize("separate_head", [False, True])
def test_the_loss_is_forward_backward_s_and_both_centres_move_by_the_ema_of_the_teacher_s_means(
    vit, separate_head
):
    method = vit(separate_head=separate_head).eval()  # eval: no dropout, the same outputs on every call
    assert (method.ibot_head is method.dino_head) != separate_head
    views = random_views(0, BATCH, local=2)
    for step in range(2):
        torch.manual_seed(step)
        masks = method.draw_masks(BATCH, "cpu")
        assert masks.any()
        old_center, old_center2 = method.center.clone(), method.center2.clone()
        with torch.no_grad():
            expected, t_cls, t_patch = loss_by_the_formula(method, views, masks)
        torch.manual_seed(step)
        loss = method.training_loss(views, None, torch.arange(BATCH))
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        torch.testing.assert_close(method.center, 0.9 * old_center + 0.1 * t_cls.mean(dim=0, keepdim=True))
        # the patch centre: the mean over every masked patch of the batch (one process's)
        torch.testing.assert_close(
            method.center2, 0.9 * old_center2 + 0.1 * t_patch.mean(dim=0, keepdim=True)
        )


def sinkhorn_knopp_by_the_formula(t, tau):
    """sinkhorn_knopp_teacher in one process: Q = exp(t / tau)^T [K, B] scaled to mass 1, then three times
    each prototype's row to 1/K and each crop's column to 1/B; Q x B, transposed."""
    q = torch.exp(t / tau).T
    q = q / q.sum()
    k, b = q.shape
    for _ in range(3):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / b
    return (q * b).T


def test_sinkhorn_knopp_is_the_official_iteration_and_spreads_the_mass_over_the_prototypes(vit):
    method = vit(centering="sinkhorn_knopp")
    method.teacher_temp = 0.07
    torch.manual_seed(0)
    cls, patches = torch.randn(64, OUT) * 0.3, torch.randn(40, OUT) * 0.3
    targets, patch_targets = method.teacher_targets(cls, patches)
    for q, t, n in ((targets, cls, 64), (patch_targets, patches, 40)):
        torch.testing.assert_close(q, sinkhorn_knopp_by_the_formula(t, 0.07))
        torch.testing.assert_close(q.sum(dim=1), torch.ones(n))  # every crop (patch): a distribution
        softmax = F.softmax(t / 0.07, dim=-1)  # what no centring would give: further from n / K per prototype
        assert (q.sum(dim=0) - n / OUT).abs().max() < (softmax.sum(dim=0) - n / OUT).abs().max()
    assert not method.center.any() and not method.center2.any()  # Sinkhorn-Knopp moves no running centre
    flat, _ = method.teacher_targets(torch.zeros(6, OUT), torch.zeros(3, OUT))  # equal scores: uniform
    torch.testing.assert_close(flat, torch.full((6, OUT), 1 / OUT))


def test_a_batch_without_a_masked_patch_has_a_patch_loss_of_zero_under_either_centring(vit):
    for centering in ("centering", "sinkhorn_knopp"):
        method = vit(centering=centering, mask_probability=0.0)  # int(crops x 0) masked: none
        loss = method.training_loss(random_views(0, BATCH, local=2), None, torch.arange(BATCH))
        assert torch.isfinite(loss)
        _, patch_targets = method.teacher_targets(torch.zeros(4, OUT), torch.zeros(0, OUT))
        assert patch_targets.shape == (0, OUT)
        empty = torch.zeros(BATCH * 2, 16, dtype=torch.bool)
        assert masked_patch_cross_entropy(patch_targets, torch.zeros(0, OUT), empty).item() == 0.0


def test_half_the_global_crops_are_masked_each_with_a_share_from_its_own_bin(vit):
    method = vit(mask_probability=0.5, mask_ratio=[0.1, 0.5])
    torch.manual_seed(0)
    for _ in range(5):
        counts = method.draw_masks(32, "cpu").flatten(1).sum(dim=1)  # [2 x 32] crops, 16 patches each
        # int(64 x 0.5) crops to mask, the rest not at all; a share of 1 patch may find no block (as the
        # official MaskingGenerator, whose blocks aim at 4 patches or more)
        assert 28 <= int((counts > 0).sum()) <= 32
        assert counts.max() <= 8  # a share at most 0.5 of the 16 patches
    shares = mask_share_draws(8, 0.5, (0.1, 0.5), random.Random(0))
    drawn = sorted(s for s in shares if s > 0)
    assert len(drawn) == 4 and shares.count(0.0) == 4
    for i, s in enumerate(drawn):  # one share in each of the bins [0.1, 0.2), [0.2, 0.3), ...
        assert 0.1 + 0.1 * i <= s <= 0.2 + 0.1 * i


def test_the_teacher_temperature_warms_up_per_step_then_stays(vit):
    method = vit(warmup_teacher_temp_epochs=2, warmup_teacher_temp=0.04, teacher_temp=0.07)
    temps = [method.teacher_temperature(s, 2) for s in range(6)]  # 2 steps an epoch: 4 warm-up steps
    assert temps[:4] == pytest.approx([0.04, 0.05, 0.06, 0.07])  # np.linspace(0.04, 0.07, 4)
    assert temps[4] == temps[5] == pytest.approx(0.07)


def test_each_parameter_s_lr_is_layer_decayed_patch_embedding_x0_2_and_norms_and_biases_undecayed(vit):
    method = vit(layer_decay=0.5, patch_embed_lr_mult=0.2)
    blocks = len(method.backbone.blocks)  # 2: layers 0 (embeddings), 1, 2 (blocks), 3 (the rest)
    scale, decay = {}, {}
    for group in method.param_groups():
        for p in group["params"]:
            scale[id(p)], decay[id(p)] = group["lr_scale"], group.get("weight_decay") != 0.0
    b = method.backbone
    assert (
        scale[id(b.cls_token)]
        == scale[id(b.pos_embed)]
        == scale[id(method.mask_token)]
        == 0.5 ** (blocks + 1)
    )
    assert scale[id(b.patch_embed.proj.weight)] == pytest.approx(0.2 * 0.5 ** (blocks + 1))
    assert (
        scale[id(b.blocks[0].attn.qkv.weight)] == 0.5**blocks and scale[id(b.blocks[1].mlp.fc1.weight)] == 0.5
    )
    assert (
        scale[id(b.norm.weight)] == 1.0
        and scale[id(method.dino_head.last_layer.parametrizations.weight.original0)] == 1.0
    )
    assert decay[id(b.cls_token)] and decay[id(method.mask_token)] and decay[id(b.blocks[0].attn.qkv.weight)]
    assert not decay[id(b.blocks[0].norm1.weight)] and not decay[id(b.blocks[0].attn.qkv.bias)]
    assert not decay[id(method.dino_head.mlp[0].bias)]
    trained = {id(p) for p in method.parameters() if p.requires_grad}
    assert set(scale) == trained and sum(len(g["params"]) for g in method.param_groups()) == len(trained)


def test_each_module_s_gradient_norm_is_clipped_the_last_layer_frozen_first_and_the_teacher_evaluated(vit):
    method = vit(separate_head=True)
    trained = [p for p in method.parameters() if p.requires_grad]
    for p in trained:
        p.grad = torch.full_like(p, 10.0)
    method.on_before_step(EpochContext(0, 10, 0, 10, torch.device("cpu"), forward_train_set=None))
    backbone = [*method.backbone.parameters(), method.mask_token]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in backbone]))
    assert norm.item() == pytest.approx(3.0, rel=1e-4)  # one total norm for the backbone and its mask token
    for head in method.heads:
        assert all(p.grad is None for p in head.last_layer.parameters())
        rest = [p.grad for p in head.mlp.parameters()]
        assert (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in rest])) <= 3.0 + 1e-4
        )
    for p in trained:
        p.grad = torch.ones_like(p)
    method.on_before_step(EpochContext(1, 10, 10, 10, torch.device("cpu"), forward_train_set=None))
    assert all(p.grad is not None for h in method.heads for p in h.last_layer.parameters())
    assert method.encoder() is method.teacher[0] and not any(
        p.requires_grad for p in method.teacher.parameters()
    )
    assert (
        len(method.teacher) == 3 and len(vit().teacher) == 2
    )  # a separate ibot head has its own teacher copy


def test_an_unknown_centring_is_a_config_error_naming_it(vit):
    with pytest.raises(ConfigError, match="methods/dinov2/config.yaml: centering must be one of"):
        vit(centering="sk")
    assert math.isclose(vit().clip_grad, 3.0)
