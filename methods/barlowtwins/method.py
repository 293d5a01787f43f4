"""Barlow Twins (Zbontar et al., ICML 2021): redundancy reduction between two views' embeddings.

    z1, z2 = projector(backbone(y1)), projector(backbone(y2))    # y1, y2: the two asymmetric views
    c = bn(z1)^T bn(z2) / N            # cross-correlation of the batch-standardised embeddings [D, D]
    loss = sum_i (1 - c_ii)^2 + lambda sum_{i != j} c_ij^2
    LARS: weights adapted and decayed; biases and BN parameters neither, at their own lr

Under DDP the embeddings of every rank are gathered (with gradient) first, so c, the loss and the
gradient are those of one process on the whole batch (the official code all-reduces c instead,
which gives the same c but 1/W of the gradient: README.md).
"""

from sslbench.distributed import gather_with_grad
from sslbench.kit.losses import barlow_twins
from sslbench.kit.method import Method, bn_mlp, exclude_bias_and_norm


class BarlowTwins(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = bn_mlp([self.feature_dim, *p["projector"]], hidden_bias=False)
        self.lambd = float(p["lambd"])
        self.bias_lr_scale = float(p["bias_lr_scale"])

    def training_loss(self, views, labels, indices):
        z1 = self.projector(self.backbone(views[0]))  # one forward per view, as main.py: BN per view
        z2 = self.projector(self.backbone(views[1]))
        return barlow_twins(gather_with_grad(z1), gather_with_grad(z2), self.lambd)

    def param_groups(self):  # main.py: weights at lr, biases and BN at lr x 0.0048 / 0.2, not adapted
        return exclude_bias_and_norm(self, lr_scale=self.bias_lr_scale)
