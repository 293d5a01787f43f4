"""STL-10's labelled splits: the binary version's files, 96x96 colour, each channel column-major."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sslbench.data.files import (
    DatasetError,
    FileSpec,
    data_root,
    download_hint,
    files_missing,
    locate,
    locate_or_download,
    section_files,
    torchvision_download,
)
from sslbench.data.spec import DatasetSpec

if TYPE_CHECKING:
    from sslbench.data.containers import Dataset, ImageSet

STL_FILES = ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"]
STL_SHAPE = (3, 96, 96)
STL_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def stl10_files(root=None, download=False, **options) -> FileSpec:
    base = data_root(root)
    return FileSpec("stl10", [base / "stl10_binary", base], list(STL_FILES), download_hint("stl10", base))


def _read_stl_split(images_path: Path, labels_path: Path) -> ImageSet:
    import numpy as np

    from sslbench.data.containers import in_memory

    raw = np.fromfile(images_path, dtype=np.uint8)
    per_image = int(np.prod(STL_SHAPE))
    if raw.size == 0 or raw.size % per_image:
        raise DatasetError(
            f"{images_path}: {raw.size} bytes is not a whole number of 3x96x96 images ({per_image} "
            "bytes each); "
            "the file is truncated, fetch it again"
        )
    # Each channel is stored column-major: the file reads as [N, C, W, H].
    images = raw.reshape(-1, *STL_SHAPE).transpose(0, 1, 3, 2)
    labels = np.fromfile(labels_path, dtype=np.uint8).astype(np.int64)
    if len(labels) != len(images):
        raise DatasetError(
            f"{labels_path}: {len(labels)} labels for the {len(images)} images in {images_path}"
        )
    if len(labels) and (labels.min() < 1 or labels.max() > 10):
        raise DatasetError(f"{labels_path}: labels must be 1..10, found {labels.min()}..{labels.max()}")
    return in_memory(images, labels - 1)


def load_stl10(root=None, download=False, image_size=None) -> Dataset:
    from sslbench.data.containers import Dataset

    base = data_root(root)
    found = locate_or_download(
        stl10_files(root),
        download,
        lambda: torchvision_download("STL10", base, {"split": "train"}),
    )
    names_file = found["train_X.bin"].parent / "class_names.txt"
    class_names = names_file.read_text().split() if names_file.exists() else list(STL_CLASSES)
    return Dataset(
        name="stl10",
        train=_read_stl_split(found["train_X.bin"], found["train_y.bin"]),
        test=_read_stl_split(found["test_X.bin"], found["test_y.bin"]),
        num_classes=10,
        channels=3,
        image_size=96,
        class_names=class_names,
    )


def split_sizes(section: dict) -> dict[str, int] | None:
    """The label files' sizes (a byte per label); None where the files are absent."""
    if files_missing(stl10_files, section) is not None:
        return None
    found = locate(section_files(stl10_files, section))
    return {split: found[f"{split}_y.bin"].stat().st_size for split in ("train", "test")}


STL10 = DatasetSpec(
    name="stl10",
    loader=load_stl10,
    source="torchvision's STL10 download (the binary version, stl10_binary)",
    files=stl10_files,
    split_sizes=split_sizes,
    channels=3,
)
