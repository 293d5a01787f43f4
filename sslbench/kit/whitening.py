"""Batch whitening by Cholesky, in sub-batches: W-MSE's (htdt/self-supervised methods/whitening.py
Whitening2d in training mode, methods/w_mse.py)."""

from __future__ import annotations

import torch

from sslbench.kit.losses import full_precision


def whiten(x: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Rows of ``x`` [n, d] centred by their mean, then multiplied by the inverse of the Cholesky factor L
    of their covariance C = xcᵀ xc / (n - 1), shrunk to (1 - eps) C + eps I:  z = xc L⁻ᵀ, whose covariance is
    the identity. L⁻¹ is lower triangular, so z's first coordinate is xc's first over its std, and each
    next one is what is left of xc's next after the ones before (Gram-Schmidt over the dimensions).
    Computed in float32 at least (a Cholesky factorisation in bf16 fails or loses the whitening)."""
    if x.ndim != 2:
        raise ValueError(f"whiten takes [n, d], got shape {tuple(x.shape)}")
    n, d = x.shape
    if n <= d:
        raise ValueError(f"whitening {d} dimensions needs more than {d} rows, got {n}")
    with torch.autocast(x.device.type, enabled=False):
        x = full_precision(x)
        centred = x - x.mean(dim=0, keepdim=True)
        eye = torch.eye(d, dtype=x.dtype, device=x.device)
        cov = (1 - eps) * (centred.T @ centred) / (n - 1) + eps * eye
        inverse = torch.linalg.solve_triangular(torch.linalg.cholesky(cov), eye, upper=False)  # L⁻¹
        return centred @ inverse.T


def whiten_sub_batches(x: torch.Tensor, order: torch.Tensor, size: int, eps: float = 0.0) -> torch.Tensor:
    """``x`` [n, d] whitened in sub-batches of ``size`` rows: the rows ``order[0:size]`` together, then
    ``order[size:2 size]``, ...; each row stays in its place. ``order`` is a permutation of range(n) and
    ``size`` divides n (w_mse.py: ``torch.randperm(bs).view(-1, w_size)``)."""
    if x.shape[0] % size:
        raise ValueError(f"a batch of {x.shape[0]} does not split into sub-batches of {size}")
    z = torch.empty_like(x, dtype=torch.promote_types(x.dtype, torch.float32))
    for rows in order.view(-1, size):
        z[rows] = whiten(x[rows], eps)
    return z
