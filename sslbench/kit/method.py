"""The plugin contract every method implements.

A method is an ``nn.Module`` that receives the backbone from the engine and owns
its heads, its loss and its state (queues, momentum encoders, prototypes,
pseudo-labels).  The engine owns everything else: the loop, the views, the
optimiser and its schedule, the momentum (EMA) updates, checkpoints, devices,
AMP, DDP and logs.

    class MyMethod(Method):
        num_views = 2           # global views per image the loss needs (at the dataset's size)
        multi_crop = False      # True: `augment.crops` may add smaller (local) views after them
        needs_labels = False    # True for supervised methods (SupCon, CE)

        def __init__(self, backbone, info, cfg): ...
        def training_loss(self, views, labels, indices) -> Tensor
        def param_groups(self) -> list[dict]       # optional: lr scale, fixed lr, wd, LARS exclusion
        def momentum_pairs(self) -> list[tuple]    # optional: (online modules, target) EMA pairs
        def on_epoch_start(self, ctx) -> None      # optional: E-step, relabelling
        def on_before_step(self, ctx) -> None      # optional: clip or drop gradients
        def on_step_end(self, ctx) -> None         # optional: state updates after the step
        def encoder(self) -> nn.Module             # the network evaluated
        def projection_head(self) -> nn.Sequential # optional: the head on encoder()'s features
        def health(self, forward_train_set) -> dict  # optional: a teacher's entropy, prototype usage

One epoch, as the engine runs it: ``on_epoch_start(ctx)``, then ``epoch_order(N, generator)`` (a
random permutation of the N training images unless the method samples) cut into full batches, each
rank taking its shard of every batch; one training step per batch:

    views = augment(images)                    # num_views global views, then local crops
    loss = method.training_loss(views, labels, indices)
    loss.backward()                            # under DDP: gradients averaged over ranks
    method.on_before_step(ctx)
    optimizer.step()                           # lr of each group set by the schedule before
    tau = momentum at this step                # for online, target in momentum_pairs():
    target <- tau target + (1 - tau) online    #   every parameter, not the BN statistics
    method.on_step_end(ctx)

Views (``augment:`` in the method's config.yaml, parsed by sslbench.augment.views.view_groups): one view
setting for every view, a list with one per view (BYOL's asymmetric views: presets ``byol_view1``
and ``byol_view2``), or multi-crop groups ``{crops: [{count, size, <view settings>}, ...]}`` with
sizes as fractions of the dataset's image side. ``training_loss`` gets the views in that order: the
``num_views`` global views (at the dataset's size) first, then any local crops (only where
``multi_crop`` is True; how many is the config's, so count them in ``views``). ``embed_crops``
runs a network over views of several sizes as one batch per size (SwAV's and DINO's multi-crop
forward); ``embed_views`` embeds same-size views as one batch (SimCLR, SupCon). The heads several
methods share are here too: ``projection_mlp``, ``bn_mlp`` and ``DINOHead`` (DINO's and iBOT's).

Parameter groups (``param_groups``): dicts with ``params`` and any of ``lr_scale`` (the schedule's
lr times it), ``fixed_lr`` (True: the group keeps ``train.lr`` x ``lr_scale``, the schedule never
moves it), ``weight_decay`` (default ``train.weight_decay``) and ``exclude_from_lars`` (no weight
decay and no LARS adaptation; needs ``weight_decay: 0.0``). Every trainable parameter in exactly
one group. ``exclude_bias_and_norm`` splits parameters the way BYOL, Barlow Twins, VICReg, MoCo v3
and DINO do. The optimiser is ``train.optimizer`` (sgd | adam | adamw | lars: sslbench.optim.Lars; see
sslbench.optim for its trust ratios, ``lars_trust_ratio``, and the settings ``lars_trust_coefficient``
and ``lars_trust_clip``).

Momentum pairs (``momentum_pairs``): a list of ``(online, target)`` with ``online`` a sequence of
modules whose parameters, in order, match ``target.parameters()`` in number and shapes. The
method's config.yaml gives ``momentum`` (tau_base) and ``momentum_schedule``: ``constant`` (MoCo
v1/v2: tau = tau_base) or ``cosine`` (BYOL, MoCo v3, DINO: tau_k = 1 - (1 - tau_base)(cos(pi k / K)
+ 1) / 2, k the 0-based index of the step just taken, K the run's steps: tau_base after the first
step, 1 - (1 - tau_base) pi^2 / (4 K^2) after the last, as BYOL's target_ema and DINO's
cosine_scheduler; MoCo v3's code applies that tau at the next forward, one step later) or ``linear``
(MSN: tau_k = tau_base + (1 - tau_base) k / K). The
engine applies ``target <- tau target + (1 - tau) online`` right after each optimiser step and
logs the last tau of each epoch as ``target_momentum``. The target is the method's to build:
``sslbench.kit.momentum.frozen_copy`` copies the online modules (MoCo, MoCo v3, DINO); BYOL's official
target is initialised on its own (build it and ``freeze`` it). The target never receives gradients
(the engine refuses a pair whose target has trainable parameters or whose shapes differ); its
batch-norm statistics are its own.

State that must survive a resume lives in parameters and buffers; everything random is re-seeded
per epoch by the engine (draw from torch's global RNG, never keep a generator).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


@dataclass
class DataInfo:
    """What a method may know about the data when it is built."""

    num_classes: int
    num_train: int
    channels: int
    image_size: int
    batch_size: int  # the global batch (train.batch_size), over every process
    epochs: int  # train.epochs


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

    num_views: int = 2  # global views (the dataset's size); may be set in __init__ from the config
    multi_crop: bool = False  # True: the config may add local crops after the global views
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
        """The loss for one batch: ``views`` holds the ``num_views`` global views [B, C, H, W], then
        any local crops [B, C, h, w]; ``indices`` are the images' positions in the train split."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_loss()")

    def param_groups(self) -> list[dict]:
        """The optimiser's parameter groups (module docstring); default: every trainable
        parameter in one group with the ``train`` settings."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def momentum_pairs(self) -> list[tuple[Sequence[nn.Module], nn.Module]]:
        """(online modules, target) pairs the engine moves by EMA after every step; default none."""
        return []

    def on_epoch_start(self, ctx: EpochContext) -> None:
        """Called before every epoch (including the first)."""

    def epoch_order(self, num_train: int, generator: torch.Generator) -> torch.Tensor:
        """The training images of the epoch, in the order they are batched (called after
        ``on_epoch_start``): ``num_train`` indices, the same on every rank, so draw only
        from ``generator``. Default: a random permutation; DeepCluster samples uniformly over its
        clusters (an index may then repeat)."""
        return torch.randperm(num_train, generator=generator)

    def on_before_step(self, ctx: EpochContext) -> None:
        """Called after the backward pass (gradients averaged over ranks), before the optimiser
        step: clip gradients or set them to None (a frozen layer: no update, no weight decay)."""

    def on_step_end(self, ctx: EpochContext) -> None:
        """Called after every optimiser step and the momentum updates."""

    def encoder(self) -> nn.Module:
        """The network whose pooled features are evaluated."""
        return self.backbone

    def projection_head(self) -> nn.Sequential | None:
        """The projection head on ``encoder()``'s features, as a Sequential of layers; None (the default)
        where the method has none. The final checkpoint keeps its first layer (``kit.headlayer``), which
        semi-supervised fine-tuning of a ViT starts from, as SimCLR v2 and iBOT do."""
        return None

    def health(self, forward_train_set: Callable) -> dict[str, float]:
        """Label-free measures of the method's own heads that the monitors log (a teacher's entropy,
        the prototypes' usage: ``sslbench.kit.health``), from ``forward_train_set`` (``EpochContext``'s);
        none by default. It must change no state and draw no random number: the monitors never
        change the training."""
        return {}

    @property
    def trains(self) -> bool:
        """False for methods without trainable parameters (the untrained floor)."""
        return any(p.requires_grad for p in self.parameters())


REQUIRED_HOOKS = ("training_loss",)
GROUP_OPTIONS = ("params", "lr_scale", "fixed_lr", "weight_decay", "momentum", "exclude_from_lars")


def checked_param_groups(method: Method) -> list[dict]:
    """``method.param_groups()``, checked: known options only, every trainable parameter in
    exactly one group, no frozen one (its momentum or weight decay would still move it)."""
    name = type(method).__name__
    groups = [dict(group) for group in method.param_groups()]
    seen: dict[int, int] = {}
    for i, group in enumerate(groups):
        unknown = sorted(set(group) - set(GROUP_OPTIONS))
        if unknown or "params" not in group:
            raise ValueError(
                f"{name}.param_groups()[{i}]: needs `params` and takes only {list(GROUP_OPTIONS)}; "
                f"got unknown {unknown}"
            )
        group["params"] = list(group["params"])
        for p in group["params"]:
            if not p.requires_grad:
                raise ValueError(f"{name}.param_groups()[{i}] holds a parameter that does not require grad")
            if id(p) in seen:
                raise ValueError(f"{name}.param_groups(): a parameter is in groups {seen[id(p)]} and {i}")
            seen[id(p)] = i
    missing = [n for n, p in method.named_parameters() if p.requires_grad and id(p) not in seen]
    if missing:
        raise ValueError(f"{name}.param_groups() leaves out trainable parameters: {', '.join(missing)}")
    return [group for group in groups if group["params"]]


def exclude_bias_and_norm(module: nn.Module, **excluded_options) -> list[dict]:
    """Two groups of ``module``'s trainable parameters: the weights (ndim > 1) with the ``train``
    settings, then biases and norm parameters (ndim <= 1) with no weight decay and no LARS
    adaptation (BYOL's exclude_bias_and_norm; Barlow Twins, VICReg, MoCo v3 and DINO test
    ndim == 1 or <= 1: the same split). ``excluded_options`` add to the second group (Barlow
    Twins' bias lr: ``lr_scale=0.024``)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim > 1]},
        {
            "params": [p for p in params if p.ndim <= 1],
            "weight_decay": 0.0,
            "exclude_from_lars": True,
            **excluded_options,
        },
    ]


@torch.no_grad()
def clip_each_gradient(params: Iterable[torch.Tensor], max_norm: float) -> None:
    """DINO's utils.clip_gradients (iBOT's too): each gradient tensor scaled to norm at most ``max_norm`` on
    its own, not by a global norm (the 1e-6 as theirs). Parameters without a gradient are skipped."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(torch.clamp(max_norm / (p.grad.norm() + 1e-6), max=1.0))


def embed_views(backbone: nn.Module, projector: nn.Module, views: list[torch.Tensor]) -> torch.Tensor:
    """[B, V, D]: the L2-normalised projection of each of the V views of B images. The views go
    through the network as one concatenated batch, so batch-norm statistics span all of them, as in
    SimCLR's and SupContrast's code (and one large forward is faster than V small ones)."""
    z = F.normalize(projector(backbone(torch.cat(views))), dim=1)  # [V*B, D], view-major
    return z.view(len(views), -1, z.shape[1]).transpose(0, 1)


def embed_crops(
    backbone: Callable[[torch.Tensor], torch.Tensor],
    views: list[torch.Tensor],
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """``head(backbone(view))`` for every view, in order: consecutive views of one size go through
    ``backbone`` as one concatenated batch each, then ``head`` runs once on every view's features
    together (SwAV's and DINO's multi-crop forward: batch-norm statistics of the backbone span one
    size's views, those of the head all views)."""
    features, start = [], 0
    while start < len(views):
        end = start + 1
        while end < len(views) and views[end].shape[-2:] == views[start].shape[-2:]:
            end += 1
        features.append(backbone(torch.cat(views[start:end])))
        start = end
    out = torch.cat(features)
    if head is not None:
        out = head(out)
    return list(out.split([v.shape[0] for v in views]))


def projection_mlp(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2) -> nn.Sequential:
    """The MLP projection head of SimCLR / MoCo v2: (Linear-ReLU) x (n-1), Linear."""
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers += [nn.Linear(dim, hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*layers)


def bn_mlp(
    dims: Sequence[int], hidden_bias: bool = False, output_bias: bool = False, output_bn: bool = False
) -> nn.Sequential:
    """The batch-norm MLP heads of BYOL, SimSiam and MoCo v3: for ``dims`` = [in, hidden..., out],
    (Linear -> BatchNorm1d -> ReLU) into every hidden width, then Linear to ``out``, then
    BatchNorm1d(out, affine=False) when ``output_bn``. ``hidden_bias`` / ``output_bias``: whether
    those Linears have a bias (BYOL's MLP: hidden yes, output no; SimSiam's predictor: the reverse;
    MoCo v3's _build_mlp: none). torch's BatchNorm1d defaults (momentum 0.1, eps 1e-5) are the
    official codes' (BYOL's haiku decay 0.9, eps 1e-5)."""
    layers: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-2], dims[1:-1]):
        layers += [nn.Linear(d_in, d_out, bias=hidden_bias), nn.BatchNorm1d(d_out), nn.ReLU(inplace=True)]
    layers.append(nn.Linear(dims[-2], dims[-1], bias=output_bias))
    if output_bn:
        layers.append(nn.BatchNorm1d(dims[-1], affine=False))
    return nn.Sequential(*layers)


class DINOHead(nn.Module):
    """DINO's head (facebookresearch/dino vision_transformer.py DINOHead), which iBOT shares: Linear layers
    initialised trunc_normal(std 0.02) with zero bias, GELU (and BatchNorm1d with use_bn), then
    L2-normalise and the weight-normalised last layer (torch's default init; norms filled with 1 and
    frozen with norm_last_layer). It maps the last dimension: embeddings [N, D] or tokens [N, L, D]
    (iBOT's patch tokens; without use_bn)."""

    def __init__(self, in_dim, out_dim, hidden_dim, bottleneck_dim, num_layers, use_bn, norm_last_layer):
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(dims, dims[1:])):
            layers.append(nn.Linear(d_in, d_out))
            if i < num_layers - 1:
                layers += [nn.BatchNorm1d(d_out), nn.GELU()] if use_bn else [nn.GELU()]
        self.mlp = nn.Sequential(*layers)
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        norms = self.last_layer.parametrizations.weight.original0  # g [out_dim, 1]; original1 is v
        with torch.no_grad():
            norms.fill_(1.0)
        norms.requires_grad_(not norm_last_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class MatryoshkaDINOHead(nn.Module):
    """Franca's nested DINO head (valeoai/Franca franca/layers/mrl_dino_head.py MRLDINOHead): one head per
    width d in `nesting`, each a Linear(in_dim, d), then an MLP of `num_layers` Linear-GELU layers to the
    bottleneck (a GELU after the last one too, no L2 normalisation), then a weight-normalised Linear without
    bias to out_dim x d / nesting[-1] prototypes (norms filled with 1 and trained). The Linear layers are
    initialised trunc_normal(std 0.02) with zero bias; the last layers keep torch's. It returns the levels'
    outputs, narrowest first."""

    def __init__(self, in_dim, out_dim, hidden_dim, bottleneck_dim, num_layers, nesting):
        super().__init__()
        self.nesting = list(nesting)
        self.projections = nn.ModuleList([nn.Linear(in_dim, d) for d in self.nesting])
        self.mlps = nn.ModuleList()
        for d in self.nesting:
            dims = [d] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
            layers: list[nn.Module] = []
            for d_in, d_out in zip(dims, dims[1:]):
                layers += [nn.Linear(d_in, d_out), nn.GELU()]
            self.mlps.append(nn.Sequential(*layers))
        for module in [*self.projections, *self.mlps.modules()]:
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        # named as DINOHead's, so that a method freezes every level's last layer alike
        self.last_layer = nn.ModuleList(
            [
                weight_norm(nn.Linear(bottleneck_dim, out_dim * d // self.nesting[-1], bias=False))
                for d in self.nesting
            ]
        )
        with torch.no_grad():
            for layer in self.last_layer:
                layer.parametrizations.weight.original0.fill_(1.0)

    @property
    def mlp(self) -> nn.Sequential:
        """The widest level's layers before its last one (what `Method.projection_head` reads)."""
        return nn.Sequential(self.projections[-1], *self.mlps[-1])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(
            last(mlp(project(x))) for project, mlp, last in zip(self.projections, self.mlps, self.last_layer)
        )
