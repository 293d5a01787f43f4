"""Optimisation: the schedules, optimisers and checks of a training loop, shared by the engine
(pretraining) and the protocols that train (evaluation/classifier.py), so that each is written once:

- shuffled_batches:  one epoch's index batches in a random order
- learning_rate:     the schedule (linear warm-up, then cosine to min_lr, steps (x step_factor) or constant)
- set_learning_rate: every parameter group's lr at a step (its own base, or fixed)
- weight_decay_at:   the weight-decay schedule (constant, or cosine to ``weight_decay_end``) at a step
- set_weight_decay:  every decaying parameter group's weight decay at a step (called beside the lr's)
- make_optimizer:    SGD, Adam, AdamW or LARS (``Lars``) from settings, over parameter groups
- check_finite:      the divergence check, raising TrainingDiverged
- autocast:          the bf16 autocast context of a device (CUDA only)

Parameter groups (``make_optimizer``): a group is a dict with ``params`` and any of these options
(a method's ``param_groups()`` returns such dicts; plain tensors make one group with none):

- ``lr_scale`` (1.0):   the group's lr is the schedule's lr times it (its ``base_lr`` is
                        ``train.lr`` x ``lr_scale``; Barlow Twins' bias lr);
- ``fixed_lr`` (False): the schedule never moves the group: its lr stays ``base_lr`` (SimSiam's
                        predictor, ``--fix-pred-lr``);
- ``weight_decay``:     the group's own (default ``train.weight_decay``), its value at the start of
                        training (``base_weight_decay``, kept in the optimiser's state: the schedule
                        below moves ``weight_decay`` from it);
- ``momentum``:         the group's own SGD / LARS momentum (default ``train.momentum``; DeepCluster's
                        top layer: 0, its own SGD without momentum). Adam and AdamW have none: an error;
- ``exclude_from_lars`` (False): LARS neither adapts nor decays the group (biases and norm
                        parameters in BYOL, Barlow Twins, VICReg, MoCo v3); it must have weight
                        decay 0. Under SGD / Adam / AdamW the flag does nothing (the weight decay does).

LARS is ``Lars`` below (You, Gitman, Ginsburg 2017, with momentum as the self-supervised codes run
it), with ``train.momentum``, ``train.lars_trust_coefficient`` (eta), ``train.lars_trust_clip``
(LARC's clipping: the adapted lr never exceeds the group's lr) and ``train.lars_trust_ratio``, the
trust ratio's form (``LARS_TRUST_RATIOS``): ``update_norm``, eta ||w|| / ||g + wd w|| (BYOL's
optimizers.py, Barlow Twins' and VICReg's main*.py, MoCo v3's optimizer.py, DINO's utils.py), or
``larc``, apex LARC's eta ||w|| / (||g|| + wd ||w||) (SwAV's). They differ most at g = 0: there
``update_norm`` gives eta / wd and the tensor still moves (by lr eta w), ``larc`` leaves it undecayed
and unadapted. Every group not excluded is adapted, also when its weight decay is 0 (as every
official LARS).

Warm-up (``train.warmup_epochs`` > 0, ``train.warmup_ramp``, ``WARMUP_RAMPS``): ``linear`` is
base x step / warm-up steps, 0 at the first step (BYOL's schedules.py, Barlow Twins' and VICReg's
adjust_learning_rate; MoCo v3's lr x epoch / warmup_epochs on the fractional epoch is the same);
``linspace`` is numpy's linspace(0, base, warm-up steps), 0 at the first step and base at the last
warm-up step (DINO's cosine_scheduler, SwAV's warm-up). The cosine part starts at base after either.

Weight-decay schedule (``train.weight_decay_end``; null: constant, every group keeps its own): a
cosine per step over the whole run, no warm-up, from ``train.weight_decay`` to ``weight_decay_end``,
wd_k = end + (start - end) (1 + cos(pi k / K)) / 2 for the 0-based step k of the run's K steps (DINO's
utils.cosine_scheduler(weight_decay, weight_decay_end, epochs, niter_per_ep): ``start`` at the first
step, close to ``end`` at the last, which it never reaches). A group with its own weight decay follows
the same curve times its ratio to ``train.weight_decay``; a group with weight decay 0 (biases and norms
``exclude_bias_and_norm`` leaves out) stays at 0, as DINO's second group.

This module knows nothing of methods, checkpoints or protocols (it imports only sslbench.errors):
the engine and the protocols call it, never the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from sslbench.errors import ConfigError, SslbenchError


class TrainingDiverged(SslbenchError, ValueError):
    """The loss became NaN or infinite; the message says where and what to lower."""


def shuffled_batches(
    count: int, batch_size: int, generator: torch.Generator, min_size: int = 1
) -> list[torch.Tensor]:
    """One epoch's index batches of ``batch_size`` in an order drawn from ``generator``. The last,
    smaller batch is dropped when it holds fewer than ``min_size`` indices and is not the only one
    (``min_size = batch_size``: fixed-size batches; 2: batch norm in train mode needs two)."""
    batches = torch.randperm(count, generator=generator).split(batch_size)
    return list(batches[: batch_count(count, batch_size, min_size)])


def batch_count(count: int, batch_size: int, min_size: int = 1) -> int:
    """How many batches shuffled_batches makes of ``count`` indices."""
    full, rest = divmod(count, batch_size)
    return full + int(rest > 0 and (rest >= min_size or full == 0))


WARMUP_RAMPS = ("linear", "linspace")
STEP_FACTOR = 0.1  # `train.step_factor` when absent: the step schedule's lr factor at each milestone


def warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    """How many steps warm up: those whose epoch, step / steps_per_epoch, is below ``warmup_epochs``."""
    count = math.ceil(warmup_epochs * steps_per_epoch)
    while count > 0 and (count - 1) / steps_per_epoch >= warmup_epochs:  # float round-off either way
        count -= 1
    while count / steps_per_epoch < warmup_epochs:
        count += 1
    return count


def at_group_scale(schedule: dict, key: str, base: float) -> float:
    """The schedule's ``key`` (an lr: the warm-up's start, the cosine's end; 0 when absent) for a group
    whose lr is ``base``: scaled by base / lr, as the group's whole curve is."""
    return schedule.get(key, 0.0) * base / schedule["lr"] if schedule["lr"] else 0.0


def learning_rate(schedule: dict, step: int, steps_per_epoch: int, base: float | None = None) -> float:
    """Linear warm-up (``warmup_ramp``: see the module docstring), then cosine to zero (or to
    ``min_lr``), steps at milestones (x ``step_factor`` at each, default 0.1), or constant. The cosine runs
    over ``cosine_truncate`` (default 1) of its half period: CAPI's WarmupThenCosine stops it at 0.8, where
    the lr is still min_lr + 0.095 (lr - min_lr).

    ``schedule`` holds ``lr``, ``epochs``, ``schedule`` and optionally ``warmup_epochs`` (with
    ``warmup_ramp`` and ``warmup_start_lr``), ``milestones``, ``step_factor`` (the ``train`` section's keys)
    and ``min_lr``; ``base`` replaces ``lr`` (a parameter group's own). The warm-up starts at
    ``warmup_start_lr`` x base / lr (0 when absent; I-JEPA's start_lr) and the cosine ends at ``min_lr``
    x base / lr: a group at x times the lr starts and ends at x times them, as MAE's util/lr_sched.py
    scales the whole curve by a group's ``lr_scale``.
    """
    base = schedule["lr"] if base is None else base
    epoch = step / steps_per_epoch
    warmup = schedule.get("warmup_epochs", 0)
    if epoch < warmup:
        ramp = schedule["warmup_ramp"]
        start = at_group_scale(schedule, "warmup_start_lr", base)
        if ramp == "linear":
            return start + (base - start) * epoch / warmup
        if ramp == "linspace":
            last = warmup_steps(warmup, steps_per_epoch) - 1
            if last <= 0:  # numpy's linspace of one value: its start
                return start
            return start + (base - start) * step / last
        raise ConfigError(
            f"config key `train.warmup_ramp`: unknown ramp {ramp!r}; known: {', '.join(WARMUP_RAMPS)}"
        )
    kind = schedule["schedule"]
    if kind == "cosine":
        progress = (epoch - warmup) / max(1e-12, schedule["epochs"] - warmup)
        floor = at_group_scale(schedule, "min_lr", base)
        angle = math.pi * schedule.get("cosine_truncate", 1.0) * min(1.0, progress)
        return floor + (base - floor) * 0.5 * (1.0 + math.cos(angle))
    if kind == "step":
        # factor ** k, as before the setting (0.1 ** k at the default: the same float operations)
        factor = schedule.get("step_factor", STEP_FACTOR)
        return base * factor ** sum(epoch >= m for m in schedule.get("milestones", []))
    if kind == "constant":
        return base
    raise ConfigError(
        f"config key `train.schedule`: unknown schedule {kind!r}; known: cosine, step, constant"
    )


def set_learning_rate(optimizer: torch.optim.Optimizer, schedule: dict, step: int, steps_per_epoch: int):
    """Every parameter group's lr at ``step``: the schedule applied to the group's ``base_lr``
    (or to the schedule's ``lr`` for a group without one); a ``fixed_lr`` group keeps its base."""
    for group in optimizer.param_groups:
        if group.get("fixed_lr"):
            group["lr"] = group["base_lr"]
        else:
            group["lr"] = learning_rate(schedule, step, steps_per_epoch, group.get("base_lr"))


def weight_decay_at(schedule: dict, step: int, steps_per_epoch: int, base: float | None = None) -> float:
    """The weight decay at ``step`` (module docstring): ``train.weight_decay`` (or ``base``, a group's
    own at the start) when ``weight_decay_end`` is null, else the cosine from it to ``weight_decay_end``
    over ``epochs`` x ``steps_per_epoch`` steps, scaled by ``base`` / ``weight_decay``."""
    start = schedule["weight_decay"]
    base = start if base is None else base
    end = schedule.get("weight_decay_end")
    if end is None or base == 0:
        return base
    total = max(1, schedule["epochs"] * steps_per_epoch)
    value = end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * min(step, total) / total))
    return value * base / start


def set_weight_decay(optimizer: torch.optim.Optimizer, schedule: dict, step: int, steps_per_epoch: int):
    """Every parameter group's weight decay at ``step`` (``weight_decay_at`` of the group's
    ``base_weight_decay``); nothing changes when ``weight_decay_end`` is null."""
    if schedule.get("weight_decay_end") is None:
        return
    for group in optimizer.param_groups:
        base = group.get("base_weight_decay", group["weight_decay"])
        group["weight_decay"] = weight_decay_at(schedule, step, steps_per_epoch, base)


def uses_fused_optimizer(train: dict, device: torch.device) -> bool:
    """``train.fused_optimizer``: auto = fused on CUDA only (the CPU keeps the for-each update: a fused
    one would change the bits of CPU runs); true / false force it."""
    fused = train.get("fused_optimizer", "auto")
    return device.type == "cuda" if fused == "auto" else bool(fused)


# adam: torch's Adam, whose weight decay is an L2 term added to the gradient before the moments (W-MSE's
# optim.Adam); adamw: decoupled weight decay (MAE, DINO's ViT, MoCo v3's ViT).
OPTIMIZERS = ("sgd", "adam", "adamw", "lars")


def param_groups(params, train: dict) -> list[dict]:
    """The optimiser's groups: each group of ``params`` (or one group of plain tensors) with its
    options filled in (module docstring), its ``base_lr`` and starting ``lr``, and its
    ``base_weight_decay``. A group that sets ``base_lr`` itself (the protocols' fine-tune) keeps it."""
    if train.get("weight_decay_end") is not None and train["weight_decay"] == 0:
        raise ConfigError(
            f"config key `train.weight_decay_end` = {train['weight_decay_end']}: the weight-decay cosine "
            "scales each group's own decay by its ratio to `train.weight_decay`, which is 0; set "
            "`train.weight_decay` > 0 (the schedule's start) or `weight_decay_end: null`"
        )
    params = list(params)
    groups = [dict(g) for g in params] if params and isinstance(params[0], dict) else [{"params": params}]
    for group in groups:
        group["params"] = list(group["params"])
        group.setdefault("lr_scale", 1.0)
        group.setdefault("fixed_lr", False)
        group.setdefault("exclude_from_lars", False)
        group.setdefault("weight_decay", train["weight_decay"])
        group.setdefault("base_weight_decay", group["weight_decay"])
        group.setdefault("base_lr", train["lr"] * group["lr_scale"])
        group.setdefault("lr", group["base_lr"])
    return groups


def make_optimizer(params, train: dict, device: torch.device | str = "cpu") -> torch.optim.Optimizer:
    """``train.optimizer`` over ``params`` (tensors or parameter groups: see the module docstring)."""
    name = train["optimizer"]
    groups = param_groups(params, train)
    fused = {"fused": True} if uses_fused_optimizer(train, torch.device(device)) else {}
    if name == "sgd":
        return torch.optim.SGD(
            groups, lr=train["lr"], momentum=train["momentum"], weight_decay=train["weight_decay"], **fused
        )
    if name in ("adam", "adamw"):
        if any("momentum" in group for group in groups):
            raise ConfigError(
                f"config key `train.optimizer`: {name} has no momentum, but a parameter group sets its own "
                "`momentum`; use sgd or lars for this method"
            )
        betas = tuple(train.get("adam_betas") or (0.9, 0.999))  # null: torch's default
        adam = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return adam(groups, lr=train["lr"], betas=betas, weight_decay=train["weight_decay"], **fused)
    if name == "lars":
        return make_lars(groups, train)
    raise ConfigError(
        f"config key `train.optimizer`: unknown optimiser {name!r}; known: {', '.join(OPTIMIZERS)}"
    )


LARS_TRUST_RATIOS = ("update_norm", "larc")


def make_lars(groups: list[dict], train: dict) -> torch.optim.Optimizer:
    """``Lars`` over ``groups``: every group adapted but those with ``exclude_from_lars``."""
    if train.get("fused_optimizer") is True:
        raise ConfigError(
            "config key `train.fused_optimizer`: true needs `train.optimizer` sgd, adam or adamw; LARS has "
            "no fused update (set it to auto or false)"
        )
    ratio = train["lars_trust_ratio"]
    if ratio not in LARS_TRUST_RATIOS:
        raise ConfigError(
            f"config key `train.lars_trust_ratio`: unknown rule {ratio!r}; "
            f"known: {', '.join(LARS_TRUST_RATIOS)}"
        )
    for group in groups:
        if group["exclude_from_lars"] and group["weight_decay"] != 0:
            raise ValueError(
                f"a parameter group with exclude_from_lars has weight_decay {group['weight_decay']}: LARS "
                "neither adapts nor decays it; give the excluded group weight_decay 0.0"
            )
    return Lars(
        groups,
        lr=train["lr"],
        momentum=train["momentum"],
        weight_decay=train["weight_decay"],
        trust_coefficient=train["lars_trust_coefficient"],
        trust_ratio=ratio,
        trust_clip=bool(train["lars_trust_clip"]),
    )


class Lars(torch.optim.Optimizer):
    """LARS with momentum. For each tensor w of a group that is not ``exclude_from_lars``, with
    gradient g: the update d = (g + wd w) q, q the trust ratio of ``trust_ratio``
    (``update_norm``: eta ||w|| / ||g + wd w||, 1 where either norm is 0; ``larc``: eta ||w|| /
    (||g|| + wd ||w|| + 1e-8), and where ||w|| or ||g|| is 0, d = g: apex LARC's), q clipped to at
    most 1 / lr with ``trust_clip`` (where it adapts: the adapted lr q lr never exceeds lr). An
    excluded group's update is g. Then mu = momentum mu + d (mu = d at the first step) and
    w -= lr mu, as SGD's momentum without dampening."""

    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        trust_ratio: str = "update_norm",
        trust_clip: bool = False,
    ):
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            trust_ratio=trust_ratio,
            trust_clip=trust_clip,
            exclude_from_lars=False,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            updates = grads if group["exclude_from_lars"] else lars_updates(params, grads, group)
            if group["momentum"] != 0:
                states = [self.state[p] for p in params]
                started = [i for i, state in enumerate(states) if "momentum_buffer" in state]
                if started:
                    buffers = [states[i]["momentum_buffer"] for i in started]
                    torch._foreach_mul_(buffers, group["momentum"])
                    torch._foreach_add_(buffers, [updates[i] for i in started])
                for state, update in zip(states, updates):
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = update.detach().clone()
                updates = [state["momentum_buffer"] for state in states]
            torch._foreach_add_(params, updates, alpha=-group["lr"])
        return loss


def lars_updates(params: list[torch.Tensor], grads: list[torch.Tensor], group: dict) -> list[torch.Tensor]:
    """The adapted updates d of ``Lars`` (its docstring) of one group's tensors, new tensors."""
    wd, eta = group["weight_decay"], group["trust_coefficient"]
    w_norms = torch.stack(torch._foreach_norm(params))
    if group["trust_ratio"] == "update_norm":
        updates = torch._foreach_add(grads, params, alpha=wd)
        d_norms = torch.stack(torch._foreach_norm(updates))
        adapt = (w_norms > 0) & (d_norms > 0)
        ratios = eta * w_norms / torch.where(adapt, d_norms, 1.0)
    else:  # larc
        g_norms = torch.stack(torch._foreach_norm(grads))
        adapt = (w_norms > 0) & (g_norms > 0)
        ratios = eta * w_norms / (g_norms + w_norms * wd + 1e-8)
        # apex: no weight decay where not adapted. apex adds wd * w with wd a Python float; on the float32
        # parameters the optimiser holds, torch casts that scalar to float32, so this float32 tensor of wd
        # gives the same products, bit for bit, without a device sync to read `adapt`.
        decays = torch.where(adapt, wd, 0.0).to(w_norms.dtype)
        updates = torch._foreach_add(grads, torch._foreach_mul(params, list(decays.unbind())))
    if group["trust_clip"]:
        ratios = torch.clamp(ratios / group["lr"], max=1.0)
    ratios = torch.where(adapt, ratios, 1.0)
    torch._foreach_mul_(updates, list(ratios.unbind()))
    return updates


def check_finite(loss: torch.Tensor, message: Callable[..., str], *context) -> float:
    """The loss as a float; TrainingDiverged(message(loss, *context)) when it is NaN or infinite."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingDiverged(message(value, *context))
    return value


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device`` when ``enabled`` (the engine enables it on CUDA only)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)
