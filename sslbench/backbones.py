"""Backbones: any timm model by name, as a feature extractor (num_classes=0).

The small-image stem (3x3 conv, stride 1, no max-pool) is the CIFAR convention
of SimCLR, SupCon and most CIFAR reproductions of MoCo; it applies to timm's
ResNet family, whose stem is ``conv1`` + ``bn1`` + ``maxpool``.
"""

from __future__ import annotations

import timm
from torch import nn

from .errors import SslbenchError


class BackboneError(SslbenchError, ValueError):
    pass


PIXELS = "pixels"


class Pixels(nn.Module):
    """The input pixels themselves as features: each (normalised) image flattened, C x S x S values
    at the size S the images come at. No weights: the raw-input floor of every table."""

    def __init__(self, in_chans: int, image_size: int):
        super().__init__()
        self.num_features = in_chans * image_size * image_size

    def forward(self, x):
        return x.flatten(1)


def create_backbone(
    name: str, in_chans: int = 3, small_stem: bool = False, image_size: int | None = None, **kwargs
) -> nn.Module:
    """A timm model with its classifier removed, or ``pixels`` (``Pixels``, for ``image_size`` images);
    ``model.num_features`` is the feature size."""
    if name == PIXELS:
        return Pixels(in_chans, image_size)
    if name not in timm.list_models():
        close = timm.list_models(f"*{name}*")[:10]
        raise BackboneError(
            f"unknown backbone {name!r} (config key `backbone.name`): not a timm model name; "
            f"similar names: {close or 'none'}; see timm.list_models()"
        )
    model = timm.create_model(name, pretrained=False, num_classes=0, in_chans=in_chans, **kwargs)
    if small_stem:
        apply_small_stem(model, name)
    return model


def backbone_from_config(cfg: dict, in_chans: int, image_size: int) -> nn.Module:
    """The backbone a run's settings name (their ``backbone`` section), for ``in_chans``-channel images
    of ``image_size`` pixels (only ``pixels`` depends on the size: timm's models pool it away)."""
    return create_backbone(
        cfg["backbone"]["name"],
        in_chans=in_chans,
        small_stem=cfg["backbone"].get("small_stem", False),
        image_size=image_size,
    )


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
