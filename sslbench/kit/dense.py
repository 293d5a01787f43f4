"""Dense features and their correspondence between two views (DenseCL, Wang et al., CVPR 2021).

- ``feature_map``: a backbone's pooled features and its last feature map as P positions of C channels: a
  CNN's H x W grid (timm's ``forward_features``), a ViT's patch tokens (its prefix tokens left out).
- ``dense_correspondence``: for every position of one view, the position of the other view whose feature is
  the most similar by cosine (WXinlong/DenseCL openselfsup/models/densecl.py: the argmax over the key's
  positions of the normalised backbone features' similarity).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def feature_map(backbone: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled [B, C], map [B, C, P]): the backbone's own pooled output and the features it pools."""
    features = backbone.forward_features(x)
    pooled = backbone.forward_head(features)
    if features.ndim == 4:  # [B, C, H, W]: a CNN's grid
        return pooled, features.flatten(2)
    if features.ndim == 3:  # [B, N, C]: a ViT's tokens
        return pooled, features[:, getattr(backbone, "num_prefix_tokens", 0) :].transpose(1, 2)
    raise ValueError(f"a feature map [B, C, H, W] or tokens [B, N, C] expected, got {tuple(features.shape)}")


@torch.no_grad()
def dense_correspondence(query_map: torch.Tensor, key_map: torch.Tensor) -> torch.Tensor:
    """[B, P]: for each of the query's P positions, the index of the key position with the largest cosine
    similarity between their features (maps [B, C, P] and [B, C, P']; ties: the first). No gradient."""
    if query_map.ndim != 3 or key_map.shape[:2] != query_map.shape[:2]:
        raise ValueError(
            "maps [B, C, P] of the same B and C expected, got "
            f"{tuple(query_map.shape)}, {tuple(key_map.shape)}"
        )
    similarity = F.normalize(query_map, dim=1).transpose(1, 2) @ F.normalize(key_map, dim=1)  # [B, P, P']
    return similarity.argmax(dim=2)


def gather_positions(key_map: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[B, D, P]: key_map [B, D, P'] at the positions ``index`` [B, P] (the query's matches)."""
    return torch.gather(key_map, 2, index.unsqueeze(1).expand(-1, key_map.shape[1], -1))
