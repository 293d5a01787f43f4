"""SupCon (Khosla et al., 2020): supervised contrastive learning on two views.

    z_i = normalize(g(f(aug_i(x))))           for the two views i = 1, 2 (one concatenated batch)
    loss = SupCon([z_1, z_2], y; T, T_base)    # positives: every other view of the same class,
                                               # over the whole batch (every rank's, under DDP)

f is the backbone (evaluated), g the 'mlp' head of SupContrast's resnet_big.py
(Linear(d, d) - ReLU - Linear(d, 128)). The classifier stage of the paper is our
linear protocol, run on f's features.
"""

from sslbench.distributed import gather, gather_with_grad
from sslbench.kit.losses import supcon
from sslbench.kit.method import Method, embed_views, projection_mlp


class SupCon(Method):
    num_views = 2
    needs_labels = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = projection_mlp(
            self.feature_dim, p["proj_hidden_dim"] or self.feature_dim, p["proj_dim"]
        )
        self.temperature = p["temperature"]
        self.base_temperature = p["base_temperature"]

    def training_loss(self, views, labels, indices):
        if labels is None:
            raise ValueError(
                "SupCon needs the class labels of the batch (needs_labels = True); got labels=None"
            )
        # Under DDP: one loss over the whole batch, every rank's views and labels (as SupContrast's one
        # process); the gradient flows back to this rank's part.
        z = gather_with_grad(embed_views(self.backbone, self.projector, views))  # [B, 2, D]
        return supcon(z, gather(labels), temperature=self.temperature, base_temperature=self.base_temperature)
