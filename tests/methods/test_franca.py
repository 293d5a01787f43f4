"""Franca (methods/franca): the whole loss against ssl_meta_arch.py's forward_backward with its nested heads
written out level by level (Sinkhorn-Knopp targets per level, DINO's and iBOT's terms summed over the
levels), the masks that collate_data_and_cast draws with the inverse rolled blocks, and the settings it
refuses. The step it shares with DINOv2 is pinned in test_dinov2.py, the masks and the head in tests/kit;
under 2 processes everything is one process's on the whole batch: tests/methods/test_distributed.py."""

import pytest
import torch
import torch.nn.functional as F
from support import VIT_P2_PADDED, random_views

from sslbench.errors import ConfigError
from sslbench.kit.clustering import balanced_assignment
from sslbench.kit.losses import koleo
from sslbench.kit.method import MatryoshkaDINOHead
from sslbench.kit.vit import masked_tokens

BATCH = 8
SMALL = {
    "out_dim": 32,
    "ibot_out_dim": 48,
    "hidden_dim": 24,
    "bottleneck_dim": 12,
    "nesting_divisors": [4, 2, 1],
}


@pytest.fixture
def vit(build):
    def make(**overrides):
        torch.manual_seed(0)
        return build("franca", 0, backbone=VIT_P2_PADDED, **{**SMALL, **overrides}).eval()

    return make


def test_the_heads_nest_three_widths_of_the_backbone_each_with_its_share_of_the_prototypes(vit):
    method = vit()
    d = method.feature_dim  # the tiny ViT's 32
    for head, out in ((method.dino_head, 32), (method.ibot_head, 48)):
        assert isinstance(head, MatryoshkaDINOHead) and head.nesting == [d // 4, d // 2, d]
        assert [layer.out_features for layer in head.last_layer] == [out // 4, out // 2, out]
    assert method.ibot_head is not method.dino_head


def loss_by_the_formula(method, views, masks):
    """forward_backward with MRL: per level l, the teacher's class-token outputs on the 2 global crops and its
    masked-patch outputs each through 3 Sinkhorn-Knopp iterations; DINO's term of level l the mean over the
    (teacher crop, other student crop) pairs; iBOT's the masked patches' cross-entropies weighted by 1 / their
    image's masked count, over the 2B crops; both summed over the levels; KoLeo as DINOv2's."""
    tau = method.teacher_temp
    g = torch.cat(views[:2])
    m = masks.flatten(1)
    t_tokens = masked_tokens(method.teacher[0], g)
    t_cls, t_patch = method.teacher[1](t_tokens[:, 0]), method.teacher[2](t_tokens[:, 1:][m])
    s_tokens = masked_tokens(method.backbone, g, masks, method.mask_token)
    s_cls = method.dino_head(s_tokens[:, 0])
    s_local = [method.dino_head(method.backbone(v)) for v in views[2:]]
    s_patch = method.ibot_head(s_tokens[:, 1:][m])
    image = torch.arange(m.shape[0]).unsqueeze(1).expand_as(m)[m]
    dino = ibot = 0.0
    for level in range(3):
        p = balanced_assignment(torch.exp(t_cls[level] / tau)).chunk(2)
        students = list(s_cls[level].chunk(2)) + [out[level] for out in s_local]
        pairs = [
            -(p[i] * F.log_softmax(students[v] / 0.1, dim=-1)).sum(dim=-1).mean()
            for i in range(2)
            for v in range(len(students))
            if v != i
        ]
        dino = dino + sum(pairs) / len(pairs)
        q = balanced_assignment(torch.exp(t_patch[level] / tau), num_samples=int(m.sum()))
        per_patch = -(q * F.log_softmax(s_patch[level] / 0.1, dim=-1)).sum(dim=-1)
        ibot = ibot + sum(per_patch[k] / m[image[k]].sum() for k in range(len(per_patch))) / m.shape[0]
    kol = sum(koleo(c) for c in s_tokens[:, 0].chunk(2))
    return dino + 0.1 * kol + ibot


def test_the_loss_is_forward_backward_s_with_every_level_s_terms_summed(vit):
    method = vit()
    views = random_views(0, BATCH, local=2)
    torch.manual_seed(0)
    masks = method.draw_masks(BATCH, "cpu")
    assert masks.any()
    torch.manual_seed(0)
    loss = method.training_loss(views, None, None)
    assert torch.allclose(loss, loss_by_the_formula(method, views, masks), atol=1e-5)
    one_level = vit(nesting_divisors=[1])
    torch.manual_seed(0)
    assert not torch.allclose(one_level.training_loss(views, None, None), loss, atol=1e-3)


def test_half_the_crops_are_masked_every_patch_but_one_rolled_block_with_a_share_from_its_bin(vit):
    method = vit()
    torch.manual_seed(0)
    for _ in range(5):
        counts = method.draw_masks(32, "cpu").flatten(1).sum(dim=1)  # 2 x 32 crops of 16 patches
        masked = sorted(int(c) for c in counts if c > 0)
        assert len(masked) == 32  # int(64 x 0.5), each at least int(16 x 0.1) = 1 patch
        # shares in 32 equal bins of [0.1, 0.65]: the i-th crop's count is int(16 x share_i), exactly
        assert masked[0] >= 1 and masked[-1] <= int(16 * 0.65)


@pytest.mark.parametrize(
    "overrides,key",
    [
        ({"centering": "centering"}, "centering"),
        ({"nesting_divisors": [2, 4, 1]}, "nesting_divisors"),
        ({"nesting_divisors": [3, 1]}, "nesting_divisors"),  # 3 divides neither 32 nor out_dim
        ({"nesting_divisors": [4, 2]}, "nesting_divisors"),  # the widest level must be the backbone's
    ],
)
def test_settings_the_nested_heads_cannot_take_are_config_errors_naming_the_key(vit, overrides, key):
    with pytest.raises(ConfigError, match=f"methods/franca/config.yaml: {key}"):
        vit(**overrides)
