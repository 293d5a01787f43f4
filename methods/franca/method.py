"""Franca (Venkataramanan et al., 2025): DINOv2's masked self-distillation with nested (Matryoshka) heads,
each width of the class token's and the patches' heads its own clustering, and masks that hide all but one
rolled block.

    student = (vit, dino_head, ibot_head), each head one head per width d in D/16, D/8, D/4, D/2, D
    teacher = copy(student), no gradient
    for x in loader:
        m = masks of the global crops: half of them masked (shares in equal bins of [0.1, 0.65]), each every
            patch but one rectangle, the grid then rolled by a random offset
        s, s_v, t = DINOv2's student (masked global crops), local crops and teacher (unmasked global crops)
        for each width d:                                      # the heads' levels
            p_d = SK(dino_head_d(t.cls)), q_d = SK(ibot_head_d(t.patches[m]))      # Sinkhorn-Knopp per level
            L_dino += DINOv2's class-token term of level d; L_ibot += its masked-patch term of level d
        L_koleo = sum over the 2 global crops of KoLeo(s.cls of that crop)
        loss = L_dino + 0.1 L_koleo + L_ibot
        DINOv2's update (clipping, frozen last layers, layer-decayed AdamW, the teacher's EMA)

valeoai/Franca franca/train/ssl_meta_arch.py (forward_backward), franca/layers/mrl_dino_head.py (MRLDINOHead),
franca/loss/mrl_dino_loss.py and mrl_ibot_patch_loss.py (the levels' Sinkhorn-Knopp and sums),
franca/data/masking.py (InverseBlockMasking with roll), franca/data/collate.py, franca/train/train.py and
franca/configs/ (ssl_default_config.yaml, train/IN21K/*.yaml). The rest of the step is DINOv2's, the kit's
`MaskedSelfDistillation`. The evaluated encoder is the teacher's backbone.
"""

from sslbench.errors import ConfigError
from sslbench.kit.distill import MaskedSelfDistillation
from sslbench.kit.method import MatryoshkaDINOHead
from sslbench.kit.vit import inverse_block_mask, rolled_block_mask


class Franca(MaskedSelfDistillation):
    config_file = "methods/franca/config.yaml"

    def __init__(self, backbone, info, cfg):
        p = cfg["params"]
        d, divisors = int(backbone.num_features), list(p["nesting_divisors"])
        widths = [p["out_dim"], p["ibot_out_dim"], d]
        if (
            divisors[-1:] != [1]
            or divisors != sorted(set(divisors), reverse=True)
            or any(n % k for n in widths for k in divisors)
        ):
            raise ConfigError(
                f"{self.config_file}: nesting_divisors must decrease to 1 and divide the backbone's width "
                f"{d}, out_dim and ibot_out_dim, got {divisors}"
            )
        super().__init__(backbone, info, cfg)
        self.inverse, self.roll = bool(p["inverse_block"]), bool(p["roll"])

    def build_head(self, p, out_dim):
        """MRLDINOHead on the nesting list [D / 16, D / 8, D / 4, D / 2, D] of ssl_meta_arch.py."""
        nesting = [self.feature_dim // k for k in p["nesting_divisors"]]
        return MatryoshkaDINOHead(self.feature_dim, out_dim, p["hidden_dim"], p["bottleneck_dim"], 3, nesting)

    def mask(self, count, rng):
        """train.py's MaskingGenerator with use_block_masking: InverseBlockMasking (or BlockMasking)."""
        draw = inverse_block_mask if self.inverse else rolled_block_mask
        return draw(self.grid, self.grid, count, self.log_aspect, rng, roll=self.roll)

    def training_loss(self, views, labels, indices):
        return self.weighted_sum(self.distillation_terms(views))
