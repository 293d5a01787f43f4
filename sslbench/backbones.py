"""Backbones: any timm model by name, as a feature extractor (num_classes=0).

The small-image stem (3x3 conv, stride 1, no max-pool) is the CIFAR convention
of SimCLR, SupCon and most CIFAR reproductions of MoCo; it applies to timm's
ResNet family, whose stem is ``conv1`` + ``bn1`` + ``maxpool``.

An input filter is a fixed layer in front of the network, part of the backbone (so the encoder
evaluated has it too): ``sobel``, DeepCluster's. A method asks for it in its config.yaml
(``backbone: {input_filter: sobel}``); the suite's backbone section never sets it.

``backbone.args`` go to ``timm.create_model`` as they are. A Vision Transformer takes the dataset's image
size (``img_size``) unless its args say otherwise; timm's ``vision_transformer`` models also take
``dynamic_img_size: true`` (BEiT's family, whose relative position bias is sized for one grid, does not):
multi-crop views of another size then resample the position embeddings at each forward (timm's
bicubic, antialiased resampling, where DINO's ``interpolate_pos_encoding`` scales by the size ratio + 0.1
without antialias: one implementation for every method, the values differ slightly).

What a network's features are (``backbone.features``, ``FEATURES``): ``pooled``, its own pooled output
(a ResNet's global average; a ViT's per its ``global_pool`` arg: ``token``, the class token after the
final norm, as DINO's kNN and MoCo v3's linear probe; ``avg``, the mean of the patch tokens), or DINO's
ViT linear-probe inputs (eval_linear.py): ``last4_cls``, the class tokens of the last 4 blocks after
the final norm, concatenated (``--n_last_blocks 4``, its ViT-S setting), and ``cls_avgpool``, the last
block's class token and mean patch token, interleaved per channel as eval_linear.py's reshape leaves them
(``--n_last_blocks 1 --avgpool_patchtokens``, its ViT-B one).
Training always uses the pooled output; ``feature_reader`` applies the setting where features are read.
"""

from __future__ import annotations

import timm
import torch
import torch.nn.functional as F
from timm.layers import SwiGLUPacked
from torch import nn

from sslbench import capi_vit  # noqa: F401  (registers capi_vit_large_patch14 with timm)
from sslbench.errors import SslbenchError


class BackboneError(SslbenchError, ValueError):
    pass


PIXELS = "pixels"
INPUT_FILTERS = ("sobel",)
FEATURES = ("pooled", "last4_cls", "cls_avgpool")
VIT_MODULES = ("vision_transformer", "beit")  # timm's ViT families: class token, blocks, global_pool, norms
RESIZING_MODULES = ("vision_transformer",)  # those whose models also take dynamic_img_size
MLP_LAYERS = {"swiglu_packed": SwiGLUPacked}  # `backbone.args.mlp_layer` by name (DINOv2's fused SwiGLU)


class Pixels(nn.Module):
    """The input pixels themselves as features: each (normalised) image flattened, C x S x S values
    at the size S the images come at. No weights: the raw-input floor of every table."""

    def __init__(self, in_chans: int, image_size: int):
        super().__init__()
        self.num_features = in_chans * image_size * image_size

    def forward(self, x):
        return x.flatten(1)


def create_backbone(
    name: str,
    in_chans: int = 3,
    small_stem: bool = False,
    image_size: int | None = None,
    input_filter: str | None = None,
    **kwargs,
) -> nn.Module:
    """A timm model with its classifier removed, or ``pixels`` (``Pixels``, for ``image_size`` images);
    ``model.num_features`` is the feature size. ``input_filter`` puts a fixed filter in front of it
    (``FilteredBackbone``)."""
    if input_filter is not None:
        if input_filter not in INPUT_FILTERS:
            raise BackboneError(
                f"unknown input filter {input_filter!r} (a method's `backbone.input_filter`); known: "
                f"{', '.join(INPUT_FILTERS)}"
            )
        net = create_backbone(name, SobelFilter.out_channels, small_stem, image_size, **kwargs)
        return FilteredBackbone(SobelFilter(in_chans), net)
    if name == PIXELS:
        return Pixels(in_chans, image_size)
    if name not in timm.list_models():
        close = timm.list_models(f"*{name}*")[:10]
        raise BackboneError(
            f"unknown backbone {name!r} (config key `backbone.name`): not a timm model name; "
            f"similar names: {close or 'none'}; see timm.list_models()"
        )
    if isinstance(kwargs.get("mlp_layer"), str):
        if kwargs["mlp_layer"] not in MLP_LAYERS:
            raise BackboneError(
                f"config key `backbone.args.mlp_layer` = {kwargs['mlp_layer']!r}: known names are "
                f"{', '.join(MLP_LAYERS)}"
            )
        kwargs = {**kwargs, "mlp_layer": MLP_LAYERS[kwargs["mlp_layer"]]}
    if is_vit(name):
        resizing = timm.models.is_model_in_modules(name, RESIZING_MODULES)
        kwargs = {"img_size": image_size, **({"dynamic_img_size": True} if resizing else {}), **kwargs}
    try:
        model = timm.create_model(name, pretrained=False, num_classes=0, in_chans=in_chans, **kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        raise BackboneError(
            f"config key `backbone.args` = {kwargs}: timm.create_model({name!r}) refuses them: "
            f"{type(err).__name__}: {err}. Fix or remove the argument."
        ) from None
    if small_stem:
        apply_small_stem(model, name)
    return model


def is_vit(name: str) -> bool:
    return name != PIXELS and timm.models.is_model_in_modules(name, VIT_MODULES)


def backbone_from_config(cfg: dict, in_chans: int, image_size: int) -> nn.Module:
    """The backbone a run's settings name (their ``backbone`` section), for ``in_chans``-channel images
    of ``image_size`` pixels (``pixels`` and ViTs depend on the size; timm's CNNs pool it away)."""
    section = cfg["backbone"]
    return create_backbone(
        section["name"],
        in_chans=in_chans,
        small_stem=section.get("small_stem", False),
        image_size=image_size,
        input_filter=section.get("input_filter"),
        **(section.get("args") or {}),
    )


class FeatureReader(nn.Module):
    """DINO's ViT linear-probe inputs from a timm ViT (``FEATURES``): [B, 4D] or [B, 2D]."""

    def __init__(self, vit: nn.Module, features: str):
        super().__init__()
        self.vit, self.features = vit, features
        self.blocks = 4 if features == "last4_cls" else 1
        if len(vit.blocks) < self.blocks:
            raise BackboneError(
                f"config key `backbone.features` = {features!r} reads the last {self.blocks} blocks; this "
                f"ViT has {len(vit.blocks)}. Use `features: pooled` or a deeper ViT."
            )
        self.num_features = vit.num_features * (self.blocks if features == "last4_cls" else 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.vit.get_intermediate_layers(x, n=self.blocks, return_prefix_tokens=True, norm=True)
        tokens = [prefix[:, 0] for _, prefix in out]
        if self.features == "cls_avgpool":
            # eval_linear.py's column order: class token and mean patch token interleaved per channel
            return torch.stack([tokens[-1], out[-1][0].mean(1)], dim=-1).flatten(1)
        return torch.cat(tokens, dim=1)


def feature_reader(backbone: nn.Module, section: dict) -> nn.Module:
    """The backbone as its features are read (``backbone.features``; ``pooled``: the backbone itself)."""
    features = section.get("features", "pooled")
    if features == "pooled":
        return backbone
    if not hasattr(backbone, "get_intermediate_layers"):
        raise BackboneError(
            f"config key `backbone.features` = {features!r} reads a Vision Transformer's blocks; "
            f"{section['name']!r} is none. Use `features: pooled`."
        )
    return FeatureReader(backbone, features)


class SobelFilter(nn.Module):
    """DeepCluster's fixed input filter (models/alexnet.py, ``--sobel``): grey (the mean of the
    channels: the official 1x1 convolution with weights 1/3; on one channel the identity), then the
    horizontal and vertical 3x3 Sobel gradients with zero padding 1: [B, C, H, W] -> [B, 2, H, W].
    The kernels are constants (buffers), so nothing trains or decays them."""

    out_channels = 2

    def __init__(self, in_chans: int):
        super().__init__()
        gx = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]])
        self.register_buffer("grey", torch.full((1, in_chans, 1, 1), 1.0 / in_chans), persistent=False)
        self.register_buffer("gradients", torch.stack([gx, gx.T])[:, None], persistent=False)  # Gx, Gy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.conv2d(x, self.grey), self.gradients, padding=1)


class FilteredBackbone(nn.Module):
    """``net(input_filter(x))``, with ``net``'s ``num_features``."""

    def __init__(self, input_filter: nn.Module, net: nn.Module):
        super().__init__()
        self.input_filter, self.net = input_filter, net
        self.num_features = net.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.input_filter(x))


def apply_small_stem(model: nn.Module, name: str) -> None:
    """Replace the stem by a 3x3 stride-1 conv and drop the max-pool (in place)."""
    if not (hasattr(model, "conv1") and hasattr(model, "maxpool") and hasattr(model, "bn1")):
        raise BackboneError(
            f"backbone.small_stem is only defined for timm's ResNet family; {name!r} has no "
            "conv1/bn1/maxpool stem. Set `backbone.small_stem: false` or choose a ResNet."
        )
    old = model.conv1
    first = old[0] if isinstance(old, nn.Sequential) else old  # deep stems ('t', 'd' variants, test_resnet)
    width = model.bn1.num_features
    model.conv1 = nn.Conv2d(first.in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
