"""DINOv3's Gram anchoring (methods/dinov3): before its phase the loss is DINOv2's (the kit's step, pinned in
test_dinov2.py); in it, DINOv2's terms with the local crops' pairs reweighted plus the Gram loss of the
student's patch tokens against the Gram teacher's, computed here from timm's own forward; the Gram teacher
loaded and refreshed on the steps train.py's loop picks, replayed; the weights' schedules. The Gram loss and
the schedule are pinned in tests/kit; under 2 processes everything is one process's on the whole batch:
tests/methods/test_distributed.py."""

import pytest
import torch
import torch.nn.functional as F
from support import VIT_P2_PADDED, random_views

from sslbench.errors import ConfigError
from sslbench.kit.losses import gram_loss

BATCH = 8
SMALL = {"out_dim": 32, "ibot_out_dim": 24, "hidden_dim": 24, "bottleneck_dim": 12}


@pytest.fixture
def vit(build):
    def make(name="dinov3", **overrides):
        torch.manual_seed(0)
        return build(name, 0, backbone=VIT_P2_PADDED, **{**SMALL, **overrides}).eval()

    return make


def losses(method, views, seed=0):
    torch.manual_seed(seed)  # the same masks for every call
    return method.training_loss(views, None, None)


def test_before_the_gram_phase_the_loss_is_dinov2_s_with_the_same_settings(vit):
    v3 = vit()
    v2 = vit("dinov2", separate_head=True, centering="sinkhorn_knopp")
    v3.anchor(0, 100)
    assert (v3.gram_weight, v3.local_weight) == (0.0, 1.0)
    views = random_views(0, BATCH, local=2)
    assert torch.equal(losses(v3, views), losses(v2, views))


def gram_targets_by_hand(method, crops, scale):
    """The Gram teacher's normed patch tokens by timm's forward_features of the crops resized x scale
    (bicubic), each channel's grid brought back to the student's by a bicubic resize."""
    big = (
        F.interpolate(crops, scale_factor=scale, mode="bicubic", align_corners=False) if scale > 1 else crops
    )
    tokens = method.gram_teacher.forward_features(big)[:, 1:]
    side = int(tokens.shape[1] ** 0.5)
    maps = tokens.reshape(len(crops), side, side, -1).permute(0, 3, 1, 2)
    maps = F.interpolate(maps, size=(method.grid, method.grid), mode="bicubic", align_corners=False)
    return maps.permute(0, 2, 3, 1).reshape(len(crops), method.grid**2, -1)


@pytest.mark.parametrize("scale", [1, 2])
def test_in_the_phase_the_loss_adds_the_weighted_gram_loss_and_reweights_the_local_pairs(vit, scale):
    method = vit(gram_teacher_scale=scale, gram_start=0.5, gram_ramp=0.0)
    with torch.no_grad():  # a Gram teacher other than the student, as after some steps
        for p in method.gram_teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    method.anchor(60, 100)
    assert (method.gram_weight, method.local_weight) == (2.0, 0.5)
    views = random_views(1, BATCH, local=2)
    total = losses(method, views)
    torch.manual_seed(0)
    terms = method.distillation_terms(views, local_weight=0.5)
    dinov2_part = terms.dino + 0.1 * terms.koleo + terms.ibot  # the config's weights 1, 0.1, 1
    targets = gram_targets_by_hand(method, torch.cat(views[:2]), scale)
    expected = dinov2_part + 2.0 * gram_loss(terms.student_tokens[:, 1:], targets)
    assert torch.allclose(total, expected, atol=1e-5)
    assert not torch.allclose(total, dinov2_part, atol=1e-3)  # the Gram term is not nothing
    unweighted = method.distillation_terms(views, local_weight=1.0)
    assert not torch.allclose(terms.dino, unweighted.dino)  # the local pairs count half


def official_gram_copies(total, load, first, every, max_updates):
    """train.py's loop: the steps (iterations done) at which the Gram teacher takes the EMA teacher's weights:
    before iteration it_load_ema_teacher, and after an iteration it whose it + 1 passes the update test. A
    step may copy twice (after the iteration before, then before its own): the same weights, listed once."""
    copies, updates = [], 0
    for it in range(total):
        if it == load:
            copies.append(it)
        if it + 1 >= first and (it + 1) % every == 0 and updates < max_updates:
            copies.append(it + 1)
            updates += 1
    return sorted(set(copies))


@pytest.mark.parametrize(
    "shares,steps",  # (gram_start, gram_first_update, gram_update_every) and the steps they give of 100
    [
        ((0.8333, 0.8417, 0.0083), (83, 84, 1)),
        ((0.5, 0.8, 0.05), (50, 80, 5)),
        ((0.3, 0.3, 0.1), (30, 30, 10)),
    ],
)
def test_the_gram_teacher_is_loaded_as_the_phase_starts_and_refreshed_as_train_py_does(vit, shares, steps):
    start, first, every = shares
    method = vit(gram_start=start, gram_first_update=first, gram_update_every=every, gram_max_updates=3)
    copies = []
    for step in range(101):
        with torch.no_grad():  # the EMA teacher moves every step
            next(method.teacher[0].parameters()).add_(1.0)
        before = next(method.gram_teacher.parameters()).clone()
        method.anchor(step, 100)
        if step:  # the epoch-start hook and the step-end hook both call it: a second call copies nothing new
            method.anchor(step, 100)
        now = next(method.gram_teacher.parameters())
        if not torch.equal(before, now):
            assert torch.equal(now, next(method.teacher[0].parameters()))
            copies.append(step)
    assert copies == official_gram_copies(100, *steps, max_updates=3)


def test_the_gram_teacher_is_frozen_and_not_the_evaluated_encoder(vit):
    method = vit()
    assert not any(p.requires_grad for p in method.gram_teacher.parameters())
    grouped = {id(p) for group in method.param_groups() for p in group["params"]}
    assert not grouped & {id(p) for p in method.gram_teacher.parameters()}
    assert method.encoder() is method.teacher[0]


def test_an_unknown_negatives_rule_is_a_config_error_naming_the_file_and_key(vit):
    with pytest.raises(ConfigError, match="methods/dinov3/config.yaml: gram_negatives"):
        vit(gram_negatives="drop")
