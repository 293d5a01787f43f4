"""VICReg (Bardes, Ponce, LeCun, ICLR 2022): variance-invariance-covariance regularisation.

    x, y = expander(backbone(view1)), expander(backbone(view2))
    invariance = mean squared error between x and y
    variance   = (mean_d relu(1 - std_d(x)) + mean_d relu(1 - std_d(y))) / 2    # std with eps 1e-4
    covariance = sum_{i != j} C(x)_ij^2 / D + sum_{i != j} C(y)_ij^2 / D
    loss = 25 invariance + 25 variance + 1 covariance
    LARS: weights adapted and decayed; biases and BN parameters neither

Under DDP x and y are gathered with gradient (main_vicreg.py's FullGatherLayer), so the variance and
covariance are those of the whole batch and the loss and gradient those of one process.
"""

import torch.nn.functional as F

from sslbench.distributed import gather_with_grad
from sslbench.kit.losses import covariance_penalty, variance_hinge
from sslbench.kit.method import Method, bn_mlp, exclude_bias_and_norm


class VICReg(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.expander = bn_mlp([self.feature_dim, *p["expander"]], hidden_bias=True)
        self.sim_coeff, self.std_coeff, self.cov_coeff = (
            float(p[k]) for k in ("sim_coeff", "std_coeff", "cov_coeff")
        )

    def training_loss(self, views, labels, indices):
        x = self.expander(self.backbone(views[0]))  # one forward per view, as main_vicreg.py
        y = self.expander(self.backbone(views[1]))
        x, y = gather_with_grad(x), gather_with_grad(y)
        invariance = F.mse_loss(x, y)  # float32 under autocast (torch's autocast lists mse_loss)
        variance = (variance_hinge(x) + variance_hinge(y)) / 2
        covariance = covariance_penalty(x) + covariance_penalty(y)
        return self.sim_coeff * invariance + self.std_coeff * variance + self.cov_coeff * covariance

    def param_groups(self):  # main_vicreg.py: one lr; biases and BN neither decayed nor adapted
        return exclude_bias_and_norm(self)
