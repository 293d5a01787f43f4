"""MoCo v3, ResNet form (Chen, Xie, He, ICCV 2021): a query network with a predictor contrasts its
output against the keys of a momentum encoder, the other images of the batch as negatives (no queue).

    f_q = predictor(projector(backbone))    # projector: 2-layer MLP, BN on the output; predictor: 2-layer MLP
    f_k = projector'(backbone'), no gradient  # a copy of backbone + projector, moved only by the EMA
    for x in loader:
        x1, x2 = aug1(x), aug2(x)           # blur p 1.0 / 0.1, solarisation p 0 / 0.2
        q1, q2 = f_q(x1), f_q(x2)           # one forward per view: each its own BN statistics
        k1, k2 = f_k(x1), f_k(x2)
        loss = ctr(q1, k2) + ctr(q2, k1)
        LARS step on f_q (biases and norms: no weight decay, no adaptation)
        f_k <- m f_k + (1 - m) [backbone, projector],  m = 1 - (1 - m_0)(cos(pi k / K) + 1) / 2

    ctr(q, k) = 2 tau * CrossEntropy(normalize(q) normalize(gather(k))^T / tau, own key)

The keys of every rank are gathered without gradient (moco/builder.py concat_all_gather), so each
query's negatives are the other keys of the whole batch; the EMA is the engine's update of
``momentum_pairs()`` (``momentum_schedule: cosine``). The evaluated encoder is the query backbone.
"""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.losses import batch_info_nce
from sslbench.method import Method, bn_mlp, exclude_bias_and_norm
from sslbench.pretrain.momentum import frozen_copy


class MoCoV3(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = bn_mlp([self.feature_dim, p["mlp_dim"], p["dim"]], output_bn=True)
        self.predictor = bn_mlp([p["dim"], p["mlp_dim"], p["dim"]])
        self.momentum_encoder = frozen_copy([self.backbone, self.projector])
        self.temperature = float(p["temperature"])

    def training_loss(self, views, labels, indices):
        q1, q2 = (self.predictor(self.projector(self.backbone(v))) for v in views)
        with torch.no_grad():
            k1, k2 = (self.momentum_encoder(v) for v in views)
        return self.contrastive_loss(q1, k2) + self.contrastive_loss(q2, k1)

    def contrastive_loss(self, q, k):
        """ctr(q, k): this rank's queries are rows rank * B .. (rank + 1) * B of the gathered batch."""
        keys = dist.gather(F.normalize(k, dim=1))
        first_row = dist.rank() * q.shape[0]
        return 2 * self.temperature * batch_info_nce(F.normalize(q, dim=1), keys, self.temperature, first_row)

    def param_groups(self):
        return exclude_bias_and_norm(nn.ModuleList([self.backbone, self.projector, self.predictor]))

    def momentum_pairs(self):
        return [([self.backbone, self.projector], self.momentum_encoder)]
