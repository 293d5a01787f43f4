"""TEMPLATE — copy this folder to methods/<your_method>/ (a name not starting with "_").

Discovery skips folders whose name starts with "_", so this one never runs.
Write the method like its paper's pseudo-code; the engine does the rest
(loop, optimiser, schedule, checkpoints, devices, logs).
"""

import torch
import torch.nn.functional as F

from sslbench.kit.losses import supcon  # the kit (sslbench/kit/) holds every loss and the shared maths
from sslbench.kit.method import Method, projection_mlp


class MyMethod(Method):
    num_views = 2  # how many global views (at the dataset's size) of each image training_loss receives
    multi_crop = False  # True: `augment: {crops: [...]}` may add smaller (local) crops after them
    needs_labels = False  # True: training_loss receives the true labels

    def __init__(self, backbone, info, cfg):
        # backbone: the timm model (num_classes=0); backbone.num_features is self.feature_dim.
        # info: DataInfo(num_classes, num_train, channels, image_size, batch_size, epochs).
        # cfg["params"]: the settings of this folder's config.yaml (after preset overrides).
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = projection_mlp(self.feature_dim, self.feature_dim, p["proj_dim"])
        self.temperature = p["temperature"]
        # State that must survive a resume (queues, prototypes, labels) goes in buffers:
        # self.register_buffer("queue", torch.zeros(...))

    def training_loss(self, views, labels, indices):
        # views: list of num_views tensors [B, C, H, W] (then any local crops [B, C, h, w], where
        # multi_crop; sslbench.kit.method.embed_crops embeds them one batch per size); indices: positions
        # in the train split.
        z = torch.stack([F.normalize(self.projector(self.backbone(v)), dim=1) for v in views], dim=1)
        return supcon(z, labels=None, temperature=self.temperature, base_temperature=self.temperature)

    # Optional (sslbench/kit/method.py's docstring has the whole contract):
    # def param_groups(self):          # [{params, lr_scale?, fixed_lr?, weight_decay?, exclude_from_lars?}];
    #                                  # sslbench.kit.method.exclude_bias_and_norm splits biases and norms off
    # def momentum_pairs(self):        # [(online modules, target)]: the engine's EMA after every step, with
    #                                  # `momentum` and `momentum_schedule` from config.yaml
    # def on_epoch_start(self, ctx):   # ctx.forward_train_set(fn): fn on every train image (eval transform)
    # def on_before_step(self, ctx):   # the gradients before the optimiser step: clip, or set to None
    # def on_step_end(self, ctx):      # state updates after the step; ctx.progress is in [0, 1]
    # def encoder(self):               # the network evaluated (default: self.backbone)
