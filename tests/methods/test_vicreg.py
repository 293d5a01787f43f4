"""VICReg (methods/vicreg; sslbench.kit.losses.variance_hinge and covariance_penalty): main_vicreg.py's loss
on inputs with a hand-computable answer, its invariants, and the method's expander, views and LARS groups.

The DDP side (2 gloo processes give the one-process loss and gradients on the whole batch) is
tests/methods/test_distributed.py, which discovers this folder."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, hadamard_columns, lars_groups, mlp_layout
from torch import nn

from sslbench.kit.losses import covariance_penalty, variance_hinge
from sslbench.pretrain.trainer import Trainer

EPS = 1e-4  # main_vicreg.py: std = sqrt(Var + 0.0001)

# x: columns of mean 0, unbiased variances 4/3 and 8/3, covariance 4/3 (all by hand, N - 1 = 3)
X = torch.tensor([[1.0, 2.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, -2.0]], dtype=torch.float64)


def test_terms_by_hand_on_a_two_dimensional_batch():
    y = X / 2  # variances 1/3 and 2/3: both stds below 1
    assert variance_hinge(X).item() == 0.0  # stds sqrt(4/3), sqrt(8/3) >= 1
    hinge_y = ((1 - math.sqrt(1 / 3 + EPS)) + (1 - math.sqrt(2 / 3 + EPS))) / 2
    assert variance_hinge(y).item() == pytest.approx(hinge_y, rel=1e-12)
    assert covariance_penalty(X).item() == pytest.approx(
        2 * (4 / 3) ** 2 / 2, rel=1e-12
    )  # (C_12^2 + C_21^2) / D
    assert covariance_penalty(y).item() == pytest.approx(2 * (1 / 3) ** 2 / 2, rel=1e-12)
    assert F.mse_loss(X, y).item() == pytest.approx((1 + 4 + 1 + 0 + 1 + 0 + 1 + 4) / 4 / 8, rel=1e-12)


def test_the_method_s_loss_by_hand(tmp_path, method_config):
    # 25 invariance + 25 (var_x + var_y) / 2 + 1 (cov_x + cov_y), with x, y = X, X / 2 as embeddings
    method = Trainer(
        METHODS_DIR / "vicreg", method_config("vicreg", expander=[2]), 0, tmp_path, progress=False
    ).method
    method.expander = nn.Identity()
    method.backbone = nn.Identity()  # the views are the embeddings
    hinge_y = ((1 - math.sqrt(1 / 3 + EPS)) + (1 - math.sqrt(2 / 3 + EPS))) / 2
    expected = 25 * 0.375 + 25 * (0 + hinge_y) / 2 + 1 * (16 / 9 + 1 / 9)
    assert method.training_loss([X, X / 2], None, torch.arange(4)).item() == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_variance_term_is_zero_iff_every_std_reaches_one(seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(64, 8, generator=g, dtype=torch.float64)
    z = z / z.std(0) * torch.linspace(1.0, 3.0, 8, dtype=torch.float64)  # stds 1 ... 3
    assert variance_hinge(z).item() == 0.0
    z[:, 0] *= 0.5  # one dimension's std to 0.5: only it enters, divided by D
    assert variance_hinge(z).item() == pytest.approx((1 - math.sqrt(0.25 + EPS)) / 8, rel=1e-9)
    assert variance_hinge(torch.zeros(5, 8)).item() == pytest.approx(1 - math.sqrt(EPS), rel=1e-6)  # collapse


def test_covariance_term_is_zero_for_decorrelated_embeddings_and_positive_otherwise():
    z = 3.0 + hadamard_columns(16, 8) * torch.linspace(
        0.5, 4.0, 8, dtype=torch.float64
    )  # any scales, a shift
    assert covariance_penalty(z).item() == pytest.approx(0.0, abs=1e-24)
    mixed = torch.cat([z[:, :4], z[:, :4] + z[:, 4:]], 1)
    assert covariance_penalty(mixed).item() > 0.1


@pytest.mark.parametrize("seed", [0, 1])
def test_covariance_term_is_the_naive_sum_over_pairs(seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(9, 5, generator=g, dtype=torch.float64)
    centred = z - z.mean(0)
    cov = [[float(centred[:, i] @ centred[:, j]) / 8 for j in range(5)] for i in range(5)]
    naive = sum(cov[i][j] ** 2 for i in range(5) for j in range(5) if i != j) / 5
    assert covariance_penalty(z).item() == pytest.approx(naive, rel=1e-12)


def test_the_terms_are_float32_under_bf16_autocast():
    z = torch.randn(32, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert variance_hinge(z).dtype == covariance_penalty(z).dtype == torch.float32


# --------------------------------------------------------------------------- the method


@pytest.fixture
def trainer(tmp_path, method_config):
    cfg = method_config("vicreg", expander=[32, 32, 16])
    return Trainer(METHODS_DIR / "vicreg", cfg, 0, tmp_path, progress=False)


def test_expander_is_main_vicreg_py_s_mlp(trainer):
    kinds, shapes, biases = mlp_layout(trainer.method.expander)
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert shapes == [(trainer.method.feature_dim, 32), (32, 32), (32, 16)]
    assert biases == [True, True, False]  # the last Linear is bias-free


def test_training_loss_embeds_each_view_on_its_own(trainer):
    method = trainer.method
    idx = torch.arange(32)
    views = trainer.make_views(trainer.data.train.images[idx], torch.Generator().manual_seed(0))
    x, y = (method.expander(method.backbone(v)) for v in views)  # batch norm over each view alone
    expected = (
        25 * F.mse_loss(x, y)
        + 25 * (variance_hinge(x) + variance_hinge(y)) / 2
        + covariance_penalty(x)
        + covariance_penalty(y)
    )
    assert method.training_loss(views, None, idx).item() == pytest.approx(expected.item(), rel=1e-6)


def test_lars_adapts_the_weights_not_the_biases_and_norms_at_one_lr(trainer):
    weights, biases = lars_groups(trainer)
    assert (weights["weight_decay"], weights["exclude_from_lars"], weights["trust_coefficient"]) == (
        1e-6,
        False,
        1e-3,
    )
    assert weights["trust_ratio"] == "update_norm"  # main_vicreg.py's LARS: eta |w| / |g + wd w|
    assert (biases["weight_decay"], biases["exclude_from_lars"]) == (0.0, True)  # neither decayed nor adapted
    assert weights["base_lr"] == biases["base_lr"] == pytest.approx(0.1)  # --base-lr 0.2 x 128 / 256
