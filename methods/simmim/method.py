"""SimMIM (Xie, Zhang, Cao, Lin, Bao, Yao, Dai, Hu, CVPR 2022): a simple framework for masked image
modelling. The ViT encoder sees every patch, the masked ones replaced by a learnable mask token; a linear
layer predicts each patch's pixels from its token, and an L1 loss is taken on the masked pixels only.

    x = patch_embed(img)                            # every patch
    m = random units of unit x unit patches, ceil(ratio * units) of them per image   # 1 = masked
    x = x (1 - m) + mask_token m                    # the masked patches' embeddings replaced
    z = norm(blocks([cls, x] + pos))[:, 1:]         # the encoder: the run's timm ViT (the backbone)
    y = pixel_shuffle(conv1x1(z as a grid))         # p * p * C values per patch, put back in place
    loss = sum(|img - y| * m_pixels) / (sum(m_pixels) + 1e-5) / C
    AdamW step; no weight decay on biases, norms, the class token and position embeddings

microsoft/SimMIM models/simmim.py (VisionTransformerForSimMIM, SimMIM), data/data_simmim.py
(MaskGenerator) and optimizer.py. The encoder is the backbone's own modules (sslbench/kit/vit.py), so that
the network trained is the network evaluated: its class token after the final norm.
"""

import math

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from sslbench.errors import ConfigError
from sslbench.kit.method import Method
from sslbench.kit.vit import batch_draw, check_masked_vit, masked_tokens, random_unit_mask

CONFIG = "methods/simmim/config.yaml"


class SimMIM(Method):
    num_views = 1  # data_simmim.py SimMIMTransform: one crop + flip per image, and its mask

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.patch = check_masked_vit(backbone, cfg, info, "SimMIM")
        self.grid = (info.image_size // self.patch, info.image_size // self.patch)
        self.unit = int(p["mask_unit"])
        if self.grid[0] % self.unit:
            raise ConfigError(
                f"{CONFIG}: mask_unit {self.unit} patches does not divide the {self.grid[0]} x "
                f"{self.grid[1]} patches of a {info.image_size}-px image at patch size {self.patch}"
            )
        self.units = units = (self.grid[0] // self.unit) * (self.grid[1] // self.unit)
        self.mask_count = math.ceil(units * float(p["mask_ratio"]))  # MaskGenerator: int(np.ceil(...))
        if not 1 <= self.mask_count < units:
            raise ConfigError(
                f"{CONFIG}: mask_ratio {p['mask_ratio']} masks {self.mask_count} of the {units} units; it "
                "must mask at least one and leave at least one"
            )
        self.clip_grad = float(p["clip_grad"])
        self.mask_token = nn.Parameter(torch.zeros(1, 1, self.feature_dim))
        trunc_normal_(self.mask_token, std=0.02, a=-0.02, b=0.02)  # VisionTransformerForSimMIM._trunc_normal_
        # SimMIM.decoder: Conv2d(num_features, stride^2 * C, 1), PixelShuffle(stride), stride = the patch
        self.decoder = nn.Sequential(
            nn.Conv2d(self.feature_dim, self.patch**2 * info.channels, kernel_size=1),
            nn.PixelShuffle(self.patch),
        )

    def training_loss(self, views, labels, indices):
        images = views[0]
        noise = batch_draw(images.shape[0], self.units, images.device)
        mask = random_unit_mask(noise, self.mask_count, self.grid, self.unit)
        reconstruction = self.reconstruct(images, mask)
        return masked_l1(images.float(), reconstruction.float(), mask, self.patch)

    def reconstruct(self, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W]: the decoder's pixels from the encoder's patch tokens, the masked patches' embeddings
        replaced by the mask token (mask [N, h, w], 1 = masked)."""
        z = masked_tokens(self.backbone, images, mask, self.mask_token)[:, 1:]
        grid = z.transpose(1, 2).reshape(z.shape[0], z.shape[2], *self.grid)
        return self.decoder(grid)

    def param_groups(self):
        # optimizer.py get_pretrain_param_groups: no decay for 1-D tensors, biases and the encoder's
        # no_weight_decay() (its class token and position embeddings); the mask token is decayed
        skip = {id(self.backbone.cls_token), id(self.backbone.pos_embed)}
        params = [p for p in self.parameters() if p.requires_grad]
        no_decay = [p for p in params if p.ndim <= 1 or id(p) in skip]
        return [
            {"params": [p for p in params if p.ndim > 1 and id(p) not in skip]},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    def on_before_step(self, ctx):  # main_simmim.py: clip_grad_norm_(model.parameters(), TRAIN.CLIP_GRAD)
        if self.clip_grad > 0:
            nn.utils.clip_grad_norm_(self.parameters(), self.clip_grad)


def masked_l1(
    images: torch.Tensor, reconstruction: torch.Tensor, mask: torch.Tensor, patch: int
) -> torch.Tensor:
    """models/simmim.py SimMIM.forward: the L1 error on the masked pixels (mask [N, h, w] of patches,
    expanded to pixels), summed, over (the masked pixels + 1e-5), over the channels."""
    pixels = mask.repeat_interleave(patch, 1).repeat_interleave(patch, 2).unsqueeze(1)
    error = F.l1_loss(reconstruction, images, reduction="none")
    return (error * pixels).sum() / (pixels.sum() + 1e-5) / images.shape[1]
