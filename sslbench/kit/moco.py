"""MoCo's building blocks, shared by MoCo v1/v2, PCL (whose pcl/builder.py extends moco/builder.py) and
ReSSL (whose network/ressl.py is moco/builder.py with another loss).

- ``VERSIONS``, ``moco_head``, ``check_version``, ``temperature_of``: what each MoCo version changes.
- ``SplitBatchNorm2d``, ``use_split_batch_norm``: BatchNorm over ``num_splits`` sub-batches, as the
  official single-GPU demo (colab/moco_cifar10_demo.ipynb) simulates 8 GPUs.
- ``MomentumEncoder``, ``key_encoder_of``: the key encoder, a frozen copy of the query encoder run on a
  shuffled batch (shuffle-BN, across ranks under torch.distributed as moco/builder.py); the trainer's EMA
  moves it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.method import projection_mlp
from sslbench.kit.momentum import frozen_copy
from sslbench.plan.limits import split_batch_norm_problem

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


class SplitBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d that, in training, normalises ``num_splits`` sub-batches with their own
    statistics: sub-batch j holds samples j, j + s, j + 2s, ... (as moco's CIFAR demo: viewing
    [n, c, h, w] as [n/s, s*c, h, w] makes the sub-batches channel groups without a copy; the
    batches are shuffled, so any fixed split is a random one). The running statistics
    move towards the mean of the sub-batches' statistics. In eval mode it is plain BatchNorm2d,
    and its state dict is BatchNorm2d's, so a trained backbone loads into an unmodified one.

    It computes bit for bit what the demo's layer computes: one batch norm over the grouped batch
    with the weight, bias and running statistics repeated per split, then the repeated statistics
    averaged back (tests/pretrain/test_split_batch_norm.py holds that formulation and checks equality)."""

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


class MomentumEncoder(nn.Module):
    """A frozen deep copy of the query encoder (the modules ``online``); the method declares ``(online,
    key_encoder)`` a momentum pair and the engine moves it. ``run(net, x)`` computes the keys from the copy
    (``net``, an nn.Sequential of the copied modules): by default the modules applied in order. It may return
    a tuple of tensors, each [B, ...] (DenseCL's global and dense keys); each is unshuffled alike."""

    def __init__(self, online: Sequence[nn.Module], run: Callable | None = None):
        super().__init__()
        self.net = frozen_copy(online)
        self.run = run or _in_order

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Keys for the batch x, computed on a shuffled batch and returned in x's order (shuffle-BN)."""
        if dist.world_size() > 1:
            return self._forward_shuffled_across_ranks(x)
        order = torch.randperm(x.shape[0]).to(x.device)  # CPU RNG: the same draws on every device
        inverse = torch.argsort(order)
        return _each(self.run(self.net, x[order]), lambda keys: keys[inverse])

    @torch.no_grad()
    def embed(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The key encoder on x as it is (no shuffle): features for an E-step."""
        return self.run(self.net, x)

    def _forward_shuffled_across_ranks(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        # moco/builder.py _batch_shuffle_ddp / _batch_unshuffle_ddp: rank 0 draws the permutation.
        ranks, rank = dist.world_size(), dist.rank()
        x_all = dist.gather(x)
        order = dist.broadcast(torch.randperm(x_all.shape[0]).to(x.device), src=0)
        mine, inverse = order.view(ranks, -1)[rank], torch.argsort(order)

        def unshuffle(keys):  # every rank's keys, in shuffled order, back in x_all's; then this rank's
            keys_all = dist.gather(keys)
            return keys_all[inverse].view(ranks, -1, *keys_all.shape[1:])[rank]

        return _each(self.run(self.net, x_all[mine]), unshuffle)


def _in_order(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    return net(x)


def _each(out, fn):
    """fn on a tensor, or on each tensor of a tuple."""
    return tuple(fn(t) for t in out) if isinstance(out, tuple) else fn(out)


def temperature_of(params: dict) -> float:
    """`temperature`, or the MoCo version's paper value when it is null."""
    value = params.get("temperature")
    return float(value) if value is not None else version_settings(params["version"])["temperature"]


def query_head_and_key_encoder(
    backbone: nn.Module, version: int | str, dim: int, bn_splits: int, batch_size: int
) -> tuple[nn.Sequential, MomentumEncoder]:
    """The version's query head on ``backbone`` and the key encoder, a frozen copy of both
    (``key_encoder_of``)."""
    head = moco_head(version, backbone.num_features, dim)
    return head, key_encoder_of(backbone, head, bn_splits, batch_size)


def key_encoder_of(
    backbone: nn.Module, head: nn.Module, bn_splits: int, batch_size: int, run: Callable | None = None
) -> MomentumEncoder:
    """The key encoder of the query encoder ``head(backbone)`` (or ``run((backbone, head), x)``): the
    backbone's BatchNorm2d become split BN first (``bn_splits`` sub-batches of each process's share of the
    global ``batch_size``), so that the frozen copy has them too."""
    has_batchnorm2d = any(isinstance(m, nn.BatchNorm2d) for m in backbone.modules())
    problem = split_batch_norm_problem(bn_splits, batch_size // dist.world_size(), has_batchnorm2d)
    if problem:  # the plan checked it (sslbench.plan.backbones)
        raise ConfigError(problem)
    use_split_batch_norm(backbone, bn_splits)
    return MomentumEncoder([backbone, head], run)
