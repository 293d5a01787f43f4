"""MoCo v3 (Chen, Xie, He, ICCV 2021), ResNet and ViT forms: a query network with a predictor contrasts
its output against the keys of a momentum encoder, the other images of the batch as negatives (no queue).

    f_q = predictor(projector(backbone))    # projector: 2-layer MLP (ViT: 3), BN on the output;
                                            # predictor: 2-layer MLP (ViT: BN on its output too)
    f_k = projector'(backbone'), no gradient  # a copy of backbone + projector, moved only by the EMA
    for x in loader:
        x1, x2 = aug1(x), aug2(x)           # blur p 1.0 / 0.1, solarisation p 0 / 0.2
        q1, q2 = f_q(x1), f_q(x2)           # one forward per view: each its own BN statistics
        k1, k2 = f_k(x1), f_k(x2)
        loss = ctr(q1, k2) + ctr(q2, k1)
        LARS step on f_q (biases and norms: no weight decay, no adaptation; ViT: AdamW, every parameter
        decayed, and with stop_grad_conv1 the random patch projection frozen)
        f_k <- m f_k + (1 - m) [backbone, projector],  m = 1 - (1 - m_0)(cos(pi k / K) + 1) / 2

    ctr(q, k) = 2 tau * CrossEntropy(normalize(q) normalize(gather(k))^T / tau, own key)

The ViT form (moco/builder.py MoCo_ViT, vits.py): ``proj_layers`` 3, ``pred_last_bn`` true, and
``stop_grad_conv1`` (``--stop-grad-conv1``) freezes the patch projection ``patch_embed.proj`` (weight and
bias) at its random initialisation; ``exclude_bias_and_norm`` false puts every parameter in one group with
the weight decay (main_moco.py's ``torch.optim.AdamW(model.parameters(), ...)``).

The keys of every rank are gathered without gradient (moco/builder.py concat_all_gather), so each
query's negatives are the other keys of the whole batch; the EMA is the engine's update of
``momentum_pairs()`` (``momentum_schedule: cosine``). The evaluated encoder is the query backbone.
"""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.losses import batch_info_nce
from sslbench.kit.method import Method, bn_mlp, exclude_bias_and_norm
from sslbench.kit.momentum import frozen_copy


class MoCoV3(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        hidden = [p["mlp_dim"]] * (p["proj_layers"] - 1)  # _build_mlp(num_layers, ...): 2 (ResNet), 3 (ViT)
        self.projector = bn_mlp([self.feature_dim, *hidden, p["dim"]], output_bn=True)
        self.predictor = bn_mlp([p["dim"], p["mlp_dim"], p["dim"]], output_bn=p["pred_last_bn"])
        if p["stop_grad_conv1"]:
            freeze_patch_projection(backbone, (cfg.get("backbone") or {}).get("name"))
        self.momentum_encoder = frozen_copy([self.backbone, self.projector])
        self.temperature = float(p["temperature"])
        self.exclude_bias_and_norm = bool(p["exclude_bias_and_norm"])

    def training_loss(self, views, labels, indices):
        q1, q2 = (self.predictor(self.projector(self.backbone(v))) for v in views)
        with torch.no_grad():
            k1, k2 = (self.momentum_encoder(v) for v in views)
        return self.contrastive_loss(q1, k2) + self.contrastive_loss(q2, k1)

    def contrastive_loss(self, q, k):
        """ctr(q, k): this rank's queries are rows rank * B .. (rank + 1) * B of the gathered batch."""
        keys = dist.gather(F.normalize(k, dim=1))
        first_row = dist.rank() * q.shape[0]
        return 2 * self.temperature * batch_info_nce(F.normalize(q, dim=1), keys, self.temperature, first_row)

    def param_groups(self):
        online = nn.ModuleList([self.backbone, self.projector, self.predictor])
        if self.exclude_bias_and_norm:  # moco/optimizer.py LARS: ndim <= 1 neither decayed nor adapted
            return exclude_bias_and_norm(online)
        return [{"params": [p for p in online.parameters() if p.requires_grad]}]  # AdamW(model.parameters())

    def momentum_pairs(self):
        return [([self.backbone, self.projector], self.momentum_encoder)]

    def projection_head(self):
        return self.projector


def freeze_patch_projection(backbone: nn.Module, name: str | None) -> None:
    """vits.py VisionTransformerMoCo with ``stop_grad_conv1``: the patch projection's weight and bias
    keep their random initialisation (requires_grad False). Only a Vision Transformer has one."""
    projection = getattr(getattr(backbone, "patch_embed", None), "proj", None)
    if not isinstance(projection, nn.Module) or not list(projection.parameters()):
        raise ConfigError(
            f"methods/mocov3/config.yaml: `stop_grad_conv1: true` freezes a Vision Transformer's patch "
            f"projection (patch_embed.proj); the backbone {name or type(backbone).__name__!r} has none. "
            "Use a ViT backbone (e.g. vit_small_patch16_224) or set stop_grad_conv1: false"
        )
    for parameter in projection.parameters():
        parameter.requires_grad_(False)
