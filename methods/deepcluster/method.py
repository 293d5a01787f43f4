"""DeepCluster (Caron, Bojanowski, Joulin, Douze, ECCV 2018), as facebookresearch/deepcluster
(main.py, clustering.py, util.py, models/alexnet.py).

    f = the backbone behind a fixed Sobel filter (grey, then the two 3x3 gradients)
    for epoch in range(epochs):
        x_all = f(x) for every training image                 # evaluation transform, no gradient
        y = kmeans(normalize(pca_whiten(x_all, 256)), k)      # faiss, 20 iterations, new seed each epoch
        W = fresh top layer: weight ~ N(0, 0.01), bias 0      # k outputs
        for x, i in loader(sampler uniform over the clusters):
            loss = CE(W f(aug(x)), y[i])
            SGD step on f (momentum 0.9) and on W (no momentum)

The reassignment is ``on_epoch_start`` (timed: ``reassign_seconds`` in the epoch log); the
sampler is ``epoch_order``. Under DDP every rank clusters the features of every training image
and rank 0's labels and top layer are broadcast, so every rank trains on one clustering (and
draws the same order from the engine's order generator).
"""

import time

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import kmeans, pca_whiten, uniform_over_clusters
from sslbench.kit.method import Method


class DeepCluster(Method):
    num_views = 1

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.num_clusters, self.pca_dim = int(p["num_clusters"]), int(p["pca_dim"])
        if not 1 <= self.num_clusters <= info.num_train or not 1 <= self.pca_dim <= self.feature_dim:
            raise ConfigError(
                f"methods/deepcluster/config.yaml: need 1 <= num_clusters <= {info.num_train} (the "
                f"training images) and 1 <= pca_dim <= {self.feature_dim} (the backbone's feature width); "
                f"got num_clusters {self.num_clusters}, pca_dim {self.pca_dim}"
            )
        self.kmeans_settings = dict(p["kmeans"])
        self.reassign = int(p["reassign"])  # epochs between two reassignments (main.py --reassign)
        self.top_layer = nn.Linear(self.feature_dim, self.num_clusters)
        self.register_buffer("labels", torch.full((info.num_train,), -1))  # pseudo-labels; -1: none yet

    def on_epoch_start(self, ctx):
        if ctx.epoch % self.reassign:
            return  # the clusters and the top layer of the last reassignment (both checkpointed)
        start = time.perf_counter()
        self.labels.copy_(self.cluster(ctx.forward_train_set(self.backbone)))
        self.reset_top_layer()
        ctx.log["reassign_seconds"] = time.perf_counter() - start
        sizes = torch.bincount(self.labels, minlength=self.num_clusters).float()
        ctx.log.update(
            cluster_size_min=sizes.min().item(),
            cluster_size_median=sizes.median().item(),
            cluster_size_max=sizes.max().item(),
            clusters_empty=int((sizes == 0).sum()),
        )

    @torch.no_grad()
    def cluster(self, features: torch.Tensor) -> torch.Tensor:
        """clustering.py Kmeans.cluster: PCA-whitening, L2 normalisation, faiss k-means."""
        x = F.normalize(pca_whiten(features, self.pca_dim), dim=1)
        seed = int(torch.randint(2**31 - 1, ()))  # a new seed each epoch, as run_kmeans
        labels = kmeans(x, self.num_clusters, seed=seed, **self.kmeans_settings).assignments
        return dist.broadcast(labels.to(self.labels.device))  # rank 0's clustering on every rank

    @torch.no_grad()
    def reset_top_layer(self) -> None:
        """main.py: a new top layer for every clustering, weight ~ N(0, 0.01), bias 0 (rank 0's)."""
        nn.init.normal_(self.top_layer.weight, std=0.01)
        nn.init.zeros_(self.top_layer.bias)
        dist.broadcast(self.top_layer.weight)

    def epoch_order(self, num_train, generator):
        return uniform_over_clusters(self.labels, num_train, generator)  # util.py UnifLabelSampler

    def param_groups(self):
        # main.py: the top layer has its own SGD, made anew each epoch, without momentum
        return [
            {"params": [p for p in self.backbone.parameters() if p.requires_grad]},
            {"params": self.top_layer.parameters(), "momentum": 0.0},
        ]

    def training_loss(self, views, labels, indices):
        return F.cross_entropy(self.top_layer(self.backbone(views[0])), self.labels[indices])
