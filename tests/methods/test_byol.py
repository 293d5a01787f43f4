"""BYOL (methods/byol): the regression loss, its symmetric sum, the target that receives no gradient and
moves by exactly the scheduled tau, and the per-view settings of its asymmetric views."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, random_views
from torch import nn

from sslbench.errors import ConfigError
from sslbench.kit.losses import cosine_regression
from sslbench.pretrain.trainer import Trainer


def byol_normalise(x):
    """byol/utils/helpers.py regression_loss's normalisation: x * rsqrt(max(sum x^2, 1e-12))."""
    return x * torch.rsqrt(torch.clamp((x * x).sum(-1, keepdim=True), min=1e-12))


def test_regression_loss_by_hand():
    p = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]])
    z = torch.tensor([[5.0, 0.0], [1.0, 0.0], [-1.0, -1.0]])
    # cos = 1, 0, -1: the pairs cost 2 - 2 cos = 0, 2, 4, whatever the norms; mean 2
    assert cosine_regression(p, z).item() == pytest.approx(2.0, abs=1e-6)
    g = torch.Generator().manual_seed(0)
    p, z = (
        torch.randn(7, 5, generator=g, dtype=torch.float64),
        torch.randn(7, 5, generator=g, dtype=torch.float64),
    )
    official = (byol_normalise(p) - byol_normalise(z)).pow(2).sum(-1).mean()
    assert cosine_regression(p, z).item() == pytest.approx(official.item(), rel=1e-12)
    assert cosine_regression(p, z).item() == pytest.approx((2 - 2 * F.cosine_similarity(p, z)).mean().item())


def test_loss_is_the_sum_of_both_directions_against_the_target(build):
    method = build("byol")
    v1, v2 = random_views()
    loss = method.training_loss([v1, v2], None, torch.arange(16))
    q1, q2 = (method.predictor(method.projector(method.backbone(v))) for v in (v1, v2))
    z1, z2 = method.target(v1), method.target(v2)
    expected = (byol_normalise(q1) - byol_normalise(z2)).pow(2).sum(-1).mean()
    expected = expected + (byol_normalise(q2) - byol_normalise(z1)).pow(2).sum(-1).mean()
    torch.testing.assert_close(loss, expected)
    assert 0 < loss.item() < 8  # two terms in [0, 4]: summed, not averaged


def test_heads_are_networks_py_mlps_and_the_target_is_initialised_on_its_own(build):
    method = build("byol", proj_hidden_dim=32, pred_hidden_dim=24, target_init="own")
    d = method.feature_dim
    for mlp, dims in ((method.projector, (d, 32, 256)), (method.predictor, (256, 24, 256))):
        assert [type(m) for m in mlp] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]  # no output BN
        assert (mlp[0].in_features, mlp[0].out_features, mlp[3].out_features) == dims
        assert mlp[0].bias is not None and mlp[3].bias is None  # hidden Linear with bias, output without
    online = [*method.backbone.parameters(), *method.projector.parameters()]
    target = list(method.target.parameters())
    assert [p.shape for p in target] == [p.shape for p in online]
    assert not any(p.requires_grad for p in target)
    differing = [not torch.equal(t, o) for t, o in zip(target, online) if t.ndim > 1]
    assert all(differing)  # own random draw, not a copy (byol_experiment.py _make_initial_state)
    copied = build("byol", target_init="copy")
    pairs = zip(copied.target.parameters(), [*copied.backbone.parameters(), *copied.projector.parameters()])
    assert all(torch.equal(t, o) for t, o in pairs)
    with pytest.raises(ConfigError, match="config key `target_init` must be own or copy, got 'twin'"):
        build("byol", target_init="twin")


def test_groups_exclude_biases_and_norms_and_never_hold_the_target(build):
    method = build("byol")
    weights, excluded = method.param_groups()
    online = [*method.backbone.parameters(), *method.projector.parameters(), *method.predictor.parameters()]
    assert {id(p) for p in weights["params"]} == {id(p) for p in online if p.ndim > 1}
    assert {id(p) for p in excluded["params"]} == {id(p) for p in online if p.ndim <= 1}
    assert excluded["weight_decay"] == 0.0 and excluded["exclude_from_lars"]


@pytest.mark.parametrize("target_init", ["own", "copy"])
def test_the_target_gets_no_gradient_and_moves_by_exactly_the_scheduled_tau(
    tmp_path, method_config, target_init
):
    # tau_base 0.9 over 2 epochs x 21 steps (1,347 digits / 64): tau_k = 1 - 0.1 (cos(pi k / 42) + 1) / 2,
    # by hand, at steps 0 and 30 (the engine's own train_step: optimiser step, then the momentum update)
    cfg = method_config("byol", momentum=0.9, target_init=target_init)
    trainer = Trainer(METHODS_DIR / "byol", cfg, 0, tmp_path, device="cpu", progress=False)
    method, g = trainer.method, torch.Generator().manual_seed(0)
    assert trainer.total_steps == 42
    for k in (0, 30):
        trainer.state.step = k
        ctx = trainer.epoch_context()
        idx = torch.randperm(len(trainer.labels), generator=g)[:64]
        batch = trainer.make_views(trainer.data.train.images[idx], g)
        before = [p.detach().clone() for p in method.target.parameters()]
        trainer.train_step(batch, idx, ctx)
        tau = 1 - 0.1 * (math.cos(math.pi * k / 42) + 1) / 2
        online = [p.detach() for m in (method.backbone, method.projector) for p in m.parameters()]
        for new, old, o in zip(method.target.parameters(), before, online):
            assert new.grad is None
            torch.testing.assert_close(new.detach(), tau * old + (1 - tau) * o, rtol=1e-5, atol=1e-7)
        assert ctx.log["target_momentum"] == pytest.approx(tau)
    # the predictor is no part of the pair: the target is [backbone, projector] only
    assert sum(p.numel() for p in method.target.parameters()) == sum(
        p.numel() for m in (method.backbone, method.projector) for p in m.parameters()
    )


def test_views_are_the_asymmetric_pair(tmp_path, method_config):
    trainer = Trainer(METHODS_DIR / "byol", method_config("byol"), 0, tmp_path, device="cpu", progress=False)
    first, second = trainer.view_groups
    assert (first.count, second.count) == (1, 1)
    assert (first.config.blur_p, first.config.solarise_p) == (1.0, 0.0)
    assert (second.config.blur_p, second.config.solarise_p) == (0.1, 0.2)
    for view in (first.config, second.config):  # augmentations.py's colour settings, crop (0.08, 1)
        assert (view.brightness, view.contrast, view.saturation, view.hue, view.jitter_p) == (
            0.4,
            0.4,
            0.2,
            0.1,
            0.8,
        )
        assert (view.gray_p, view.crop_scale) == (0.2, (0.08, 1.0))
