"""SimSiam (Chen & He, CVPR 2021): a siamese network whose stop-gradient alone prevents collapse;
no negatives, no momentum encoder.

    z = g(f(x))                        # backbone f, projector g (3 layers, BN on the output)
    p = h(z)                           # predictor h (bottleneck MLP)
    for x in loader:
        v1, v2 = aug(x), aug(x)        # MoCo v2's views
        z1, z2 = g(f(v1)), g(f(v2))    # one forward per view: each its own BN statistics
        p1, p2 = h(z1), h(z2)
        loss = D(p1, sg(z2)) / 2 + D(p2, sg(z1)) / 2,   D(p, z) = -cos(p, z), averaged over the batch
        SGD step; the predictor's lr stays at its initial value (--fix-pred-lr)

The evaluated encoder is the backbone f.
"""

from sslbench.kit.losses import negative_cosine
from sslbench.kit.method import Method, bn_mlp


class SimSiam(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        hidden = p["proj_hidden_dim"] or self.feature_dim  # builder.py: prev_dim, the feature dim
        # builder.py: [Linear (no bias) -> BN -> ReLU] x (layers - 1), Linear, BN(affine=False). The
        # last Linear's bias exists there but is frozen at its initial value; the BN after it removes
        # any constant, so a Linear without bias computes the same.
        self.projector = bn_mlp(
            [self.feature_dim] + [hidden] * (p["proj_layers"] - 1) + [p["dim"]], output_bn=True
        )
        self.predictor = bn_mlp([p["dim"], p["pred_dim"], p["dim"]], output_bias=True)
        self.fix_pred_lr = bool(p["fix_pred_lr"])

    def training_loss(self, views, labels, indices):
        z1, z2 = self.projector(self.backbone(views[0])), self.projector(self.backbone(views[1]))
        p1, p2 = self.predictor(z1), self.predictor(z2)
        return (negative_cosine(p1, z2.detach()) + negative_cosine(p2, z1.detach())) / 2

    def param_groups(self):
        encoder = [*self.backbone.parameters(), *self.projector.parameters()]
        return [
            {"params": [p for p in encoder if p.requires_grad]},
            {"params": self.predictor.parameters(), "fixed_lr": self.fix_pred_lr},
        ]
