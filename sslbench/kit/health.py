"""Label-free measures a method reports of its own heads (``Method.health``, logged with the monitors):
how sharp a teacher's output distribution is and how many of its outputs, or prototypes, the images
use. Collapse shows in them: a teacher giving every image the same uniform distribution has entropy
log K; one that sends every image to the same output uses one of K."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def entropy(p: torch.Tensor) -> torch.Tensor:
    """The entropy in nats of each row of probabilities ``p`` [N, K] (0 log 0 = 0), in float32."""
    p = p.float()
    return -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(dim=1)


def effective_usage(assignments: torch.Tensor, size: int) -> float:
    """How many of ``size`` outputs the ``assignments`` (an output index per image) use: the exponential
    of the entropy of their histogram, 1 when all fall on one output, k when they spread evenly over k."""
    counts = torch.bincount(assignments.long().flatten(), minlength=size).double()
    return math.exp(float(entropy((counts / counts.sum()).unsqueeze(0))[0]))


def distribution_health(
    forward_train_set: Callable, probabilities: Callable[[torch.Tensor], torch.Tensor], size: int
) -> tuple[float, float]:
    """(mean entropy, effective usage of the ``size`` outputs) of the distributions [N, size] that
    ``probabilities`` gives for the train split's images: a teacher's sharpened output, a target's
    assignment to prototypes. ``forward_train_set`` is the monitors' (``Method.health``)."""

    def measure(x):
        p = probabilities(x)
        return torch.stack([entropy(p), p.argmax(dim=1).float()], dim=1)

    out = forward_train_set(measure)
    return out[:, 0].mean().item(), effective_usage(out[:, 1], size)
