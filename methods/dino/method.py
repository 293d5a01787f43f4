"""DINO (Caron et al., ICCV 2021), ResNet and ViT forms: self-distillation with no labels, with multi-crop.

    student = head(backbone); teacher = copy(student), no gradient; c = 0 (the centre)
    for x in loader:
        s_v = student(crop_v(x))                          # every crop: 2 global, then local crops
        t_i = teacher(crop_i(x))                          # the 2 global crops only
        p_i = softmax((t_i - c) / tau_t(epoch))           # centred, sharpened; tau_t warms up per epoch
        loss = mean over (i, v != i) of CE(p_i, softmax(s_v / tau_s))
        c = m c + (1 - m) mean(t)                         # the teacher's mean output (all ranks), m = 0.9
        clip each gradient tensor's norm to clip_grad; drop the last layer's gradient in the first epoch
        SGD (ViT: AdamW) step on the student
        teacher = l teacher + (1 - l) student             # the engine's EMA, l cosine from 0.996 to 1

head: MLP (Linear-GELU, x2, Linear to the bottleneck), L2-normalise, weight-normalised linear layer
without bias (its norms fixed at 1: norm_last_layer). The evaluated encoder is the teacher's backbone,
as eval_knn.py and eval_linear.py evaluate (--checkpoint_key teacher).

The ViT form is the same method on a timm ViT (the backbone's ``args``: ``drop_path_rate`` 0.1 for the
student); main_dino.py builds the teacher without drop path, so the teacher copy's DropPath layers are
set to 0 (stochastic depth only ever drops in the student's forward).
"""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.health import distribution_health
from sslbench.kit.losses import cross_view_cross_entropy
from sslbench.kit.method import DINOHead, Method, clip_each_gradient, embed_crops, exclude_bias_and_norm
from sslbench.kit.momentum import frozen_copy, without_drop_path

CONFIG = "methods/dino/config.yaml"


class DINO(Method):
    num_views = 2  # the global crops, the teacher's only input
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        if p["num_layers"] < 2:
            raise ConfigError(
                f"{CONFIG}: num_layers must be >= 2 (the ResNet recipe's 3), got {p['num_layers']}"
            )
        self.head = DINOHead(
            self.feature_dim,
            p["out_dim"],
            p["hidden_dim"],
            p["bottleneck_dim"],
            p["num_layers"],
            p["use_bn_in_head"],
            p["norm_last_layer"],
        )
        # starts as the student, moved by EMA; main_dino.py builds the teacher without drop path
        self.teacher = without_drop_path(frozen_copy([self.backbone, self.head]))
        self.register_buffer("center", torch.zeros(1, p["out_dim"]))
        self.student_temp, self.center_momentum = float(p["student_temp"]), float(p["center_momentum"])
        self.teacher_temps = (float(p["warmup_teacher_temp"]), float(p["teacher_temp"]))
        self.warmup_teacher_temp_epochs = int(p["warmup_teacher_temp_epochs"])
        self.clip_grad, self.freeze_last_layer = float(p["clip_grad"]), int(p["freeze_last_layer"])
        self.teacher_temp = self.teacher_temperature(0)

    def teacher_temperature(self, epoch: int) -> float:
        """DINOLoss's schedule: linspace(warmup_teacher_temp, teacher_temp, warmup epochs) per epoch,
        then teacher_temp."""
        start, end = self.teacher_temps
        warmup = self.warmup_teacher_temp_epochs
        if epoch >= warmup:
            return end
        return start + (end - start) * epoch / max(1, warmup - 1)

    def training_loss(self, views, labels, indices):
        with torch.no_grad():
            teacher_out = self.teacher(torch.cat(views[: self.num_views]))  # one size: one forward
        student_out = embed_crops(self.backbone, views, head=self.head)
        targets = F.softmax((teacher_out - self.center) / self.teacher_temp, dim=-1).chunk(self.num_views)
        loss = cross_view_cross_entropy(targets, student_out, self.student_temp)
        self.update_center(teacher_out)
        return loss

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """c <- m c + (1 - m) x the mean teacher output over every rank's global crops."""
        batch_center = dist.all_reduce_sum(teacher_out.float().sum(dim=0, keepdim=True))
        batch_center /= teacher_out.shape[0] * dist.world_size()
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)

    def param_groups(self):  # utils.get_params_groups: no weight decay on biases and 1-D tensors
        return exclude_bias_and_norm(nn.ModuleList([self.backbone, self.head]))

    def encoder(self):
        return self.teacher[0]

    def projection_head(self):  # the teacher's, on the teacher backbone that encoder() evaluates
        return self.teacher[1].mlp

    @torch.no_grad()
    def health(self, forward_train_set):
        """The teacher's centred, sharpened output on the train split (the monitors'): its mean
        entropy (log K when it collapses to uniform) and how many of its K outputs the images'
        argmaxes use (1 when it collapses to one)."""

        mean_entropy, usage = distribution_health(
            forward_train_set,
            lambda x: F.softmax((self.teacher(x).float() - self.center) / self.teacher_temp, dim=-1),
            self.center.shape[1],
        )
        return {"teacher_entropy": mean_entropy, "teacher_usage": usage}

    def momentum_pairs(self):
        return [([self.backbone, self.head], self.teacher)]

    def on_epoch_start(self, ctx):
        self.teacher_temp = self.teacher_temperature(ctx.epoch)
        ctx.log["teacher_temp"] = self.teacher_temp

    def on_before_step(self, ctx):
        if self.clip_grad > 0:  # utils.clip_gradients: each tensor's own norm, not a global one
            clip_each_gradient([*self.backbone.parameters(), *self.head.parameters()], self.clip_grad)
        if ctx.epoch < self.freeze_last_layer:  # cancel_gradients_last_layer: no update, no decay
            for p in self.head.last_layer.parameters():
                p.grad = None
