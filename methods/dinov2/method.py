"""DINOv2 (Oquab et al., TMLR 2024): DINO's self-distillation of the class token and iBOT's of the masked
patches, with the KoLeo regulariser on the student's class tokens, the teacher centred by a running mean or by
Sinkhorn-Knopp, and layer-wise lr decay in pretraining.

    student = (vit, dino_head, ibot_head); teacher = copy(student), no gradient; c, c2 = 0 (the centres)
    for x in loader:
        m = block-wise masks of the global crops: half of them masked, shares in equal bins of [0.1, 0.5]
        s = student(global crops with m's patches replaced by a mask token)     # class and patch tokens
        s_v = student(local crop_v(x))                                           # the class token only
        t = teacher(global crops)                                                # no mask
        p = centre(dino_head(t.cls)), q = centre(ibot_head(t.patches[m]))        # softmax((. - c) / tau_t),
                                                                                 # or Sinkhorn-Knopp
        L_dino = mean over (i, v != i) of CE(p_i, softmax(dino_head(s_v.cls) / tau_s))
        L_ibot = mean over images of the mean over its masked patches of
                 CE(q, softmax(ibot_head(s.patches[m]) / tau_s))
        L_koleo = sum over the 2 global crops of KoLeo(s.cls of that crop)
        loss = w_dino L_dino + w_koleo L_koleo + w_ibot L_ibot
        clip each student module's gradient norm; no last-layer update in the first epoch
        AdamW step, each parameter's lr x layer_decay ** (L + 1 - its layer) (x 0.2 for the patch embedding)
        teacher = l teacher + (1 - l) student                                    # l cosine from 0.992 to 1

facebookresearch/dinov2 dinov2/train/ssl_meta_arch.py (forward_backward, get_params_groups),
dinov2/train/train.py (the schedules, clipping), dinov2/loss/ (dino_clstoken_loss.py, ibot_patch_loss.py,
koleo_loss.py), dinov2/data/collate.py and masking.py, dinov2/utils/param_groups.py and
dinov2/configs/ssl_default_config.yaml. The evaluated encoder is the teacher's backbone. The step's pieces
(masks, teacher, targets, terms, parameter groups, clipping) are the kit's `MaskedSelfDistillation`, which
DINOv3's Gram anchoring builds on.
"""

from sslbench.kit.distill import MaskedSelfDistillation


class DINOv2(MaskedSelfDistillation):
    config_file = "methods/dinov2/config.yaml"

    def training_loss(self, views, labels, indices):
        return self.weighted_sum(self.distillation_terms(views))
