"""DenseCL (Wang, Zhang, Shen, Kong, Li, CVPR 2021): MoCo v2 with a second, dense contrastive loss between the
positions of the two views' last feature maps, matched by the similarity of their backbone features.

    f_q = backbone + neck                  # neck: the global MLP on the pooled features, and a dense MLP
                                           # (1x1 convolutions) on every position of the feature map
    f_k = copy(f_q), no gradient           # the momentum (key) encoder
    for x in loader:
        q, q_grid, q_b = f_q(aug(x))       # global embedding, dense embeddings [P], backbone features [P]
        k, k_grid, k_b, k2 = f_k(aug(x))   # k2: the dense embeddings averaged over the positions
        match = argmax_j cos(q_b[i], k_b[j])            # each query position's key position
        loss_single = InfoNCE(q, k, queue, T)
        loss_dense = InfoNCE(q_grid[i], k_grid[match[i]], queue2, T)   # over every position i
        loss = (1 - lambda) loss_single + lambda loss_dense
        enqueue(queue, k); enqueue(queue2, k2)
        SGD step on f_q
        f_k = m f_k + (1 - m) f_q

WXinlong/DenseCL openselfsup/models/densecl.py and necks.py (DenseCLNeck). The key encoder is MoCo's
(sslbench/kit/moco.py): under torch.distributed its batch is shuffled across ranks; each rank's two losses
are means over its own images (and their positions) against the shared queues, which take every rank's keys.
The evaluated encoder is the query backbone.
"""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench.kit.dense import dense_correspondence, feature_map, gather_positions
from sslbench.kit.losses import info_nce
from sslbench.kit.method import Method, projection_mlp
from sslbench.kit.moco import key_encoder_of
from sslbench.kit.queue import KeyQueue, fit_queue_size


class DenseCLNeck(nn.Module):
    """necks.py DenseCLNeck: Linear-ReLU-Linear on the pooled features; the same on every position of the
    map (a 1x1 convolution is a Linear on each position's channels), then its mean over the positions."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int):
        super().__init__()
        self.mlp = projection_mlp(in_dim, hidden_dim, out_dim)
        self.dense_mlp = projection_mlp(in_dim, hidden_dim, out_dim)
        for (
            layer
        ) in self.mlp:  # densecl.py init_weights(init_linear='kaiming'): the Linears only, not the convs
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(layer.bias)

    def forward(self, pooled: torch.Tensor, fmap: torch.Tensor):
        """(global [B, D], dense [B, D, P], dense mean [B, D]) from pooled [B, C] and fmap [B, C, P]."""
        grid = self.dense_mlp(fmap.transpose(1, 2)).transpose(1, 2)
        return self.mlp(pooled), grid, grid.mean(dim=2)


def embed(modules, x: torch.Tensor):
    """(global, dense, dense mean, backbone map) of (backbone, neck) on x, each L2-normalised over its
    channels (densecl.py forward_train)."""
    backbone, neck = modules
    pooled, fmap = feature_map(backbone, x)
    return tuple(F.normalize(t, dim=1) for t in (*neck(pooled, fmap), fmap))


class DenseCL(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.neck = DenseCLNeck(self.feature_dim, p["hidden_dim"] or self.feature_dim, p["dim"])
        self.key_encoder = key_encoder_of(
            self.backbone, self.neck, p["bn_splits"], info.batch_size, run=embed
        )
        size = fit_queue_size(p["queue_size"], info.batch_size, info.num_train)
        self.queue, self.dense_queue = KeyQueue(size, p["dim"]), KeyQueue(size, p["dim"])
        self.temperature = float(p["temperature"])
        self.loss_lambda = float(p["loss_lambda"])

    def training_loss(self, views, labels, indices):
        q, q_grid, _, q_b = embed((self.backbone, self.neck), views[0])
        k, k_grid, k2, k_b = self.key_encoder(views[1])
        single = info_nce(q, k, self.queue.negatives(), self.temperature)
        matched = gather_positions(k_grid, dense_correspondence(q_b, k_b))  # [B, D, P]
        dense = info_nce(rows(q_grid), rows(matched), self.dense_queue.negatives(), self.temperature)
        self.queue.push(k)
        self.dense_queue.push(k2)
        return (1 - self.loss_lambda) * single + self.loss_lambda * dense

    def on_epoch_start(self, ctx):
        ctx.log["queue_size"] = len(self.queue)  # the effective K (shrunk on small datasets)

    def momentum_pairs(self):
        return [([self.backbone, self.neck], self.key_encoder)]

    def projection_head(self):
        return self.neck.mlp


def rows(grid: torch.Tensor) -> torch.Tensor:
    """[B * P, D]: each image's positions, image by image, from [B, D, P]."""
    return grid.transpose(1, 2).reshape(-1, grid.shape[1])
