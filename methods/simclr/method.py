"""SimCLR (Chen et al., 2020): two views, a projection MLP, NT-Xent.

    z_i = normalize(g(f(aug_i(x))))   for the two views i = 1, 2
    loss = NT-Xent(z_1, z_2; T)       # SupCon with no labels
"""
import torch
import torch.nn.functional as F

from sslbench.distributed import gather_with_grad
from sslbench.losses import supcon
from sslbench.method import Method, projection_mlp


class SimCLR(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = projection_mlp(self.feature_dim, p["proj_hidden_dim"] or self.feature_dim, p["proj_dim"])
        self.temperature = p["temperature"]

    def training_loss(self, views, labels, indices):
        z = torch.stack([F.normalize(self.projector(self.backbone(v)), dim=1) for v in views], dim=1)
        z = gather_with_grad(z)  # under DDP: negatives from every rank, as SimCLR's cross-replica loss
        # NT-Xent has no T / base_T rescaling: base_temperature = temperature.
        return supcon(z, labels=None, temperature=self.temperature, base_temperature=self.temperature)
