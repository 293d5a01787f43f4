"""NNCLR (Dwibedi, Aytar, Tompson, Sermanet, Zisserman, ICCV 2021): SimCLR's contrastive loss with each
view's positive replaced by its nearest neighbour in a support set of past embeddings.

    f = projector(backbone)               # 3-layer MLP, batch norm after every layer
    g = predictor                         # 2-layer MLP
    Q = support set of embeddings         # a FIFO queue, initialised with random unit vectors
    for x in loader:
        x1, x2 = aug1(x), aug2(x)         # BYOL's asymmetric views
        z1, z2 = f(x1), f(x2)
        p1, p2 = g(z1), g(z2)
        nn1, nn2 = NN(z1, Q), NN(z2, Q)   # the closest row of Q by cosine: no gradient
        loss = L(nn1, p2) / 2 + L(nn2, p1) / 2
        step on f, g
        enqueue(Q, z1)                    # after the loss: a batch is never its own neighbour

    L(nn, p) = CrossEntropy(normalize(nn) normalize(p)^T / tau, own row)   # over the batch

The paper's Algorithm 1 and Section 3; it has no official code. Under DDP every rank looks up its own
images in the same support set, then computes L over the whole batch (its nearest neighbours and
predictions gathered in rank order), as the paper's cross-replica TPU batch; the support set takes the
whole batch's z1. The evaluated encoder is the backbone.
"""

import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.kit.losses import batch_info_nce
from sslbench.kit.method import Method, bn_mlp, exclude_bias_and_norm
from sslbench.kit.queue import KeyQueue, fit_queue_size, nearest_neighbour


class NNCLR(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        hidden = p["proj_hidden_dim"]
        self.projector = nn.Sequential(  # Linear-BN-ReLU, Linear-BN-ReLU, Linear-BN
            *bn_mlp([self.feature_dim, hidden, hidden, p["proj_dim"]], hidden_bias=True, output_bias=True),
            nn.BatchNorm1d(p["proj_dim"]),
        )
        self.predictor = bn_mlp([p["proj_dim"], p["pred_hidden_dim"], p["proj_dim"]], True, True)
        size = fit_queue_size(p["queue_size"], info.batch_size, info.num_train)
        self.support = KeyQueue(size, p["proj_dim"])
        self.temperature = float(p["temperature"])

    def training_loss(self, views, labels, indices):
        z1, z2 = (self.projector(self.backbone(v)) for v in views)  # one forward per view
        p1, p2 = self.predictor(z1), self.predictor(z2)
        support = self.support.negatives()
        nn1, nn2 = nearest_neighbour(z1, support), nearest_neighbour(z2, support)
        loss = (self.contrastive_loss(nn1, p2) + self.contrastive_loss(nn2, p1)) / 2
        self.support.push(F.normalize(z1.detach(), dim=1))
        return loss

    def contrastive_loss(self, nn_rows, p):
        """L(nn, p) over the whole batch: every rank computes it on the gathered rows (SimCLR's gather)."""
        nn_rows = F.normalize(dist.gather(nn_rows), dim=1)
        p = F.normalize(dist.gather_with_grad(p), dim=1)
        return batch_info_nce(nn_rows, p, self.temperature)

    def param_groups(self):
        return exclude_bias_and_norm(nn.ModuleList([self.backbone, self.projector, self.predictor]))

    def on_epoch_start(self, ctx):
        ctx.log["queue_size"] = len(self.support)  # the effective support-set size (shrunk on small data)

    def projection_head(self):
        return self.projector
