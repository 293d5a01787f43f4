"""LeJEPA (Balestriero & LeCun, 2025): the views' projections predict the global views' centre, and SIGReg
keeps their distribution an isotropic Gaussian. No teacher, no stop-gradient, no predictor network.

    for x in loader:
        z_v = g(f(crop_v(x)))                             # every view v: 2 global, then 6 local crops
        mu = mean_g z_g                                   # the centre of the global views
        prediction = mean over v, n, k of (mu - z_v)^2    # every view predicts the centre
        A = S random unit directions [K, S], fresh each step, the same for every view
        regulariser = mean_v SIGReg(z_v; A)               # Epps-Pulley of z_v A against N(0, 1), mean over A
        loss = (1 - lambda) prediction + lambda regulariser
        AdamW step

f is the backbone (evaluated), g the projector MLP. SIGReg is sslbench.kit.losses.sigreg. Under DDP each
view's projections are gathered with gradient, so SIGReg's sample averages are over the whole batch, and
rank 0's directions are every rank's: the loss and gradient are those of one process on the whole batch.
"""

import torch

from sslbench.distributed import gather_with_grad
from sslbench.errors import ConfigError
from sslbench.kit.losses import centre_prediction, random_directions, sigreg
from sslbench.kit.method import Method, bn_mlp, embed_crops

CONFIG = "methods/lejepa/config.yaml"


class LeJEPA(Method):
    num_views = 2  # the global views: the centre is their mean
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        # MINIMAL.md's torchvision MLP: (Linear -> BatchNorm1d -> ReLU) into each hidden width, then Linear,
        # all with bias
        self.projector = bn_mlp([self.feature_dim, *p["projector"]], hidden_bias=True, output_bias=True)
        self.lamb = float(p["lamb"])
        if not 0 <= self.lamb <= 1:
            raise ConfigError(
                f"{CONFIG}: lamb weighs SIGReg against the prediction loss, in [0, 1]; got {self.lamb}"
            )
        self.num_slices, self.t_max, self.knots = int(p["num_slices"]), float(p["t_max"]), int(p["knots"])

    def training_loss(self, views, labels, indices):
        z = torch.stack(embed_crops(self.backbone, views, head=self.projector))  # [V, n, K]
        prediction = centre_prediction(z, self.num_views)
        everyone = gather_with_grad(z.transpose(0, 1)).transpose(0, 1)  # [V, N, K], the whole batch
        directions = random_directions(z.shape[-1], self.num_slices, z.device)  # rank 0's under DDP
        regulariser = torch.stack(
            [sigreg(z_v, directions, self.t_max, self.knots) for z_v in everyone]
        ).mean()
        return (1 - self.lamb) * prediction + self.lamb * regulariser
