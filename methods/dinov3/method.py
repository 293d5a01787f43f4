"""DINOv3's Gram anchoring (Simeoni et al., 2025) on DINOv2's step: late in training the student's patch
features are held, image by image, to the similarity structure of an earlier teacher's.

    DINOv2's student, teacher, masks and terms (kit.distill); G = copy(teacher's backbone), no gradient
    for step t:
        w_gram, w_local = schedules: 0 and 1 until the Gram phase starts, then (a cosine ramp) 2 and 0.5
        L_dino, L_koleo, L_ibot = DINOv2's terms, L_dino's local-crop pairs x w_local
        s = the student's patch tokens of the masked global crops                    # [2B, L, D], normed
        g = G(the global crops upsampled x gram_teacher_scale)'s patch tokens, resized bicubically to L
        L_gram = MSE(relu?(s_n s_n^T), relu?(g_n g_n^T)) per image, x_n = x / |x|       # [2B, L, L]
        loss = DINOv2's sum + w_gram L_gram
        DINOv2's update; at the phase's start G = teacher's backbone, then again every update_every steps
        from first_update, at most max_updates times

facebookresearch/dinov3 dinov3/loss/gram_loss.py (GramLoss), dinov3/train/ssl_meta_arch.py
(get_gram_teacher_output, compute_losses, gram_load_ema_teacher, update_gram), dinov3/train/train.py (when the
Gram teacher is loaded and refreshed), dinov3/train/cosine_lr_scheduler.py (linear_warmup_cosine_decay, the
weights' schedules) and dinov3/configs/train/dinov3_vit7b16_gram_anchor.yaml (the settings). The evaluated
encoder is the EMA teacher's backbone, as DINOv2's.
"""

import copy

import torch
import torch.nn.functional as F

from sslbench.kit.distill import MaskedSelfDistillation, warmup_cosine_value
from sslbench.kit.losses import GRAM_NEGATIVES, gram_loss
from sslbench.kit.momentum import freeze
from sslbench.kit.vit import masked_tokens


class DINOv3GramAnchoring(MaskedSelfDistillation):
    config_file = "methods/dinov3/config.yaml"

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.check_choice(p, "gram_negatives", GRAM_NEGATIVES)
        # ssl_meta_arch.py's gram_teacher: a backbone alone, loaded from the EMA teacher as the phase starts
        self.gram_teacher = freeze(copy.deepcopy(self.teacher[0]))
        self.gram_end, self.local_end = float(p["gram_loss_weight"]), float(p["local_loss_weight_end"])
        # when, as shares of the run's steps (the official iterations over its 1.2M)
        self.start, self.ramp = float(p["gram_start"]), float(p["gram_ramp"])
        self.first_update, self.update_every = float(p["gram_first_update"]), float(p["gram_update_every"])
        self.max_updates = int(p["gram_max_updates"])
        self.teacher_scale, self.negatives = int(p["gram_teacher_scale"]), p["gram_negatives"]
        self.gram_weight, self.local_weight = 0.0, 1.0

    def training_loss(self, views, labels, indices):
        terms = self.distillation_terms(views, local_weight=self.local_weight)
        loss = self.weighted_sum(terms)
        if self.gram_weight == 0:  # before the phase: DINOv2's loss (the official adds the term x 0)
            return loss
        targets = self.gram_targets(torch.cat(views[: self.num_views]))
        return loss + self.gram_weight * gram_loss(terms.student_tokens[:, 1:], targets, self.negatives)

    @torch.no_grad()
    def gram_targets(self, crops: torch.Tensor) -> torch.Tensor:
        """[2B, L, D]: the Gram teacher's patch tokens (after the final norm) of the unmasked global crops
        upsampled x gram_teacher_scale (bicubic), brought back to the student's grid by a bicubic resize
        (align_corners false, no antialias: gram.global_teacher_resize_method / _antialias)."""
        if self.teacher_scale == 1:
            return masked_tokens(self.gram_teacher, crops)[:, 1:]
        crops = F.interpolate(crops, scale_factor=self.teacher_scale, mode="bicubic", align_corners=False)
        patches = masked_tokens(self.gram_teacher, crops)[:, 1:]  # [2B, (s g)^2, D]
        side = self.grid * self.teacher_scale
        grid = patches.transpose(1, 2).unflatten(-1, (side, side))
        grid = F.interpolate(grid, size=(self.grid, self.grid), mode="bicubic", align_corners=False)
        return grid.flatten(-2).transpose(1, 2)

    @torch.no_grad()
    def anchor(self, step: int, total_steps: int) -> None:
        """The weights at `step` (linear_warmup_cosine_decay: their start values until the phase, a cosine
        over gram_ramp to their end values, then those), and the Gram teacher loaded from the EMA teacher
        before the phase's first step (gram_load_ema_teacher) and after each step that is a multiple of
        gram_update_every from gram_first_update on, gram_max_updates times (train.py's update_gram). A
        function of the step alone, so that a resumed run repeats it."""
        start, ramp = int(self.start * total_steps), int(self.ramp * total_steps)
        self.gram_weight = warmup_cosine_value(step, 0.0, 0.0, self.gram_end, start, ramp)
        self.local_weight = warmup_cosine_value(step, 1.0, 1.0, self.local_end, start, ramp)
        first, every = int(self.first_update * total_steps), max(1, int(self.update_every * total_steps))
        done = (step - 1) // every - (first - 1) // every if step > first else 0  # updates before this step
        refresh = step >= first and step % every == 0 and done < self.max_updates
        if step == start or refresh:
            self.gram_teacher.load_state_dict(self.teacher[0].state_dict())

    def on_epoch_start(self, ctx):
        super().on_epoch_start(ctx)
        self.anchor(ctx.step, ctx.num_epochs * ctx.steps_per_epoch)
        ctx.log["gram_weight"] = self.gram_weight

    def on_step_end(self, ctx):
        super().on_step_end(ctx)
        self.anchor(ctx.step, ctx.num_epochs * ctx.steps_per_epoch)
