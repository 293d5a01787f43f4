"""A timm Vision Transformer as the masked-image methods (MAE, SimMIM, MSN, iBOT, DINOv2) run it: the checks
that it can be masked, its class token and position embeddings added to patch tokens, every token with masked
patches replaced by a mask token (SimMIM, iBOT, DINOv2), the random draw of a whole batch's masks, SimMIM's
mask of random units of patches, BEiT's block-wise mask (iBOT) and DINOv2's draw of them over a batch, and
the layer of each parameter that layer-wise lr decay scales (MAE's fine-tuning, DINOv2's pretraining).

The encoder trained is the backbone's own modules (patch_embed, the positions, norm_pre, blocks, norm), so
that the network trained is the network evaluated.
"""

from __future__ import annotations

import math
import random

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError


def check_masked_vit(backbone: nn.Module, cfg: dict, info, method: str) -> int:
    """The backbone must be a timm ViT ``method`` can mask: refuse anything else, naming the key to change.
    Returns its patch size."""
    name = cfg["backbone"]["name"]
    if not isinstance(backbone, VisionTransformer):
        raise ConfigError(
            f"{method} masks the patches of a Vision Transformer, but `backbone.name` = {name!r} builds a "
            f"{type(backbone).__name__}. Set `backbone.name` to a timm vision_transformer model (for the "
            "16-px default e.g. `backbone: {name: vit_tiny_patch16_224, args: {patch_size: 4, depth: 4}}`), "
            f"or leave {method.lower()} out of `methods`."
        )
    pool = getattr(backbone, "global_pool", "token")
    if backbone.cls_token is None or backbone.num_prefix_tokens != 1 or pool != "token":
        raise ConfigError(
            f"{method}'s encoder has one class token, read after the final norm: `backbone.name` = {name!r} "
            f"with `backbone.args` {cfg['backbone'].get('args') or {}} has class token "
            f"{backbone.cls_token is not None}, {backbone.num_prefix_tokens} prefix tokens and global_pool "
            f"{pool!r}. Keep timm's defaults (class_token true, reg_tokens 0, global_pool 'token')."
        )
    if backbone.pos_embed is None or not isinstance(backbone.patch_drop, nn.Identity):
        raise ConfigError(
            f"{method} needs the ViT's position embeddings and does its own masking: `backbone.args` must "
            f"not set pos_embed 'none' or patch_drop_rate > 0 (got {cfg['backbone'].get('args') or {}})."
        )
    ph, pw = backbone.patch_embed.patch_size
    if ph != pw or info.image_size % ph:
        raise ConfigError(
            f"{method} reconstructs square patches that tile the image: `backbone.args.patch_size` "
            f"{(ph, pw)} must be square and divide the dataset's image size {info.image_size}."
        )
    if backbone.patch_embed.proj.in_channels != info.channels:
        raise ConfigError(
            f"`backbone.name` = {name!r} takes {backbone.patch_embed.proj.in_channels} channels, the "
            f"images have {info.channels}"
        )
    return ph


def with_positions(vit: VisionTransformer, patches: torch.Tensor) -> torch.Tensor:
    """[N, 1 + L, D]: the class token (plus its position) before the patch tokens [N, L, D] plus theirs, as
    the ViT's own forward adds them (timm's ``_pos_embed``)."""
    return vit._pos_embed(patches)


def masked_tokens(
    vit: VisionTransformer, images: torch.Tensor, mask: torch.Tensor | None = None, mask_token=None
) -> torch.Tensor:
    """[N, 1 + L, D]: every token after the ViT's final norm, the class token first; where ``mask`` [N, h, w]
    (1 = masked, row-major patches) is given, the masked patches' embeddings are replaced by ``mask_token``
    [1, 1, D] before the class token and the positions are added (SimMIM's VisionTransformerForSimMIM,
    iBOT's mask_model)."""
    x = vit.patch_embed(images)  # [N, L, D], or [N, h, w, D] where the ViT resamples its positions
    if mask is not None:
        w = mask.reshape(*x.shape[:-1], 1).to(x.dtype)  # the patches in row-major order either way
        x = x * (1 - w) + mask_token.to(x.dtype) * w
    return vit.norm(vit.blocks(vit.norm_pre(with_positions(vit, x))))


@torch.no_grad()
def batch_draw(batch: int, length: int, device) -> torch.Tensor:
    """[batch, length] uniform noise for this rank's images: rank 0's draw for the whole batch, of which
    this rank takes its rows. The official codes' ranks draw their own (seeded seed + rank): the same
    distribution; here 2 processes compute what one computes on the whole batch. In one process:
    torch.rand(batch, length) from the global RNG the trainer seeds."""
    everyone = torch.rand(batch * dist.world_size(), length, device=device)
    return dist.broadcast(everyone)[dist.rank() * batch : (dist.rank() + 1) * batch]


def random_unit_mask(noise: torch.Tensor, count: int, grid: tuple[int, int], unit: int) -> torch.Tensor:
    """SimMIM's mask (data_simmim.py MaskGenerator): the patch grid [h, w] cut into mask units of unit x unit
    patches, ``count`` units of each image masked at random (those of smallest ``noise`` [N, units], a
    uniform random subset as np.random.permutation(units)[:count] draws it), each unit's patches with it.
    Returns [N, h, w], 1 = masked."""
    h, w = grid
    if h % unit or w % unit:
        raise ValueError(f"mask units of {unit} x {unit} patches do not tile a {h} x {w} grid of patches")
    rows, cols = h // unit, w // unit
    if noise.shape[1] != rows * cols or not 0 <= count <= rows * cols:
        raise ValueError(f"{count} of {rows * cols} units from noise of shape {tuple(noise.shape)}")
    masked = torch.zeros_like(noise)
    masked.scatter_(1, noise.argsort(dim=1)[:, :count], 1.0)
    units = masked.view(-1, rows, cols)
    return units.repeat_interleave(unit, dim=1).repeat_interleave(unit, dim=2)


def block_mask(
    h: int,
    w: int,
    count: float,
    log_aspect: tuple[float, float],
    rng: random.Random,
    min_area: float | None = None,
    max_area: float | None = None,
) -> torch.Tensor:
    """BEiT's block-wise mask (microsoft/unilm beit/masking_generator.py), as iBOT's loader.py and DINOv2's
    masking.py draw it: on an h x w grid of patches, rectangles of area ~ U(min_area, what is left, at most
    ``max_area``) and aspect ratio exp(U(log_aspect)), each strictly inside the grid, are masked until at
    least ``count`` patches are (or ten tries in a row add none). ``min_area`` None: iBOT's
    (min(h, w) // 3)^2; ``max_area`` None: no cap (iBOT's). Returns a bool [h, w], True = masked; ``rng``
    draws every number."""
    if min_area is None:
        min_area = (min(h, w) // 3) ** 2
    mask = torch.zeros(h, w, dtype=torch.bool)
    masked = 0
    while masked < count:
        room, added = count - masked, 0
        if max_area is not None:
            room = min(room, max_area)
        for _ in range(10):
            area = rng.uniform(min_area, room)
            aspect = math.exp(rng.uniform(*log_aspect))
            bh, bw = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if bw < w and bh < h:
                top, left = rng.randint(0, h - bh), rng.randint(0, w - bw)
                block = mask[top : top + bh, left : left + bw]
                new = bh * bw - int(block.sum())
                if 0 < new <= room:
                    block.fill_(True)
                    added += new
            if added > 0:
                break
        if added == 0:
            break
        masked += added
    return mask


def mask_share_draws(
    num_masks: int, probability: float, ratio_range: tuple[float, float], rng
) -> list[float]:
    """DINOv2's shares of the patches to mask for ``num_masks`` images (collate.py collate_data_and_cast):
    int(num_masks x probability) of them are masked, the i-th with a share uniform in the i-th of as many
    equal bins of ``ratio_range``, the others not at all (share 0), then the list is shuffled. ``rng``
    (random.Random) draws every number."""
    masked = int(num_masks * probability)
    low, high = ratio_range
    edges = [low + (high - low) * i / masked for i in range(masked + 1)] if masked else []
    shares = [rng.uniform(edges[i], edges[i + 1]) for i in range(masked)] + [0.0] * (num_masks - masked)
    rng.shuffle(shares)
    return shares


def vit_layer_id(name: str, num_blocks: int) -> int:
    """The layer of a timm ViT parameter named ``name`` (MAE's util/lr_decay.py get_layer_id_for_vit, DINOv2's
    utils/param_groups.py get_vit_lr_decay_rate): 0 for the embeddings (class token, positions, patch
    embedding, DINOv2's mask token), i + 1 for block i, ``num_blocks`` + 1 for what follows the blocks.
    Layer-wise lr decay scales a parameter's lr by decay ** (num_blocks + 1 - layer)."""
    if name in ("cls_token", "pos_embed", "reg_token", "mask_token") or name.startswith("patch_embed"):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return num_blocks + 1
