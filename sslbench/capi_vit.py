"""CAPI's encoder as a timm model (``capi_vit_large_patch14``), so that its released weights (format ``capi``)
load into a suite backbone and go through the protocols. It is the encoder half of facebookresearch/capi
model.py's ``EncoderDecoder``, which timm's ViTs cannot hold:

- register tokens (16) in front of the patch tokens, no class token and no position embedding;
- 2-D RoPE on q and k, with learned frequencies per channel (``Rope.freqs``, the official initial ones) and
  coordinates: each patch's row and column in [0, 1], the registers spread along the image's edges;
- pre-norm blocks with RMSNorm, separate q, k and v projections, a GELU MLP, and no bias anywhere;
- a final RMSNorm without weights.

Module names are the official ones (``encoder.blocks.0.residual1.fn.q_proj``), so a released state dict loads
key for key. No drop path: the suite reads this network, it does not train it.

Its features (``forward``): the patch tokens after the final norm, averaged, as the suite reads a CAPI run
it trained (the teacher's patch tokens, averaged). CAPI's hub model returns the mean of its decoder's first
block over every position instead, and its paper's probes read the registers and patch tokens; neither is
read here (the decoder is not loaded)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.models import register_model
from torch import nn

from sslbench.errors import SslbenchError


def rope_frequencies(dim: int, max_freq: float = 7.0, min_freq: float = 7e-4) -> torch.Tensor:
    """The angular frequencies [2, dim] at initialisation: dim / 4 frequencies spaced geometrically from
    ``max_freq`` down to ``min_freq``, each for a pair of channels (c, c + dim / 4); the first half of the
    channels turns with the row coordinate, the second half with the column."""
    steps = max_freq * (max_freq / min_freq) ** torch.linspace(0, -1, dim // 4)
    paired = torch.cat([steps, steps])
    freqs = torch.zeros(2, dim)
    freqs[0, : dim // 2] = paired
    freqs[1, dim // 2 :] = paired
    return freqs * 2 * math.pi


class Rope(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.freqs = nn.Parameter(rope_frequencies(dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """x cos(angle) + rotate_half(x) sin(angle), angle = coords @ freqs: channel c is paired with
        c + dim / 2, whose angle comes from the other coordinate, so the map is a rotation only where row =
        column. model.py's RoPE, as its released weights were trained with."""
        angle = coords @ self.freqs
        first, second = x.chunk(2, dim=-1)
        return x * angle.cos() + torch.cat([-second, first], dim=-1) * angle.sin()


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.rope = Rope(dim // num_heads)

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        heads = lambda t: t.reshape(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)
        q = self.rope(heads(self.q_proj(x)), coords[:, None])
        k = self.rope(heads(self.k_proj(x)), coords[:, None])
        out = F.scaled_dot_product_attention(q, k, heads(self.v_proj(x)))
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim, bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Residual(nn.Module):
    def __init__(self, norm: nn.Module, fn: nn.Module):
        super().__init__()
        self.norm, self.fn = norm, fn

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return x + self.fn(self.norm(x), **kwargs)


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, eps: float):
        super().__init__()
        self.residual1 = Residual(nn.RMSNorm(dim, eps=eps), Attention(dim, num_heads))
        self.residual2 = Residual(nn.RMSNorm(dim, eps=eps), Mlp(dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        return self.residual2(self.residual1(x, coords=coords))


class Encoder(nn.Module):
    def __init__(self, dim: int, depth: int, num_heads: int, eps: float):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, num_heads, eps) for _ in range(depth))


def edge_coordinates(n: int) -> torch.Tensor:
    """[n, 2]: n registers spaced evenly along the unit square's edges, a quarter on each, clockwise from
    (0, 0) (model.py's ``register_coordinates: edge``)."""
    side = n // 4
    c = torch.arange(side) / side
    zeros, ones = torch.zeros(side), torch.ones(side)
    edges = [(c, zeros), (ones, c), (1 - c, ones), (zeros, 1 - c)]
    return torch.cat([torch.stack(edge, dim=1) for edge in edges])


class CapiViT(nn.Module):
    def __init__(
        self,
        in_chans: int = 3,
        patch_size: int = 14,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        n_registers: int = 16,
        eps: float = 1e-5,
    ):
        super().__init__()
        if n_registers % 4:
            raise SslbenchError(
                f"capi_vit: n_registers = {n_registers}; the registers sit 1 / 4 on each edge"
            )
        self.patch_size, self.num_features, self.num_prefix_tokens = patch_size, embed_dim, n_registers
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.registers = nn.Parameter(torch.zeros(1, n_registers, embed_dim))
        self.encoder = Encoder(embed_dim, depth, num_heads, eps)
        self.enc_norm = nn.RMSNorm(embed_dim, eps=eps, elementwise_affine=False)

    def coordinates(self, rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
        """[registers + rows x cols, 2]: the registers' edge coordinates scaled to the patches' range, then
        each patch's (row, column) in [0, 1], row by row."""
        grid = torch.cartesian_prod(torch.linspace(0, 1, rows), torch.linspace(0, 1, cols))
        low, high = grid.min(dim=0).values, grid.max(dim=0).values
        registers = low + edge_coordinates(self.num_prefix_tokens) * (high - low)
        return torch.cat([registers, grid]).to(like)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """[B, registers + patches, D]: every token after the final norm."""
        patches = self.patch_embed(images)
        coords = self.coordinates(*patches.shape[2:], like=patches).expand(len(images), -1, -1)
        x = torch.cat([self.registers.expand(len(images), -1, -1), patches.flatten(2).transpose(1, 2)], dim=1)
        for block in self.encoder.blocks:
            x = block(x, coords)
        return self.enc_norm(x)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward_features(images)[:, self.num_prefix_tokens :].mean(dim=1)


@register_model
def capi_vit_large_patch14(pretrained: bool = False, num_classes: int = 0, **kwargs) -> CapiViT:
    """CAPI's ViT-L/14 (default_pretrain_config.yaml: 1024-d, 24 blocks, 16 heads, 16 registers)."""
    for factory_option in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(factory_option, None)
    if pretrained or num_classes:
        raise SslbenchError(
            "capi_vit_large_patch14 is a feature extractor with no downloadable weights: create it with "
            "pretrained=False, num_classes=0 and load a released file (format capi)"
        )
    return CapiViT(**kwargs)
