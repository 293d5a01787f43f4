"""Momentum (EMA) targets, and MoCo's machinery shared by the momentum-contrast methods (MoCo, PCL).

- ``momentum_at``:         tau at a step: constant (MoCo v1/v2) or cosine to 1 (BYOL, MoCo v3, DINO).
- ``check_momentum``:      a method's ``momentum`` and ``momentum_schedule`` settings, checked.
- ``checked_momentum_pairs``: a method's ``momentum_pairs``, checked (shapes; frozen targets).
- ``ema_update``:          target <- tau target + (1 - tau) online, every parameter (the engine calls
                           it for each of a method's ``momentum_pairs`` after the optimiser step).
- ``frozen_copy``, ``freeze``: a target as a gradient-free copy of online modules, or one built apart.

- ``moco_head``:           the query head of MoCo v1 (linear) or v2 (MLP, hidden = feature dim).
- ``check_version``:       warn when the augmentation / schedule do not match the MoCo version.
- ``SplitBatchNorm2d``:    BatchNorm that normalises ``num_splits`` sub-batches separately, as the
                           official single-GPU demo (colab/moco_cifar10_demo.ipynb) simulates 8 GPUs.
- ``use_split_batch_norm``: swap a network's BatchNorm2d layers for SplitBatchNorm2d, in place.
- ``MomentumEncoder``:     the key encoder: a frozen deep copy of the query encoder (moved by the
                           engine's EMA, theta_k <- m theta_k + (1 - m) theta_q), run on a shuffled
                           batch (shuffle-BN; across ranks when torch.distributed runs, as
                           moco/builder.py).
- ``KeyQueue``:            the FIFO queue of K keys (ring buffer), filled after the loss.
- ``fit_queue_size``:      K as a multiple of the keys pushed per step, shrunk on small datasets.

References: facebookresearch/moco (moco/builder.py, main_moco.py, the colab CIFAR demo);
deepmind-research byol/utils/schedules.py (target_ema), facebookresearch/dino utils.py
(cosine_scheduler), facebookresearch/moco-v3 main_moco.py (adjust_moco_momentum).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from . import distributed as dist
from .errors import ConfigError
from .method import projection_mlp

# What each MoCo version changes (facebookresearch/moco README: v2 = --mlp --moco-t 0.2 --aug-plus --cos).
# cifar_demo: the official CIFAR-10 demo (colab/moco_cifar10_demo.ipynb): a linear head (ResNet-18's
# fc with 128 outputs), T 0.1, its own augmentation (no blur, crop scale (0.08, 1)), cosine schedule.
VERSIONS = {
    1: {"head_layers": 1, "temperature": 0.07, "augment": "mocov1", "schedule": "step"},
    2: {"head_layers": 2, "temperature": 0.2, "augment": "mocov2", "schedule": "cosine"},
    "cifar_demo": {"head_layers": 1, "temperature": 0.1, "augment": "moco_cifar_demo", "schedule": "cosine"},
}


def version_settings(version) -> dict:
    if version not in VERSIONS:
        raise ConfigError(
            f"config key `version` must be 1, 2 or cifar_demo (MoCo v1 / v2 / the CIFAR-10 demo), "
            f"got {version!r}"
        )
    return VERSIONS[version]


def moco_head(version: int | str, feature_dim: int, out_dim: int) -> nn.Sequential:
    """v1 and the demo: the backbone's fc replaced by Linear(feature_dim, out_dim); v2: Linear-ReLU-Linear."""
    layers = version_settings(version)["head_layers"]
    return projection_mlp(feature_dim, feature_dim, out_dim, num_layers=layers)


def check_version(cfg: dict) -> None:
    """Warn when the run's augmentation preset or lr schedule is not the one of its MoCo version.

    The engine, not the method, applies ``augment`` and ``train``; a preset that switches
    ``version`` must switch those too.
    """
    version = cfg["params"]["version"]
    expected = version_settings(version)
    augment = cfg.get("augment") or {}
    preset = augment.get("preset", "mocov2") if isinstance(augment, dict) else None
    schedule = cfg["train"].get("schedule")
    if preset != expected["augment"] or schedule != expected["schedule"]:
        warnings.warn(
            f"{cfg['method']}: version {version} uses augment.preset {expected['augment']!r} and "
            f"train.schedule {expected['schedule']!r}, but this run has {preset!r} and {schedule!r}; "
            f"set them in methods/{cfg['method']}/config.yaml or method_overrides.{cfg['method']} "
            "to run that version as its paper does",
            stacklevel=2,
        )


# --- momentum (EMA) targets ----------------------------------------------------------------

MOMENTUM_SCHEDULES = ("constant", "cosine")


def check_momentum(params: dict) -> tuple[float, str]:
    """(tau_base, schedule) from a method's settings ``momentum`` and ``momentum_schedule``."""
    base, schedule = params.get("momentum"), params.get("momentum_schedule")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 0.0 <= base <= 1.0:
        raise ConfigError(
            f"config key `momentum` (the momentum target's tau_base) must lie in [0, 1], got {base!r}; "
            "a method with momentum pairs sets it and `momentum_schedule` in its config.yaml"
        )
    if schedule not in MOMENTUM_SCHEDULES:
        raise ConfigError(
            f"config key `momentum_schedule` must be one of {list(MOMENTUM_SCHEDULES)} (constant: MoCo "
            f"v1/v2; cosine from `momentum` to 1: BYOL, MoCo v3, DINO), got {schedule!r}"
        )
    return float(base), schedule


def momentum_at(base: float, schedule: str, step: int, total_steps: int) -> float:
    """tau after the optimiser step of 0-based index ``step`` of ``total_steps``: ``base``
    (constant), or 1 - (1 - base)(cos(pi step / total) + 1) / 2 (cosine, step clamped to the
    total), BYOL's target_ema and DINO's cosine_scheduler per step. MoCo v3 moves its target by
    the same tau one step later, at the next forward: a one-step shift."""
    if schedule == "constant":
        return base
    if schedule == "cosine":
        progress = min(step, total_steps) / max(1, total_steps)
        return 1.0 - (1.0 - base) * (math.cos(math.pi * progress) + 1.0) / 2.0
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
                "sslbench.momentum.frozen_copy or freeze it (sslbench.momentum.freeze)"
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


# --- split batch norm ----------------------------------------------------------------------


class SplitBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d that, in training, normalises ``num_splits`` sub-batches with their own
    statistics: sub-batch j holds samples j, j + s, j + 2s, ... (as moco's CIFAR demo: viewing
    [n, c, h, w] as [n/s, s*c, h, w] makes the sub-batches channel groups without a copy; the
    batches are shuffled, so any fixed split is a random one). The running statistics
    move towards the mean of the sub-batches' statistics. In eval mode it is plain BatchNorm2d,
    and its state dict is BatchNorm2d's, so a trained backbone loads into an unmodified one.

    It computes bit for bit what the demo's layer computes: one batch norm over the grouped batch
    with the weight, bias and running statistics repeated per split, then the repeated statistics
    averaged back (tests/test_split_batch_norm.py holds that formulation and checks equality)."""

    def __init__(self, num_features: int, num_splits: int, **kwargs):
        super().__init__(num_features, **kwargs)
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        self.num_splits = num_splits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        n, c, h, w = x.shape
        s = self.num_splits
        if n % s:
            raise ConfigError(
                f"SplitBatchNorm2d: batch of {n} is not divisible into {s} splits "
                "(config key `bn_splits` must divide the batch size)"
            )
        factor = 0.0 if self.momentum is None else self.momentum
        mean = var = None
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative average, as nn.BatchNorm2d
                factor = 1.0 / float(self.num_batches_tracked)
            # Every split starts from the shared statistics; batch norm moves each copy in place.
            mean = torch.cat((self.running_mean,) * s)
            var = torch.cat((self.running_var,) * s)
        weight = bias = None
        if self.affine:
            weight = self.weight.expand(s, c).reshape(-1)
            bias = self.bias.expand(s, c).reshape(-1)
        # [n, c, h, w] -> [n/s, s*c, h, w], a view of contiguous x: channel group j = samples j (mod s).
        out = F.batch_norm(x.reshape(n // s, s * c, h, w), mean, var, weight, bias, True, factor, self.eps)
        if self.track_running_stats:  # the splits' statistics averaged, as the demo averages them
            torch.mean(mean.view(s, c), 0, out=self.running_mean)
            torch.mean(var.view(s, c), 0, out=self.running_var)
        # Not out.reshape: timm's in-place activation and residual add would then write into a view,
        # and autograd would copy each layer's whole gradient three times (CopySlices), most of what
        # split BN used to cost a step. _unsafe_view records no view; it is safe because nothing else
        # holds the grouped output (batch norm's backward keeps its input, never its output).
        return torch.ops.aten._unsafe_view(out, (n, c, h, w))


def use_split_batch_norm(module: nn.Module, num_splits: int) -> nn.Module:
    """Replace every nn.BatchNorm2d in ``module`` by a SplitBatchNorm2d with the same state (in place).

    num_splits = 1 leaves the network as it is. Other batch-norm types (BatchNorm1d, timm's
    BatchNormAct2d, ...) cannot be split and raise an error.
    """
    if num_splits == 1:
        return module
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm2d:
            split = SplitBatchNorm2d(
                child.num_features,
                num_splits,
                eps=child.eps,
                momentum=child.momentum,
                affine=child.affine,
                track_running_stats=child.track_running_stats,
            )
            split.load_state_dict(child.state_dict())
            device = next((t.device for t in child.state_dict().values()), torch.device("cpu"))
            setattr(module, name, split.to(device))
        elif isinstance(child, _BatchNorm) and not isinstance(child, SplitBatchNorm2d):
            raise ConfigError(
                f"bn_splits = {num_splits} needs plain nn.BatchNorm2d layers, but {name!r} is a "
                f"{type(child).__name__}; set config key `bn_splits: 1`"
            )
        else:
            use_split_batch_norm(child, num_splits)
    return module


def check_bn_splits(num_splits, batch_size: int) -> int:
    if not isinstance(num_splits, int) or num_splits < 1 or batch_size % num_splits:
        raise ConfigError(
            f"config key `bn_splits` = {num_splits!r} must be a positive integer dividing the batch size "
            f"{batch_size} of each process (`train.batch_size` / number of processes)"
        )
    return num_splits


# --- the key encoder -----------------------------------------------------------------------


class MomentumEncoder(nn.Module):
    """A frozen deep copy of the query encoder (the modules ``online``, applied in order); the
    method declares ``(online, key_encoder)`` a momentum pair and the engine moves it."""

    def __init__(self, online: Sequence[nn.Module]):
        super().__init__()
        self.net = frozen_copy(online)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Keys for the batch x, computed on a shuffled batch and returned in x's order (shuffle-BN)."""
        if dist.world_size() > 1:
            return self._forward_shuffled_across_ranks(x)
        order = torch.randperm(x.shape[0]).to(x.device)  # CPU RNG: the same draws on every device
        return self.net(x[order])[torch.argsort(order)]

    @torch.no_grad()
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The key encoder on x as it is (no shuffle): features for an E-step."""
        return self.net(x)

    def _forward_shuffled_across_ranks(self, x: torch.Tensor) -> torch.Tensor:
        # moco/builder.py _batch_shuffle_ddp / _batch_unshuffle_ddp: rank 0 draws the permutation.
        ranks, rank = dist.world_size(), dist.rank()
        x_all = dist.gather(x)
        order = dist.broadcast(torch.randperm(x_all.shape[0]).to(x.device), src=0)
        mine = order.view(ranks, -1)[rank]
        keys_all = dist.gather(self.net(x_all[mine]))  # in shuffled order
        return keys_all[torch.argsort(order)].view(ranks, -1, *keys_all.shape[1:])[rank]


# --- the queue -----------------------------------------------------------------------------


class KeyQueue(nn.Module):
    """K keys [K, dim] in a ring buffer; ``pointer`` is where the next batch of keys goes."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("keys", F.normalize(torch.randn(size, dim), dim=1))  # as moco/builder.py
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return self.keys.shape[0]

    def negatives(self) -> torch.Tensor:
        """A snapshot of the queue: the loss keeps using it after ``push`` overwrites the buffer."""
        return self.keys.clone()

    @torch.no_grad()
    def push(self, keys: torch.Tensor) -> None:
        """Enqueue this step's keys (every rank's) over the oldest ones."""
        keys = dist.gather(keys.detach())
        n, size = keys.shape[0], len(self)
        if size % n:
            raise ValueError(f"queue size {size} is not a multiple of the {n} keys pushed per step")
        slots = (self.pointer + torch.arange(n, device=self.keys.device)) % size  # no host sync
        self.keys.index_copy_(0, slots, keys.to(self.keys.dtype))
        self.pointer.add_(n).remainder_(size)


def fit_queue_size(requested: int, keys_per_step: int, num_train: int) -> int:
    """The queue size K actually used: a multiple of the keys pushed per step (moco/builder.py
    asserts it), at most num_train - keys_per_step, so the queue cannot hold a key of every
    training image (otherwise each image's previous-epoch key would always be among its own
    negatives). A change is announced with a warning; a dataset too small for one batch of
    negatives is an error."""
    if not isinstance(requested, int) or requested < 1:
        raise ConfigError(f"config key `queue_size` must be a positive integer, got {requested!r}")
    fitted = min(requested, num_train - keys_per_step) // keys_per_step * keys_per_step
    if fitted < keys_per_step:
        raise ConfigError(
            f"{num_train} training images are too few for a queue of at least one batch of "
            f"{keys_per_step} keys next to the batch itself; lower `train.batch_size`"
        )
    if fitted != requested:
        warnings.warn(
            f"queue_size {requested} shrunk to {fitted}: a multiple of the {keys_per_step} keys pushed per "
            f"step and at most num_train - batch = {num_train - keys_per_step} ({num_train} training images)",
            stacklevel=2,
        )
    return fitted


# --- assembly ------------------------------------------------------------------------------


def moco_components(
    backbone: nn.Module, num_train: int, cfg: dict
) -> tuple[nn.Sequential, MomentumEncoder, KeyQueue]:
    """MoCo's query head, key encoder and queue from a method's config (keys `version`, `dim`,
    `queue_size`, `bn_splits`; the engine reads `momentum` and `momentum_schedule`). Switches the
    backbone's BatchNorm2d to split BN first, so the key encoder (a copy) has it too."""
    p = cfg["params"]
    check_version(cfg)
    batch_size = int(cfg["train"]["batch_size"])  # the global batch: every step enqueues this many keys
    use_split_batch_norm(backbone, check_bn_splits(p["bn_splits"], batch_size // dist.world_size()))
    head = moco_head(p["version"], int(backbone.num_features), int(p["dim"]))
    key_encoder = MomentumEncoder([backbone, head])
    queue = KeyQueue(fit_queue_size(p["queue_size"], batch_size, num_train), int(p["dim"]))
    return head, key_encoder, queue


def temperature_of(params: dict) -> float:
    """`temperature`, or the MoCo version's paper value when it is null."""
    value = params.get("temperature")
    return float(value) if value is not None else version_settings(params["version"])["temperature"]
