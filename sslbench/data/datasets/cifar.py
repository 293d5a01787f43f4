"""CIFAR-10 and CIFAR-100: the python version's pickled batches (torchvision's layout), 32x32 colour."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING

from sslbench.data.files import (
    DatasetError,
    FileSpec,
    data_root,
    download_hint,
    locate_or_download,
    torchvision_download,
)
from sslbench.data.spec import DatasetSpec

if TYPE_CHECKING:
    import numpy as np

    from sslbench.data.containers import Dataset, ImageSet

CIFAR10_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR100_FILES = {"train": ["train"], "test": ["test"]}
CIFAR_SPLIT_SIZES = {"train": 50000, "test": 10000}  # CIFAR-10's and CIFAR-100's python batches
CIFAR_PIXELS = 3 * 32 * 32


def cifar_files(name: str, folder_name: str, files: dict[str, list[str]], root=None) -> FileSpec:
    base = data_root(root)
    return FileSpec(
        name, [base / folder_name, base], files["train"] + files["test"], download_hint(name, base)
    )


def cifar10_files(root=None, download=False, **options) -> FileSpec:
    return cifar_files("cifar10", "cifar-10-batches-py", CIFAR10_FILES, root)


def cifar100_files(root=None, download=False, **options) -> FileSpec:
    return cifar_files("cifar100", "cifar-100-python", CIFAR100_FILES, root)


def _read_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            content = pickle.load(handle, encoding="bytes")  # the official files are Python 2 pickles
    except (
        Exception
    ) as error:  # a damaged pickle fails in many ways (EOFError, UnpicklingError, ValueError...)
        raise DatasetError(
            f"{path}: cannot unpickle ({error!r}); the file is damaged or truncated, fetch it again"
        ) from error
    if not isinstance(content, dict):
        raise DatasetError(f"{path}: expected a pickled dict, found {type(content).__name__}")
    return {key.decode() if isinstance(key, bytes) else key: value for key, value in content.items()}


def _read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    batch = _read_pickle(path)
    for key in ("data", label_key):
        if key not in batch:
            raise DatasetError(f"{path}: key b'{key}' missing (keys: {sorted(batch)}); not a CIFAR batch")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != CIFAR_PIXELS or len(data) != len(labels):
        raise DatasetError(
            f"{path}: b'data' has shape {data.shape} and b'{label_key}' {len(labels)} entries; "
            f"expected [N, {CIFAR_PIXELS}] and N labels"
        )
    return data.reshape(-1, 3, 32, 32), labels  # rows hold the 1024 R, then G, then B values, row-major


def _class_names(meta_path: Path, key: str) -> list[str] | None:
    if not meta_path.exists():
        return None
    names = _read_pickle(meta_path).get(key)
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names] if names is not None else None


def _cifar_split(paths: list[Path], label_key: str) -> ImageSet:
    import numpy as np

    from sslbench.data.containers import in_memory

    batches = [_read_cifar_batch(path, label_key) for path in paths]
    return in_memory(np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))


def _load_cifar(
    spec: FileSpec,
    files: dict[str, list[str]],
    label_key,
    meta_file,
    names_key,
    num_classes,
    torchvision_class,
    root,
    download,
) -> Dataset:
    from sslbench.data.containers import Dataset

    base = data_root(root)
    found = locate_or_download(
        spec, download, lambda: torchvision_download(torchvision_class, base, {"train": True})
    )
    folder = found[files["train"][0]].parent
    return Dataset(
        name=spec.dataset,
        train=_cifar_split([found[f] for f in files["train"]], label_key),
        test=_cifar_split([found[f] for f in files["test"]], label_key),
        num_classes=num_classes,
        channels=3,
        image_size=32,
        class_names=_class_names(folder / meta_file, names_key),
    )


def load_cifar10(root=None, download=False, image_size=None) -> Dataset:
    return _load_cifar(
        cifar10_files(root),
        CIFAR10_FILES,
        "labels",
        "batches.meta",
        "label_names",
        10,
        "CIFAR10",
        root,
        download,
    )


def load_cifar100(root=None, download=False, image_size=None) -> Dataset:
    return _load_cifar(
        cifar100_files(root),
        CIFAR100_FILES,
        "fine_labels",
        "meta",
        "fine_label_names",
        100,
        "CIFAR100",
        root,
        download,
    )


def split_sizes(section: dict) -> dict[str, int]:
    """The official batches' fixed sizes."""
    return dict(CIFAR_SPLIT_SIZES)


CIFAR10 = DatasetSpec(
    name="cifar10",
    loader=load_cifar10,
    source="torchvision's CIFAR10 download (the python version, cifar-10-batches-py)",
    files=cifar10_files,
    split_sizes=split_sizes,
    channels=3,
)
CIFAR100 = DatasetSpec(
    name="cifar100",
    loader=load_cifar100,
    source="torchvision's CIFAR100 download (the python version, cifar-100-python)",
    files=cifar100_files,
    split_sizes=split_sizes,
    channels=3,
)
