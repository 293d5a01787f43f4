"""DINOv2's masked self-distillation (Oquab et al., TMLR 2024; facebookresearch/dinov2), the step that
DINOv3's Gram anchoring and Franca build on: a student ViT with a class-token head and a patch head, its EMA
teacher, the teacher's targets (a running-mean centring or Sinkhorn-Knopp), the block-wise masks of the global
crops, the three loss terms (DINO's on the class tokens, iBOT's on the masked patches, KoLeo), the
layer-decayed parameter groups, the clipping per module and the frozen last layers. A method subclasses
`MaskedSelfDistillation` and writes its loss from `distillation_terms`; it may change the heads (`build_head`:
Franca's nested ones, whose levels each get their targets and terms) and the masks' generator (`mask`). The
settings are DINOv2's `config.yaml` keys; DINOv3's weight schedule is here too."""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import balanced_assignment
from sslbench.kit.health import distribution_health
from sslbench.kit.losses import cross_view_cross_entropy, koleo, masked_patch_cross_entropy
from sslbench.kit.method import DINOHead, MatryoshkaDINOHead, Method, embed_crops
from sslbench.kit.momentum import frozen_copy, without_drop_path
from sslbench.kit.vit import (
    block_mask,
    check_masked_vit,
    mask_share_draws,
    masked_tokens,
    shared_rng,
    vit_layer_id,
)

CENTERINGS = ("centering", "sinkhorn_knopp")


def warmup_cosine_value(step: int, start: float, peak: float, end: float, warmup: int, cosine: int) -> float:
    """DINOv3's linear_warmup_cosine_decay at `step`: linear from start towards peak over `warmup` steps
    (np.linspace without its endpoint), then a cosine from peak to end over `cosine` steps (np.linspace(0, pi,
    cosine), so it reaches end on its last step), then end."""
    if step < warmup:
        return start + (peak - start) * step / warmup
    i = step - warmup
    if i >= cosine:
        return end
    phase = math.pi * i / (cosine - 1) if cosine > 1 else 0.0
    return end + (peak - end) * (1 + math.cos(phase)) / 2


@dataclass
class DistillationTerms:
    """One batch's loss terms, and what a method adds its own terms from: the student's tokens of the masked
    global crops [2B, 1 + L, D] (after the final norm) and the masks [2B, L]."""

    dino: torch.Tensor
    koleo: torch.Tensor
    ibot: torch.Tensor
    student_tokens: torch.Tensor
    masks: torch.Tensor


def levels(out) -> tuple[torch.Tensor, ...]:
    """A head's outputs as a tuple of levels: DINOHead's one, a Matryoshka head's one per nesting level."""
    return out if isinstance(out, tuple) else (out,)


def level_sum(terms: list[torch.Tensor]) -> torch.Tensor:
    """The sum of the levels' terms (Franca's losses add them up); a single level's term as it is."""
    return functools.reduce(operator.add, terms)


class MaskedSelfDistillation(Method):
    config_file = "methods/dinov2/config.yaml"  # the subclass's, named in its errors
    num_views = 2  # the global crops, the teacher's only input and the only ones masked
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.check_choice(p, "centering", CENTERINGS)
        self.patch = check_masked_vit(backbone, cfg, info, self.config_file.split("/")[1])  # the folder
        self.grid = info.image_size // self.patch
        # [dino head, ibot head]; separate_head false (ssl_default_config): the patches take the class token's
        self.heads = nn.ModuleList([self.build_head(p, p["out_dim"])])
        if p["separate_head"]:
            self.heads.append(self.build_head(p, p["ibot_out_dim"]))
        # the backbone's mask_token in DINOv2 (zeros at first): a parameter of the method here
        self.mask_token = nn.Parameter(torch.zeros(1, 1, self.feature_dim))
        # [backbone, dino head(, ibot head)]; build_model_from_cfg: the teacher has no drop path
        self.teacher = without_drop_path(frozen_copy([self.backbone, *self.heads]))
        self.register_buffer("center", torch.zeros(1, p["out_dim"]))
        self.register_buffer(
            "center2", torch.zeros(1, p["ibot_out_dim" if p["separate_head"] else "out_dim"])
        )
        self.centering, self.center_momentum = p["centering"], float(p["center_momentum"])
        if self.centering == "centering" and isinstance(self.dino_head, MatryoshkaDINOHead):
            raise ConfigError(
                f"{self.config_file}: centering 'centering' keeps one centre, which the nested heads' levels "
                "cannot share: set centering: sinkhorn_knopp"
            )
        self.student_temp = float(p["student_temp"])
        self.teacher_temps = (float(p["warmup_teacher_temp"]), float(p["teacher_temp"]))
        self.warmup_teacher_temp_epochs = float(p["warmup_teacher_temp_epochs"])
        self.weights = {k: float(p[f"{k}_loss_weight"]) for k in ("dino", "koleo", "ibot")}
        self.mask_probability, self.mask_ratio = float(p["mask_probability"]), tuple(p["mask_ratio"])
        if not 0 <= self.mask_ratio[0] <= self.mask_ratio[1] <= 1:
            raise ConfigError(
                f"{self.config_file}: mask_ratio must be [low, high] with 0 <= low <= high <= 1"
            )
        self.log_aspect = (math.log(p["mask_min_aspect"]), -math.log(p["mask_min_aspect"]))
        self.layer_decay, self.patch_embed_lr_mult = float(p["layer_decay"]), float(p["patch_embed_lr_mult"])
        self.clip_grad, self.freeze_last_layer = float(p["clip_grad"]), int(p["freeze_last_layer"])
        self.teacher_temp = self.teacher_temperature(0, 1)

    def check_choice(self, p: dict, key: str, choices: tuple) -> None:
        """A setting that names one of `choices`, refused otherwise with the file and the key."""
        if p[key] not in choices:
            raise ConfigError(f"{self.config_file}: {key} must be one of {choices}, got {p[key]!r}")

    def build_head(self, p: dict, out_dim: int) -> nn.Module:
        """DINOv2's DINOHead: DINO's, its last layer's norms trained (no norm_last_layer), no batch norm."""
        return DINOHead(
            self.feature_dim,
            out_dim,
            p["hidden_dim"],
            p["bottleneck_dim"],
            3,
            use_bn=False,
            norm_last_layer=False,
        )

    @property
    def dino_head(self) -> DINOHead:
        return self.heads[0]

    @property
    def ibot_head(self) -> DINOHead:
        return self.heads[-1]

    def teacher_temperature(self, step: int, steps_per_epoch: int) -> float:
        """train.py's teacher_temp schedule, per step: np.linspace(warmup_teacher_temp, teacher_temp, warm-up
        steps) over the warm-up epochs' steps, then teacher_temp."""
        start, end = self.teacher_temps
        warmup = int(self.warmup_teacher_temp_epochs * steps_per_epoch)
        if step >= warmup:
            return end
        return start + (end - start) * step / max(1, warmup - 1)

    def distillation_terms(self, views, local_weight: float = 1.0) -> DistillationTerms:
        """ssl_meta_arch.py's forward_backward up to the weighted sum: the global crops masked, the teacher's
        targets, DINO's term (the mean over the pairs; `local_weight` scales the local crops' pairs, as
        DINOv3's reweighting does), KoLeo summed over the global crops, iBOT's term. Where the heads have
        levels (Matryoshka heads), each level has its own targets, and DINO's and iBOT's terms add up over
        them."""
        globals_, locals_ = views[: self.num_views], views[self.num_views :]
        masks = self.draw_masks(globals_[0].shape[0], globals_[0].device).flatten(1)  # [2B, L]
        with torch.no_grad():
            tokens = masked_tokens(self.teacher[0], torch.cat(globals_))
            teacher_cls = levels(self.teacher[1](tokens[:, 0]))
            # [M, K2]: the masked patches only
            teacher_patches = levels(self.teacher[-1](tokens[:, 1:][masks]))
        student = masked_tokens(self.backbone, torch.cat(globals_), masks, self.mask_token)
        student_cls = [list(level.chunk(self.num_views)) for level in levels(self.dino_head(student[:, 0]))]
        if locals_:
            local_features = torch.cat(embed_crops(self.backbone, locals_))
            for views_of_level, level in zip(student_cls, levels(self.dino_head(local_features))):
                views_of_level += level.split([v.shape[0] for v in locals_])
        view_weights = None
        if local_weight != 1.0:
            view_weights = [1.0] * self.num_views + [local_weight] * len(locals_)
        targets = [self.teacher_targets(c, m) for c, m in zip(teacher_cls, teacher_patches)]
        loss_dino = level_sum(
            [
                cross_view_cross_entropy(t.chunk(self.num_views), s, self.student_temp, view_weights)
                for (t, _), s in zip(targets, student_cls)
            ]
        )
        loss_koleo = sum(koleo(dist.gather_with_grad(c)) for c in student[:, 0].chunk(self.num_views))
        patch_logits = levels(self.ibot_head(student[:, 1:][masks]))
        loss_ibot = level_sum(
            [
                masked_patch_cross_entropy(t, logits / self.student_temp, masks)
                for (_, t), logits in zip(targets, patch_logits)
            ]
        )
        return DistillationTerms(loss_dino, loss_koleo, loss_ibot, student, masks)

    def weighted_sum(self, terms: DistillationTerms) -> torch.Tensor:
        """forward_backward's loss: w_dino L_dino + w_koleo L_koleo + w_ibot L_ibot."""
        w = self.weights
        return w["dino"] * terms.dino + w["koleo"] * terms.koleo + w["ibot"] * terms.ibot

    @torch.no_grad()
    def teacher_targets(self, cls: torch.Tensor, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's class-token [2B, K] and masked-patch [M, K2] distributions. `centering`: softmax((t -
        c) / tau_t), then each centre moves 0.9 towards the mean output over every rank (the patches': over
        every rank's masked patches); `sinkhorn_knopp`: three Sinkhorn-Knopp iterations of exp(t / tau_t)
        over every rank's rows, the patches' over every rank's masked patches."""
        tau = self.teacher_temp
        count = int(dist.all_reduce_sum(torch.tensor([float(patches.shape[0])], device=patches.device))[0])
        if self.centering == "sinkhorn_knopp":
            return (
                balanced_assignment(torch.exp(cls.float() / tau)),
                balanced_assignment(torch.exp(patches.float() / tau), num_samples=count),
            )
        targets = (
            F.softmax((cls - self.center) / tau, dim=-1),
            F.softmax((patches - self.center2) / tau, dim=-1),
        )
        cls_mean = dist.all_reduce_sum(cls.float().sum(dim=0, keepdim=True)) / (
            cls.shape[0] * dist.world_size()
        )
        patch_mean = dist.all_reduce_sum(patches.float().sum(dim=0, keepdim=True)) / max(count, 1)
        self.center.mul_(self.center_momentum).add_(cls_mean, alpha=1 - self.center_momentum)
        self.center2.mul_(self.center_momentum).add_(patch_mean, alpha=1 - self.center_momentum)
        return targets

    @torch.no_grad()
    def draw_masks(self, batch: int, device) -> torch.Tensor:
        """[num_views x batch, h, w] bool: collate_data_and_cast's masks of every global crop of this rank's
        images (view-major): int(crops x mask_probability) of the crops masked, shares in equal bins of
        mask_ratio, shuffled, each drawn by MaskingGenerator (blocks of at least min_mask_patches, at most
        max_mask_share of the patches). The whole batch's from rank 0's seed, so that 2 processes compute what
        one computes on the whole batch (the official collate draws each rank's)."""
        rng = shared_rng(device)
        everyone = batch * dist.world_size()
        shares = mask_share_draws(self.num_views * everyone, self.mask_probability, self.mask_ratio, rng)
        n = self.grid * self.grid
        masks = torch.stack([self.mask(int(n * share), rng) for share in shares])
        masks = masks.view(self.num_views, everyone, self.grid, self.grid)
        mine = masks[:, dist.shard(everyone)]
        return mine.reshape(-1, self.grid, self.grid).to(device)

    def mask(self, count: int, rng) -> torch.Tensor:
        """[h, w] bool: MaskingGenerator's mask of `count` patches, in blocks of at least min_mask_patches, at
        most max_mask_share of the patches each."""
        return block_mask(
            self.grid,
            self.grid,
            count,
            self.log_aspect,
            rng,
            min_area=int(self.cfg["params"]["min_mask_patches"]),
            max_area=float(self.cfg["params"]["max_mask_share"]) * self.grid * self.grid,
        )

    def param_groups(self):
        """get_params_groups_with_decay: each student parameter's lr x layer_decay ** (L + 1 - its layer)
        (the heads': 1), x patch_embed_lr_mult in the patch embedding; no weight decay on biases and on
        names with `norm` or `gamma`."""
        num_blocks = len(self.backbone.blocks)
        named = [(n, p, True) for n, p in self.backbone.named_parameters()] + [
            ("mask_token", self.mask_token, True)
        ]
        named += [(n, p, False) for n, p in self.heads.named_parameters()]
        groups: dict[tuple[float, bool], dict] = {}
        for name, param, in_backbone in named:
            layer = vit_layer_id(name, num_blocks) if in_backbone else num_blocks + 1
            scale = self.layer_decay ** (num_blocks + 1 - layer)
            if "patch_embed" in name:
                scale *= self.patch_embed_lr_mult
            decay = not (name.endswith(".bias") or "norm" in name or "gamma" in name)
            group = groups.setdefault((scale, decay), {"params": [], "lr_scale": scale})
            if not decay:
                group["weight_decay"] = 0.0
            group["params"].append(param)
        return list(groups.values())

    def encoder(self):
        return self.teacher[0]

    def projection_head(self):
        """The teacher's class-token head, on the teacher backbone that encoder() evaluates."""
        return self.teacher[1].mlp

    @torch.no_grad()
    def health(self, forward_train_set):
        """The teacher's sharpened class-token output on the train split (the monitors'), centred by the
        running centre (zero under Sinkhorn-Knopp, whose targets need a batch): its mean entropy and how many
        of its K outputs the images' argmaxes use (a Matryoshka head's: its widest level's)."""

        def teacher(x):
            return levels(self.teacher[1](self.teacher[0](x)))[-1]

        mean_entropy, usage = distribution_health(
            forward_train_set,
            lambda x: F.softmax((teacher(x).float() - self.center) / self.teacher_temp, dim=-1),
            self.center.shape[1],
        )
        return {"teacher_entropy": mean_entropy, "teacher_usage": usage}

    def momentum_pairs(self):
        return [([self.backbone, *self.heads], self.teacher)]

    def on_epoch_start(self, ctx):
        self.teacher_temp = self.teacher_temperature(ctx.step, ctx.steps_per_epoch)
        ctx.log["teacher_temp"] = self.teacher_temp

    def on_before_step(self, ctx):
        if self.clip_grad > 0:  # train.py: each student module's total gradient norm at most clip_grad
            torch.nn.utils.clip_grad_norm_([*self.backbone.parameters(), self.mask_token], self.clip_grad)
            for module in self.heads:
                torch.nn.utils.clip_grad_norm_(module.parameters(), self.clip_grad)
        if ctx.epoch < self.freeze_last_layer:  # the last layers' lr is 0 in the first epoch
            for module in self.heads:
                for p in module.last_layer.parameters():
                    p.grad = None

    def on_step_end(self, ctx):
        self.teacher_temp = self.teacher_temperature(ctx.step, ctx.steps_per_epoch)
