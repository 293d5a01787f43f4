"""MMCR, maximum manifold capacity representations (Yerxa, Kuang, Simoncelli, Chung, NeurIPS 2023): many
views of each image, their embeddings' centroid, and the nuclear norm of the centroids maximised.

    f = projector(backbone)               # projector: Linear-BN-ReLU-Linear, no biases (Barlow Twins')
    for x in loader:
        v_1..v_n = aug(x), ..., aug(x)    # n views (n_aug: 40 on CIFAR, 2 on ImageNet)
        z_i = normalize(f(v_i))           # all views through the networks as one batch
        c = mean_i z_i                    # each image's centroid
        loss = -||C||_*  (+ lmbda x mean_b ||Z_b||_*, off by default)   # the nuclear norm over the batch
        Adam step

As ThomasYerxa/mmcr (mmcr/cifar_stl: loss_mmcr.py, models.py, train.py, data.py; the loss is
``sslbench.kit.losses.mmcr``). Under DDP every rank computes the loss over the whole batch (the views'
embeddings gathered with their gradient), so 2 processes compute what one computes on it. The evaluated
encoder is the backbone.
"""

from sslbench import distributed as dist
from sslbench.kit.losses import mmcr
from sslbench.kit.method import Method, bn_mlp, embed_views


class MMCR(Method):
    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.num_views = p["num_views"]
        # models.py's projector: no biases
        self.projector = bn_mlp([self.feature_dim, p["proj_hidden_dim"], p["proj_dim"]])
        self.lmbda = float(p["lmbda"])

    def training_loss(self, views, labels, indices):
        z = embed_views(self.backbone, self.projector, views)  # [B, n, C], one batch through the networks
        return mmcr(dist.gather_with_grad(z), self.lmbda)

    def projection_head(self):
        return self.projector
