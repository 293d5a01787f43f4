"""A folder of class folders (ImageNet, ImageNet-100, Places205): root/<train_dir>/<class>/* and
root/<test_dir>/<class>/*, classes sorted, images decoded from their files batch by batch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sslbench.data.files import DatasetError, FileSpec, locate
from sslbench.data.spec import DatasetSpec

if TYPE_CHECKING:
    from sslbench.data.containers import Dataset, ImageSet

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def imagefolder_files(root=None, download=False, train_dir="train", test_dir="val", **options) -> FileSpec:
    if root is None:
        raise DatasetError("imagefolder needs root= : a folder holding train/<class>/* and val/<class>/*")
    base = Path(root).expanduser()
    how = (
        f"put the images in {base}/{train_dir}/<class>/<image> and {base}/{test_dir}/<class>/<image> "
        "(ImageNet: extract the official archives and sort val/ into class folders; Places205: one folder "
        "per scene category); these datasets cannot be downloaded automatically"
    )
    return FileSpec("imagefolder", [base], [train_dir, test_dir], how)


def _image_files(folder: Path) -> list[str]:
    files = []
    for directory, subdirs, names in os.walk(folder, followlinks=True):
        subdirs.sort()
        files += [os.path.join(directory, n) for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)]
    return files


def _read_classes_file(path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(
            f"classes_file {path} not found (expected one class folder name, e.g. a wnid, per line)"
        )
    return sorted(
        {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}
    )


def _folder_split(split_dir: Path, classes: list[str], image_size: int, restrict: bool) -> ImageSet:
    import torch

    from sslbench.data.containers import ImageSet

    class_dirs = sorted(d.name for d in split_dir.iterdir() if d.is_dir())
    unknown = [d for d in class_dirs if d not in classes]
    if unknown and not restrict:
        raise DatasetError(
            f"{split_dir}: class folders {unknown[:5]} have no counterpart in the training folder"
        )
    paths, labels = [], []
    for label, name in enumerate(classes):
        if (split_dir / name).is_dir():
            files = _image_files(split_dir / name)
            paths += files
            labels += [label] * len(files)
    if not paths:
        raise DatasetError(f"{split_dir}: no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return ImageSet(labels=torch.tensor(labels, dtype=torch.int64), paths=paths, image_size=image_size)


def load_imagefolder(
    root=None, download=False, image_size=None, classes_file=None, train_dir="train", test_dir="val"
) -> Dataset:
    """root/<train_dir>/<class>/* and root/<test_dir>/<class>/*; classes sorted; decoded lazily."""
    from sslbench.data.containers import Dataset
    from sslbench.data.images import DEFAULT_LAZY_IMAGE_SIZE

    found = locate(imagefolder_files(root, train_dir=train_dir, test_dir=test_dir))
    split_dirs = {"train": found[train_dir], "test": found[test_dir]}
    classes = sorted(d.name for d in split_dirs["train"].iterdir() if d.is_dir())
    if classes_file is not None:
        wanted = _read_classes_file(classes_file)
        absent = [c for c in wanted if c not in classes]
        if absent:
            raise DatasetError(
                f"classes_file {classes_file}: classes {absent[:5]} have no folder in {split_dirs['train']}"
            )
        classes = wanted
    if not classes:
        raise DatasetError(f"{split_dirs['train']}: no class folders")
    size = image_size or DEFAULT_LAZY_IMAGE_SIZE
    restrict = classes_file is not None
    return Dataset(
        name="imagefolder",
        train=_folder_split(split_dirs["train"], classes, size, restrict),
        test=_folder_split(split_dirs["test"], classes, size, restrict),
        num_classes=len(classes),
        channels=3,
        image_size=size,
        class_names=classes,
    )


IMAGEFOLDER = DatasetSpec(
    name="imagefolder",
    loader=load_imagefolder,
    source="your own copy (ImageNet's official archives, Places205...): nothing is downloaded",
    files=imagefolder_files,
    lazy=True,
    channels=3,
    preflight_load=False,
)
