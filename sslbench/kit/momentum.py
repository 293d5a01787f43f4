"""Momentum (EMA) targets: tau's schedule, the method's pairs checked, and the update
target <- tau target + (1 - tau) online that the trainer applies after every optimiser step.

References: deepmind-research byol/utils/schedules.py (target_ema), facebookresearch/dino utils.py
(cosine_scheduler), facebookresearch/moco-v3 main_moco.py (adjust_moco_momentum)."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from timm.layers import DropPath
from torch import nn

from sslbench.errors import ConfigError

MOMENTUM_SCHEDULES = ("constant", "cosine", "linear")


def check_momentum(params: dict) -> tuple[float, str, float, float]:
    """(tau_base, schedule, warmup, truncate) from a method's settings ``momentum``, ``momentum_schedule``
    and the optional ``momentum_warmup`` (share of the run, default 0) and ``momentum_truncate`` (default
    1) that ``momentum_at`` reads."""
    base, schedule = params.get("momentum"), params.get("momentum_schedule")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 0.0 <= base <= 1.0:
        raise ConfigError(
            f"config key `momentum` (the momentum target's tau_base) must lie in [0, 1], got {base!r}; "
            "a method with momentum pairs sets it and `momentum_schedule` in its config.yaml"
        )
    if schedule not in MOMENTUM_SCHEDULES:
        raise ConfigError(
            f"config key `momentum_schedule` must be one of {list(MOMENTUM_SCHEDULES)} (constant: MoCo "
            f"v1/v2; cosine from `momentum` to 1: BYOL, MoCo v3, DINO; linear to 1: MSN), got {schedule!r}"
        )
    warmup, truncate = params.get("momentum_warmup", 0.0), params.get("momentum_truncate", 1.0)
    if not 0.0 <= warmup < 1.0 or not 0.0 < truncate <= 1.0:
        raise ConfigError(
            f"config keys `momentum_warmup` (a share of the run in [0, 1)) and `momentum_truncate` (in "
            f"(0, 1]): got {warmup!r} and {truncate!r}; set them in the method's config.yaml"
        )
    return float(base), schedule, float(warmup), float(truncate)


def momentum_at(
    base: float, schedule: str, step: int, total_steps: int, warmup: float = 0.0, truncate: float = 1.0
) -> float:
    """tau after the optimiser step of 0-based index ``step`` of ``total_steps``: ``base``
    (constant), 1 - (1 - base)(cos(pi step / total) + 1) / 2 (cosine, step clamped to the
    total), BYOL's target_ema and DINO's cosine_scheduler per step, or base + (1 - base) step / total
    (linear, clamped), MSN's momentum_scheduler. MoCo v3 moves its target by the same tau one step
    later, at the next forward: a one-step shift.

    CAPI's WarmupThenCosine: over the first W = round(``warmup`` x total) steps tau is np.linspace(1, base,
    W) (the target barely moves while the student is young), then the schedule runs over the other steps,
    the cosine over ``truncate`` of its half period (0.8: it ends at 1 - 0.095 (1 - base))."""
    if schedule == "constant":
        return base
    if warmup:
        steps = round(warmup * total_steps)
        if step < steps:
            return 1.0 - (1.0 - base) * step / max(1, steps - 1)
        step, total_steps = step - steps, total_steps - steps
    progress = min(step, total_steps) / max(1, total_steps)
    if schedule == "cosine":
        return 1.0 - (1.0 - base) * (math.cos(math.pi * truncate * progress) + 1.0) / 2.0
    if schedule == "linear":
        return base + (1.0 - base) * progress
    raise ConfigError(f"unknown momentum_schedule {schedule!r}; known: {list(MOMENTUM_SCHEDULES)}")


def paired_parameters(
    online: Sequence[nn.Module], target: nn.Module
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(online, target) parameters in order; they must match in number and shapes."""
    theta_o = [p.detach() for m in online for p in m.parameters()]
    theta_t = [p.detach() for p in target.parameters()]
    if len(theta_o) != len(theta_t) or any(a.shape != b.shape for a, b in zip(theta_o, theta_t)):
        raise ValueError(
            f"momentum pair: the online modules' {len(theta_o)} parameters do not match the target's "
            f"{len(theta_t)} in order and shape"
        )
    return theta_o, theta_t


def checked_momentum_pairs(pairs: list) -> list[tuple[list[nn.Module], nn.Module]]:
    """A method's ``momentum_pairs()``, checked once when training starts: each online side matches
    its target in order and shapes, and no target parameter takes gradients (the EMA alone moves it;
    the optimiser would move it too)."""
    checked = []
    for i, (online, target) in enumerate(pairs):
        online = list(online)
        paired_parameters(online, target)
        if any(p.requires_grad for p in target.parameters()):
            raise ValueError(
                f"momentum pair {i}: the target has parameters that require grad; build it with "
                "sslbench.kit.momentum.frozen_copy or freeze it (sslbench.kit.momentum.freeze)"
            )
        checked.append((online, target))
    return checked


@torch.no_grad()
def ema_update(online: Sequence[nn.Module], target: nn.Module, tau: float) -> None:
    """theta_t <- tau theta_t + (1 - tau) theta_o for every parameter (not the BN statistics)."""
    theta_o, theta_t = paired_parameters(online, target)
    torch._foreach_mul_(theta_t, tau)
    torch._foreach_add_(theta_t, theta_o, alpha=1.0 - tau)


def freeze(module: nn.Module) -> nn.Module:
    """No gradients for ``module``'s parameters: a target moves only by the momentum rule."""
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def frozen_copy(online: Sequence[nn.Module]) -> nn.Sequential:
    """A target that starts as a copy of ``online`` (applied in order), without gradients."""
    return freeze(nn.Sequential(*(copy.deepcopy(m) for m in online)))


def without_drop_path(target: nn.Module) -> nn.Module:
    """``target`` with every timm DropPath set to drop nothing: a teacher built without stochastic depth
    (DINO's, DINOv2's), whose student keeps it."""
    for module in target.modules():
        if isinstance(module, DropPath):
            module.drop_prob = 0.0
    return target
