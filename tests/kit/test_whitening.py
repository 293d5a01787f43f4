"""Cholesky whitening in sub-batches (sslbench.kit.whitening): W-MSE's Whitening2d in training mode."""

import math

import pytest
import torch

from sslbench.kit.whitening import whiten, whiten_sub_batches


def test_whiten_by_hand():
    # mean (1, 1/3); centred rows (-1, -1/3), (0, 2/3), (1, -1/3); covariance over n - 1 = 2: diag(1, 1/3),
    # so L = diag(1, 1/sqrt 3) and z = centred x diag(1, sqrt 3)
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
    s = math.sqrt(3)
    expected = torch.tensor([[-1.0, -s / 3], [0.0, 2 * s / 3], [1.0, -s / 3]], dtype=torch.float64)
    torch.testing.assert_close(whiten(x), expected)


def test_whitened_rows_have_identity_covariance_and_the_first_coordinate_is_only_standardised():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64) @ torch.randn(
        6, 6, generator=g, dtype=torch.float64
    )
    z = whiten(x + 3.0)
    torch.testing.assert_close(z.mean(0), torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(z.T @ z / 199, torch.eye(6, dtype=torch.float64))
    first = x[:, 0] - x[:, 0].mean()
    torch.testing.assert_close(z[:, 0], first / first.std())  # L⁻¹ is lower triangular


def test_eps_shrinks_the_covariance_towards_the_identity():
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(whiten(x, eps=1.0), x - x.mean(0))  # covariance replaced by I: only centred


def test_half_precision_is_whitened_in_float32_and_too_few_rows_are_refused():
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(2))
    z = whiten(x.bfloat16())
    assert z.dtype == torch.float32
    torch.testing.assert_close(z.T @ z / 63, torch.eye(4), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="needs more than 4 rows"):
        whiten(x[:4])


def test_sub_batches_are_whitened_apart_and_every_row_stays_in_its_place():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 2, generator=g, dtype=torch.float64)
    order = torch.randperm(12, generator=g)
    z = whiten_sub_batches(x, order, 4)
    for rows in order.view(3, 4):
        torch.testing.assert_close(z[rows], whiten(x[rows]))
    assert not torch.allclose(z, whiten(x))  # the whole batch at once is another whitening
    with pytest.raises(ValueError, match="does not split"):
        whiten_sub_batches(x, order, 5)
