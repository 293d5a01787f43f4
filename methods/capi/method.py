"""CAPI (Darcet, Baldassarre, Oquab, Mairal, Bojanowski, 2025): masked patches predicted as the clusters a
teacher's online clustering puts them in. Loss and clustering are positionwise; the encoder sees the
visible patches only, a cross-attention decoder reads them at the masked positions.

    teacher = EMA(encoder); clustering = a linear layer on the teacher's L2-normed patch tokens
    for x in loader:
        masked = inverse block: 65 % of the patches hidden, all but one rolled rectangle
        t = teacher(x)                                  # every patch, no gradient
        c = clustering(normalize(t))                    # [B, L, K]
        q = sinkhorn_knopp(c / tau_t), at each position over the batch's images, no gradient
        clustering_loss = H(q, softmax(c / tau_c))      # trains the clustering layer alone
        z = encoder(x[visible])
        p = head(decoder(mask tokens at the masked positions, cross-attending z))
        loss = H(q[masked], softmax(p / tau_s)) + clustering_loss
        AdamW step; teacher = m teacher + (1 - m) encoder

facebookresearch/capi @ 98b4fa1: train_capi.py (do_teacher, do_student, the loop), model.py
(EncoderDecoder, L2NormLinear, OnlineClustering, sinkhorn_knopp), data.py (InverseBlockMasking,
collate_data_and_cast), utils.py (get_params_groups, WarmupThenCosine), default_pretrain_config.yaml.
The encoder is the backbone's own modules; the evaluated encoder is the teacher (the config's ``full``
evaluation reads ``student_ema``), its patch tokens averaged.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import balanced_assignment
from sslbench.kit.losses import soft_cross_entropy
from sslbench.kit.method import Method
from sslbench.kit.momentum import frozen_copy
from sslbench.kit.vit import (
    check_masked_vit,
    encode_kept,
    fix_sincos_positions,
    inverse_block_mask,
    keep_patches,
    masked_tokens,
    shared_rng,
    sincos_pos_embed,
)

CONFIG = "methods/capi/config.yaml"
NORM_EPS = 1e-5  # EncoderDecoder's norm_layer_kwargs
EXP_SHIFT = 50.0  # model.py's exp_max_values in float32: every column's largest entry becomes exp(50)


@torch.no_grad()
def positionwise_sinkhorn(logits: torch.Tensor, temperature: float, iterations: int) -> torch.Tensor:
    """model.py's sinkhorn_knopp with positionwise_sk: logits [B, L, K] -> assignments [B, L, K], each
    row summing to 1. At every position l, exp(logits[:, l] / temperature) is balanced over every rank's
    images: each cluster's column normalised over the images, then each image's row over the clusters,
    ``iterations`` times. Before the exp each column is shifted so that its largest entry over every rank
    is EXP_SHIFT (stable_exp); the column normalisation removes the shift."""
    scaled = logits.detach().float().transpose(0, 1) / temperature  # [L, B, K]
    shift = dist.all_reduce_max(scaled.max(dim=1, keepdim=True).values)
    return balanced_assignment((scaled - shift + EXP_SHIFT).exp(), iterations).transpose(0, 1)


class OnlineClustering(nn.Module):
    """model.py's OnlineClustering: a linear layer (weights N(0, 1), bias 0) on L2-normed tokens. It
    returns the Sinkhorn-Knopp assignments of its logits at ``target_temp`` (the targets) and the cross
    entropy between them and its own softmax at ``pred_temp``, which alone trains it."""

    def __init__(self, dim, clusters, bias, target_temp, pred_temp, iterations):
        super().__init__()
        self.layer = nn.Linear(dim, clusters, bias=bias)
        nn.init.normal_(self.layer.weight, std=1.0)
        if bias:
            nn.init.zeros_(self.layer.bias)
        self.target_temp, self.pred_temp, self.iterations = target_temp, pred_temp, iterations

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.layer(F.normalize(tokens.detach(), dim=-1, eps=1e-7))
        targets = positionwise_sinkhorn(logits, self.target_temp, self.iterations)
        return targets, soft_cross_entropy(targets, logits, self.pred_temp)


class CrossAttentionBlock(nn.Module):
    """model.py's decoder Block: pre-norm (RMSNorm) cross-attention from the queries to the context, then
    a GELU MLP (x4), each residual; no biases. The queries never attend to each other."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.RMSNorm(dim, eps=NORM_EPS)
        self.q_proj, self.k_proj, self.v_proj, self.proj = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.norm2 = nn.RMSNorm(dim, eps=NORM_EPS)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim, bias=False), nn.GELU(), nn.Linear(4 * dim, dim, bias=False)
        )

    def attend(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        (n, q_len, d), k_len, h = x.shape, context.shape[1], self.heads
        q = self.q_proj(x).reshape(n, q_len, h, d // h).transpose(1, 2)
        k = self.k_proj(context).reshape(n, k_len, h, d // h).transpose(1, 2)
        v = self.v_proj(context).reshape(n, k_len, h, d // h).transpose(1, 2)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, q_len, d))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.norm1(x), context)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """EncoderDecoder's decoder: a learned mask token plus each predicted patch's position, blocks that
    cross-attend to the encoder's output, a final RMSNorm without affine. Linears: Xavier-uniform."""

    def __init__(self, grid: tuple[int, int], dim: int, depth: int, heads: int):
        super().__init__()
        self.mask_token = nn.Parameter(torch.empty(1, 1, dim))
        nn.init.normal_(self.mask_token, std=0.02)
        self.register_buffer("pos_embed", sincos_pos_embed(dim, grid, cls_token=False)[None])
        self.blocks = nn.ModuleList(CrossAttentionBlock(dim, heads) for _ in range(depth))
        self.out_norm = nn.RMSNorm(dim, eps=NORM_EPS, elementwise_affine=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)

    def forward(self, context: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        positions = self.pos_embed.expand(len(context), -1, -1)
        x = self.mask_token + keep_patches(positions, [predicted])
        for block in self.blocks:
            x = block(x, context)
        return self.out_norm(x)


class L2NormLinear(nn.Module):
    """model.py's L2NormLinear: L2-normalise, then a weight-normalised Linear without bias (direction
    trunc_normal 0.02, norms filled with 1 and trained)."""

    def __init__(self, dim: int, clusters: int):
        super().__init__()
        layer = nn.Linear(dim, clusters, bias=False)
        nn.init.trunc_normal_(layer.weight, std=0.02)
        self.last_layer = weight_norm(layer)
        with torch.no_grad():
            self.last_layer.parametrizations.weight.original0.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(x, dim=-1))


class CAPI(Method):
    num_views = 1  # one crop per image, masked

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        patch = check_masked_vit(backbone, cfg, info, "CAPI", class_token=False)
        self.grid = (info.image_size // patch, info.image_size // patch)
        patches = self.grid[0] * self.grid[1]
        self.num_masked = int(patches * p["mask_ratio"])  # collate_data_and_cast
        self.num_predicted = int(self.num_masked * p["prediction_subsampling"])
        if not 0 < self.num_masked < patches or self.num_predicted < 1:
            raise ConfigError(
                f"{CONFIG}: mask_ratio {p['mask_ratio']} of this {self.grid[0]} x {self.grid[1]} grid masks "
                f"{self.num_masked} patches, and prediction_subsampling {p['prediction_subsampling']} "
                f"predicts {self.num_predicted} of them; mask at least one patch, leave one visible and "
                "predict one"
            )
        self.log_aspect = (math.log(p["mask_min_aspect"]), -math.log(p["mask_min_aspect"]))
        self.roll = bool(p["roll"])
        self.student_temp = p["student_temp"]
        heads = backbone.blocks[0].attn.num_heads
        fix_sincos_positions(backbone)  # DEVIATION (README): RoPE there, its frequencies never trained
        self.decoder = Decoder(self.grid, self.feature_dim, p["decoder_depth"], heads)
        self.head = L2NormLinear(self.feature_dim, p["num_clusters"])
        self.clustering = OnlineClustering(
            self.feature_dim,
            p["num_clusters"],
            p["clustering_bias"],
            p["target_temp"],
            p["pred_temp"],
            p["sinkhorn_iterations"],
        )
        self.target_encoder = frozen_copy([self.backbone])

    @torch.no_grad()
    def draw_masks(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(visible [B, L - M], predicted [B, P]) patch indices of this rank's images: an inverse block of M
        masked patches per image, P of them drawn to be predicted (collate_data_and_cast), the whole batch's
        drawn from rank 0's seed so that 2 processes compute what one does (the official loader draws each
        rank's)."""
        rng = shared_rng(device)
        everyone = batch * dist.world_size()
        h, w = self.grid
        masks = torch.stack(
            [
                inverse_block_mask(h, w, self.num_masked, self.log_aspect, rng, self.roll).flatten()
                for _ in range(everyone)
            ]
        )
        masked = masks.nonzero()[:, 1].reshape(everyone, self.num_masked)
        chosen = torch.tensor(
            [rng.sample(range(self.num_masked), self.num_predicted) for _ in range(everyone)]
        )
        predicted = masked.gather(1, chosen)
        visible = (~masks).nonzero()[:, 1].reshape(everyone, -1)
        mine = dist.shard(everyone)
        return visible[mine].to(device), predicted[mine].to(device)

    def training_loss(self, views, labels, indices):
        images = views[0]
        visible, predicted = self.draw_masks(images.shape[0], images.device)
        with torch.no_grad():  # do_teacher: the teacher sees every patch
            tokens = masked_tokens(self.target_encoder[0], images)
        targets, clustering_loss = self.clustering(tokens)
        prediction = self.head(self.decoder(encode_kept(self.backbone, images, [visible]), predicted))
        return (
            soft_cross_entropy(keep_patches(targets, [predicted]), prediction, self.student_temp)
            + clustering_loss
        )

    def param_groups(self):
        """get_params_groups over the student (encoder, decoder, head): no weight decay on biases, 0.1 of it
        on norm weights, 0.2 of the lr in the patch embedding. The clustering layer: the lr of its own
        AdamW, whose schedule has the student's shape, and torch's default weight decay 0.01 on all of it."""
        p, decay = self.cfg["params"], self.cfg["train"]["weight_decay"]
        student = [(f"backbone.{n}", q) for n, q in self.backbone.named_parameters() if q.requires_grad]
        student += [(f"decoder.{n}", q) for n, q in self.decoder.named_parameters()]
        student += [(f"head.{n}", q) for n, q in self.head.named_parameters()]
        groups: dict[tuple[float, float], dict] = {}
        for name, param in student:
            lr_scale = p["patch_embed_lr_mult"] if "patch_embed" in name else 1.0
            wd = decay
            if name.endswith(".bias") or "gamma" in name:
                wd = 0.0
            if "norm" in name and "weight" in name:
                wd = decay * p["norm_wd_mult"]
            groups.setdefault((lr_scale, wd), {"params": [], "lr_scale": lr_scale, "weight_decay": wd})
            groups[(lr_scale, wd)]["params"].append(param)
        clustering = {
            "params": list(self.clustering.parameters()),
            "lr_scale": p["clustering_lr_scale"],
            "weight_decay": p["clustering_weight_decay"],
        }
        return [*groups.values(), clustering]

    def encoder(self):
        return self.target_encoder[0]

    def momentum_pairs(self):
        return [([self.backbone], self.target_encoder)]
