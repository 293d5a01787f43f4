"""iBOT (Zhou, Wei, Wang, Shen, Xie, Yuille, Kong, ICLR 2022): image BERT pre-training with an online
tokenizer. DINO's self-distillation of the class token across views, plus masked image modelling: the
student sees its global views with block-wise masks and predicts, at every masked patch, the teacher's
output for that patch of the unmasked view.

    student = head(vit); teacher = copy(student), no gradient; c, c2 = 0 (the centres)
    for x in loader:
        m_i = block-wise mask of each global view (of a random share of its patches, 0 for some images)
        s_i = student(crop_i(x) with m_i's patches replaced by a mask token)   # every token, head on each
        s_v = student(local crop_v(x))                                        # the class token only
        t_i = teacher(crop_i(x))                                              # every token, no mask
        p_i = softmax((t_i[cls] - c) / tau_t), q_i = softmax((t_i[patches] - c2) / tau_t2)
        L_cls = mean over (i, v != i) of CE(p_i, softmax(s_v[cls] / tau_s))            # DINO's
        L_mim = mean over i, images and each image's masked patches of CE(q_i, softmax(s_i / tau_s))
        loss = lambda1 L_cls + lambda2 L_mim; c, c2 <- 0.9 c + 0.1 means of the teacher's outputs (all ranks)
        clip each gradient tensor's norm; drop the last layer's gradient in the first epoch; AdamW step
        teacher = l teacher + (1 - l) student                                 # l cosine from 0.996 to 1

bytedance/ibot main_ibot.py (iBOTLoss, train_one_epoch), models/head.py (iBOTHead with shared_head: one
head for the class and the patch tokens), models/vision_transformer.py (mask_model: the masked patches'
embeddings replaced by a learned token), loader.py (ImageFolderMask: the block-wise masks). The evaluated
encoder is the teacher's backbone (the released checkpoints' `teacher`).
"""

import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.health import distribution_health
from sslbench.kit.losses import cross_view_cross_entropy, masked_patch_cross_entropy
from sslbench.kit.method import DINOHead, Method, clip_each_gradient, embed_crops, exclude_bias_and_norm
from sslbench.kit.momentum import frozen_copy
from sslbench.kit.vit import block_mask, check_masked_vit, masked_tokens

CONFIG = "methods/ibot/config.yaml"


class IBOT(Method):
    num_views = 2  # the global crops, the teacher's only input and the only ones masked
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.patch = check_masked_vit(backbone, cfg, info, "iBOT")
        self.grid = info.image_size // self.patch
        self.head = DINOHead(  # shared_head: the class and the patch tokens through one head
            self.feature_dim,
            p["out_dim"],
            p["hidden_dim"],
            p["bottleneck_dim"],
            num_layers=3,
            use_bn=False,
            norm_last_layer=p["norm_last_layer"],
        )
        self.mask_token = nn.Parameter(torch.zeros(1, 1, self.feature_dim))  # masked_embed: zeros
        self.teacher = frozen_copy([self.backbone, self.head])
        self.register_buffer("center", torch.zeros(1, p["out_dim"]))
        self.register_buffer("center2", torch.zeros(1, 1, p["out_dim"]))
        self.student_temp, self.center_momentum = float(p["student_temp"]), float(p["center_momentum"])
        self.teacher_temps = (float(p["warmup_teacher_temp"]), float(p["teacher_temp"]))
        self.patch_temps = (float(p["warmup_teacher_patch_temp"]), float(p["teacher_patch_temp"]))
        self.warmup_teacher_temp_epochs = int(p["warmup_teacher_temp_epochs"])
        self.lambda1, self.lambda2 = float(p["lambda1"]), float(p["lambda2"])
        self.pred_ratio, self.pred_ratio_var = list(p["pred_ratio"]), list(p["pred_ratio_var"])
        if len(self.pred_ratio_var) == 1:  # ImageFolderMask: one spread for every ratio
            self.pred_ratio_var *= len(self.pred_ratio)
        if len(self.pred_ratio_var) != len(self.pred_ratio):
            raise ConfigError(
                f"{CONFIG}: pred_ratio_var has {len(self.pred_ratio_var)} values for {len(self.pred_ratio)} "
                "pred_ratio values; give one spread, or one per ratio"
            )
        for ratio, var in zip(self.pred_ratio, self.pred_ratio_var):
            if ratio < var:  # get_pred_ratio's assert
                raise ConfigError(
                    f"{CONFIG}: pred_ratio {ratio} is below its pred_ratio_var {var}; the share drawn, "
                    "uniform in ratio ± var, must not go below 0"
                )
        self.log_aspect = (math.log(p["pred_aspect_ratio"][0]), math.log(p["pred_aspect_ratio"][1]))
        self.clip_grad, self.freeze_last_layer = float(p["clip_grad"]), int(p["freeze_last_layer"])
        self.temps = self.temperatures(0)

    def temperatures(self, epoch: int) -> tuple[float, float]:
        """iBOTLoss's teacher_temp_schedule and teacher_temp2_schedule (mim_start_epoch 0): each
        linspace(warm-up, final, warm-up epochs) per epoch, then the final value."""
        warmup = self.warmup_teacher_temp_epochs
        if epoch >= warmup:
            return self.teacher_temps[1], self.patch_temps[1]
        share = epoch / max(1, warmup - 1)
        return tuple(start + (end - start) * share for start, end in (self.teacher_temps, self.patch_temps))

    def training_loss(self, views, labels, indices):
        globals_, locals_ = views[: self.num_views], views[self.num_views :]
        masks = self.draw_masks(globals_[0].shape[0], globals_[0].device)  # [2B, h, w]
        with torch.no_grad():
            teacher = self.teacher[1](masked_tokens(self.teacher[0], torch.cat(globals_)))
        student = self.head(masked_tokens(self.backbone, torch.cat(globals_), masks, self.mask_token))
        student_cls = list(student[:, 0].chunk(self.num_views))
        if locals_:  # the local crops' class tokens (masked_im_modeling off for them)
            student_cls += embed_crops(self.backbone, locals_, head=self.head)
        cls_temp, patch_temp = self.temps
        targets = F.softmax((teacher[:, 0] - self.center) / cls_temp, dim=-1).chunk(self.num_views)
        loss_cls = cross_view_cross_entropy(targets, student_cls, self.student_temp)
        patch_targets = F.softmax((teacher[:, 1:] - self.center2) / patch_temp, dim=-1).chunk(self.num_views)
        patch_logits = (student[:, 1:] / self.student_temp).chunk(self.num_views)
        flat_masks = masks.flatten(1).chunk(self.num_views)
        loss_mim = (
            sum(
                masked_patch_cross_entropy(q[m], s[m], m)
                for q, s, m in zip(patch_targets, patch_logits, flat_masks)
            )
            / self.num_views
        )
        self.update_centers(teacher)
        return self.lambda1 * loss_cls + self.lambda2 * loss_mim

    @torch.no_grad()
    def draw_masks(self, batch: int, device) -> torch.Tensor:
        """[num_views x batch, h, w] bool: ImageFolderMask's block-wise mask of every global view of this
        rank's images (view-major), each of a share of the patches drawn per mask: one of `pred_ratio`'s
        values (each uniform within its `pred_ratio_var`), 0 masking none. The whole batch's masks are drawn
        from rank 0's seed, so that 2 processes compute what one computes on the whole batch (the official
        loader draws per image in its workers)."""
        seed = int(dist.broadcast(torch.randint(0, 2**31 - 1, (1,), device=device))[0])
        rng = random.Random(seed)
        everyone = batch * dist.world_size()
        masks = torch.stack(
            [
                torch.stack(
                    [
                        block_mask(self.grid, self.grid, self.draw_count(rng), self.log_aspect, rng)
                        for _ in range(everyone)
                    ]
                )
                for _ in range(self.num_views)
            ]
        )  # [views, everyone, h, w]
        mine = masks[:, dist.shard(everyone)]
        return mine.reshape(-1, self.grid, self.grid).to(device)

    def draw_count(self, rng: random.Random) -> float:
        """get_pred_ratio x the patches: a ratio drawn for each of `pred_ratio`'s values, then one of them."""
        ratios = [
            rng.uniform(m - v, m + v) if v > 0 else m for m, v in zip(self.pred_ratio, self.pred_ratio_var)
        ]
        return rng.choice(ratios) * self.grid * self.grid

    @torch.no_grad()
    def update_centers(self, teacher: torch.Tensor) -> None:
        """iBOTLoss.update_center: c and c2 <- m c + (1 - m) x the teacher's mean class-token output and its
        mean patch output (each image's patches averaged first) over every rank's global crops."""
        count = teacher.shape[0] * dist.world_size()
        cls_mean = dist.all_reduce_sum(teacher[:, 0].float().sum(dim=0, keepdim=True)) / count
        patch_mean = dist.all_reduce_sum(teacher[:, 1:].float().mean(dim=1).sum(dim=0, keepdim=True)) / count
        self.center.mul_(self.center_momentum).add_(cls_mean, alpha=1 - self.center_momentum)
        self.center2.mul_(self.center_momentum).add_(patch_mean.unsqueeze(0), alpha=1 - self.center_momentum)

    def param_groups(self):  # utils.get_params_groups: no weight decay on biases and 1-D tensors
        groups = exclude_bias_and_norm(nn.ModuleList([self.backbone, self.head]))
        groups[0]["params"].append(self.mask_token)  # masked_embed [1, D]: decayed with the weights
        return groups

    def encoder(self):
        return self.teacher[0]

    def projection_head(self):  # the teacher's, on the teacher backbone that encoder() evaluates
        return self.teacher[1].mlp

    @torch.no_grad()
    def health(self, forward_train_set):
        """The teacher's centred, sharpened class-token output on the train split (the monitors'): its mean
        entropy and how many of its K outputs the images' argmaxes use."""

        mean_entropy, usage = distribution_health(
            forward_train_set,
            lambda x: F.softmax((self.teacher(x).float() - self.center) / self.temps[0], dim=-1),
            self.center.shape[1],
        )
        return {"teacher_entropy": mean_entropy, "teacher_usage": usage}

    def momentum_pairs(self):
        return [([self.backbone, self.head], self.teacher)]

    def on_epoch_start(self, ctx):
        self.temps = self.temperatures(ctx.epoch)
        ctx.log["teacher_temp"], ctx.log["teacher_patch_temp"] = self.temps

    def on_before_step(self, ctx):
        if self.clip_grad > 0:  # utils.clip_gradients: each tensor's own norm, not a global one
            clip_each_gradient(self.parameters(), self.clip_grad)
        if ctx.epoch < self.freeze_last_layer:  # cancel_gradients_last_layer: no update, no decay
            for p in self.head.last_layer.parameters():
                p.grad = None
