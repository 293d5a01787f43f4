"""The plugin contract every method implements.

A method is an ``nn.Module`` that receives the backbone from the engine and owns
its heads, its loss and its state (queues, momentum encoders, prototypes,
pseudo-labels).  The engine owns everything else: the loop, the optimiser and
schedule, checkpoints, devices, AMP, DDP and logs.

    class MyMethod(Method):
        num_views = 2           # augmented views per image the loss needs
        needs_labels = False    # True for supervised methods (SupCon, CE)

        def __init__(self, backbone, info, cfg): ...
        def training_loss(self, views, labels, indices) -> Tensor
        def on_epoch_start(self, ctx) -> None      # optional: E-step, relabelling
        def on_step_end(self, ctx) -> None         # optional: momentum updates
        def encoder(self) -> nn.Module             # the network evaluated
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DataInfo:
    """What a method may know about the data when it is built."""

    num_classes: int
    num_train: int
    channels: int
    image_size: int


@dataclass
class EpochContext:
    """Handed to the hooks: where training stands and a way to see the data.

    ``forward_train_set(fn)`` runs ``fn`` on every training image (evaluation
    transform, dataset order, no gradient, batched on the training device) and
    returns the concatenated outputs, so that an E-step or a relabelling never
    needs its own data loop.
    """

    epoch: int
    num_epochs: int
    step: int
    steps_per_epoch: int
    device: torch.device
    forward_train_set: Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]
    log: dict = field(default_factory=dict)  # scalars a hook wants in the epoch log

    @property
    def progress(self) -> float:
        """Fraction of training done, in [0, 1]."""
        total = max(1, self.num_epochs * self.steps_per_epoch)
        return min(1.0, self.step / total)


class Method(nn.Module):
    """Base class of every method in ``methods/<name>/method.py``."""

    num_views: int = 2
    needs_labels: bool = False

    def __init__(self, backbone: nn.Module, info: DataInfo, cfg: dict):
        super().__init__()
        self.backbone = backbone
        self.info = info
        self.cfg = cfg
        self.feature_dim = int(backbone.num_features)

    def training_loss(
        self, views: list[torch.Tensor], labels: torch.Tensor | None, indices: torch.Tensor
    ) -> torch.Tensor:
        """The loss for one batch: ``views`` holds ``num_views`` tensors [B, C, H, W];
        ``indices`` are the images' positions in the train split."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_loss()")

    def on_epoch_start(self, ctx: EpochContext) -> None:
        """Called before every epoch (including the first)."""

    def on_step_end(self, ctx: EpochContext) -> None:
        """Called after every optimiser step."""

    def encoder(self) -> nn.Module:
        """The network whose pooled features are evaluated."""
        return self.backbone

    @property
    def trains(self) -> bool:
        """False for methods without trainable parameters (the untrained floor)."""
        return any(p.requires_grad for p in self.parameters())


REQUIRED_HOOKS = ("training_loss",)


def embed_views(backbone: nn.Module, projector: nn.Module, views: list[torch.Tensor]) -> torch.Tensor:
    """[B, V, D]: the L2-normalised projection of each of the V views of B images. The views go
    through the network as one concatenated batch, so batch-norm statistics span all of them, as in
    SimCLR's and SupContrast's code (and one large forward is faster than V small ones)."""
    z = F.normalize(projector(backbone(torch.cat(views))), dim=1)  # [V*B, D], view-major
    return z.view(len(views), -1, z.shape[1]).transpose(0, 1)


def projection_mlp(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2) -> nn.Sequential:
    """The MLP projection head of SimCLR / MoCo v2: (Linear-ReLU) x (n-1), Linear."""
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers += [nn.Linear(dim, hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*layers)
