"""VISReg (Wu, Balestriero, Levine, 2026): LeJEPA's prediction loss with SIGReg replaced by three decoupled
regularisers of each view's batch: its mean to 0, each dimension's spread to 1, and its shape, sketched on
random directions, to a standard normal's.

    for x in loader:
        z_v = g(f(crop_v(x)))                             # every view: the global crops, then any local
        prediction = mean over v, n, k of (mean_g z_g - z_v)^2
        A = S random unit directions [K, S], fresh each step, the same for every view
        centre_v, scale_v, shape_v = VISReg terms of z_v  # mean^2; (std - 1)^2; sorted (z_v - mean) / sg(std)
                                                          # A against the normal quantiles
        loss = (1 - lambda) prediction + lambda mean_v (centre_v + scale_v + shape_v)
        clip the gradients' total norm; AdamW step

f is the backbone (evaluated), g the projector MLP. The terms are sslbench.kit.losses.visreg_terms. Under DDP
each view's projections are gathered with gradient and rank 0's directions are every rank's, so the loss and
gradient are those of one process on the whole batch.
"""

import torch
from torch import nn

from sslbench.distributed import gather_with_grad
from sslbench.errors import ConfigError
from sslbench.kit.losses import centre_prediction, random_directions, visreg_terms
from sslbench.kit.method import Method, bn_mlp, embed_crops, exclude_bias_and_norm

CONFIG = "methods/visreg/config.yaml"


class VISReg(Method):
    num_views = 4  # the global views (configs/*.yaml n_global): the centre is their mean
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.num_views = int(p["global_views"])
        # vit_encoder.py's torchvision MLP: (Linear -> BatchNorm1d -> ReLU) into each hidden width, then
        # Linear, all with bias
        self.projector = bn_mlp([self.feature_dim, *p["projector"]], hidden_bias=True, output_bias=True)
        self.lamb = float(p["lamb"])
        if not 0 <= self.lamb <= 1:
            raise ConfigError(
                f"{CONFIG}: lamb weighs the regularisers against the prediction, in [0, 1]; got {self.lamb}"
            )
        self.num_slices, self.clip_grad = int(p["num_slices"]), float(p["clip_grad"])

    def training_loss(self, views, labels, indices):
        z = torch.stack(embed_crops(self.backbone, views, head=self.projector))  # [V, n, K]
        prediction = centre_prediction(z, self.num_views)
        everyone = gather_with_grad(z.transpose(0, 1)).transpose(0, 1)  # [V, N, K], the whole batch
        directions = random_directions(z.shape[-1], self.num_slices, z.device)  # rank 0's under DDP
        regulariser = torch.stack([sum(visreg_terms(z_v, directions)) for z_v in everyone]).mean()
        return (1 - self.lamb) * prediction + self.lamb * regulariser

    def param_groups(self):  # utils.get_parameter_groups: no weight decay on biases and 1-D tensors
        return exclude_bias_and_norm(self)

    def on_before_step(self, ctx):  # train.py: clip_grad_norm_(net.parameters(), clip_grad_norm)
        if self.clip_grad > 0:
            nn.utils.clip_grad_norm_(self.parameters(), self.clip_grad)
