"""Where each dataset's files are looked for, and whether they are there.

No torch here: planning (``sslbench.plan``) asks ``missing_files`` before any job runs, so that an
optional evaluation target whose files are absent is skipped with the message of how to get them,
and a required one stops the run. ``sslbench.data`` parses the files ``locate`` finds.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sslbench.errors import SslbenchError


class DatasetError(SslbenchError, ValueError):
    """A dataset is unknown, missing or damaged; the message names the paths and the fix."""


# Where `root=None` points for datasets that live under a data folder (the repo ignores ./data).
DATA_ROOT_ENV = "SSLBENCH_DATA"
DEFAULT_DATA_ROOT = "data"
# Where Debian's `dataset-fashion-mnist` package installs the IDX files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR100_FILES = {"train": ["train"], "test": ["test"]}
STL_FILES = ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"]
VOC_SPLIT_FILES = {"train": "ImageSets/Main/trainval.txt", "test": "ImageSets/Main/test.txt"}
# The rows of scikit-learn's digits in each split (sslbench.data reads the images by them).
DIGITS_SPLIT_FILE = Path(__file__).with_name("digits_split.txt")
CIFAR_SPLIT_SIZES = {"train": 50000, "test": 10000}  # CIFAR-10's and CIFAR-100's python batches


@dataclass
class FileSpec:
    """The files of one dataset: ``names`` all in one of ``folders`` (the first that holds them)."""

    dataset: str
    folders: list[Path]
    names: list[str]
    how_to_get: str
    allow_gz: bool = False


def data_root(root) -> Path:
    if root is not None:
        return Path(root).expanduser()
    return Path(os.environ.get(DATA_ROOT_ENV, DEFAULT_DATA_ROOT)).expanduser()


def download_hint(dataset: str, folder: Path) -> str:
    return (
        f"call load_dataset({dataset!r}, root=..., download=True) (or `--download`) to fetch them "
        "with torchvision "
        f"into {folder}, or pass root= pointing at a folder that holds them"
    )


def find(folder: Path, name: str, allow_gz: bool = False) -> Path | None:
    for candidate in [folder / name] + ([folder / f"{name}.gz"] if allow_gz else []):
        if candidate.exists():
            return candidate
    return None


def locate(spec: FileSpec) -> dict[str, Path]:
    """Paths of the spec's names in the first folder that holds them all; else an error listing what
    each folder lacks and how to get the files."""
    for folder in spec.folders:
        found = {name: find(folder, name, spec.allow_gz) for name in spec.names}
        if all(found.values()):
            return found
    report = "\n".join(
        f"  {folder}: missing {', '.join(n for n in spec.names if find(folder, n, spec.allow_gz) is None)}"
        for folder in spec.folders
    )
    raise DatasetError(
        f"{spec.dataset}: dataset files not found. Looked in:\n{report}\nTo get them: {spec.how_to_get}"
    )


# --------------------------------------------------------------------------- per dataset


def fashion_mnist_files(root=None, download=False, **options) -> FileSpec:
    folders = [Path(root), Path(root) / "FashionMNIST" / "raw"] if root is not None else []
    folders.append(FASHION_MNIST_SYSTEM_DIR)
    download_folder = data_root(root) / "FashionMNIST" / "raw"
    if download:
        folders.append(download_folder)
    how = (
        "`apt-get install dataset-fashion-mnist` (installs them in "
        f"{FASHION_MNIST_SYSTEM_DIR}), or pass root= pointing at a folder holding the four IDX files "
        f"(optionally .gz), or download=True to fetch them with torchvision into {download_folder}"
    )
    return FileSpec("fashion_mnist", folders, list(FASHION_MNIST_FILES.values()), how, allow_gz=True)


def cifar_files(name: str, folder_name: str, files: dict[str, list[str]], root=None) -> FileSpec:
    base = data_root(root)
    return FileSpec(
        name, [base / folder_name, base], files["train"] + files["test"], download_hint(name, base)
    )


def cifar10_files(root=None, download=False, **options) -> FileSpec:
    return cifar_files("cifar10", "cifar-10-batches-py", CIFAR10_FILES, root)


def cifar100_files(root=None, download=False, **options) -> FileSpec:
    return cifar_files("cifar100", "cifar-100-python", CIFAR100_FILES, root)


def stl10_files(root=None, download=False, **options) -> FileSpec:
    base = data_root(root)
    return FileSpec("stl10", [base / "stl10_binary", base], list(STL_FILES), download_hint("stl10", base))


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


def voc07_files(root=None, download=False, **options) -> FileSpec:
    base = data_root(root)
    names = [*VOC_SPLIT_FILES.values(), "JPEGImages", "Annotations"]
    return FileSpec("voc07", [base / "VOCdevkit" / "VOC2007", base], names, download_hint("voc07", base))


# None: the dataset ships with a Python package (nothing to look for).
FILE_SPECS: dict[str, Callable[..., FileSpec] | None] = {
    "digits": None,
    "fashion_mnist": fashion_mnist_files,
    "cifar10": cifar10_files,
    "cifar100": cifar100_files,
    "stl10": stl10_files,
    "imagefolder": imagefolder_files,
    "voc07": voc07_files,
}
MULTILABEL_DATASETS = ("voc07",)  # their labels are [N, classes] in the VOC devkit's codes
# Decoded from their image files batch by batch (sslbench.data's ImageSet.paths); every other loader
# holds its images in memory, and the DAG prepares those once per section (`sslbench prepare`).
LAZY_DATASETS = ("imagefolder", "voc07")


def missing_files(section: dict) -> str | None:
    """Why the files of a config's dataset section cannot be found (the message names where they were
    looked for and how to get them), or None when they are there or will be downloaded."""
    spec_of = FILE_SPECS.get(section["name"])
    if spec_of is None or section.get("download", False):
        return None
    try:
        locate(spec_of(root=section.get("root"), **section.get("options", {})))
    except DatasetError as err:
        return str(err)
    return None


def digits_split() -> dict[str, list[int]]:
    """{split: the rows of scikit-learn's digits in it}, as DIGITS_SPLIT_FILE stores them (train's line,
    then test's, after the comments)."""
    lines = [line for line in DIGITS_SPLIT_FILE.read_text().splitlines() if not line.startswith("#")]
    return {split: [int(row) for row in line.split()] for split, line in zip(("train", "test"), lines)}


def split_sizes(section: dict) -> dict[str, int] | None:
    """{split: images} of a config's dataset section, read without loading the images: digits' split
    file, the IDX label headers (Fashion-MNIST), the label files' sizes (STL-10: a byte per label),
    the CIFAR batches' fixed sizes. None where the files are absent (``missing_files`` says so) or only
    reading the folders would tell (imagefolder, voc07)."""
    name = section["name"]
    if name == "digits":
        return {split: len(rows) for split, rows in digits_split().items()}
    if name in ("cifar10", "cifar100"):
        return dict(CIFAR_SPLIT_SIZES)
    if name not in ("fashion_mnist", "stl10") or missing_files(section) is not None:
        return None
    found = locate(FILE_SPECS[name](root=section.get("root"), **section.get("options", {})))
    if name == "stl10":
        return {split: found[f"{split}_y.bin"].stat().st_size for split in ("train", "test")}
    sizes = {}
    for split, key in (("train", "train_labels"), ("test", "test_labels")):
        path = found[FASHION_MNIST_FILES[key]]
        try:
            with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
                header = f.read(8)
        except (OSError, EOFError):
            return None  # a damaged file: loading it says so
        if len(header) < 8 or header[:4] != b"\x00\x00\x08\x01":
            return None
        sizes[split] = struct.unpack(">I", header[4:])[0]
    return sizes


def subset_too_large(name: str, split: str, size: int, available: int) -> str:
    """What a `subset` larger than its split is told: by the planner where the split's size is known
    before loading (``split_sizes``), else when the dataset is loaded."""
    return (
        f"{size} is more than the {available} images of the {split} split of {name}; give at most "
        f"{available}, or remove `subset.{split}` to keep the whole split"
    )
