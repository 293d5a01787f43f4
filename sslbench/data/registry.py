"""The datasets: every ``DatasetSpec`` at the top level of a module of ``sslbench/data/datasets/`` (a
module there is a dataset, nothing else to edit), and what the suite asks of a dataset by name.

Imported by the planner: no torch here nor in the dataset modules (``sslbench.data.spec`` says why);
loading a dataset imports what its loader needs.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from sslbench.data import datasets
from sslbench.data.files import DatasetError, files_missing
from sslbench.data.spec import DatasetSpec

if TYPE_CHECKING:
    from sslbench.data.containers import Dataset


def discover(package: ModuleType) -> dict[str, DatasetSpec]:
    """{name: spec} of the DatasetSpecs at the top level of every module of ``package``, by name; two
    specs of one name are an error naming both modules."""
    found: dict[str, tuple[DatasetSpec, str]] = {}
    for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        for value in vars(importlib.import_module(module.name)).values():
            if not isinstance(value, DatasetSpec):
                continue
            first, where = found.setdefault(value.name, (value, module.name))
            if first is not value:  # the same spec imported by another module is still one dataset
                raise DatasetError(
                    f"dataset {value.name!r} is defined twice: in {where} and in {module.name}; "
                    "rename one of them (a spec's `name`)"
                )
    return {name: found[name][0] for name in sorted(found)}


DATASETS: dict[str, DatasetSpec] = discover(datasets)
LAZY_DATASETS = tuple(name for name, spec in DATASETS.items() if spec.lazy)
MULTILABEL_DATASETS = tuple(name for name, spec in DATASETS.items() if spec.multilabel)
COMMON_ARGUMENTS = {"root", "download", "image_size"}  # every loader's; its other arguments are options


def load_dataset(
    name: str,
    root: str | None = None,
    download: bool = False,
    image_size: int | None = None,
    subset: dict[str, int] | None = None,
    **options,
) -> Dataset:
    """Load a registered dataset with its fixed train/test split.

    In-memory sets are resized once here when `image_size` differs from their native size;
    lazy sets decode at `image_size`. ``subset`` keeps a fixed stratified part of each split it names
    (``{train: n, test: m}``, ``stratified_subset``), drawn before the resize, which costs per image.
    `options` go to the loader (imagefolder: classes_file, ...).
    """
    from sslbench.data.containers import stratified_subset
    from sslbench.data.images import resized

    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}")
    loader = DATASETS[name].loader
    accepted = set(inspect.signature(loader).parameters) - COMMON_ARGUMENTS
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise DatasetError(
            f"dataset {name!r} takes no option(s) {unknown}; it accepts {sorted(accepted) or 'none'}"
        )
    if image_size is not None and int(image_size) < 1:
        raise DatasetError(f"image_size must be a positive integer, got {image_size!r}")
    dataset = loader(root=root, download=download, image_size=image_size, **options)
    if subset:
        dataset = stratified_subset(dataset, subset)
    if image_size is not None and dataset.image_size != image_size:
        dataset = resized(dataset, int(image_size))
    return dataset


def load_arguments(section: dict) -> dict:
    """What ``load_data`` reads of a dataset section, defaults filled in: sections with equal
    arguments load the same images (the label and planning keys such as `optional` play no part)."""
    return {
        "name": section["name"],
        "root": section.get("root"),
        "download": section.get("download", False),
        "image_size": section.get("image_size"),
        "subset": section.get("subset") or None,
        "options": section.get("options") or {},
    }


def load_data(cfg: dict, prepared: str | Path | None = None) -> Dataset:
    """The dataset of a config's ``dataset`` section (a run's settings, or ``{"dataset": section}``).

    ``prepared``: that section's file from ``prepare_dataset``, read instead of the dataset's own
    files: the same Dataset, without decoding every image, drawing the subset and resizing again."""
    if prepared is not None:
        from sslbench.data.prepared import load_prepared

        return load_prepared(prepared, cfg["dataset"])
    d = load_arguments(cfg["dataset"])
    return load_dataset(
        d["name"],
        root=d["root"],
        download=d["download"],
        image_size=d["image_size"],
        subset=d["subset"],
        **d["options"],
    )


def missing_files(section: dict) -> str | None:
    """Why the files of a config's dataset section cannot be found (the message names where they were
    looked for and how to get them), or None when they are there or will be downloaded."""
    spec = DATASETS.get(section["name"])
    return files_missing(spec.files if spec is not None else None, section)


def split_sizes(section: dict) -> dict[str, int] | None:
    """{split: images} of a config's dataset section, read without loading the images (its spec's
    `split_sizes`). None where its files are absent (``missing_files`` says so) or only reading them
    would tell."""
    spec = DATASETS.get(section["name"])
    if spec is None or spec.split_sizes is None:
        return None
    return spec.split_sizes(section)


def subset_too_large(name: str, split: str, size: int, available: int) -> str:
    """What a `subset` larger than its split is told: by the planner where the split's size is known
    before loading (``split_sizes``), else when the dataset is loaded."""
    return (
        f"{size} is more than the {available} images of the {split} split of {name}; give at most "
        f"{available}, or remove `subset.{split}` to keep the whole split"
    )
