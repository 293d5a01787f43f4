"""Image utilities the loaders, the jobs and the view pipelines share: decoding a file, resizing uint8
images (once, at load time), converting channels, and the statistics views are normalised with."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sslbench.data.files import DatasetError

if TYPE_CHECKING:
    from sslbench.data.containers import Dataset, ImageSet

# Output size of `load()` for lazily decoded folder datasets when none is given.
DEFAULT_LAZY_IMAGE_SIZE = 224


def decode_image(path: str, size: int, channels: int = 3) -> torch.Tensor:
    """Decode with PIL, resize the shorter side to `size`, centre-crop to size x size: uint8 [C, "
    "size, size]."""
    mode = {1: "L", 3: "RGB"}[channels]
    try:
        with Image.open(path) as opened:
            image = opened.convert(mode)  # convert() forces the full decode, so damage shows here
    except (OSError, SyntaxError, ValueError) as error:
        raise DatasetError(
            f"{path}: cannot decode image ({error}); the file is damaged or truncated"
        ) from error
    width, height = image.size
    scale = size / min(width, height)
    new_width, new_height = max(size, round(width * scale)), max(size, round(height * scale))
    if (new_width, new_height) != (width, height):
        image = image.resize((new_width, new_height), Image.Resampling.BILINEAR)
    left, top = (new_width - size) // 2, (new_height - size) // 2
    image = image.crop((left, top, left + size, top + size))
    array = np.asarray(image, dtype=np.uint8).reshape(size, size, channels)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def resize_images(images: torch.Tensor, size: int, chunk: int = 1024) -> torch.Tensor:
    """Bilinear, antialiased resize of uint8 [N, C, H, W] to [N, C, size, size], back to uint8."""
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((len(images), images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, len(images), chunk):  # chunks bound the float32 copy's memory
        batch = images[start : start + chunk].float()
        resized = F.interpolate(
            batch, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[start : start + chunk] = resized.round().clamp(0, 255).to(torch.uint8)
    return out


def resized(dataset: Dataset, size: int) -> Dataset:
    """An in-memory dataset with both splits resized to ``size`` (``resize_images``)."""

    def resize(split: ImageSet) -> ImageSet:
        return dataclasses.replace(split, images=resize_images(split.images, size))

    return dataclasses.replace(
        dataset, train=resize(dataset.train), test=resize(dataset.test), image_size=size
    )


# What a transfer target's images go through to fit an encoder trained on other channels (stored in
# every result row as `transfer_channels`).
CHANNEL_CONVERSIONS = {
    (1, 3): "grey repeated to 3 channels",
    (3, 1): "ITU-R 601-2 luma, L = (299 R + 587 G + 114 B) / 1000 (PIL's convert('L'))",
}


def channel_conversion(source: int, channels: int) -> str:
    return "none" if source == channels else CHANNEL_CONVERSIONS[source, channels]


def convert_channels(dataset: Dataset, channels: int) -> Dataset:
    """The dataset as ``channels``-channel images. Folder sets decode to it (PIL's own conversion);
    in-memory sets are converted here with PIL's integer arithmetic, so both give the same pixels."""
    if channels == dataset.channels:
        return dataset
    channel_conversion(dataset.channels, channels)  # a KeyError for anything but 1 <-> 3

    def convert(split: ImageSet) -> ImageSet:
        if split.images is None:
            return dataclasses.replace(split, channels=channels)
        if channels == 3:
            images = split.images.expand(-1, 3, -1, -1).contiguous()
        else:  # PIL's RGB -> L: (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16
            weights = torch.tensor([19595, 38470, 7471], dtype=torch.int64).view(1, 3, 1, 1)
            luma = ((split.images.to(torch.int64) * weights).sum(1, keepdim=True) + 0x8000) >> 16
            images = luma.to(torch.uint8)
        return dataclasses.replace(split, images=images, channels=channels)

    return dataclasses.replace(
        dataset, train=convert(dataset.train), test=convert(dataset.test), channels=channels
    )


# --- statistics: what the views are normalised with

# ITU-R 601-2 luma weights (torchvision's rgb_to_grayscale rounds red to 0.2989).
LUMA_WEIGHTS = (0.299, 0.587, 0.114)

IMAGENET_MEAN = (0.485, 0.456, 0.406)

IMAGENET_STD = (0.229, 0.224, 0.225)

# ImageNet's grey statistics, derived with the same luma weights: the mean is
# exact; the std assumes fully correlated channels (an upper bound, ~0.226).
IMAGENET_GREY_MEAN = sum(w * m for w, m in zip(LUMA_WEIGHTS, IMAGENET_MEAN))

IMAGENET_GREY_STD = sum(w * s for w, s in zip(LUMA_WEIGHTS, IMAGENET_STD))


def dataset_stats(channels: int, images: torch.Tensor | None = None) -> tuple[list[float], list[float]]:
    """Per-channel mean and std in [0, 1] units.

    From a uint8 train tensor [N, C, H, W] when given; otherwise ImageNet's
    values (its luma-weighted grey values for 1 channel).
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if images is None:
        if channels == 3:
            return list(IMAGENET_MEAN), list(IMAGENET_STD)
        return [IMAGENET_GREY_MEAN], [IMAGENET_GREY_STD]
    check_uint8_batch(images, channels, "dataset_stats(images=...)")
    total = torch.zeros(channels, dtype=torch.float64)
    total_sq = torch.zeros(channels, dtype=torch.float64)
    for chunk in images.split(1024):  # float64 sums in chunks: exact enough, bounded memory
        values = chunk.to(torch.float64).transpose(0, 1).reshape(channels, -1) / 255
        total += values.sum(1).cpu()
        total_sq += values.square().sum(1).cpu()
    count = images.numel() // channels
    if count == 0:
        raise ValueError("dataset_stats got an empty image tensor; pass the training images")
    mean = total / count
    std = (total_sq / count - mean.square()).clamp_min(0).sqrt()
    if (std == 0).any():
        raise ValueError(
            f"dataset_stats: a channel is constant (std {std.tolist()}); it cannot be normalised"
        )
    return mean.tolist(), std.tolist()


def check_uint8_batch(images: torch.Tensor, channels: int, where: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(
            f"{where}: expected a uint8 tensor [B, C, H, W], got {type(images).__name__} "
            f"of shape {tuple(getattr(images, 'shape', ()))}"
        )
    if images.dtype != torch.uint8:
        raise ValueError(
            f"{where}: expected dtype uint8 (raw pixels 0..255), got {images.dtype}; "
            f"pass the dataset's uint8 images, not already-scaled floats"
        )
    if images.shape[1] != channels:
        raise ValueError(f"{where}: expected {channels} channel(s), got shape {tuple(images.shape)}")
