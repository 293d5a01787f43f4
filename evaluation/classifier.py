"""The protocols' training loop (paper-mode linear probe, semi-supervised and MAE fine-tuning):
cross-entropy on augmented views, one optimiser step per batch, and the top-1 / top-5 of the trained
model. Not a protocol (no DEFAULTS)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sslbench.extract.features import embed
from sslbench.optim import batch_count, check_finite, set_learning_rate, shuffled_batches

from .common import topk_accuracy


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
    batch_transform: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> None:
    """``schedule["epochs"]`` passes of cross-entropy over ``images`` (an ImageSet): each batch's
    views (``augment``) go through ``forward`` to logits, then one optimiser step with the lr of
    ``schedule`` at that step. ``generators`` are (data order, views); ``diverged(loss, epoch)``
    is the message of the TrainingDiverged raised when the loss is not finite. ``batch_transform``
    takes (views, labels) to (views, targets), where targets may be class probabilities (mixup,
    label smoothing): cross-entropy takes either."""
    order, views = generators
    labels = images.labels.to(device)
    steps_per_epoch = batch_count(len(images), batch_size, min_batch)
    step = 0
    for epoch in range(schedule["epochs"]):
        for idx in shuffled_batches(len(images), batch_size, order, min_batch):
            set_learning_rate(optimizer, schedule, step, steps_per_epoch)
            x, targets = augment(images.load(idx).to(device), views), labels[idx.to(device)]
            if batch_transform is not None:
                x, targets = batch_transform(x, targets)
            loss = F.cross_entropy(forward(x), targets)
            check_finite(loss, diverged, epoch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1


def scores(model: torch.nn.Module, images, transform, used: dict, device: torch.device) -> dict[int, float]:
    """{1: top-1, 5: top-5} of ``model``'s logits on ``images`` (an ImageSet), in eval mode without
    gradients, ``used["eval_batch_size"]`` images at a time."""
    logits = embed(model, images, transform, device, used["eval_batch_size"])
    return topk_accuracy(logits.numpy(), images.labels.numpy(), ks=(1, 5))
