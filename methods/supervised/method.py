"""Supervised cross-entropy: the baseline of SupContrast's main_ce.py.

    loss = CE(W f(aug(x)) + b, y)

f is the backbone (evaluated), W a linear classifier over the dataset's classes.
"""

import torch.nn.functional as F
from torch import nn

from sslbench.kit.method import Method


class Supervised(Method):
    num_views = 1
    needs_labels = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        self.classifier = nn.Linear(self.feature_dim, info.num_classes)

    def training_loss(self, views, labels, indices):
        if labels is None:
            raise ValueError(
                "supervised cross-entropy needs the class labels (needs_labels = True); got None"
            )
        return F.cross_entropy(self.classifier(self.backbone(views[0])), labels)
