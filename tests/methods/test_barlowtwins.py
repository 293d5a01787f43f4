"""Barlow Twins (methods/barlowtwins, sslbench.kit.losses.barlow_twins): the loss of main.py on inputs with a
hand-computable answer, its invariants, and the method's projector, views and LARS groups.

The DDP side (2 gloo processes give the one-process loss and gradients on the whole batch) is
tests/methods/test_distributed.py, which discovers this folder."""

import math

import pytest
import torch
from support import METHODS_DIR, hadamard_columns, lars_groups, mlp_layout
from torch import nn

from sslbench.kit.losses import barlow_twins, cross_correlation, off_diagonal
from sslbench.pretrain.trainer import Trainer

LAMBD = 0.0051
BN_EPS = 1e-5  # main.py's BatchNorm1d(affine=False): its standardisation divides by sqrt(var + 1e-5)
SHRINK = 1 / (1 + BN_EPS)  # c_ii of identical standardised columns (biased variance 1)


def naive_loss(c: torch.Tensor, lambd: float) -> float:
    d = c.shape[0]
    on = sum((1 - float(c[i, i])) ** 2 for i in range(d))
    off = sum(float(c[i, j]) ** 2 for i in range(d) for j in range(d) if i != j)
    return on + lambd * off


# --------------------------------------------------------------------------- the loss


def test_loss_by_hand_on_a_two_dimensional_batch():
    # z1 = [a, b], z2 = [a, (a + b) / sqrt 2], a and b orthogonal +-1 columns:
    # c = s [[1, 1/sqrt 2], [0, 1/sqrt 2]] with s = 1 / (1 + eps)
    a, b = hadamard_columns(4, 2).T
    z1 = torch.stack([a, b], 1)
    z2 = torch.stack([a, (a + b) / math.sqrt(2)], 1)
    s, r = SHRINK, 1 / math.sqrt(2)
    expected = (1 - s) ** 2 + (1 - s * r) ** 2 + LAMBD * ((s * r) ** 2 + 0.0**2)
    assert barlow_twins(z1, z2, LAMBD).item() == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(
        cross_correlation(z1, z2), s * torch.tensor([[1, r], [0, r]], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_cross_correlation_is_main_py_batch_norm_product_and_the_loss_its_sums(seed):
    g = torch.Generator().manual_seed(seed)
    z1 = 3 * torch.randn(10, 6, generator=g, dtype=torch.float64) + 2
    z2 = z1 + torch.randn(10, 6, generator=g, dtype=torch.float64)
    bn = nn.BatchNorm1d(6, affine=False).double().train()  # main.py's self.bn, in training mode
    c = bn(z1).T @ bn(z2) / 10
    torch.testing.assert_close(cross_correlation(z1, z2), c, rtol=1e-12, atol=1e-12)
    assert barlow_twins(z1, z2, LAMBD).item() == pytest.approx(naive_loss(c, LAMBD), rel=1e-12)


@pytest.mark.parametrize("shift, scale", [(0.0, 1.0), (5.0, 2.0), (-3.0, 40.0)])
def test_identical_decorrelated_standardised_embeddings_give_zero(shift, scale):
    # batch standardisation makes any shift and scale (variance >= 1, eps negligible) the same point
    z = shift + scale * hadamard_columns(16, 8)
    assert barlow_twins(z, z.clone(), LAMBD).item() == pytest.approx(0.0, abs=8 * 1e-10)
    correlated = torch.cat([z[:, :4], z[:, :4] + 0.5 * z[:, 4:]], 1)  # identical, but not decorrelated
    assert barlow_twins(correlated, correlated.clone(), LAMBD).item() > 0.01


def test_lambda_weights_the_off_diagonal_only():
    z = hadamard_columns(8, 4)
    flipped = z * torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=torch.float64)  # c = s diag(1, -1, 1, 1)
    for lambd in (0.0, LAMBD, 1.0):  # a diagonal c: lambda changes nothing
        expected = 3 * (1 - SHRINK) ** 2 + (1 + SHRINK) ** 2
        assert barlow_twins(z, flipped, lambd).item() == pytest.approx(expected, rel=1e-12)
    g = torch.Generator().manual_seed(0)
    z1, z2 = (torch.randn(12, 5, generator=g, dtype=torch.float64) for _ in range(2))
    c = cross_correlation(z1, z2)
    off = sum(float(c[i, j]) ** 2 for i in range(5) for j in range(5) if i != j)
    on = sum((1 - float(c[i, i])) ** 2 for i in range(5))
    assert barlow_twins(z1, z2, 0.0).item() == pytest.approx(on, rel=1e-12)
    assert (barlow_twins(z1, z2, 0.3) - barlow_twins(z1, z2, 0.1)).item() == pytest.approx(
        0.2 * off, rel=1e-10
    )


def test_off_diagonal_lists_every_entry_but_the_diagonal_in_row_order():
    m = torch.arange(16.0).view(4, 4)
    expected = [m[i, j].item() for i in range(4) for j in range(4) if i != j]
    assert off_diagonal(m).tolist() == expected
    with pytest.raises(ValueError, match="square"):
        off_diagonal(torch.zeros(3, 4))


def test_the_loss_is_float32_under_bf16_autocast():
    g = torch.Generator().manual_seed(0)
    z1, z2 = (torch.randn(64, 32, generator=g) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = barlow_twins(z1.bfloat16(), z2.bfloat16(), LAMBD)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(
        barlow_twins(z1.bfloat16().float(), z2.bfloat16().float(), LAMBD).item()
    )


# --------------------------------------------------------------------------- the method


@pytest.fixture
def trainer(tmp_path, method_config):
    return Trainer(
        METHODS_DIR / "barlowtwins",
        method_config("barlowtwins", projector=[32, 32, 16]),
        0,
        tmp_path,
        progress=False,
    )


def test_projector_is_main_py_s_bias_free_mlp(trainer):
    kinds, shapes, biases = mlp_layout(trainer.method.projector)
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert shapes == [(trainer.method.feature_dim, 32), (32, 32), (32, 16)]
    assert biases == [False, False, False]


def test_training_loss_is_the_loss_of_each_view_embedded_on_its_own(trainer):
    method = trainer.method
    g = torch.Generator().manual_seed(0)
    idx = torch.arange(32)
    views = trainer.make_views(trainer.data.train.images[idx], g)
    loss = method.training_loss(views, None, idx)
    z1, z2 = (method.projector(method.backbone(v)) for v in views)  # batch norm over each view alone
    assert loss.item() == pytest.approx(barlow_twins(z1, z2, LAMBD).item(), rel=1e-6)
    joint = method.projector(method.backbone(torch.cat(views))).split(32)  # batch norm over both views
    assert abs(barlow_twins(*joint, LAMBD).item() - loss.item()) > 1e-3


def test_lars_adapts_the_weights_and_gives_biases_and_norms_their_own_lr(trainer):
    weights, biases = lars_groups(trainer)
    assert (weights["weight_decay"], weights["exclude_from_lars"]) == (1e-6, False)
    assert (
        weights["trust_coefficient"] == 0.02
    )  # the default's eta (README.md; main.py's 1e-3 in the presets)
    assert weights["trust_ratio"] == "update_norm"  # main.py's LARS: eta |w| / |g + wd w|
    assert (biases["weight_decay"], biases["exclude_from_lars"]) == (0.0, True)  # neither decayed nor adapted
    # config.yaml's lr 0.1 = --learning-rate-weights 0.2 x 128 / 256; the biases' 0.0048 x 128 / 256
    assert (weights["base_lr"], biases["base_lr"]) == pytest.approx((0.1, 0.0024))
