"""Batched view pipelines (SimCLR / MoCo v2 style) that run on the batch's device.

Input: uint8 images [B, C, H, W] (C = 1 or 3).  Output: float32 [B, C, S, S],
normalised with the dataset's mean/std.  Every sample gets its own random
parameters, drawn on the CPU from the ``torch.Generator`` handed to ``forward``
(same seed, same views, whatever the device) and then moved to the device.
Every parameter is drawn, in one fixed order, whatever the probabilities and
the colour order, so a seed gives the same crops, factors and coin flips under
any setting; the settings only decide what is applied.

The pipeline, per sample:

1. random resized crop + horizontal flip, both in one ``grid_sample`` call on a
   per-sample axis-aligned grid (the resampling equals torchvision's crop + bilinear
   resize without antialiasing). The box is drawn by ``crop_sampler``: ``torchvision``
   as ``RandomResizedCrop.get_params`` draws it (10 tries, then a central crop), or
   ``byol`` as BYOL's utils/dataset.py ``_decode_and_random_crop``: one area and one
   log-uniform aspect ratio, the width and height rounded and clipped to the image's,
   never retried;
2. colour jitter with probability ``jitter_p``: brightness, contrast,
   saturation and hue as torchvision's ``ColorJitter`` defines them, applied in
   a random order per sample (as torchvision and SimCLR's ``random_order=True``
   do), clamped to [0, 1] after each step;
3. grayscale with probability ``gray_p`` (ITU-R 601 luma, kept as 3 channels).
   Steps 2 and 3 run in the order of each preset's official code: jitter then
   grey (SimCLR, MoCo v2 / PCL, SupContrast, MoCo's CIFAR demo, self-label's
   cifar.py), or grey then jitter with ``grey_first`` (InstDisc / MoCo v1's
   main_moco.py, self-label's data.py).  The orders differ: brightness,
   contrast and saturation commute with luma (up to clamping), but a hue
   rotation keeps each pixel's largest and smallest channel, not its luma, so
   grey(hue(x)) != grey(x), while a grey image goes through the jitter grey;
4. Gaussian blur with probability ``blur_p``, scaled with the image: sigma ~
   U(blur_sigma) is given in pixels of a 224-px view (the papers' [0.1, 2] px
   on 224-px crops: MoCo v2 / PCL's PIL blur, SimCLR) and applied as
   sigma * S / 224 on an S-px view, so every size gets the blur of 224 px
   relative to its side.  The kernel follows SimCLR's rule (data_util.py
   random_blur: kernel_size = S // 10, radius = kernel_size // 2, 2 * radius + 1
   taps; 23 at 224 px), which spans +-5.5 sigma at the largest sigma (less where
   S // 10 rounds down: +-3.5 sigma at 32 px).  Below 20 px the rule gives one
   tap, i.e. no blur, which is what the relative blur amounts to there (sigma
   <= 0.15 px on 16 px).  Separable, reflect padding (SimCLR pads with zeros;
   PIL's blur replicates the edge);
5. solarisation with probability ``solarise_p`` (BYOL's, Barlow Twins', VICReg's, MoCo v3's
   and DINO's second view): every value at or above ``solarise_threshold`` becomes 1 - value
   (PIL's ``ImageOps.solarize``, which the PyTorch codes call, inverts pixels >= 128 of 255:
   ``PIL_SOLARISE_THRESHOLD``, 128 / 255, the ``byol_view`` presets'; BYOL's augmentations.py on
   [0, 1] uses 0.5);
6. normalisation.

Augmentation policy (``policy``, default ``simclr``: the steps above). ``randaugment`` and
``autoaugment`` keep step 1 (crop and flip) and replace steps 2-5 with torchvision.transforms.v2's
``RandAugment(num_ops=policy_ops, magnitude=policy_magnitude)`` (N = 2, M = 9: its defaults) or
``AutoAugment`` (its ImageNet policy), applied to the crop quantised to uint8 (as the PIL pipelines
of the papers apply them to the cropped PIL image), then normalised: SupCon's augmentation
ablation (Khosla et al. 2020, its AutoAugment / RandAugment / SimAugment comparison). torchvision draws
one set of ops per call, for a whole batched tensor, from torch's global RNG; here every image gets its
own draw: one call per image, each under its own seed drawn from the view generator (after every
other parameter of the view, and only for these policies, so the crops of a seed are the crops of
every policy), inside ``torch.random.fork_rng`` so that the global CPU RNG is left as it was. The
per-image calls are torchvision's Python dispatch, not arithmetic, and dominate a CPU run at 16 px: a
30-epoch SupCon run on the default (2 x 1,347 calls per epoch) trained in 209 s with ``randaugment`` and
319 s with ``autoaugment`` against 34 s with its simclr views (seed 1 of config/ablation_supcon_ce.yaml,
on a shared 2-core CPU; seed 0 under heavier load: 508 / 459 s against 268 s). 0.2-3 ms per call,
depending on the load. On a GPU they are one small launch per op and image (not measured).

The official recipes flip last (MoCo, self-label); flipping commutes with the
colour steps and the symmetric blur, so flipping with the crop draws the same
distribution.  SimCLR itself keeps sigma in pixels at every size (its CIFAR
recipe drops the blur instead), so on small images this blur is weaker than
SimCLR's code would give: the same fraction of the side as at 224 px.

For 1-channel images saturation, hue and grayscale are no-ops (as in
torchvision); brightness, contrast, blur, crop and flip still apply.

Several views at once (``ViewAugment.views``, and ``MultiViewAugment`` for several settings and
sizes): the parameters of view 1, then of view 2, ... are drawn in turn, exactly as so many
calls of ``forward`` draw them, and every step then runs once on the whole stack of views.
Solarisation's coin is drawn after every other parameter of a view, and only where
``solarise_p > 0``, so the views of a pipeline without it are the views it drew before
solarisation existed.

The ``augment`` setting of a method (``view_groups``) takes three forms:

- one view setting, ``{preset: mocov2, blur_p: 0.0, ...}``: every view of the method is drawn
  with it (its ``num_views`` views, at the dataset's image size);
- a list with one setting per view, ``[{preset: byol_view1}, {preset: byol_view2}]``:
  BYOL's asymmetric views; consecutive equal settings are drawn in one call;
- multi-crop groups, ``{preset: swav, crops: [{count: 2, size: 1.0, crop_scale: [0.14, 1]},
  {count: 6, size: 0.43, crop_scale: [0.05, 0.14]}]}``: ``count`` views of side
  ``size`` x the dataset's image size each, rounded to the nearest pixel (halves up), at least
  2 px. The settings outside ``crops`` are every group's; a group's own keys (``preset`` and
  any ViewConfig field) override them. SwAV's 224 / 96 px become size 1.0 / 0.43, i.e. 16 / 7 px
  on the default's 16-px digits, 32 / 14 px on CIFAR, 224 / 96 px on ImageNet.

Views come out in order: the groups in their order, each group's views in turn. The first
views are the method's ``num_views`` global views, at the dataset's size; smaller (local)
views follow only for a method that takes them (``Method.multi_crop``).

Known deviation: ``grid_sample`` does not antialias, so crops larger than the
output size are downscaled with some aliasing (torchvision antialiases).  For
the small images this benchmark mostly uses, crops are upscaled and nothing
changes.
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

from .errors import ConfigError

# ITU-R 601-2 luma weights (torchvision's rgb_to_grayscale rounds red to 0.2989).
LUMA_WEIGHTS = (0.299, 0.587, 0.114)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# ImageNet's grey statistics, derived with the same luma weights: the mean is
# exact; the std assumes fully correlated channels (an upper bound, ~0.226).
IMAGENET_GREY_MEAN = sum(w * m for w, m in zip(LUMA_WEIGHTS, IMAGENET_MEAN))
IMAGENET_GREY_STD = sum(w * s for w, s in zip(LUMA_WEIGHTS, IMAGENET_STD))

_CROP_TRIES = 10  # torchvision's RandomResizedCrop tries 10 boxes before the fallback
CROP_SAMPLERS = ("torchvision", "byol")  # how a crop box is drawn (the module docstring, step 1)
PIL_SOLARISE_THRESHOLD = 128 / 255  # ImageOps.solarize's default threshold 128, on [0, 1]

# blur_sigma is in pixels of a view of this side (the papers' ImageNet crops), scaled by side / 224.
BLUR_REFERENCE_SIDE = 224


@dataclass(frozen=True)
class ViewConfig:
    """Settings of one view pipeline; see VIEW_PRESETS for the papers' values."""

    crop_scale: tuple[float, float] = (0.2, 1.0)  # RandomResizedCrop scale (area fraction)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # aspect ratio range (w / h)
    crop_sampler: str = "torchvision"  # torchvision (10 tries, central fallback) | byol (one box, clipped)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4  # factor ~ U[max(0, 1 - b), 1 + b]
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1  # shift ~ U[-h, h] of a full turn, h <= 0.5
    gray_p: float = 0.2
    grey_first: bool = False  # random grey before the colour jitter (MoCo v1, self-label data.py)
    blur_p: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)  # in pixels of a 224-px view, scaled by side / 224
    # blur kernel size scales with the image: ~10% of the side, odd (SimCLR's rule)
    solarise_p: float = 0.0
    solarise_threshold: float = 0.5  # values >= it become 1 - value (BYOL's 0.5; PIL's: 128/255)
    policy: str = "simclr"  # simclr (the steps above) | randaugment | autoaugment (replace steps 2-5)
    policy_ops: int = 2  # RandAugment's N (ops per image), torchvision's default
    policy_magnitude: int = 9  # RandAugment's M (of 31 bins), torchvision's default

    def __post_init__(self):
        for name in ("crop_scale", "crop_ratio", "blur_sigma"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise ValueError(f"ViewConfig.{name} must be a pair (low, high), got {value!r}")
            object.__setattr__(self, name, (float(value[0]), float(value[1])))  # YAML gives lists
        low, high = self.crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(
                f"ViewConfig.crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}"
            )
        low, high = self.crop_ratio
        if not 0 < low <= high:
            raise ValueError(f"ViewConfig.crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}")
        low, high = self.blur_sigma
        if not 0 < low <= high:
            raise ValueError(f"ViewConfig.blur_sigma must satisfy 0 < low <= high, got {self.blur_sigma}")
        for name in ("flip_p", "jitter_p", "gray_p", "blur_p", "solarise_p"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"ViewConfig.{name} is a probability in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.solarise_threshold <= 1:
            raise ValueError(
                "ViewConfig.solarise_threshold must be in [0, 1] (a pixel value), "
                f"got {self.solarise_threshold}"
            )
        for name in ("brightness", "contrast", "saturation"):
            if getattr(self, name) < 0:
                raise ValueError(f"ViewConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.hue <= 0.5:
            raise ValueError(f"ViewConfig.hue must be in [0, 0.5] (a fraction of a turn), got {self.hue}")
        if not isinstance(self.grey_first, bool):
            raise ValueError(f"ViewConfig.grey_first must be true or false, got {self.grey_first!r}")
        if self.crop_sampler not in CROP_SAMPLERS:
            raise ValueError(
                f"ViewConfig.crop_sampler must be one of {list(CROP_SAMPLERS)}, got {self.crop_sampler!r}"
            )
        if self.policy not in POLICIES:
            raise ValueError(f"ViewConfig.policy must be one of {list(POLICIES)}, got {self.policy!r}")
        for name, low, high in (("policy_ops", 1, 14), ("policy_magnitude", 0, 30)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"ViewConfig.{name} must be an integer in [{low}, {high}], got {value!r}")


# simclr: the module docstring's colour steps 2-5; the others replace them (torchvision.transforms.v2).
POLICIES = ("simclr", "randaugment", "autoaugment")


def policy_transform(config: ViewConfig) -> nn.Module | None:
    """torchvision's transform of a view's ``policy`` (None for ``simclr``), applied to one uint8 image."""
    if config.policy == "randaugment":
        return transforms_v2.RandAugment(num_ops=config.policy_ops, magnitude=config.policy_magnitude)
    if config.policy == "autoaugment":
        return transforms_v2.AutoAugment(transforms_v2.AutoAugmentPolicy.IMAGENET)
    return None


# Values read from the official code (torchvision transforms unless said otherwise).
VIEW_PRESETS: dict[str, ViewConfig] = {
    # google-research/simclr data_util.py: crop area (0.08, 1), ratio (3/4, 4/3), flip,
    # colour jitter strength 1.0 -> 0.8/0.8/0.8/0.2 with p=0.8 (random order), then grey p=0.2,
    # blur p=0.5 with sigma ~ U(0.1, 2.0) and kernel height // 10 (ImageNet recipe; the
    # paper's CIFAR runs use strength 0.5 and no blur: override for those).
    "simclr": ViewConfig(
        crop_scale=(0.08, 1.0),
        brightness=0.8,
        contrast=0.8,
        saturation=0.8,
        hue=0.2,
        jitter_p=0.8,
        gray_p=0.2,
        blur_p=0.5,
    ),
    # facebookresearch/moco main_moco.py without --aug-plus (InstDisc's recipe, also PCL v1's):
    # crop (0.2, 1), grey p=0.2, then ColorJitter(0.4, 0.4, 0.4, 0.4) always, flip.
    "mocov1": ViewConfig(
        crop_scale=(0.2, 1.0),
        brightness=0.4,
        contrast=0.4,
        saturation=0.4,
        hue=0.4,
        jitter_p=1.0,
        gray_p=0.2,
        grey_first=True,
        blur_p=0.0,
    ),
    # facebookresearch/moco main_moco.py --aug-plus (also PCL's recipe): crop (0.2, 1),
    # ColorJitter(0.4, 0.4, 0.4, 0.1) p=0.8, then grey p=0.2, blur sigma (0.1, 2) p=0.5, flip.
    "mocov2": ViewConfig(),
    # facebookresearch/moco colab/moco_cifar10_demo.ipynb (colab-notebook branch): crop with
    # torchvision's default scale (0.08, 1), flip, ColorJitter(0.4, 0.4, 0.4, 0.1) p=0.8, then
    # grey p=0.2, no blur.
    "moco_cifar_demo": ViewConfig(
        crop_scale=(0.08, 1.0),
        brightness=0.4,
        contrast=0.4,
        saturation=0.4,
        hue=0.1,
        jitter_p=0.8,
        gray_p=0.2,
        blur_p=0.0,
    ),
    # HobbitLong/SupContrast main_supcon.py: crop (0.2, 1), flip,
    # ColorJitter(0.4, 0.4, 0.4, 0.1) p=0.8, then grey p=0.2, no blur.
    "supcon": ViewConfig(
        crop_scale=(0.2, 1.0),
        brightness=0.4,
        contrast=0.4,
        saturation=0.4,
        hue=0.1,
        jitter_p=0.8,
        gray_p=0.2,
        blur_p=0.0,
    ),
    # yukimasano/self-label data.py, augs=3 (main.py's default, ImageNet): RandomResizedCrop
    # with torchvision's default scale (0.08, 1), grey p=0.2, then ColorJitter(0.4, 0.4, 0.4,
    # 0.4) always, flip.  (Its cifar.py crops at scale (0.2, 1) and jitters before the grey.)
    "sela": ViewConfig(
        crop_scale=(0.08, 1.0),
        brightness=0.4,
        contrast=0.4,
        saturation=0.4,
        hue=0.4,
        jitter_p=1.0,
        gray_p=0.2,
        grey_first=True,
        blur_p=0.0,
    ),
    # The standard supervised ImageNet recipe (pytorch/examples imagenet/main.py):
    # RandomResizedCrop (0.08, 1) + flip, no colour.  (SupContrast's main_ce.py uses
    # scale (0.2, 1) on CIFAR: override crop_scale to match it.)
    "supervised": ViewConfig(
        crop_scale=(0.08, 1.0),
        jitter_p=0.0,
        gray_p=0.0,
        blur_p=0.0,
    ),
    # BYOL's asymmetric pair (deepmind-research byol/utils/augmentations.py) as the PyTorch codes
    # that use it write it: Barlow Twins (main.py Transform), VICReg (augmentations.py), MoCo v3
    # (main_moco.py, with crop scale (0.2, 1)) and DINO's two global crops (main_dino.py): crop
    # (0.08, 1) (torchvision's RandomResizedCrop), flip, ColorJitter(0.4, 0.4, 0.2, 0.1) p=0.8,
    # grey p=0.2, then blur p=1.0 (view 1) / 0.1 (view 2) and solarisation p=0 / 0.2 at PIL's
    # threshold 128/255 (ImageOps.solarize). BYOL's own code differs in its crop (crop_sampler
    # byol), its threshold (0.5) and its jitter (it adds brightness instead of scaling it):
    # methods/byol/config.yaml sets the first two.
    "byol_view1": ViewConfig(
        crop_scale=(0.08, 1.0),
        brightness=0.4,
        contrast=0.4,
        saturation=0.2,
        hue=0.1,
        jitter_p=0.8,
        gray_p=0.2,
        blur_p=1.0,
        solarise_p=0.0,
        solarise_threshold=PIL_SOLARISE_THRESHOLD,
    ),
    # No augmentation: the whole (square) image resized to the output size.
    "none": ViewConfig(
        crop_scale=(1.0, 1.0),
        crop_ratio=(1.0, 1.0),
        flip_p=0.0,
        jitter_p=0.0,
        gray_p=0.0,
        blur_p=0.0,
    ),
}
# BYOL's view 2: view 1 with blur p 0.1 and solarisation p 0.2 (see the comment above byol_view1)
VIEW_PRESETS["byol_view2"] = dataclasses.replace(VIEW_PRESETS["byol_view1"], blur_p=0.1, solarise_p=0.2)


def view_config(preset: str = "mocov2", **overrides) -> ViewConfig:
    """A preset from VIEW_PRESETS with some fields replaced."""
    if preset not in VIEW_PRESETS:
        raise ConfigError(f"unknown view preset {preset!r}; choose one of {sorted(VIEW_PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ViewConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(
            f"unknown ViewConfig key(s) {unknown} for preset {preset!r}; valid keys: {sorted(fields)}"
        )
    try:
        return dataclasses.replace(VIEW_PRESETS[preset], **overrides)
    except ValueError as err:  # ViewConfig's checks of the values an `augment:` section set
        raise ConfigError(f"`augment` settings: {err}") from err


@dataclass(frozen=True)
class CropGroup:
    """``count`` views of side ``size`` pixels drawn with ``config``, made in one call."""

    count: int
    size: int
    config: ViewConfig


def view_groups(augment: dict | list, image_size: int, num_views: int) -> list[CropGroup]:
    """The views of a method's ``augment`` setting (the module docstring's three forms), in order;
    consecutive groups of equal size and settings are merged (one call draws them all)."""
    if isinstance(augment, list):
        if not augment:
            raise ConfigError("`augment`: an empty list; give one view setting per view")
        groups = [
            CropGroup(1, image_size, _view_setting(entry, f"augment[{i}]")) for i, entry in enumerate(augment)
        ]
    elif isinstance(augment, dict) and "crops" in augment:
        shared = {key: value for key, value in augment.items() if key != "crops"}
        crops = augment["crops"]
        if not isinstance(crops, list) or not crops:
            raise ConfigError(
                "`augment.crops` must be a non-empty list of {count, size, <view settings>} groups, "
                f"got {crops!r}"
            )
        groups = [
            _crop_group(crop, shared, image_size, f"augment.crops[{i}]") for i, crop in enumerate(crops)
        ]
    elif isinstance(augment, dict):
        groups = [CropGroup(num_views, image_size, _view_setting(augment, "augment"))]
    else:
        raise ConfigError(
            "`augment` must be one view setting (a mapping), a list of them or {crops: [...]}, "
            f"got {augment!r}"
        )
    merged = [groups[0]]
    for group in groups[1:]:
        last = merged[-1]
        if (group.size, group.config) == (last.size, last.config):
            merged[-1] = CropGroup(last.count + group.count, last.size, last.config)
        else:
            merged.append(group)
    return merged


def crop_side(size: float, image_size: int) -> int:
    """A crop's side in pixels: ``size`` x the dataset's image side, to the nearest pixel (halves up)."""
    return int(size * image_size + 0.5)


def _crop_group(crop, shared: dict, image_size: int, where: str) -> CropGroup:
    if not isinstance(crop, dict):
        raise ConfigError(f"`{where}` must be a mapping {{count, size, <view settings>}}, got {crop!r}")
    count, size = crop.get("count"), crop.get("size", 1.0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"`{where}.count` must be a positive integer (views of this group), got {count!r}")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= 1:
        raise ConfigError(
            f"`{where}.size` is the crop's side as a fraction of the image's, in (0, 1], got {size!r}"
        )
    side = crop_side(size, image_size)
    if side < 2:
        raise ConfigError(
            f"`{where}.size` = {size} gives {side} px on {image_size}-px images; a crop needs at least 2 px"
        )
    setting = {**shared, **{key: value for key, value in crop.items() if key not in ("count", "size")}}
    return CropGroup(count, side, _view_setting(setting, where))


def _view_setting(setting, where: str) -> ViewConfig:
    if not isinstance(setting, dict):
        raise ConfigError(
            f"`{where}` must be a mapping of view settings (preset, ViewConfig fields), got {setting!r}"
        )
    try:
        return view_config(**setting)
    except ConfigError as err:
        raise ConfigError(f"`{where}`: {err}") from err


def check_view_groups(groups: list[CropGroup], num_views: int, multi_crop: bool, image_size: int) -> None:
    """The views fit the method: its ``num_views`` global views first, at the dataset's size, then
    smaller (local) views only for a multi-crop method."""
    sides = [group.size for group in groups for _ in range(group.count)]
    if len(sides) < num_views or (len(sides) > num_views and not multi_crop):
        raise ConfigError(
            f"`augment` gives {len(sides)} view(s) but the method takes {num_views} (its num_views)"
            + ("" if not multi_crop else " global views, then any local crops")
            + "; give one view setting for all of them or one per view"
        )
    if any(side != image_size for side in sides[:num_views]):
        raise ConfigError(
            f"`augment`: the first {num_views} view(s) are the method's global views, at the dataset's "
            f"{image_size} px (size: 1.0), but their sides are {sides[:num_views]}; put smaller crops "
            "after them"
        )


def describe_views(groups: list[CropGroup]) -> str:
    """'2 x 16px + 6 x 7px': the views of a plan, for logs and benchmark notes."""
    return " + ".join(f"{group.count} x {group.size}px" for group in groups)


def blur_kernel_size(image_size: int) -> int:
    """SimCLR's rule: radius = (side // 10) // 2, kernel = 2 * radius + 1 (1, i.e. no blur, below 20 px)."""
    return 2 * ((image_size // 10) // 2) + 1


def blur_sigma_scale(image_size: int) -> float:
    """The factor from blur_sigma (pixels of a 224-px view) to pixels of an image_size view."""
    return image_size / BLUR_REFERENCE_SIDE


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
    _check_uint8_batch(images, channels, "dataset_stats(images=...)")
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


def _check_uint8_batch(images: torch.Tensor, channels: int, where: str) -> None:
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


def _mean_std_buffers(channels: int, mean: Sequence[float], std: Sequence[float]):
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"mean {list(mean)} and std {list(std)} need one value per channel ({channels})")
    if any(s <= 0 for s in std):
        raise ValueError(f"std values must be > 0, got {list(std)}")
    as_column = lambda v: torch.tensor([float(x) for x in v], dtype=torch.float32).view(channels, 1, 1)
    return as_column(mean), as_column(std)


# --------------------------------------------------------------------------------------
# Colour operations on float images in [0, 1], one factor per sample (torchvision's
# definitions, batched).  Each takes x [n, C, H, W] and a factor tensor [n] on x's device.


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


_JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


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


# --------------------------------------------------------------------------------------
# Per-sample random parameters, drawn on the CPU.


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
    # Drawn last and only where used: a pipeline without solarisation draws what it drew before it existed.
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


# --------------------------------------------------------------------------------------


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
        _check_uint8_batch(images, self.channels, type(self).__name__)
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
            for op_index, (op, count) in enumerate(zip(_JITTER_OPS, counts)):
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
        _check_uint8_batch(images, self.channels, type(self).__name__)
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
