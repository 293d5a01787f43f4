"""The pieces of a training loop, shared by the engine (pretraining), the paper-mode linear probe
and the semi-supervised fine-tune, so that each is written once:

- shuffled_batches:  one epoch's index batches in a random order
- learning_rate:     the schedule (linear warm-up, then cosine, x0.1 steps or constant) at a step
- set_learning_rate: every parameter group's lr at a step (its own base, or fixed)
- make_optimizer:    SGD, AdamW or LARS (timm.optim.Lars) from settings, over parameter groups
- check_finite:      the divergence check, raising TrainingDiverged
- autocast:          the bf16 autocast context of a device (CUDA only)
- fit_classifier:    the protocols' loop: cross-entropy on augmented views, one step per batch

Parameter groups (``make_optimizer``): a group is a dict with ``params`` and any of these options
(a method's ``param_groups()`` returns such dicts; plain tensors make one group with none):

- ``lr_scale`` (1.0):   the group's lr is the schedule's lr times it (its ``base_lr`` is
                        ``train.lr`` x ``lr_scale``; Barlow Twins' bias lr);
- ``fixed_lr`` (False): the schedule never moves the group: its lr stays ``base_lr`` (SimSiam's
                        predictor, ``--fix-pred-lr``);
- ``weight_decay``:     the group's own (default ``train.weight_decay``);
- ``momentum``:         the group's own SGD / LARS momentum (default ``train.momentum``; DeepCluster's
                        top layer: 0, its own SGD without momentum). AdamW has none: an error;
- ``exclude_from_lars`` (False): LARS neither adapts nor decays the group (biases and norm
                        parameters in BYOL, Barlow Twins, VICReg, MoCo v3); it must have weight
                        decay 0. Under SGD / AdamW the flag does nothing (the weight decay does).

LARS is timm's ``Lars`` with ``train.momentum``, ``train.lars_trust_coefficient`` (eta) and
``train.lars_trust_clip`` (LARC's clipping: the adapted lr never exceeds the group's lr). Its trust
ratio is apex LARC's, eta ||w|| / (||g|| + wd ||w||); BYOL, Barlow Twins, VICReg, MoCo v3 and DINO's
own LARS divide by ||g + wd w|| instead (equal when wd = 0, within wd ||w|| / ||g|| otherwise, tiny
at their wd of 1e-6): a method README that uses it says so. Every group not excluded is adapted,
also when its weight decay is 0 (timm's ``always_adapt``).

This module knows nothing of methods, checkpoints or protocols (it imports only sslbench.errors):
the engine and the protocols call it, never the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .errors import ConfigError, SslbenchError


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


def learning_rate(schedule: dict, step: int, steps_per_epoch: int, base: float | None = None) -> float:
    """Linear warm-up, then cosine to zero, x0.1 steps at milestones, or constant.

    ``schedule`` holds ``lr``, ``epochs``, ``schedule`` and optionally ``warmup_epochs`` and
    ``milestones`` (the ``train`` section's keys); ``base`` replaces ``lr`` (a parameter group's own).
    """
    base = schedule["lr"] if base is None else base
    epoch = step / steps_per_epoch
    warmup = schedule.get("warmup_epochs", 0)
    if epoch < warmup:
        return base * (step + 1) / (warmup * steps_per_epoch)
    kind = schedule["schedule"]
    if kind == "cosine":
        progress = (epoch - warmup) / max(1e-12, schedule["epochs"] - warmup)
        return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    if kind == "step":
        return base * 0.1 ** sum(epoch >= m for m in schedule.get("milestones", []))
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


def uses_fused_optimizer(train: dict, device: torch.device) -> bool:
    """``train.fused_optimizer``: auto = fused on CUDA only (on the CPU the default for-each update
    keeps runs bit-identical to earlier ones); true / false force it."""
    fused = train.get("fused_optimizer", "auto")
    return device.type == "cuda" if fused == "auto" else bool(fused)


OPTIMIZERS = ("sgd", "adamw", "lars")


def param_groups(params, train: dict) -> list[dict]:
    """The optimiser's groups: each group of ``params`` (or one group of plain tensors) with its
    options filled in (module docstring) and its ``base_lr`` and starting ``lr``. A group that sets
    ``base_lr`` itself (the protocols' fine-tune) keeps it."""
    params = list(params)
    groups = [dict(g) for g in params] if params and isinstance(params[0], dict) else [{"params": params}]
    for group in groups:
        group["params"] = list(group["params"])
        group.setdefault("lr_scale", 1.0)
        group.setdefault("fixed_lr", False)
        group.setdefault("exclude_from_lars", False)
        group.setdefault("weight_decay", train["weight_decay"])
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
    if name == "adamw":
        if any("momentum" in group for group in groups):
            raise ConfigError(
                "config key `train.optimizer`: adamw has no momentum, but a parameter group sets its own "
                "`momentum`; use sgd or lars for this method"
            )
        return torch.optim.AdamW(groups, lr=train["lr"], weight_decay=train["weight_decay"], **fused)
    if name == "lars":
        return make_lars(groups, train)
    raise ConfigError(
        f"config key `train.optimizer`: unknown optimiser {name!r}; known: {', '.join(OPTIMIZERS)}"
    )


def make_lars(groups: list[dict], train: dict) -> torch.optim.Optimizer:
    """timm's Lars: every group adapted (``always_adapt``) but those with ``exclude_from_lars``."""
    from timm.optim import Lars

    if train.get("fused_optimizer") is True:
        raise ConfigError(
            "config key `train.fused_optimizer`: true needs `train.optimizer` sgd or adamw; timm's LARS has "
            "no fused update (set it to auto or false)"
        )
    for group in groups:
        if group["exclude_from_lars"] and group["weight_decay"] != 0:
            raise ValueError(
                f"a parameter group with exclude_from_lars has weight_decay {group['weight_decay']}: timm's "
                "Lars adapts every group it decays; give the excluded group weight_decay 0.0"
            )
        group["always_adapt"] = not group["exclude_from_lars"]
    return Lars(
        groups,
        lr=train["lr"],
        momentum=train["momentum"],
        weight_decay=train["weight_decay"],
        trust_coeff=train["lars_trust_coefficient"],
        trust_clip=bool(train["lars_trust_clip"]),
    )


def check_finite(loss: torch.Tensor, message: Callable[..., str], *context) -> float:
    """The loss as a float; TrainingDiverged(message(loss, *context)) when it is NaN or infinite."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingDiverged(message(value, *context))
    return value


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device`` when ``enabled`` (the engine enables it on CUDA only)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def fit_classifier(
    forward: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    images,
    augment,
    schedule: dict,
    batch_size: int,
    generators: tuple[torch.Generator, torch.Generator],
    device: torch.device,
    diverged: Callable[[float, int], str],
    min_batch: int = 1,
) -> None:
    """``schedule["epochs"]`` passes of cross-entropy over ``images`` (an ImageSet): each batch's
    views (``augment``) go through ``forward`` to logits, then one optimiser step with the lr of
    ``schedule`` at that step. ``generators`` are (data order, views); ``diverged(loss, epoch)``
    is the message of the TrainingDiverged raised when the loss is not finite."""
    order, views = generators
    labels = images.labels.to(device)
    steps_per_epoch = batch_count(len(images), batch_size, min_batch)
    step = 0
    for epoch in range(schedule["epochs"]):
        for idx in shuffled_batches(len(images), batch_size, order, min_batch):
            set_learning_rate(optimizer, schedule, step, steps_per_epoch)
            logits = forward(augment(images.load(idx).to(device), views))
            loss = F.cross_entropy(logits, labels[idx.to(device)])
            check_finite(loss, diverged, epoch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
