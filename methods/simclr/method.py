"""SimCLR (Chen et al., 2020): two views, a projection MLP, NT-Xent.

z_i = normalize(g(f(aug_i(x))))   for the two views i = 1, 2 (one concatenated batch through f, g)
loss = NT-Xent(z_1, z_2; T)       # SupCon with no labels
"""

from sslbench.distributed import gather_with_grad
from sslbench.losses import supcon
from sslbench.method import Method, embed_views, projection_mlp


class SimCLR(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = projection_mlp(
            self.feature_dim, p["proj_hidden_dim"] or self.feature_dim, p["proj_dim"]
        )
        self.temperature = p["temperature"]

    def training_loss(self, views, labels, indices):
        z = embed_views(self.backbone, self.projector, views)  # [B, 2, D]
        z = gather_with_grad(z)  # under DDP: negatives from every rank, as SimCLR's cross-replica loss
        # NT-Xent has no T / base_T rescaling: base_temperature = temperature.
        return supcon(z, labels=None, temperature=self.temperature, base_temperature=self.temperature)
