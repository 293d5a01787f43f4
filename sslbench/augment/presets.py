"""View settings: ``ViewConfig`` and the official recipes' presets (``VIEW_PRESETS``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sslbench.errors import ConfigError

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
# LeJEPA's views (rbalestr-lab/lejepa README.md, "Data augmentation and views"), global and local alike:
# BYOL's jitter, grey and flip with blur p 0.5 and solarisation p 0.2 at 128; the global crops' scale (0.3, 1)
# (the local crops set their own (0.05, 0.3))
VIEW_PRESETS["lejepa"] = dataclasses.replace(
    VIEW_PRESETS["byol_view1"], crop_scale=(0.3, 1.0), blur_p=0.5, solarise_p=0.2
)


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
        raise ConfigError(str(err)) from err  # the caller names where the setting is
