"""Per-sample colour and blur operations on float batches in [0, 1], as torchvision defines them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sslbench.augment.presets import BLUR_REFERENCE_SIDE
from sslbench.data.images import LUMA_WEIGHTS


def blur_kernel_size(image_size: int) -> int:
    """SimCLR's rule: radius = (side // 10) // 2, kernel = 2 * radius + 1 (1, i.e. no blur, below 20 px)."""
    return 2 * ((image_size // 10) // 2) + 1


def blur_sigma_scale(image_size: int) -> float:
    """The factor from blur_sigma (pixels of a 224-px view) to pixels of an image_size view."""
    return image_size / BLUR_REFERENCE_SIDE


def _per_sample(factor: torch.Tensor) -> torch.Tensor:
    return factor.view(-1, 1, 1, 1)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma [n, 1, H, W] of RGB images (1-channel images are returned as they are)."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (LUMA_WEIGHTS[0] * r + LUMA_WEIGHTS[1] * g + LUMA_WEIGHTS[2] * b).unsqueeze(1)


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor * x + (1 - factor) * other, clamped to [0, 1]."""
    f = _per_sample(factor)
    return (f * x + (1 - f) * other).clamp_(0, 1)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * _per_sample(factor)).clamp_(0, 1)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the image's mean grey level."""
    mean = grayscale(x).mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean, factor)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the grey image; no-op on 1 channel."""
    if x.shape[1] == 1:
        return x
    return _blend(x, grayscale(x), factor)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the hue by ``shift`` turns (in [-0.5, 0.5]) in HSV space; no-op on 1 channel.

    Value (max) and chroma (max - min) are kept; the hue, in sixths of a turn, is
    rotated and the RGB channels rebuilt with the closed form
    c_n = value - chroma * clamp(min(k, 4 - k), 0, 1), k = (n + 6 * hue) mod 6,
    n = 5, 3, 1 for R, G, B.
    """
    if x.shape[1] == 1:
        return x
    hue_sixths, value, chroma = _hue_value_chroma(x)
    k = _HSV_CHANNEL_OFFSETS.to(x.device, x.dtype) + (hue_sixths.unsqueeze(1) + 6 * _per_sample(shift))
    k = k - 6 * torch.floor(k / 6)  # mod 6 (torch.remainder is several times slower on CPU)
    ramp = torch.minimum(k, 4 - k).clamp_(0, 1)
    return value.unsqueeze(1) - chroma.unsqueeze(1) * ramp  # in [min, max]: no clamp needed


_HSV_CHANNEL_OFFSETS = torch.tensor([5.0, 3.0, 1.0]).view(1, 3, 1, 1)


def _hue_value_chroma(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HSV hue in sixths of a turn (in [-1, 5]), value and chroma, each [n, H, W]."""
    r, g, b = x.unbind(1)
    value = x.amax(dim=1)
    chroma = value - x.amin(dim=1)
    # Grey pixels have zero differences, hence hue 0 here; their hue is irrelevant anyway.
    inverse_chroma = 1 / chroma.clamp_min(1e-12)
    hue_if_red_max = (g - b) * inverse_chroma
    hue_if_green_max = (b - r) * inverse_chroma + 2
    hue_if_blue_max = (r - g) * inverse_chroma + 4
    # The largest channel picks the sector (ties: red, then green, as torchvision).  lerp
    # with 0/1 weights selects exactly and is much faster than torch.where on CPU.
    red_max = (r == value).to(x.dtype)
    green_max = (g == value).to(x.dtype)
    hue_sixths = torch.lerp(torch.lerp(hue_if_blue_max, hue_if_green_max, green_max), hue_if_red_max, red_max)
    return hue_sixths, value, chroma


JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def solarise(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Values at or above ``threshold`` become 1 - value (images in [0, 1])."""
    return torch.where(x >= threshold, 1 - x, x)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Separable Gaussian blur with a per-sample sigma [n] (pixels) and reflect padding.

    Each pass is a weighted sum of shifted copies: for these small kernels that is
    faster on CPU than a grouped convolution, and it batches per-sample kernels.
    """
    radius = kernel_size // 2
    offsets = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    weights = torch.exp(-offsets.square() / (2 * sigma.view(-1, 1).square()))
    weights = (weights / weights.sum(dim=1, keepdim=True)).view(-1, 1, 1, 1, kernel_size)
    height, width = x.shape[-2:]
    mode = "reflect" if radius < min(height, width) else "replicate"
    padded = F.pad(x, (radius, radius, radius, radius), mode=mode)
    rows = sum(weights[..., tap] * padded[..., :, tap : tap + width] for tap in range(kernel_size))
    return sum(weights[..., tap] * rows[..., tap : tap + height, :] for tap in range(kernel_size))
