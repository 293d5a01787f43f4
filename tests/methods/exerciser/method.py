"""A test method that uses every piece of the method contract at once (tests/methods/test_contract.py,
tests/methods/test_distributed.py): parameter groups (biases and norms excluded, a fixed-lr predictor) under
LARS, a momentum pair with the cosine schedule, per-view settings and multi-crop views, and a gradient
hook before the step. Not a method of the suite (it lives under tests/, so discovery never finds it).

    p_v = predictor(projector(backbone(view_v)))       for every view v (one forward per size)
    z_i = target(view_i)                               for the global views i, no gradient
    loss = mean over pairs (i, v != i) of 2 - 2 cos(p_v, z_i)
    target <- tau target + (1 - tau) [backbone, projector]     (the engine, cosine tau)
"""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench.kit.method import Method, embed_crops, exclude_bias_and_norm
from sslbench.kit.momentum import frozen_copy


class Exerciser(Method):
    num_views = 2
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = nn.Sequential(
            nn.Linear(self.feature_dim, p["hidden_dim"]),
            nn.BatchNorm1d(p["hidden_dim"]),
            nn.ReLU(),
            nn.Linear(p["hidden_dim"], p["dim"]),
        )
        self.predictor = nn.Linear(p["dim"], p["dim"])
        self.target = frozen_copy([self.backbone, self.projector])
        self.clip = float(p["clip"])
        self.last_views: list[tuple[int, ...]] = []  # the shapes of the last batch's views, for tests

    def training_loss(self, views, labels, indices):
        self.last_views = [tuple(v.shape) for v in views]
        predictions = embed_crops(self.backbone, views, head=lambda x: self.predictor(self.projector(x)))
        with torch.no_grad():
            targets = embed_crops(self.target, views[: self.num_views])
        terms = [
            2 - 2 * F.cosine_similarity(p, z.detach(), dim=1).mean()
            for i, z in enumerate(targets)
            for v, p in enumerate(predictions)
            if v != i
        ]
        return torch.stack(terms).mean()

    def param_groups(self):
        online = nn.ModuleList([self.backbone, self.projector])
        return [*exclude_bias_and_norm(online), {"params": self.predictor.parameters(), "fixed_lr": True}]

    def momentum_pairs(self):
        return [([self.backbone, self.projector], self.target)]

    def on_before_step(self, ctx):
        for p in self.parameters():  # DINO's clip: each tensor's gradient norm at most `clip`
            if p.grad is not None:
                p.grad.mul_(torch.clamp(self.clip / (p.grad.norm() + 1e-6), max=1.0))
