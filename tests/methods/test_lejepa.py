"""LeJEPA (methods/lejepa; sslbench.kit.losses.epps_pulley and sigreg): the Epps-Pulley statistic against its
closed form and its expectation under the null, SIGReg's slicing, and the method's loss by hand (every view
predicts the global views' centre; SIGReg on every view, the same fresh directions for all), its projector and
views.

The DDP side (2 gloo processes give the one-process loss and gradients on the whole batch: SIGReg's averages
over the gathered batch, rank 0's directions) is tests/methods/test_distributed.py, which discovers this
folder."""

import math

import numpy as np
import pytest
import torch
from support import METHODS_DIR, fixed_batch_losses, mlp_layout
from torch import nn

from sslbench.kit.losses import centre_prediction, epps_pulley, random_directions, sigreg
from sslbench.pretrain.trainer import Trainer

ROOT_2PI = math.sqrt(2 * math.pi)
# Over the whole line, with w(t) = exp(-t^2 / 2) = phi(t), N(0, 1)'s characteristic function:
#   integral cos(a t) w dt = sqrt(2 pi) exp(-a^2 / 2),  integral cos(a t) w phi dt = sqrt(pi) exp(-a^2 / 4),
#   integral phi^2 w dt = sqrt(2 pi / 3)
NULL_MEAN = ROOT_2PI - math.sqrt(2 * math.pi / 3)  # E T = integral (1 - phi^2) w dt, for every N
COLLAPSED = ROOT_2PI - 2 * math.sqrt(math.pi) + math.sqrt(2 * math.pi / 3)  # T / N of N equal zeros


def closed_form(x: list[float]) -> float:
    """N x the integral over the whole line of |phi_N - phi|^2 w, expanded into the integrals above."""
    n = len(x)
    pairs = sum(math.exp(-((a - b) ** 2) / 2) for a in x for b in x)
    return n * (
        ROOT_2PI * pairs / n**2
        - 2 * math.sqrt(math.pi) * sum(math.exp(-(a**2) / 4) for a in x) / n
        + math.sqrt(2 * math.pi / 3)
    )


def test_epps_pulley_is_the_closed_form_integral_on_a_wide_fine_grid():
    x = [-1.0, 0.0, 0.5, 2.0]
    got = epps_pulley(torch.tensor(x, dtype=torch.float64)[:, None], t_max=12.0, knots=4001)
    assert got.item() == pytest.approx(closed_form(x), rel=1e-9)
    assert epps_pulley(
        torch.zeros(10, 1, dtype=torch.float64), t_max=12.0, knots=4001
    ).item() == pytest.approx(10 * COLLAPSED, rel=1e-9)


def test_epps_pulley_on_the_default_grid_is_the_trapezoid_over_the_symmetric_interval():
    # epps_pulley.py's grid: 17 points of [0, 3], weights doubled; here numpy's trapezoid on 33 of [-3, 3]
    x = np.array([-1.5, -0.2, 0.3, 0.9, 2.4])
    t = np.linspace(-3, 3, 33)
    ecf = np.exp(1j * np.outer(t, x)).mean(axis=1)
    integrand = np.abs(ecf - np.exp(-(t**2) / 2)) ** 2 * np.exp(-(t**2) / 2)
    expected = len(x) * np.trapezoid(integrand, t)
    assert epps_pulley(torch.tensor(x)[:, None]).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [16, 256])
def test_the_statistic_of_normal_samples_stays_at_its_null_mean_whatever_the_sample_size(n):
    # E |phi_N(t) - phi(t)|^2 = (1 - phi(t)^2) / N: N x the integral has the same mean at every N, on any grid
    t = np.linspace(0, 3, 17)
    weights = np.full(17, 2 * 3 / 16)
    weights[[0, -1]] /= 2
    grid_mean = float((weights * (1 - np.exp(-(t**2))) * np.exp(-(t**2) / 2)).sum())
    assert grid_mean == pytest.approx(NULL_MEAN, abs=0.03)  # the truncation at 3 and the coarse grid
    g = torch.Generator().manual_seed(n)
    statistics = epps_pulley(torch.randn(n, 4000, generator=g, dtype=torch.float64))
    standard_error = statistics.std().item() / math.sqrt(4000)
    assert abs(statistics.mean().item() - grid_mean) < 4 * standard_error


def test_a_collapsed_or_shifted_sample_s_statistic_grows_with_the_sample_size():
    g = torch.Generator().manual_seed(0)
    for n in (64, 512):
        normal = epps_pulley(torch.randn(n, 200, generator=g, dtype=torch.float64)).mean().item()
        shifted = epps_pulley(1.0 + torch.randn(n, 200, generator=g, dtype=torch.float64)).mean().item()
        collapsed = epps_pulley(torch.zeros(n, 1, dtype=torch.float64)).item()
        assert normal < 1.5
        assert shifted > 0.1 * n and collapsed > 0.35 * n  # both about proportional to n
    assert epps_pulley(torch.zeros(128, 1)).item() == pytest.approx(
        2 * epps_pulley(torch.zeros(64, 1)).item()
    )


def test_sigreg_is_the_mean_statistic_of_the_projections_on_the_directions():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(32, 5, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])
    assert sigreg(z, torch.eye(5, dtype=torch.float64)).item() == pytest.approx(epps_pulley(z).mean().item())
    a = torch.nn.functional.normalize(torch.randn(5, 7, generator=g, dtype=torch.float64), dim=0)
    assert sigreg(z, a).item() == pytest.approx(epps_pulley(z @ a).mean().item())
    with pytest.raises(ValueError, match=r"directions must be \[5, S\]"):
        sigreg(z, torch.eye(4, dtype=torch.float64))


def test_sigreg_is_float32_under_bf16_autocast():
    z = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert sigreg(z, torch.eye(8).bfloat16()).dtype == torch.float32


# --------------------------------------------------------------------------- the method


@pytest.fixture
def trainer(tmp_path, method_config):
    return Trainer(
        METHODS_DIR / "lejepa", method_config("lejepa", projector=[32, 32, 8]), 0, tmp_path, progress=False
    )


def test_projector_is_minimal_md_s_mlp_with_every_bias(trainer):
    kinds, shapes, biases = mlp_layout(trainer.method.projector)
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert shapes == [(trainer.method.feature_dim, 32), (32, 32), (32, 8)]
    assert biases == [True, True, True]


def test_views_are_two_global_and_six_local_crops(trainer):
    views = trainer.make_views(trainer.data.train.images[:4], torch.Generator().manual_seed(0))
    side = trainer.data.train.images.shape[-1]
    assert [v.shape[-1] for v in views] == [side] * 2 + [int(0.4375 * side + 0.5)] * 6


def the_loss_by_hand(z: list[torch.Tensor], lamb: float, directions: torch.Tensor) -> torch.Tensor:
    centre = (z[0] + z[1]) / 2
    prediction = sum(((centre - v) ** 2).mean() for v in z) / len(z)  # global views too
    regulariser = sum(epps_pulley(v @ directions).mean() for v in z) / len(z)
    return (1 - lamb) * prediction + lamb * regulariser


@pytest.mark.parametrize("lamb", [0.0, 0.05, 1.0])
def test_the_method_s_loss_by_hand(tmp_path, method_config, lamb):
    method = Trainer(
        METHODS_DIR / "lejepa", method_config("lejepa", lamb=lamb, num_slices=6), 0, tmp_path, progress=False
    ).method
    method.backbone, method.projector = nn.Identity(), nn.Identity()  # the views are the projections
    g = torch.Generator().manual_seed(1)
    z = [torch.randn(12, 3, generator=g, dtype=torch.float64) + i for i in range(2)]
    z += [torch.randn(12, 3, generator=g, dtype=torch.float64) * 2 for _ in range(3)]
    torch.manual_seed(7)
    got = method.training_loss(z, None, torch.arange(12))
    torch.manual_seed(7)  # the directions: 6 unit columns drawn from the global RNG
    directions = torch.nn.functional.normalize(torch.randn(3, 6), dim=0).double()
    assert got.item() == pytest.approx(the_loss_by_hand(z, lamb, directions).item(), rel=1e-6)


def test_the_directions_are_fresh_at_every_step_and_unit_columns():
    torch.manual_seed(0)
    first, second = random_directions(16, 256), random_directions(16, 256)
    assert first.shape == (16, 256)
    torch.testing.assert_close(first.norm(dim=0), torch.ones(256))
    assert not torch.allclose(first, second)
    torch.manual_seed(0)  # the global random stream, which the engine seeds
    torch.testing.assert_close(random_directions(16, 256), first)


def test_centre_prediction_by_hand():
    # views 0, 1 global: centre (1, 1) for image 0 and (0, 2) for image 1; a third, local view
    z = torch.tensor([[[0.0, 0.0], [0.0, 2.0]], [[2.0, 2.0], [0.0, 2.0]], [[1.0, 3.0], [4.0, 2.0]]])
    # squared errors: view 0 (1 + 1, 0 + 0), view 1 (1 + 1, 0 + 0), view 2 (0 + 4, 16 + 0); 12 entries
    assert centre_prediction(z, 2).item() == pytest.approx(24 / 12)
    assert centre_prediction(z, 3).item() > 0  # the local view in the centre moves it
    with pytest.raises(ValueError, match="num_global"):
        centre_prediction(z, 4)


def test_training_lowers_the_loss_on_a_fixed_batch(trainer):
    losses = fixed_batch_losses(trainer, steps=15, labelled=False, reseed=0)  # the same directions every step
    assert losses[-1] < 0.7 * losses[0], losses
