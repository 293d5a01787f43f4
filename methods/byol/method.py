"""BYOL (Grill et al., NeurIPS 2020): the online network predicts the projection a slow-moving
target network makes of the other view; no negatives.

    online:  q = h(g(f(x)))                 # backbone f, projector g, predictor h (MLPs with BN)
    target:  z' = g'(f'(x)), no gradient    # initialised on its own, moved only by the EMA
    for x in loader:
        v1, v2 = aug1(x), aug2(x)           # blur p 1.0 / 0.1, solarisation p 0 / 0.2
        q1, q2 = online(v1), online(v2)     # one forward per view: each its own BN statistics
        z1', z2' = target(v1), target(v2)   # in train mode (batch statistics), as the official code
        loss = mean_b [ l(q1, sg(z2')) + l(q2, sg(z1')) ],   l(p, z) = 2 - 2 cos(p, z)
        LARS step on the online network (biases and norms: no weight decay, no adaptation)
        target <- tau target + (1 - tau) online,  tau = 1 - (1 - tau_base)(cos(pi k / K) + 1) / 2

The last line is the engine's momentum update of ``momentum_pairs()`` (``momentum_schedule: cosine``).
The evaluated encoder is the online backbone f.
"""

import torch
from torch import nn

from sslbench.backbones import backbone_from_config
from sslbench.errors import ConfigError
from sslbench.kit.losses import cosine_regression
from sslbench.kit.method import Method, bn_mlp, exclude_bias_and_norm
from sslbench.kit.momentum import freeze, frozen_copy


class BYOL(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        projector_dims = [self.feature_dim, p["proj_hidden_dim"], p["proj_dim"]]
        self.projector = bn_mlp(projector_dims, hidden_bias=True)  # networks.py MLP
        self.predictor = bn_mlp([p["proj_dim"], p["pred_hidden_dim"], p["proj_dim"]], hidden_bias=True)
        # byol_experiment.py _make_initial_state gives the target its own random draw (`own`: the same
        # architecture built again); `copy` starts it as the online network (the default's choice).
        if p["target_init"] == "own":
            target_backbone = backbone_from_config(cfg, info.channels, info.image_size)
            self.target = freeze(nn.Sequential(target_backbone, bn_mlp(projector_dims, hidden_bias=True)))
        elif p["target_init"] == "copy":
            self.target = frozen_copy([self.backbone, self.projector])
        else:
            raise ConfigError(f"config key `target_init` must be own or copy, got {p['target_init']!r}")

    def online(self, view):
        return self.predictor(self.projector(self.backbone(view)))

    def training_loss(self, views, labels, indices):
        q1, q2 = self.online(views[0]), self.online(views[1])
        with torch.no_grad():
            z1, z2 = self.target(views[0]), self.target(views[1])
        return cosine_regression(q1, z2) + cosine_regression(q2, z1)

    def param_groups(self):
        return exclude_bias_and_norm(nn.ModuleList([self.backbone, self.projector, self.predictor]))

    def momentum_pairs(self):
        return [([self.backbone, self.projector], self.target)]
