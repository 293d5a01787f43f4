"""W-MSE (Ermolov, Siarohin, Sangineto, Sebe, ICML 2021): the MSE between views' embeddings after
whitening each view's embeddings over sub-batches, so that they cannot collapse; no negatives, no target
network, no predictor.

    f = head(backbone)                    # head: Linear-BN-ReLU-Linear to emb (64 on CIFAR)
    for x in loader:
        v_1..v_d = aug(x), ..., aug(x)    # d = 2 (W-MSE 2) or 4 (W-MSE 4)
        h_i = f(v_i)                      # backbone per view, the head on all views at once
        repeat w_iter times:
            split the batch at random into sub-batches of w_size
            z_i = whiten(h_i) in each sub-batch       # Cholesky whitening: identity covariance
            loss += sum over pairs i < j of 2 - 2 cos(z_i, z_j), averaged over the batch
        loss /= w_iter x pairs

As htdt/self-supervised methods/w_mse.py and methods/whitening.py (``sslbench.kit.whitening``). Under DDP
every rank computes that loss over the whole batch (each view's embeddings gathered in rank order, the
sub-batches drawn by rank 0), as the official code, which runs on one process (nn.DataParallel), whitens
over the whole batch it is given. The evaluated encoder is the backbone.
"""

import itertools

import torch

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.losses import cosine_regression
from sslbench.kit.method import Method, bn_mlp
from sslbench.kit.whitening import whiten_sub_batches


class WMSE(Method):
    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.num_views = p["num_views"]
        # get_head; its last Linear's bias is left out: every sub-batch is centred before anything reads it
        self.head = bn_mlp([self.feature_dim, p["proj_hidden_dim"], p["proj_dim"]], hidden_bias=True)
        self.w_size, self.w_iter, self.w_eps = p["w_size"], p["w_iter"], float(p["w_eps"])
        if info.batch_size % self.w_size or self.w_size <= p["proj_dim"]:
            raise ConfigError(
                f"config key `w_size` = {self.w_size}: the sub-batch must divide `train.batch_size` "
                f"({info.batch_size}) and exceed `proj_dim` ({p['proj_dim']}), or its covariance is singular"
            )

    def training_loss(self, views, labels, indices):
        h = self.head(torch.cat([self.backbone(v) for v in views]))
        h = [dist.gather_with_grad(view) for view in h.chunk(self.num_views)]  # the whole batch, per view
        pairs = list(itertools.combinations(range(self.num_views), 2))
        loss = 0
        for _ in range(self.w_iter):
            order = dist.broadcast(torch.randperm(h[0].shape[0], device=h[0].device))  # rank 0's sub-batches
            z = [whiten_sub_batches(view, order, self.w_size, self.w_eps) for view in h]
            loss = loss + sum(cosine_regression(z[i], z[j]) for i, j in pairs)
        return loss / (self.w_iter * len(pairs))
