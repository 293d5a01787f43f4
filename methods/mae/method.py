"""MAE (He et al., CVPR 2022): masked autoencoders. A ViT encoder sees a random quarter of the patches;
a light decoder reconstructs the pixels of the others from the encoded ones and mask tokens.

    x = patch_embed(img) + pos[1:]                  # every patch, with its position, before masking
    keep 25% of the patches of each image at random # noise ~ U(0, 1) per patch, the smallest kept
    z = norm(blocks([cls + pos[0], kept patches]))  # the encoder: the run's timm ViT (the backbone)
    y = decoder_embed(z)                            # Linear to the decoder's width
    y = [y_cls, unshuffle(y_kept, mask tokens)] + sincos pos   # every patch again, in image order
    pred = decoder_pred(decoder_norm(decoder_blocks(y)))[:, 1:]  # p * p * C pixels per patch
    target = patchify(img)                          # per patch: rows, then columns, channels last
    if norm_pix_loss: target = (target - mean) / sqrt(var + 1e-6)  # each patch's own statistics
    loss = mean over the removed patches of mean((pred - target)^2)
    AdamW step; weight decay on every tensor of more than one dimension (biases and norms: none)

models_mae.py (facebookresearch/mae) builds its own ViT; here the encoder is the backbone's own
modules: patch_embed, its class token and position embeddings, norm_pre, blocks, norm, so
that the encoder trained is exactly the network evaluated: the backbone, its class token after the
final norm (its normal forward).
"""

from functools import partial

import torch
from timm.models.vision_transformer import Block
from torch import nn

from sslbench.errors import ConfigError
from sslbench.kit.method import Method, exclude_bias_and_norm
from sslbench.kit.vit import (
    batch_draw,
    check_masked_vit,
    fix_sincos_positions,
    sincos_pos_embed,
    with_positions,
)

CONFIG = "methods/mae/config.yaml"
LN_EPS = 1e-6  # models_mae.py: norm_layer=partial(nn.LayerNorm, eps=1e-6)


def random_masking(x: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None):
    """Per-sample random masking of the tokens ``x`` [N, L, D]: the int(L (1 - mask_ratio)) tokens of
    smallest noise are kept, in the order of their noise. Returns (kept tokens [N, keep, D], mask [N, L]
    in the patches' order with 1 = removed, ids_restore [N, L]: each patch's rank in the shuffle)."""
    n, length, dim = x.shape
    keep = int(length * (1 - mask_ratio))  # models_mae.py: int(), not round()
    if noise is None:
        noise = torch.rand(n, length, device=x.device)  # the global RNG the trainer seeds
    ids_shuffle = noise.argsort(dim=1)  # ascending: the first `keep` are kept
    ids_restore = ids_shuffle.argsort(dim=1)
    kept = x.gather(1, ids_shuffle[:, :keep, None].expand(-1, -1, dim))
    mask = (ids_restore >= keep).to(x.dtype)
    return kept, mask, ids_restore


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """[N, C, H, W] -> [N, (H/p)(W/p), p p C]: patches in row-major order, each patch's values ordered
    (pixel row, pixel column, channel) (models_mae.py's einsum 'nchpwq->nhwpqc')."""
    n, c, height, width = images.shape
    h, w = height // patch, width // patch
    x = images.reshape(n, c, h, patch, w, patch).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(n, h * w, patch * patch * c)


def unpatchify(patches: torch.Tensor, patch: int, channels: int, grid: tuple[int, int]) -> torch.Tensor:
    """The inverse of ``patchify`` for a grid of (rows, columns) patches."""
    h, w = grid
    n = patches.shape[0]
    x = patches.reshape(n, h, w, patch, patch, channels).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(n, channels, h * patch, w * patch)


def normalised_patches(target: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """norm_pix_loss's target: each patch minus its mean, over sqrt(its unbiased variance + eps)."""
    mean = target.mean(dim=-1, keepdim=True)
    var = target.var(dim=-1, keepdim=True)  # torch's default: unbiased (N - 1), as models_mae.py
    return (target - mean) / (var + eps).sqrt()


def masked_patch_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, norm_pix: bool):
    """models_mae.py forward_loss: the mean squared error of each patch, averaged over the removed
    patches (mask 1) only."""
    if norm_pix:
        target = normalised_patches(target)
    per_patch = (pred - target).pow(2).mean(dim=-1)  # [N, L]
    return (per_patch * mask).sum() / mask.sum()


class MAE(Method):
    num_views = 1  # main_pretrain.py: one crop + flip per image

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.patch = check_masked_vit(backbone, cfg, info, "MAE")
        self.grid = (info.image_size // self.patch, info.image_size // self.patch)
        num_patches = self.grid[0] * self.grid[1]
        self.mask_ratio = float(p["mask_ratio"])
        keep = int(num_patches * (1 - self.mask_ratio))
        if not 1 <= keep < num_patches:
            raise ConfigError(
                f"{CONFIG}: mask_ratio {self.mask_ratio} keeps {keep} of the {num_patches} patches of a "
                f"{info.image_size}-px image at patch size {self.patch}; it must keep at least one and "
                "remove at least one"
            )
        self.norm_pix_loss = bool(p["norm_pix_loss"])
        enc_dim, dec_dim = self.feature_dim, int(p["decoder_dim"])
        if dec_dim % 4 or (p["sincos_pos_embed"] and enc_dim % 4):
            raise ConfigError(
                f"{CONFIG}: decoder_dim {dec_dim} (and with sincos_pos_embed the backbone's width {enc_dim}) "
                "must be divisible by 4: the 2-D sin-cos table's four parts"
            )
        if dec_dim % int(p["decoder_heads"]):
            raise ConfigError(
                f"{CONFIG}: decoder_dim {dec_dim} must be divisible by decoder_heads {p['decoder_heads']}"
            )
        if p["sincos_pos_embed"]:
            fix_sincos_positions(backbone)  # models_mae.py: the encoder's, never trained

        # The decoder (models_mae.py "MAE decoder specifics"), initialised as initialize_weights does.
        self.decoder_embed = nn.Linear(enc_dim, dec_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
        self.register_buffer("decoder_pos_embed", sincos_pos_embed(dec_dim, self.grid, cls_token=True)[None])
        self.decoder_blocks = nn.Sequential(
            *(
                Block(
                    dec_dim,
                    int(p["decoder_heads"]),
                    mlp_ratio=4.0,  # models_mae.py: the encoder's mlp_ratio 4
                    qkv_bias=True,
                    norm_layer=partial(nn.LayerNorm, eps=LN_EPS),
                )
                for _ in range(int(p["decoder_depth"]))
            )
        )
        self.decoder_norm = nn.LayerNorm(dec_dim, eps=LN_EPS)
        self.decoder_pred = nn.Linear(dec_dim, self.patch * self.patch * info.channels)
        nn.init.normal_(self.mask_token, std=0.02)
        decoder = nn.ModuleList(
            [self.decoder_embed, self.decoder_blocks, self.decoder_norm, self.decoder_pred]
        )
        for module in decoder.modules():  # _init_weights: xavier_uniform Linear, zero bias; LayerNorm 1, 0
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward_encoder(self, images, mask_ratio, noise=None):
        """The backbone on the kept patches: (tokens [N, 1 + keep, D] after the final norm, the class
        token first; mask [N, L]; ids_restore [N, L])."""
        vit = self.backbone
        tokens = with_positions(vit, vit.patch_embed(images))  # [cls + pos_0, patches + pos_1..L]
        kept, mask, ids_restore = random_masking(tokens[:, 1:], mask_ratio, noise)
        x = vit.norm_pre(torch.cat([tokens[:, :1], kept], dim=1))
        return vit.norm(vit.blocks(x)), mask, ids_restore

    def forward_decoder(self, latent, ids_restore):
        """[N, L, p p C]: each patch's predicted pixels, in image order."""
        x = self.decoder_embed(latent)
        cls, kept = x[:, :1], x[:, 1:]
        n, length = ids_restore.shape
        filled = torch.cat([kept, self.mask_token.expand(n, length - kept.shape[1], -1)], dim=1)
        patches = filled.gather(1, ids_restore[..., None].expand(-1, -1, x.shape[2]))  # unshuffle
        x = torch.cat([cls, patches], dim=1) + self.decoder_pos_embed
        x = self.decoder_pred(self.decoder_norm(self.decoder_blocks(x)))
        return x[:, 1:]

    def training_loss(self, views, labels, indices):
        images = views[0]
        if tuple(images.shape[-2:]) != tuple(s * self.patch for s in self.grid):
            raise ValueError(f"MAE expects {self.info.image_size}-px views, got {tuple(images.shape[-2:])}")
        noise = batch_draw(images.shape[0], self.grid[0] * self.grid[1], images.device)
        latent, mask, ids_restore = self.forward_encoder(images, self.mask_ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        target = patchify(images.float(), self.patch)  # the loss in fp32 (under autocast too)
        return masked_patch_loss(pred.float(), target, mask.float(), self.norm_pix_loss)

    def param_groups(self):
        # main_pretrain.py: timm 0.3.2 optim_factory.add_weight_decay(model, wd) with no skip list:
        # no decay for 1-D tensors and biases, decay for everything else (class and mask tokens too);
        # the frozen position embeddings are in no group.
        return exclude_bias_and_norm(self)
