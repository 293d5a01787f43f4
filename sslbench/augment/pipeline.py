"""The batched view pipelines: per-sample parameters drawn on the CPU from the generator handed to
``forward`` (same seed, same views on any device), then crop + flip, colour jitter, grey, blur,
solarisation and normalisation on the batch's device. README.md here describes each step and its
official source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.transforms import v2 as transforms_v2

from sslbench.augment.ops import (
    JITTER_OPS,
    blur_kernel_size,
    blur_sigma_scale,
    gaussian_blur,
    grayscale,
    solarise,
)
from sslbench.augment.presets import (
    ViewConfig,
)
from sslbench.augment.views import CropGroup
from sslbench.data.images import check_uint8_batch

_CROP_TRIES = 10  # torchvision's RandomResizedCrop tries 10 boxes before the fallback


def policy_transform(config: ViewConfig) -> nn.Module | None:
    """torchvision's transform of a view's ``policy`` (None for ``simclr``), applied to one uint8 image."""
    if config.policy == "randaugment":
        return transforms_v2.RandAugment(num_ops=config.policy_ops, magnitude=config.policy_magnitude)
    if config.policy == "autoaugment":
        return transforms_v2.AutoAugment(transforms_v2.AutoAugmentPolicy.IMAGENET)
    return None


def _mean_std_buffers(channels: int, mean: Sequence[float], std: Sequence[float]):
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"mean {list(mean)} and std {list(std)} need one value per channel ({channels})")
    if any(s <= 0 for s in std):
        raise ValueError(f"std values must be > 0, got {list(std)}")
    as_column = lambda v: torch.tensor([float(x) for x in v], dtype=torch.float32).view(channels, 1, 1)
    return as_column(mean), as_column(std)


@dataclass
class _ViewParams:
    top: torch.Tensor  # [B] crop box in input pixels (integers, as float)
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor
    flip: torch.Tensor  # [B] bool
    jitter: torch.Tensor  # [B] bool
    jitter_order: torch.Tensor  # [B, 4] a permutation of the 4 jitter ops
    jitter_factors: torch.Tensor  # [B, 4] brightness, contrast, saturation factors; hue shift
    gray: torch.Tensor  # [B] bool
    blur: torch.Tensor  # [B] bool
    sigma: torch.Tensor  # [B]
    solarise: torch.Tensor  # [B] bool
    policy_seeds: torch.Tensor  # [B] int64: each image's seed for torchvision's policy (0 if unused)


def _stack_params(params: list[_ViewParams]) -> _ViewParams:
    """The parameters of several views of a batch as those of one batch of all of them, in order."""
    if len(params) == 1:
        return params[0]
    fields = [f.name for f in dataclasses.fields(_ViewParams)]
    return _ViewParams(*(torch.cat([getattr(p, name) for p in params]) for name in fields))


def _uniform(n: int, low: float, high: float, generator, shape: tuple = ()) -> torch.Tensor:
    return low + (high - low) * torch.rand((n, *shape), generator=generator)


def _draw_crop_boxes(n: int, in_h: int, in_w: int, cfg: ViewConfig, generator):
    """torchvision's RandomResizedCrop.get_params (or BYOL's crop, ``crop_sampler``), for n samples
    at once: top, left, height, width, integers as floats."""
    if cfg.crop_sampler == "byol":
        return _draw_byol_crop_boxes(n, in_h, in_w, cfg, generator)
    area = in_h * in_w
    target_area = area * _uniform(n, *cfg.crop_scale, generator, (_CROP_TRIES,))
    log_ratio = _uniform(
        n, math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1]), generator, (_CROP_TRIES,)
    )
    aspect = torch.exp(log_ratio)
    widths = torch.round(torch.sqrt(target_area * aspect))
    heights = torch.round(torch.sqrt(target_area / aspect))
    valid = (widths > 0) & (widths <= in_w) & (heights > 0) & (heights <= in_h)
    first_valid = valid.float().argmax(dim=1, keepdim=True)  # argmax returns the first maximum
    found = valid.any(dim=1)
    width = widths.gather(1, first_valid).squeeze(1)
    height = heights.gather(1, first_valid).squeeze(1)
    # Fallback: a central crop with the aspect ratio clamped into the allowed range.
    in_ratio = in_w / in_h
    if in_ratio < cfg.crop_ratio[0]:
        fallback_w, fallback_h = in_w, round(in_w / cfg.crop_ratio[0])
    elif in_ratio > cfg.crop_ratio[1]:
        fallback_w, fallback_h = round(in_h * cfg.crop_ratio[1]), in_h
    else:
        fallback_w, fallback_h = in_w, in_h
    width = torch.where(found, width, float(fallback_w))
    height = torch.where(found, height, float(fallback_h))
    # Integer offsets uniform over the valid positions (randint(0, in - size + 1)).
    position = torch.rand((n, 2), generator=generator)
    top = torch.floor(position[:, 0] * (in_h - height + 1)).clamp_max(in_h - height)
    left = torch.floor(position[:, 1] * (in_w - width + 1)).clamp_max(in_w - width)
    top = torch.where(found, top, torch.div(in_h - height, 2, rounding_mode="floor"))
    left = torch.where(found, left, torch.div(in_w - width, 2, rounding_mode="floor"))
    return top, left, height, width


def _draw_byol_crop_boxes(n: int, in_h: int, in_w: int, cfg: ViewConfig, generator):
    """BYOL's _decode_and_random_crop: area ~ U(crop_scale) x the image's, aspect ratio log-uniform
    in crop_ratio, width and height rounded (half to even, as tf.round) and clipped to the image's,
    then integer offsets uniform over the positions that fit. One draw per sample, never retried: 4 n
    numbers. A side is at least 1 px (the official needs no floor at its sizes)."""
    area = in_h * in_w * _uniform(n, *cfg.crop_scale, generator)
    aspect = torch.exp(_uniform(n, math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1]), generator))
    width = torch.round(torch.sqrt(area * aspect)).clamp(1, in_w)
    height = torch.round(torch.sqrt(area / aspect)).clamp(1, in_h)
    position = torch.rand((n, 2), generator=generator)
    top = torch.floor(position[:, 0] * (in_h - height + 1)).clamp_max(in_h - height)
    left = torch.floor(position[:, 1] * (in_w - width + 1)).clamp_max(in_w - width)
    return top, left, height, width


def _draw_params(n: int, in_h: int, in_w: int, cfg: ViewConfig, generator) -> _ViewParams:
    # Always the same draws in the same order, whatever the probabilities, so a
    # seed gives the same stream of parameters across configurations.
    top, left, height, width = _draw_crop_boxes(n, in_h, in_w, cfg, generator)
    flip = torch.rand(n, generator=generator) < cfg.flip_p
    jitter = torch.rand(n, generator=generator) < cfg.jitter_p
    jitter_order = torch.argsort(torch.rand((n, 4), generator=generator), dim=1)
    factors = torch.stack(
        [
            _uniform(n, max(0.0, 1 - cfg.brightness), 1 + cfg.brightness, generator),
            _uniform(n, max(0.0, 1 - cfg.contrast), 1 + cfg.contrast, generator),
            _uniform(n, max(0.0, 1 - cfg.saturation), 1 + cfg.saturation, generator),
            _uniform(n, -cfg.hue, cfg.hue, generator),
        ],
        dim=1,
    )
    gray = torch.rand(n, generator=generator) < cfg.gray_p
    blur = torch.rand(n, generator=generator) < cfg.blur_p
    sigma = _uniform(n, *cfg.blur_sigma, generator)
    # Drawn last and only where used: without solarisation, the other draws do not depend on this step.
    if cfg.solarise_p > 0:
        solarise = torch.rand(n, generator=generator) < cfg.solarise_p
    else:
        solarise = torch.zeros(n, dtype=torch.bool)
    # One seed per image for torchvision's policy, drawn after everything else and only where used.
    if cfg.policy != "simclr":
        policy_seeds = torch.randint(0, 2**62, (n,), generator=generator)
    else:
        policy_seeds = torch.zeros(n, dtype=torch.int64)
    return _ViewParams(
        top,
        left,
        height,
        width,
        flip,
        jitter,
        jitter_order,
        factors,
        gray,
        blur,
        sigma,
        solarise,
        policy_seeds,
    )


def _indices(mask: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """Positions of a CPU mask on the target device (None if empty): no device sync."""
    idx = mask.nonzero().squeeze(1)
    return idx.to(device) if idx.numel() else None


def _sample_coordinates(
    start: torch.Tensor, length: torch.Tensor, in_size: int, out_size: int, mirrored: torch.Tensor | None
) -> torch.Tensor:
    """Where each output pixel samples the input along one axis, in grid_sample's
    normalised coordinates (align_corners=False: the image edges are at -1 and 1).

    Output pixel o looks at start + (o + 0.5) * length / out_size (pixel-edge units),
    clamped to the crop's outer pixel centres: exactly torchvision's crop followed by
    a bilinear resize.  ``mirrored`` samples flip the axis.  Returns [n, out_size].
    """
    start, length = start.double().view(-1, 1), length.double().view(-1, 1)
    offset = (torch.arange(out_size, dtype=torch.float64) + 0.5) * length / out_size
    if mirrored is not None:
        offset = torch.where(mirrored.view(-1, 1), length - offset, offset)
    position = (start + offset).clamp(min=start + 0.5, max=start + length - 0.5)
    return (2 * position / in_size - 1).float()


class ViewAugment(nn.Module):
    """One random view per image: uint8 [B, C, H, W] -> normalised float32 [B, C, S, S]."""

    def __init__(
        self, image_size: int, channels: int, mean: Sequence[float], std: Sequence[float], config: ViewConfig
    ):
        super().__init__()
        if int(image_size) <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        if not isinstance(config, ViewConfig):
            raise ValueError(f"config must be a ViewConfig (see view_config()), got {type(config).__name__}")
        self.image_size = int(image_size)
        self.channels = channels
        self.config = config
        self.blur_kernel_size = blur_kernel_size(self.image_size)
        self.blur_sigma_scale = blur_sigma_scale(self.image_size)
        self.policy = policy_transform(config)
        mean_t, std_t = _mean_std_buffers(channels, mean, std)
        self.register_buffer("mean", mean_t, persistent=False)
        self.register_buffer("std", std_t, persistent=False)
        # Which jitter ops can change anything (a zero strength, or 1 channel, disables one).
        colour = channels == 3
        self._jitter_enabled = (
            config.brightness > 0,
            config.contrast > 0,
            config.saturation > 0 and colour,
            config.hue > 0 and colour,
        )

    def extra_repr(self) -> str:
        return f"image_size={self.image_size}, channels={self.channels}, config={self.config}"

    @torch.no_grad()
    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.views(images, generator, 1)[0]

    @torch.no_grad()
    def views(
        self, images: torch.Tensor, generator: torch.Generator | None = None, count: int = 1
    ) -> list[torch.Tensor]:
        """``count`` views of the batch, the same as ``count`` calls of forward draw, in one pass."""
        check_uint8_batch(images, self.channels, type(self).__name__)
        n, _, in_h, in_w = images.shape
        if generator is not None and generator.device.type != "cpu":
            raise ValueError("ViewAugment draws its parameters on the CPU: pass a CPU torch.Generator")
        params = _stack_params([_draw_params(n, in_h, in_w, self.config, generator) for _ in range(count)])
        stacked = images if count == 1 else images.repeat(count, 1, 1, 1)
        return list(self._pipeline(stacked, params).split(n))

    def _pipeline(self, images: torch.Tensor, params: _ViewParams) -> torch.Tensor:
        device = images.device
        x = self._crop_and_flip(images, params)
        if self.policy is not None:
            return (self._apply_policy(x, params.policy_seeds) - self.mean.to(device)) / self.std.to(device)
        if self.config.grey_first:
            self._grey(x, params, device)
            self._jitter(x, params, device)
        else:
            self._jitter(x, params, device)
            self._grey(x, params, device)
        if self.blur_kernel_size > 1 and (idx := _indices(params.blur, device)) is not None:
            sigma = params.sigma.to(device)[idx] * self.blur_sigma_scale
            x[idx] = gaussian_blur(x[idx], sigma, self.blur_kernel_size)
        if (idx := _indices(params.solarise, device)) is not None:
            x[idx] = solarise(x[idx], self.config.solarise_threshold)
        return (x - self.mean.to(device)) / self.std.to(device)

    def _apply_policy(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        """torchvision's policy on each image of the crops x (in [0, 1]) under its own seed; the
        result is quantised to uint8 levels, as the policy sees and returns them."""
        pixels = (x * 255).round_().to(torch.uint8)
        with torch.random.fork_rng(devices=[]):  # torchvision draws from the global CPU RNG
            for i, seed in enumerate(seeds.tolist()):
                torch.default_generator.manual_seed(seed)  # the CPU RNG only: CUDA states untouched
                pixels[i] = self.policy(pixels[i])
        return pixels.float() / 255

    def _grey(self, x: torch.Tensor, params: _ViewParams, device: torch.device) -> None:
        """Random grayscale in place (3 channels kept); a no-op on 1-channel images."""
        if self.channels == 3 and (idx := _indices(params.gray, device)) is not None:
            x[idx] = grayscale(x[idx]).expand(-1, 3, -1, -1)

    def _crop_and_flip(self, images: torch.Tensor, params: _ViewParams) -> torch.Tensor:
        n, _, in_h, in_w = images.shape
        size = self.image_size
        x = images.float() / 255
        full_image = (params.top == 0) & (params.left == 0) & (params.height == in_h) & (params.width == in_w)
        if in_h == in_w == size and bool(full_image.all()):
            # Nothing to resample: flip only, exactly.
            if (idx := _indices(params.flip, images.device)) is not None:
                x[idx] = x[idx].flip(-1)
            return x
        # The crop is axis-aligned, so the sampling grid is separable: one row of x and one
        # column of y coordinates per sample, computed on the CPU and broadcast on the device.
        xs = _sample_coordinates(params.left, params.width, in_w, size, mirrored=params.flip)
        ys = _sample_coordinates(params.top, params.height, in_h, size, mirrored=None)
        device = images.device
        xs, ys = xs.to(device), ys.to(device)
        grid = torch.stack(
            (xs[:, None, :].expand(n, size, size), ys[:, :, None].expand(n, size, size)), dim=-1
        )
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)

    def _jitter(self, x: torch.Tensor, params: _ViewParams, device: torch.device) -> None:
        """Colour jitter in place, each sample's four ops in its own random order.

        For each of the four slots the jittered samples are gathered sorted by the op
        they get in that slot, so every op runs once on a contiguous slice; the chunk
        stays gathered from slot to slot (one re-gather each) and is scattered back once.
        """
        jittered = params.jitter.nonzero().squeeze(1)
        if jittered.numel() == 0 or not any(self._jitter_enabled):
            return
        factors = params.jitter_factors[jittered]
        chunk, holds = x[jittered.to(device)], torch.arange(jittered.numel())  # row -> position in jittered
        for slot in range(4):
            op_of = params.jitter_order[jittered, slot]
            wanted = torch.argsort(op_of, stable=True)  # positions in jittered, grouped by op
            row_of_position = torch.empty_like(holds)
            row_of_position[holds] = torch.arange(holds.numel())
            chunk, holds = chunk[row_of_position[wanted].to(device)], wanted
            counts = torch.bincount(op_of, minlength=4).tolist()
            slot_factors = factors[wanted].to(device)
            start = 0
            for op_index, (op, count) in enumerate(zip(JITTER_OPS, counts)):
                if count and self._jitter_enabled[op_index]:
                    part = slice(start, start + count)
                    chunk[part] = op(chunk[part], slot_factors[part, op_index])
                start += count
        x[jittered[holds].to(device)] = chunk


class MultiViewAugment(nn.Module):
    """The views of a method's ``augment`` setting (``view_groups``): one ViewAugment per group, a
    group's views in one call, a list of uint8 [B, C, H, W] -> normalised [B, C, S_v, S_v] per view."""

    def __init__(self, groups: list[CropGroup], channels: int, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.counts = [group.count for group in groups]
        self.groups = nn.ModuleList(ViewAugment(g.size, channels, mean, std, g.config) for g in groups)

    @property
    def num_views(self) -> int:
        return sum(self.counts)

    @torch.no_grad()
    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        return [
            view
            for augment, count in zip(self.groups, self.counts)
            for view in augment.views(images, generator, count)
        ]


class EvalTransform(nn.Module):
    """Deterministic: centre square crop if not square, resize to S if needed, normalise."""

    def __init__(self, image_size: int, channels: int, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        if int(image_size) <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.image_size = int(image_size)
        self.channels = channels
        mean_t, std_t = _mean_std_buffers(channels, mean, std)
        self.register_buffer("mean", mean_t, persistent=False)
        self.register_buffer("std", std_t, persistent=False)

    def extra_repr(self) -> str:
        return f"image_size={self.image_size}, channels={self.channels}"

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_uint8_batch(images, self.channels, type(self).__name__)
        _, _, in_h, in_w = images.shape
        x = images.float() / 255
        if in_h != in_w:
            side = min(in_h, in_w)
            top, left = (in_h - side) // 2, (in_w - side) // 2
            x = x[:, :, top : top + side, left : left + side]
        if x.shape[-1] != self.image_size:
            x = F.interpolate(
                x,
                size=(self.image_size, self.image_size),
                mode="bilinear",
                align_corners=False,
                antialias=True,
            ).clamp_(0, 1)
        return (x - self.mean.to(x.device)) / self.std.to(x.device)
