"""MSN (Assran, Caron, Misra, Bojanowski, Bordes, Vincent, Joulin, Rabbat, Ballas, ECCV 2022): masked
siamese networks. An anchor view with some of its patches dropped is matched, through soft assignments to
learnable prototypes, to the assignment of an unmasked target view by a momentum encoder.

    f = head(vit); f_t = copy(f), no gradient; P = K prototypes
    for x in loader:
        keep = a random subset of floor(L (1 - drop)) patches, one for the whole batch
        z = [f(x_1 with only `keep`), f(focal crops)]         # the anchors: every view but the target
        h = f_t(x_0)                                          # the target view, every patch
        p = softmax(cos(z, P) / tau)                          # the anchors' assignments
        q = sinkhorn(sharpen(softmax(cos(h, P) / tau), T))    # the targets, p^(1/T) renormalised
        loss = mean over anchors of H(q, p) - H(mean of p) + log K      # + me-max; H(p) x ent_weight
        clip the encoder's gradient norm; AdamW step; f_t = m f_t + (1 - m) f, m linear from 0.996 to 1

facebookresearch/msn src/msn_train.py (main, init_model, init_opt), src/losses.py (init_msn_loss,
distributed_sinkhorn), src/deit.py (forward, forward_features: the patch drop), src/data_manager.py
(make_transforms). The evaluated encoder is the target's backbone, as linear_eval.py reads the
checkpoint's `target_encoder`.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import balanced_assignment
from sslbench.kit.health import distribution_health
from sslbench.kit.losses import me_max
from sslbench.kit.method import Method, embed_crops
from sslbench.kit.momentum import frozen_copy
from sslbench.kit.vit import check_masked_vit, with_positions

CONFIG = "methods/msn/config.yaml"


def msn_head(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """init_model's projection head: Linear-BN-GELU, Linear-BN-GELU, Linear (use_bn), every Linear
    trunc_normal(std 0.02) with zero bias."""
    head = nn.Sequential(
        nn.Linear(in_dim, hidden_dim),
        nn.BatchNorm1d(hidden_dim),
        nn.GELU(),
        nn.Linear(hidden_dim, hidden_dim),
        nn.BatchNorm1d(hidden_dim),
        nn.GELU(),
        nn.Linear(hidden_dim, out_dim),
    )
    for layer in head:
        if isinstance(layer, nn.Linear):
            nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
    return head


def kept_count(patches: int, patch_drop: float) -> int:
    """forward_features: floor(L x (1 - patch_drop)) of an image's L patches are kept."""
    return math.floor(patches * (1.0 - patch_drop))


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    """losses.py sharpen: each row raised to 1 / T and renormalised."""
    sharp = p ** (1.0 / temperature)
    return sharp / sharp.sum(dim=1, keepdim=True)


def msn_loss(
    anchor_probs: torch.Tensor, targets: torch.Tensor, me_max_weight: float, ent_weight: float
) -> torch.Tensor:
    """init_msn_loss's loss: the cross-entropy H(targets, anchor_probs) averaged over the anchors (rows
    [V x B, K], view-major, each view's targets the same [B, K]), plus me_max_weight x (log K - H(mean
    anchor assignment)) (me-max: 0 when the batch uses every prototype equally), plus ent_weight x the
    anchors' mean entropy. The mean assignment is over every rank's anchors (the rows are gathered)."""
    views = anchor_probs.shape[0] // targets.shape[0]
    targets = torch.cat([targets] * views)
    loss = -(targets * torch.log(anchor_probs)).sum(dim=1).mean()
    if me_max_weight:
        loss = loss + me_max_weight * me_max(dist.gather_with_grad(anchor_probs))
    if ent_weight:
        loss = loss + ent_weight * -(anchor_probs * torch.log(anchor_probs)).sum(dim=1).mean()
    return loss


class MSN(Method):
    num_views = 2  # make_transforms' two random views: the target's (first), then the masked anchor
    multi_crop = True  # the focal views, anchors too, after them

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        patch = check_masked_vit(backbone, cfg, info, "MSN")
        self.patch_drop = float(p["patch_drop"])
        patches = (info.image_size // patch) ** 2
        if kept_count(patches, self.patch_drop) < 1:
            raise ConfigError(
                f"{CONFIG}: patch_drop {p['patch_drop']} keeps no patch of the {patches} of an anchor view; "
                "it must keep at least one"
            )
        self.head = msn_head(self.feature_dim, p["hidden_dim"], p["output_dim"])
        self.target = frozen_copy([self.backbone, self.head])  # starts as the anchor encoder, moved by EMA
        bound = float(p["output_dim"]) ** -0.5
        self.prototypes = nn.Parameter(torch.empty(p["num_proto"], p["output_dim"]).uniform_(-bound, bound))
        self.temperature, self.sharpen_temperature = float(p["temperature"]), float(p["sharpen_temperature"])
        self.use_sinkhorn, self.sinkhorn_iterations = bool(p["use_sinkhorn"]), 3  # distributed_sinkhorn's
        self.me_max_weight, self.ent_weight = float(p["me_max_weight"]), float(p["ent_weight"])
        self.clip_grad = float(p["clip_grad"])

    def assign(self, z: torch.Tensor) -> torch.Tensor:
        """losses.py snn with one-hot prototype labels: softmax of the cosines to the prototypes / tau."""
        cosines = F.normalize(z.float(), dim=1) @ F.normalize(self.prototypes.float(), dim=1).T
        return F.softmax(cosines / self.temperature, dim=1)

    def training_loss(self, views, labels, indices):
        with torch.no_grad():
            targets = sharpen(self.assign(self.target(views[0])), self.sharpen_temperature)
            if self.use_sinkhorn:
                targets = balanced_assignment(targets, self.sinkhorn_iterations)
        anchors = [self.head(self.masked_forward(views[1]))]
        if len(views) > 2:  # focal views: every patch (forward's patch_drop is 0 after its first group)
            anchors += embed_crops(lambda x: self.head(self.backbone(x)), views[2:])
        return msn_loss(self.assign(torch.cat(anchors)), targets, self.me_max_weight, self.ent_weight)

    def masked_forward(self, images: torch.Tensor) -> torch.Tensor:
        """forward_features with patch_drop: the ViT's class token after its final norm, from the class token
        and a random subset of the patch tokens (positions added), one subset for the whole batch
        (randperm(L)[:keep]). Under DDP rank 0's draw, so that 2 processes compute what one computes on the
        whole batch; the official ranks draw their own."""
        vit = self.backbone
        x = with_positions(vit, vit.patch_embed(images))  # [N, 1 + L, D]
        length = x.shape[1] - 1
        noise = dist.broadcast(torch.rand(1, length, device=x.device))
        kept = noise[0].argsort()[: kept_count(length, self.patch_drop)]
        x = torch.cat([x[:, :1], x[:, 1 + kept]], dim=1)
        return vit.norm(vit.blocks(vit.norm_pre(x)))[:, 0]

    def param_groups(self):
        # init_opt: no weight decay on biases, 1-D tensors (norms) and the prototypes
        params = [p for m in (self.backbone, self.head) for p in m.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.ndim > 1]},
            {"params": [p for p in params if p.ndim <= 1] + [self.prototypes], "weight_decay": 0.0},
        ]

    def momentum_pairs(self):
        return [([self.backbone, self.head], self.target)]

    def encoder(self):
        return self.target[0]

    def projection_head(self):
        return self.target[1]

    def on_before_step(self, ctx):  # clip_grad_norm_(encoder.parameters(), clip_grad): not the prototypes
        if self.clip_grad > 0:
            nn.utils.clip_grad_norm_([*self.backbone.parameters(), *self.head.parameters()], self.clip_grad)

    @torch.no_grad()
    def health(self, forward_train_set):
        """The target's sharpened assignments on the train split (the monitors'): their mean entropy (log K
        when they collapse to uniform) and how many of the K prototypes the images' argmaxes use (the
        official log's `np`, 1 when every image goes to one)."""

        mean_entropy, usage = distribution_health(
            forward_train_set,
            lambda x: sharpen(self.assign(self.target(x)), self.sharpen_temperature),
            self.prototypes.shape[0],
        )
        return {"target_entropy": mean_entropy, "prototype_usage": usage}
