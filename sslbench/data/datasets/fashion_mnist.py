"""Fashion-MNIST: the four IDX files of unsigned bytes (optionally gzipped), 28x28 grey, 60k / 10k."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from sslbench.data.files import (
    DatasetError,
    FileSpec,
    data_root,
    files_missing,
    locate,
    locate_or_download,
    section_files,
    torchvision_download,
)
from sslbench.data.spec import DatasetSpec

if TYPE_CHECKING:
    import numpy as np

    from sslbench.data.containers import Dataset, ImageSet

# Where Debian's `dataset-fashion-mnist` package installs the IDX files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]


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


def read_idx(path, expected_ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes (optionally gzipped): magic 0x0000 08 <ndim>, "
    "big-endian dims, data."""
    import numpy as np

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as error:  # bad or truncated gzip stream
        raise DatasetError(
            f"{path}: cannot read ({error}); the file is damaged or truncated, fetch it again"
        ) from error
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise DatasetError(
            f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex() or 'missing'}, "
            "expected 000008..)"
        )
    if raw[3] != expected_ndim:
        raise DatasetError(f"{path}: IDX file has {raw[3]} dimensions, expected {expected_ndim}")
    header = 4 + 4 * expected_ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header ({len(raw)} bytes); fetch the file again")
    dims = struct.unpack(f">{expected_ndim}I", raw[4:header])
    expected_bytes = header + int(np.prod(dims))
    if len(raw) != expected_bytes:
        raise DatasetError(
            f"{path}: header declares shape {dims} ({expected_bytes} bytes) but the file has "
            f"{len(raw)} bytes; "
            "it is truncated or damaged, fetch it again"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _read_idx_split(images_path: Path, labels_path: Path) -> ImageSet:
    from sslbench.data.containers import in_memory

    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise DatasetError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    return in_memory(images[:, None], labels)


def load_fashion_mnist(root=None, download=False, image_size=None) -> Dataset:
    from sslbench.data.containers import Dataset

    download_root = data_root(root)
    found = locate_or_download(
        fashion_mnist_files(root, download),
        download,
        lambda: torchvision_download("FashionMNIST", download_root, {"train": True}, {"train": False}),
    )
    paths = {key: found[name] for key, name in FASHION_MNIST_FILES.items()}
    return Dataset(
        name="fashion_mnist",
        train=_read_idx_split(paths["train_images"], paths["train_labels"]),
        test=_read_idx_split(paths["test_images"], paths["test_labels"]),
        num_classes=10,
        channels=1,
        image_size=28,
        class_names=list(FASHION_MNIST_CLASSES),
    )


def split_sizes(section: dict) -> dict[str, int] | None:
    """From the IDX label files' headers; None where the files are absent or damaged."""
    if files_missing(fashion_mnist_files, section) is not None:
        return None
    found = locate(section_files(fashion_mnist_files, section))
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


FASHION_MNIST = DatasetSpec(
    name="fashion_mnist",
    loader=load_fashion_mnist,
    source="Debian's dataset-fashion-mnist package, or torchvision's FashionMNIST download",
    files=fashion_mnist_files,
    split_sizes=split_sizes,
    channels=1,
)
