"""The pieces of a training loop, shared by the engine (pretraining), the paper-mode linear probe
and the semi-supervised fine-tune, so that each is written once:

- shuffled_batches:  one epoch's index batches in a random order
- learning_rate:     the schedule (linear warm-up, then cosine, x0.1 steps or constant) at a step
- make_optimizer:    SGD or AdamW from settings (fused on CUDA where asked)
- check_finite:      the divergence check, raising TrainingDiverged
- autocast:          the bf16 autocast context of a device (CUDA only)
- fit_classifier:    the protocols' loop: cross-entropy on augmented views, one step per batch

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
    (or to the schedule's ``lr`` for a group without one)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(schedule, step, steps_per_epoch, group.get("base_lr"))


def uses_fused_optimizer(train: dict, device: torch.device) -> bool:
    """``train.fused_optimizer``: auto = fused on CUDA only (on the CPU the default for-each update
    keeps runs bit-identical to earlier ones); true / false force it."""
    fused = train.get("fused_optimizer", "auto")
    return device.type == "cuda" if fused == "auto" else bool(fused)


def make_optimizer(params, train: dict, device: torch.device | str = "cpu") -> torch.optim.Optimizer:
    name = train["optimizer"]
    fused = {"fused": True} if uses_fused_optimizer(train, torch.device(device)) else {}
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=train["lr"], momentum=train["momentum"], weight_decay=train["weight_decay"], **fused
        )
    if name == "adamw":
        return torch.optim.AdamW(params, lr=train["lr"], weight_decay=train["weight_decay"], **fused)
    raise ConfigError(f"config key `train.optimizer`: unknown optimiser {name!r}; known: sgd, adamw")


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
