"""A method's ``augment`` setting read into groups of views (one setting, one per view, or
multi-crop groups of several sizes), checked against the method's views."""

from __future__ import annotations

from dataclasses import dataclass

from sslbench.augment.presets import ViewConfig, view_config
from sslbench.errors import ConfigError


@dataclass(frozen=True)
class CropGroup:
    """``count`` views of side ``size`` pixels drawn with ``config``, made in one call."""

    count: int
    size: int
    config: ViewConfig


def check_augment(augment, image_size: int | None = None) -> None:
    """Every key and value of a method's ``augment`` setting judged by the code that builds the job's
    views (``view_groups``, which raises the same ConfigError in the job): the plan calls it on each
    layer of a run's settings and on each run's merged setting. Without ``image_size`` (one layer of
    settings, before the dataset is known) the crops' sides in pixels are not judged. How many views
    the method takes is judged in the job (``check_view_groups``: the method's class says it)."""
    view_groups(augment, image_size, 1)


def view_groups(augment: dict | list, image_size: int | None, num_views: int) -> list[CropGroup]:
    """The views of a method's ``augment`` setting (the module docstring's three forms), in order;
    consecutive groups of equal size and settings are merged (one call draws them all). An
    ``image_size`` of None (``check_augment``) leaves the crops' sides undrawn (None)."""
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


def _crop_group(crop, shared: dict, image_size: int | None, where: str) -> CropGroup:
    if not isinstance(crop, dict):
        raise ConfigError(f"`{where}` must be a mapping {{count, size, <view settings>}}, got {crop!r}")
    count, size = crop.get("count"), crop.get("size", 1.0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"`{where}.count` must be a positive integer (views of this group), got {count!r}")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= 1:
        raise ConfigError(
            f"`{where}.size` is the crop's side as a fraction of the image's, in (0, 1], got {size!r}"
        )
    side = None if image_size is None else crop_side(size, image_size)
    if side is not None and side < 2:
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
