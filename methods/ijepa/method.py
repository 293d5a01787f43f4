"""I-JEPA (Assran et al., CVPR 2023): a context block of the image predicts, in representation space, the
target encoder's representations of four other blocks. No augmentations beyond the crop; no class token.

    target_encoder = copy(encoder), no gradient; predictor = a narrow ViT
    for x in loader:
        ctx, tgt = multi-block masks: 4 target blocks (15-20 % of the patches each, aspect 0.75-1.5), one
                   context block (85-100 %, square) without the targets' patches
        h = layer_norm(target_encoder(x))[tgt]   # every patch encoded, the targets' taken; no affine
        z = encoder(x[ctx])                      # the context's patches only, with their positions
        p = predictor(z, ctx, tgt)               # z + the targets' mask tokens (+ positions) -> the targets
        loss = smooth_l1(p, h)                   # the mean over every target patch and channel
        AdamW step; target_encoder = m target_encoder + (1 - m) encoder     # m linear from 0.996 to 1

facebookresearch/ijepa src/train.py (the step, the schedules), src/masks/multiblock.py (MaskCollator),
src/models/vision_transformer.py (VisionTransformer, VisionTransformerPredictor), src/helper.py (init_opt)
and configs/in1k_vith14_ep300.yaml. The encoder is the backbone's own modules, its fixed sin-cos positions as
there; the evaluated encoder is the target encoder, its patch tokens averaged (the paper's linear probe).
"""

from functools import partial

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.vision_transformer import Block
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.method import Method, exclude_bias_and_norm
from sslbench.kit.momentum import frozen_copy
from sslbench.kit.vit import (
    check_masked_vit,
    encode_kept,
    fix_sincos_positions,
    keep_patches,
    masked_tokens,
    multiblock_block_size,
    multiblock_masks,
    shared_rng,
    sincos_pos_embed,
)

CONFIG = "methods/ijepa/config.yaml"
LN_EPS = 1e-6  # vision_transformer.py: norm_layer=partial(nn.LayerNorm, eps=1e-6)


def repeat_interleave_batch(x: torch.Tensor, batch: int, repeat: int) -> torch.Tensor:
    """src/utils/tensors.py: ``x`` is chunks of ``batch`` rows; each chunk ``repeat`` times, in place."""
    return x.reshape(-1, batch, *x.shape[1:]).repeat_interleave(repeat, dim=0).flatten(0, 1)


class Predictor(nn.Module):
    """VisionTransformerPredictor: the context tokens mapped to the predictor's width plus their positions, a
    mask token plus its position for every target patch, ViT blocks over both, and the targets' outputs mapped
    back to the encoder's width. Positions: the fixed sin-cos table of the patch grid."""

    def __init__(self, grid: tuple[int, int], dim: int, width: int, depth: int, heads: int):
        super().__init__()
        self.embed = nn.Linear(dim, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        self.register_buffer("pos_embed", sincos_pos_embed(width, grid, cls_token=False)[None])
        norm = partial(nn.LayerNorm, eps=LN_EPS)
        self.blocks = nn.Sequential(
            *(Block(width, heads, mlp_ratio=4.0, qkv_bias=True, norm_layer=norm) for _ in range(depth))
        )
        self.norm = norm(width)
        self.proj = nn.Linear(width, dim)
        trunc_normal_(self.mask_token, std=0.02)
        for module in self.modules():  # _init_weights: trunc_normal 0.02 Linears, zero bias; LayerNorm 1, 0
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        # fix_init_weight: each block's output projections / sqrt(2 x its layer, from 1)
        with torch.no_grad():
            for layer, block in enumerate(self.blocks, start=1):
                block.attn.proj.weight.div_((2.0 * layer) ** 0.5)
                block.mlp.fc2.weight.div_((2.0 * layer) ** 0.5)

    def forward(self, z: torch.Tensor, context: list[torch.Tensor], targets: list[torch.Tensor]):
        """[len(targets) len(context) B, Kp, dim]: each (target mask, context mask, image)'s prediction of the
        target's patches, from z [len(context) B, Kc, dim], the context masks' encoded patches."""
        batch = len(z) // len(context)
        positions = self.pos_embed.expand(batch, -1, -1)
        x = self.embed(z) + keep_patches(positions, context)
        target_positions = repeat_interleave_batch(keep_patches(positions, targets), batch, len(context))
        x = torch.cat([x.repeat(len(targets), 1, 1), self.mask_token + target_positions], dim=1)
        x = self.norm(self.blocks(x))
        return self.proj(x[:, z.shape[1] :])


class IJEPA(Method):
    num_views = 1  # make_transforms: one crop per image, from which every block is cut

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        patch = check_masked_vit(backbone, cfg, info, "I-JEPA", class_token=False)
        self.grid = (info.image_size // patch, info.image_size // patch)
        heads = backbone.blocks[0].attn.num_heads  # init_model: the predictor has the encoder's heads
        if p["pred_dim"] % heads or p["pred_dim"] % 4:
            raise ConfigError(
                f"{CONFIG}: pred_dim {p['pred_dim']} must be divisible by the encoder's {heads} heads and by "
                "4 (the sin-cos table's four parts)"
            )
        self.masks = {
            "pred_scale": tuple(p["pred_mask_scale"]),
            "enc_scale": tuple(p["enc_mask_scale"]),
            "aspect": tuple(p["aspect_ratio"]),
            "npred": int(p["num_pred_masks"]),
            "nenc": int(p["num_enc_masks"]),
            "min_keep": int(p["min_keep"]),
            "allow_overlap": bool(p["allow_overlap"]),
        }
        self.check_target_blocks()
        fix_sincos_positions(backbone)  # vision_transformer.py: the encoder's positions, never trained
        self.predictor = Predictor(self.grid, self.feature_dim, p["pred_dim"], p["pred_depth"], heads)
        self.target_encoder = frozen_copy([self.backbone])

    def check_target_blocks(self):
        """A target block of fewer than min_keep + 1 patches is never accepted (the official collator then
        loops for ever): refuse the settings before any step."""
        m = self.masks
        for u in (0.0, 1.0):
            h, w = multiblock_block_size(u, self.grid, m["pred_scale"], m["aspect"])
            if h * w <= m["min_keep"]:
                raise ConfigError(
                    f"{CONFIG}: a target block of pred_mask_scale {list(m['pred_scale'])} on this "
                    f"{self.grid[0]} x {self.grid[1]} grid of patches is {h} x {w}, not more than min_keep "
                    f"{m['min_keep']}; lower min_keep, raise pred_mask_scale or use smaller patches"
                )

    @torch.no_grad()
    def draw_masks(self, batch: int, device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """MaskCollator's (context, target) masks of this rank's images: the whole batch's, cut to the
        shortest mask of the whole batch, from rank 0's seed, so that 2 processes compute what one computes on
        the whole batch (the official collator draws and cuts each rank's)."""
        everyone = batch * dist.world_size()
        context, targets = multiblock_masks(everyone, self.grid, shared_rng(device), **self.masks)
        mine = dist.shard(everyone)
        return [m[mine].to(device) for m in context], [m[mine].to(device) for m in targets]

    def training_loss(self, views, labels, indices):
        images = views[0]
        context, targets = self.draw_masks(images.shape[0], images.device)
        with torch.no_grad():  # forward_target
            h = masked_tokens(self.target_encoder[0], images)
            h = F.layer_norm(h.float(), h.shape[-1:])  # over the channels, no affine
            h = repeat_interleave_batch(keep_patches(h, targets), images.shape[0], len(context))
        z = self.predictor(encode_kept(self.backbone, images, context), context, targets)
        return F.smooth_l1_loss(z.float(), h)

    def param_groups(self):
        # init_opt: no weight decay on biases and 1-D tensors (encoder and predictor); the fixed positions
        # take no gradient
        return exclude_bias_and_norm(nn.ModuleList([self.backbone, self.predictor]))

    def encoder(self):
        return self.target_encoder[0]

    def momentum_pairs(self):
        return [([self.backbone], self.target_encoder)]
