"""RotNet (Gidaris et al., ICLR 2018): predict which of four rotations (0, 90, 180, 270 degrees) an
image was given. Every image of the batch is shown in all four rotations at once, as the official
code (gidariss/FeatureLearningRotNet) does."""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench.kit.method import Method


class RotNet(Method):
    num_views = 1

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        self.classifier = nn.Linear(self.feature_dim, cfg["params"]["num_rotations"])
        self.num_rotations = cfg["params"]["num_rotations"]

    def training_loss(self, views, labels, indices):
        x = views[0]
        rotated = torch.cat([torch.rot90(x, k, dims=(2, 3)) for k in range(self.num_rotations)])
        targets = torch.arange(self.num_rotations, device=x.device).repeat_interleave(len(x))
        return F.cross_entropy(self.classifier(self.backbone(rotated)), targets)
