"""A timm Vision Transformer as the masked-image methods (MAE, SimMIM, MSN, iBOT, DINOv2, I-JEPA, Franca,
CAPI) the checks that it can be masked, the fixed 2-D sin-cos position table (MAE, I-JEPA), its class token
and position embeddings added to patch tokens, every token with masked patches replaced by a mask token
(SimMIM, iBOT, DINOv2), the tokens of some patches kept by index and encoded alone (I-JEPA, CAPI), the
random draws every rank makes alike (a whole batch's noise, a seeded generator), SimMIM's mask of random
units of patches, BEiT's block-wise mask (iBOT) and DINOv2's draw of them over a batch, Franca's rolled
inverse blocks, I-JEPA's multi-block context and target masks, and the layer of each parameter that layer-
wise lr decay scales (MAE's fine-tuning, DINOv2's pretraining).

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


def check_masked_vit(backbone: nn.Module, cfg: dict, info, method: str, class_token: bool = True) -> int:
    """The backbone must be a timm ViT ``method`` can mask: refuse anything else, naming the key to change.
    ``class_token``: the encoder has one class token, read after the final norm (timm's defaults); false: it
    has none, and its features are the mean of its patch tokens, each after the final norm (I-JEPA's). Returns
    its patch size."""
    name = cfg["backbone"]["name"]
    if not isinstance(backbone, VisionTransformer):
        raise ConfigError(
            f"{method} masks the patches of a Vision Transformer, but `backbone.name` = {name!r} builds a "
            f"{type(backbone).__name__}. Set `backbone.name` to a timm vision_transformer model (for the "
            "16-px default e.g. `backbone: {name: vit_tiny_patch16_224, args: {patch_size: 4, depth: 4}}`), "
            f"or leave {method.lower()} out of `methods`."
        )
    pool = getattr(backbone, "global_pool", "token")
    args = cfg["backbone"].get("args") or {}
    found = (
        f"`backbone.name` = {name!r} with `backbone.args` {args} has class token "
        f"{backbone.cls_token is not None}, {backbone.num_prefix_tokens} prefix tokens and global_pool "
        f"{pool!r}"
    )
    if class_token and (backbone.cls_token is None or backbone.num_prefix_tokens != 1 or pool != "token"):
        raise ConfigError(
            f"{method}'s encoder has one class token, read after the final norm: {found}. Keep timm's "
            "defaults (class_token true, reg_tokens 0, global_pool 'token')."
        )
    if not class_token and (
        backbone.num_prefix_tokens != 0 or pool != "avg" or not isinstance(backbone.fc_norm, nn.Identity)
    ):
        raise ConfigError(
            f"{method}'s encoder has no class token; its features are the mean of its patch tokens, each "
            f"after the final norm: {found}. Set `backbone.args` class_token false, global_pool 'avg' and "
            "fc_norm false, reg_tokens 0."
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


def sincos_pos_embed(dim: int, grid: tuple[int, int], cls_token: bool) -> torch.Tensor:
    """[(1 +) h w, dim]: the fixed 2-D sin-cos position embedding of MAE's util/pos_embed.py and I-JEPA's
    vision_transformer.py (get_2d_sincos_pos_embed) for a grid of h rows and w columns, patches in row-major
    order: the first half of the channels encodes a patch's column, the second half its row
    (np.meshgrid(grid_w, grid_h) stacked: grid[0] is the column), each half [sin(pos omega), cos(pos omega)]
    with omega_i = 1 / 10000^(i / (dim / 4)); with ``cls_token``, a first row of zeros."""
    if dim % 4:
        raise ValueError(f"a 2-D sin-cos position embedding needs a width divisible by 4, got {dim}")
    h, w = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )

    def one_axis(pos):
        angles = pos.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    table = torch.cat([one_axis(cols), one_axis(rows)], dim=1)
    if cls_token:
        table = torch.cat([torch.zeros(1, dim, dtype=table.dtype), table])
    return table.float()


def fix_sincos_positions(vit: VisionTransformer) -> None:
    """The ViT's position embedding replaced by the fixed 2-D sin-cos table of its patch grid (a class token's
    row zero), never trained: MAE's and I-JEPA's encoders."""
    grid = tuple(vit.patch_embed.grid_size)
    prefix_rows = 0 if vit.no_embed_class else vit.num_prefix_tokens
    if prefix_rows > 1:
        raise ValueError(f"a sin-cos table has at most a class token's row, the ViT embeds {prefix_rows}")
    table = sincos_pos_embed(vit.pos_embed.shape[-1], grid, cls_token=prefix_rows == 1)
    with torch.no_grad():
        vit.pos_embed.copy_(table[None])
    vit.pos_embed.requires_grad_(False)


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


def keep_patches(tokens: torch.Tensor, masks: list[torch.Tensor]) -> torch.Tensor:
    """[len(masks) N, K, D]: for each mask [N, K] of patch indices, each image's tokens [N, L, D] at them, the
    masks one after another (I-JEPA's apply_masks)."""
    dim = tokens.shape[-1]
    return torch.cat([tokens.gather(1, m.unsqueeze(-1).expand(-1, -1, dim)) for m in masks])


def encode_kept(vit: VisionTransformer, images: torch.Tensor, masks: list[torch.Tensor]) -> torch.Tensor:
    """[len(masks) N, K, D]: positions added to every patch, then each mask's patches (``keep_patches``)
    alone through the blocks and the final norm (I-JEPA's VisionTransformer.forward(x, masks), CAPI's
    encoder on the visible patches)."""
    x = keep_patches(with_positions(vit, vit.patch_embed(images)), masks)
    return vit.norm(vit.blocks(vit.norm_pre(x)))


@torch.no_grad()
def shared_rng(device) -> random.Random:
    """A random.Random every rank seeds alike, from rank 0's draw of the global RNG the trainer seeds: what
    draws a whole batch's masks, of which each rank takes its own images' (DINOv2, I-JEPA; their official
    loaders draw each rank's)."""
    return random.Random(int(dist.broadcast(torch.randint(0, 2**31 - 1, (1,), device=device))[0]))


@torch.no_grad()
def batch_draw(batch: int, length: int, device) -> torch.Tensor:
    """[batch, length] uniform noise for this rank's images: rank 0's draw for the whole batch, of which
    this rank takes its rows. The official codes' ranks draw their own (seeded seed + rank): the same
    distribution; here 2 processes compute what one computes on the whole batch. In one process:
    torch.rand(batch, length) from the global RNG the trainer seeds."""
    everyone = torch.rand(batch * dist.world_size(), length, device=device)
    return dist.broadcast(everyone)[dist.shard(len(everyone))]


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


def rolled_block_mask(
    h: int, w: int, count: int, log_aspect: tuple[float, float], rng: random.Random, roll: bool = True
) -> torch.Tensor:
    """Franca's BlockMasking (valeoai/Franca franca/data/masking.py): one rectangle of ``count`` patches on an
    h x w grid. Its aspect ratio is exp(U) over ``log_aspect`` narrowed to what the grid holds
    ([log(count / w^2), log(h^2 / count)]); its sides are ceil(sqrt(count x ratio)) and ceil(sqrt(count /
    ratio)), at most the grid's; its corner is uniform (inclusive bounds); its first ``count`` patches in
    row-major order are kept; with ``roll`` the grid is then shifted cyclically by a uniform row and column
    offset. Returns a bool [h, w], True = masked; ``rng`` draws every number."""
    mask = torch.zeros(h, w, dtype=torch.bool)
    if count <= 0:
        return mask
    count = min(count, h * w)
    low = max(log_aspect[0], math.log(count / w**2))
    high = min(log_aspect[1], math.log(h**2 / (count + 1e-5)))
    aspect = math.exp(rng.uniform(min(low, high), high))
    bh = min(math.ceil(math.sqrt(count * aspect)), h)
    bw = min(math.ceil(math.sqrt(count / aspect)), w)
    top = 0 if bh >= h else rng.randint(0, h - bh)
    left = 0 if bw >= w else rng.randint(0, w - bw)
    mask[top : top + bh, left : left + bw] = True
    keep = mask.flatten().nonzero().flatten()[:count]
    mask = torch.zeros(h * w, dtype=torch.bool)
    mask[keep] = True
    mask = mask.view(h, w)
    if roll:
        shifts = (rng.randint(0, h - 1), rng.randint(0, w - 1))
        mask = torch.roll(mask, shifts, dims=(0, 1))
    return mask


def inverse_block_mask(
    h: int, w: int, count: int, log_aspect: tuple[float, float], rng: random.Random, roll: bool = True
) -> torch.Tensor:
    """Franca's InverseBlockMasking: ``count`` patches masked as everything but one (rolled) rectangle of the
    other h w - count (at least one) patches; none for a count of 0, every patch from h w on."""
    if count <= 0:
        return torch.zeros(h, w, dtype=torch.bool)
    if count >= h * w:
        return torch.ones(h, w, dtype=torch.bool)
    return ~rolled_block_mask(h, w, max(1, h * w - count), log_aspect, rng, roll)


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


def multiblock_block_size(
    u: float, grid: tuple[int, int], scale: tuple[float, float], aspect: tuple[float, float]
) -> tuple[int, int]:
    """I-JEPA's _sample_block_size (src/masks/multiblock.py): one uniform ``u`` sets both the block's share of
    the patches, scale[0] + u (scale[1] - scale[0]), and its aspect ratio (height / width) the same way;
    with keep = int(share x patches), h = round(sqrt(keep x ratio)) and w = round(sqrt(keep / ratio)), each
    at most its side of the grid minus one."""
    rows, cols = grid
    keep = int(rows * cols * (scale[0] + u * (scale[1] - scale[0])))
    ratio = aspect[0] + u * (aspect[1] - aspect[0])
    return min(round(math.sqrt(keep * ratio)), rows - 1), min(round(math.sqrt(keep / ratio)), cols - 1)


def place_block(
    size: tuple[int, int],
    grid: tuple[int, int],
    min_keep: int,
    rng: random.Random,
    allowed: list[torch.Tensor] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """I-JEPA's _sample_block_mask: an h x w block whose top-left corner is uniform in [0, rows - h) x
    [0, cols - w) (torch.randint's bound: it never reaches the last row or column), cut to the ``allowed``
    regions [rows, cols] (bool), drawn again until it keeps more than ``min_keep`` patches; after every 20
    failures in a row it drops the last region still applied. Returns (the indices of its patches, row-major,
    [K] long; where the whole block is not, [rows, cols] bool). A block that keeps too few without any region
    is an error (the official loop never ends)."""
    (rows, cols), (h, w) = grid, size
    failures = 0
    while True:
        top, left = rng.randrange(rows - h), rng.randrange(cols - w)
        block = torch.zeros(rows, cols, dtype=torch.bool)
        block[top : top + h, left : left + w] = True
        kept = block.clone()
        for region in allowed[: max(len(allowed) - failures // 20, 0)]:
            kept &= region
        indices = kept.flatten().nonzero().squeeze(1)
        if len(indices) > min_keep:
            return indices, ~block
        failures += 1
        if failures // 20 > len(allowed):
            raise ValueError(
                f"a {h} x {w} block of a {rows} x {cols} grid of patches never keeps more than min_keep "
                f"{min_keep} patches: lower min_keep or raise the blocks' scale"
            )


def multiblock_masks(
    batch: int,
    grid: tuple[int, int],
    rng: random.Random,
    pred_scale: tuple[float, float],
    enc_scale: tuple[float, float],
    aspect: tuple[float, float],
    npred: int,
    nenc: int,
    min_keep: int,
    allow_overlap: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """I-JEPA's MaskCollator (src/masks/multiblock.py) for ``batch`` images: one target-block size
    (``pred_scale``, ``aspect``) and one context-block size (``enc_scale``, square) for the whole batch;
    for each image ``npred`` target blocks placed anywhere, then ``nenc`` context blocks cut to the patches
    outside every target block (unless ``allow_overlap``). Each mask's indices are cut to the shortest of
    the batch (its first, row-major), so that they stack. Returns (context masks [nenc] of [batch, Kc],
    target masks [npred] of [batch, Kp]), patch indices (long). ``rng`` draws every number."""
    pred_size = multiblock_block_size(rng.random(), grid, pred_scale, aspect)
    enc_size = multiblock_block_size(rng.random(), grid, enc_scale, (1.0, 1.0))
    contexts, targets = [], []
    for _ in range(batch):
        placed = [place_block(pred_size, grid, min_keep, rng) for _ in range(npred)]
        targets.append([indices for indices, _ in placed])
        allowed = [] if allow_overlap else [outside for _, outside in placed]
        contexts.append([place_block(enc_size, grid, min_keep, rng, allowed)[0] for _ in range(nenc)])

    def stacked(per_image: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        shortest = min(len(m) for masks in per_image for m in masks)
        count = len(per_image[0])
        return [torch.stack([masks[j][:shortest] for masks in per_image]) for j in range(count)]

    return stacked(contexts), stacked(targets)
