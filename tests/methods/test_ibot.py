"""iBOT (methods/ibot): the masked-patch loss by hand, the whole loss against iBOTLoss's formula (the class
token's DINO loss, the patch term on the masked patches of the same view, the two centres), the masks'
shares as get_pred_ratio draws them, the teacher-temperature warm-up, the parameter groups, the gradient
clipping and the evaluated encoder. The block-wise mask is pinned in tests/kit/test_vit.py; under 2
processes everything is one process's on the whole batch: tests/methods/test_distributed.py."""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, VIT_P2_PADDED, random_views

from sslbench.errors import ConfigError
from sslbench.kit.method import EpochContext
from sslbench.kit.vit import masked_tokens
from sslbench.plugins import load_method_class

ibot = inspect.getmodule(load_method_class(METHODS_DIR / "ibot"))

BATCH = 8
OUT = 32


@pytest.fixture
def vit(build):
    def make(**overrides):
        small = {"out_dim": OUT, "hidden_dim": 24, "bottleneck_dim": 12}
        return build("ibot", 0, backbone=VIT_P2_PADDED, **{**small, **overrides})

    return make


def ibot_loss_by_the_formula(method, views, masks):
    """iBOTLoss.forward written out with the method's networks: the teacher on the unmasked global crops, the
    student on the masked ones (every token) and on the local crops (the class token)."""
    temps = method.temps
    g = torch.cat(views[:2])
    t = method.teacher[1](masked_tokens(method.teacher[0], g))
    s = method.head(masked_tokens(method.backbone, g, masks, method.mask_token))
    s_cls = list(s[:, 0].chunk(2)) + [method.head(method.backbone(v)) for v in views[2:]]
    t_cls = F.softmax((t[:, 0] - method.center) / temps[0], dim=-1).chunk(2)
    t_patch = F.softmax((t[:, 1:] - method.center2) / temps[1], dim=-1).chunk(2)
    s_patch = (s[:, 1:] / 0.1).chunk(2)
    m = masks.flatten(1).float().chunk(2)
    cls_terms, patch_terms = [], []
    for q in range(2):
        for v in range(len(s_cls)):
            if v == q:
                loss2 = torch.sum(-t_patch[q] * F.log_softmax(s_patch[v], dim=-1), dim=-1)
                patch_terms.append((torch.sum(loss2 * m[v], dim=-1) / m[v].sum(dim=-1).clamp(min=1.0)).mean())
            else:
                cls_terms.append(torch.sum(-t_cls[q] * F.log_softmax(s_cls[v] / 0.1, dim=-1), dim=-1).mean())
    return sum(cls_terms) / len(cls_terms) + sum(patch_terms) / len(patch_terms), t


def test_the_loss_is_ibotloss_and_both_centres_move_by_the_ema_of_the_teacher_s_means(vit):
    method = vit().eval()  # eval: no dropout anywhere, the same outputs on every call
    views = random_views(0, BATCH, local=2)
    for step in range(2):
        torch.manual_seed(step)
        masks = method.draw_masks(BATCH, "cpu")
        assert masks.any()
        old_center, old_center2 = method.center.clone(), method.center2.clone()
        with torch.no_grad():
            expected, t = ibot_loss_by_the_formula(method, views, masks)
        torch.manual_seed(step)
        loss = method.training_loss(views, None, torch.arange(BATCH))
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        torch.testing.assert_close(method.center, 0.9 * old_center + 0.1 * t[:, 0].mean(dim=0, keepdim=True))
        patch_mean = t[:, 1:].mean(dim=1).mean(dim=0, keepdim=True).unsqueeze(0)
        torch.testing.assert_close(method.center2, 0.9 * old_center2 + 0.1 * patch_mean)


def test_the_masks_shares_are_zero_or_uniform_around_the_ratio_as_get_pred_ratio_draws_them(vit):
    method = vit(pred_ratio=[0.0, 0.3], pred_ratio_var=[0.0, 0.2])
    torch.manual_seed(0)
    counts = torch.cat([method.draw_masks(64, "cpu").flatten(1).sum(dim=1) for _ in range(10)])
    assert counts.shape == (2 * 64 * 10,)
    none = (counts == 0).float().mean()
    assert 0.4 < none < 0.6  # pred_ratio 0 chosen half the time; U(0.1, 0.5) x 16 patches masks some
    assert counts.max() <= 8  # at most 0.5 of the 16 patches
    only = vit(pred_ratio=[0.5], pred_ratio_var=[0.0])
    masks = only.draw_masks(32, "cpu").flatten(1).sum(dim=1)
    assert (masks <= 8).all() and masks.float().mean() >= 6


def test_the_teacher_temperatures_warm_up_per_epoch_then_stay(vit):
    method = vit(warmup_teacher_temp_epochs=3, teacher_temp=0.07, teacher_patch_temp=0.06)
    temps = [method.temperatures(e) for e in range(5)]
    assert temps[0] == pytest.approx((0.04, 0.04))
    assert temps[1] == pytest.approx((0.055, 0.05))  # linspace(0.04, final, 3)[1]
    assert temps[3] == temps[4] == pytest.approx((0.07, 0.06))


def test_the_mask_token_is_decayed_biases_and_norms_are_not_and_the_teacher_is_evaluated(vit):
    method = vit()
    decayed, free = (group["params"] for group in method.param_groups())
    ids = lambda params: {id(p) for p in params}  # noqa: E731
    assert id(method.mask_token) in ids(decayed) and id(method.backbone.cls_token) in ids(decayed)
    assert {id(method.backbone.norm.weight), id(method.head.mlp[0].bias)} <= ids(free)
    trained = [p for p in method.parameters() if p.requires_grad]
    assert ids(decayed) | ids(free) == ids(trained) and not ids(decayed) & ids(free)
    assert method.encoder() is method.teacher[0] and not any(
        p.requires_grad for p in method.teacher.parameters()
    )


def test_each_gradient_tensor_is_clipped_and_the_last_layer_is_frozen_in_the_first_epoch(vit):
    method = vit()
    trained = [p for p in method.parameters() if p.requires_grad]
    for i, p in enumerate(trained):
        p.grad = torch.full_like(p, 10.0 if i % 2 else 1e-3)
    method.on_before_step(EpochContext(0, 10, 0, 10, torch.device("cpu"), forward_train_set=None))
    last = {id(p) for p in method.head.last_layer.parameters()}
    for i, p in enumerate(trained):
        if id(p) in last:
            assert p.grad is None
        elif i % 2:
            assert p.grad.norm().item() == pytest.approx(3.0, rel=1e-4)
    for p in trained:
        p.grad = torch.ones_like(p)
    method.on_before_step(EpochContext(1, 10, 10, 10, torch.device("cpu"), forward_train_set=None))
    assert all(p.grad is not None for p in method.head.last_layer.parameters() if p.requires_grad)
    assert math.isclose(method.clip_grad, 3.0)


def test_a_ratio_below_its_spread_is_a_config_error_naming_it(vit):
    with pytest.raises(
        ConfigError, match="methods/ibot/config.yaml: pred_ratio 0.1 is below its pred_ratio_var 0.2"
    ):
        vit(pred_ratio=[0.1], pred_ratio_var=[0.2])
