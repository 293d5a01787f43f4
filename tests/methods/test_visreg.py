"""VISReg (methods/visreg; sslbench.kit.losses.visreg_terms): the centre, scale and shape terms by hand and
their invariants, and the method's loss by hand (every view predicts the global views' centre; the terms on
every view with the same fresh directions), its projector, views, weight decay and clipping.

The DDP side (2 gloo processes give the one-process loss and gradients on the whole batch) is
tests/methods/test_distributed.py, which discovers this folder."""

import math
from statistics import NormalDist

import pytest
import torch
from support import METHODS_DIR, fixed_batch_losses, mlp_layout
from torch import nn

from sslbench.kit.losses import centre_prediction, visreg_terms
from sslbench.pretrain.trainer import Trainer

ONE = torch.ones(1, 1, dtype=torch.float64)  # the one direction of a 1-d embedding


def test_terms_by_hand_on_two_points():
    # z = 3, 5: mean 4, biased std 1 (+ 1e-6); normalised -1, 1 against the quantiles at 1/3, 2/3
    centre, scale, shape = visreg_terms(torch.tensor([[3.0], [5.0]], dtype=torch.float64), ONE)
    assert centre.item() == pytest.approx(16.0)
    assert scale.item() == pytest.approx(1e-12, abs=1e-15)
    q = NormalDist().inv_cdf(2 / 3)
    x = 1 / (1 + 1e-6)
    assert shape.item() == pytest.approx((x - q) ** 2, rel=1e-12)


def test_terms_by_hand_on_three_points_in_two_dimensions():
    z = torch.tensor([[0.0, 1.0], [0.0, 2.0], [3.0, 6.0]], dtype=torch.float64)
    centre, scale, shape = visreg_terms(z, torch.eye(2, dtype=torch.float64))
    assert centre.item() == pytest.approx((1**2 + 3**2) / 2)
    std = [math.sqrt((1 + 1 + 4) / 3) + 1e-6, math.sqrt((4 + 1 + 9) / 3) + 1e-6]
    assert scale.item() == pytest.approx(sum((s - 1) ** 2 for s in std) / 2, rel=1e-12)
    quantiles = [NormalDist().inv_cdf(i / 4) for i in (1, 2, 3)]
    columns = [[-1 / std[0], -1 / std[0], 2 / std[0]], [-2 / std[1], -1 / std[1], 3 / std[1]]]
    expected = sum((x - q) ** 2 for c in columns for x, q in zip(c, quantiles, strict=True)) / 6
    assert shape.item() == pytest.approx(expected, rel=1e-12)


def test_shape_ignores_shift_and_scale_and_is_small_at_the_quantiles():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 3, generator=g, dtype=torch.float64)
    a = nn.functional.normalize(torch.randn(3, 5, generator=g, dtype=torch.float64), dim=0)
    base = visreg_terms(z, a)[2].item()
    assert visreg_terms(4.0 + 3.0 * z, a)[2].item() == pytest.approx(base, rel=1e-5)  # the 1e-6 in the std
    # a sample at the normal quantiles, shuffled: normalised by its own spread r (< 1 at finite N), each
    # sorted value is q_i / (r + 1e-6): shape = mean_i q_i^2 (1 / (r + 1e-6) - 1)^2, far below a normal draw's
    q = torch.tensor([NormalDist().inv_cdf(i / 51) for i in range(1, 51)], dtype=torch.float64)
    r = q.square().mean().sqrt().item()
    at_quantiles = visreg_terms(q[torch.randperm(50, generator=g)][:, None], ONE)[2].item()
    assert at_quantiles == pytest.approx((q.square().mean() * (1 / (r + 1e-6) - 1) ** 2).item(), rel=1e-9)
    assert at_quantiles < 0.2 * base


def test_scale_gradient_stays_finite_and_pushes_apart_as_the_embeddings_collapse():
    for spread in (1e-1, 1e-4):
        z = (spread * torch.tensor([[-1.0], [1.0]], dtype=torch.float64)).requires_grad_()
        _, scale, _ = visreg_terms(z, ONE)
        scale.backward()
        # std = spread + 1e-6, d std / d z = -1/2, +1/2: the gradient 2 (std - 1) (-/+ 1/2) = +/- (1 - std),
        # near 1 in size however close the collapse; descent moves the two points apart
        assert z.grad[0, 0].item() == pytest.approx(1 - spread - 1e-6, rel=1e-6)
        assert z.grad[1, 0].item() == pytest.approx(-(1 - spread - 1e-6), rel=1e-6)


def test_the_shape_term_passes_no_gradient_through_the_std():
    # sg(std): the gradient is the one with the std held constant
    z = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64, requires_grad=True)
    visreg_terms(z, ONE)[2].backward()
    grad, centred = z.grad[:, 0], (z - z.mean()).detach()[:, 0]
    assert grad.sum().item() == pytest.approx(0.0, abs=1e-12)  # the mean's gradient cancels
    std = math.sqrt(centred.square().mean().item()) + 1e-6
    quantiles = torch.tensor([NormalDist().inv_cdf(i / 4) for i in (1, 2, 3)], dtype=torch.float64)
    expected = 2 * (centred / std - quantiles) / 3 / std  # as if std were a constant
    expected -= expected.mean()
    torch.testing.assert_close(grad, expected)


# --------------------------------------------------------------------------- the method


@pytest.fixture
def trainer(tmp_path, method_config):
    return Trainer(
        METHODS_DIR / "visreg", method_config("visreg", projector=[32, 32, 8]), 0, tmp_path, progress=False
    )


def test_projector_is_the_official_mlp_with_every_bias(trainer):
    kinds, shapes, biases = mlp_layout(trainer.method.projector)
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert shapes == [(trainer.method.feature_dim, 32), (32, 32), (32, 8)]
    assert biases == [True, True, True]


def test_four_global_views_and_no_local_ones(trainer):
    views = trainer.make_views(trainer.data.train.images[:4], torch.Generator().manual_seed(0))
    assert len(views) == trainer.method.num_views == 4
    assert {v.shape[-1] for v in views} == {trainer.data.train.images.shape[-1]}


@pytest.mark.parametrize("lamb", [0.0, 0.6, 1.0])
def test_the_method_s_loss_by_hand(tmp_path, method_config, lamb):
    cfg = method_config("visreg", lamb=lamb, num_slices=5, global_views=2)
    method = Trainer(METHODS_DIR / "visreg", cfg, 0, tmp_path, progress=False).method
    method.backbone, method.projector = nn.Identity(), nn.Identity()  # the views are the projections
    g = torch.Generator().manual_seed(1)
    z = [
        torch.randn(10, 3, generator=g, dtype=torch.float64) * (i + 1) for i in range(4)
    ]  # 2 global, 2 local
    torch.manual_seed(3)
    got = method.training_loss(z, None, torch.arange(10)).item()
    torch.manual_seed(3)  # the directions: 5 unit columns drawn from the global RNG
    directions = nn.functional.normalize(torch.randn(3, 5), dim=0).double()
    centre = (z[0] + z[1]) / 2
    prediction = sum(((centre - v) ** 2).mean() for v in z) / 4
    regulariser = sum(sum(visreg_terms(v, directions)) for v in z) / 4
    assert got == pytest.approx(((1 - lamb) * prediction + lamb * regulariser).item(), rel=1e-6)
    assert prediction.item() == pytest.approx(centre_prediction(torch.stack(z), 2).item())


def test_weight_decay_spares_biases_and_norms(trainer):
    groups = trainer.method.param_groups()
    decayed = [g for g in groups if g.get("weight_decay", 0.05) > 0]
    assert all(p.ndim > 1 for g in decayed for p in g["params"])
    assert all(p.ndim == 1 for g in groups if g.get("weight_decay") == 0.0 for p in g["params"])


def test_the_gradients_total_norm_is_clipped_to_one(trainer):
    for p in trainer.method.parameters():
        p.grad = torch.full_like(p, 10.0)
    trainer.method.on_before_step(None)
    total = torch.sqrt(sum(p.grad.square().sum() for p in trainer.method.parameters()))
    assert total.item() == pytest.approx(1.0, rel=1e-4)
    ratios = {round((p.grad / 10.0).flatten()[0].item() * 1e6) for p in trainer.method.parameters()}
    assert len(ratios) == 1  # one factor for all: the total norm, not each tensor's


def test_training_lowers_the_loss_on_a_fixed_batch(trainer):
    losses = fixed_batch_losses(trainer, steps=15, labelled=False, reseed=0)  # the same directions every step
    assert losses[-1] < 0.7 * losses[0], losses
