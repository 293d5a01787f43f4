"""Dataset registry: fixed train/test splits read from each dataset's own on-disk format.

Every loader returns a `Dataset` whose `train` and `test` are `ImageSet`s. Small datasets are
held in memory as uint8 tensors (resized once, at load time, when another size is asked for);
folder datasets (ImageNet, Places205, VOC07) keep file paths and decode in `ImageSet.load`.

Files are read by our own parsers, not torchvision's dataset classes: those verify MD5 sums of
the official archives, which real-format test files (and trimmed local copies) cannot pass.
torchvision is used only to download, and only when `download=True`.
"""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import io
import json
import os
import pickle
import struct
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sslbench import atomic, datafiles
from sslbench.datafiles import (  # noqa: F401  (DatasetError and the file lists are re-exported)
    CIFAR10_FILES,
    CIFAR100_FILES,
    FASHION_MNIST_FILES,
    LAZY_DATASETS,
    STL_FILES,
    VOC_SPLIT_FILES,
    DatasetError,
    FileSpec,
    locate,
)
from sslbench.errors import rebuild_command, unreadable

# Output size of `load()` for lazily decoded folder datasets when none is given.
DEFAULT_LAZY_IMAGE_SIZE = 224
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# --------------------------------------------------------------------------- containers


@dataclass
class ImageSet:
    """One split: labels plus either the images in memory or the paths to decode them from."""

    labels: torch.Tensor
    images: torch.Tensor | None = None
    paths: list[str] | None = None
    image_size: int | None = None
    channels: int = 3

    def __post_init__(self):
        if (self.images is None) == (self.paths is None):
            raise ValueError("ImageSet needs exactly one of `images` (in memory) or `paths` (lazy)")
        count = len(self.images) if self.images is not None else len(self.paths)
        if len(self.labels) != count:
            raise ValueError(f"ImageSet has {len(self.labels)} labels for {count} images")
        if self.paths is not None and self.image_size is None:
            raise ValueError("a lazily decoded ImageSet (paths) needs `image_size`")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices) -> ImageSet:
        """The rows ``indices`` (in that order), in memory or lazily decoded alike."""
        index = _index_tensor(indices, len(self))
        if self.images is not None:
            return dataclasses.replace(self, labels=self.labels[index], images=self.images[index])
        return dataclasses.replace(
            self, labels=self.labels[index], paths=[self.paths[i] for i in index.tolist()]
        )

    def load(self, indices) -> torch.Tensor:
        """uint8 [b, C, H, W] for `indices` (ints, a sequence, a tensor or a slice)."""
        index = _index_tensor(indices, len(self))
        if self.images is not None:
            return self.images[index]
        if len(index) == 0:
            return torch.empty((0, self.channels, self.image_size, self.image_size), dtype=torch.uint8)
        return torch.stack(
            [decode_image(self.paths[i], self.image_size, self.channels) for i in index.tolist()]
        )


@dataclass
class Dataset:
    name: str
    train: ImageSet
    test: ImageSet
    num_classes: int
    channels: int
    image_size: int  # size of the images load() returns
    multilabel: bool = False
    class_names: list[str] | None = None


def _index_tensor(indices, length: int) -> torch.Tensor:
    if isinstance(indices, slice):
        return torch.arange(length)[indices]
    return torch.as_tensor(indices, dtype=torch.long).reshape(-1)


# --------------------------------------------------------------------------- image helpers


def decode_image(path: str, size: int, channels: int = 3) -> torch.Tensor:
    """Decode with PIL, resize the shorter side to `size`, centre-crop to size x size: uint8 [C, "
    "size, size]."""
    mode = {1: "L", 3: "RGB"}[channels]
    try:
        with Image.open(path) as opened:
            image = opened.convert(mode)  # convert() forces the full decode, so damage shows here
    except (OSError, SyntaxError, ValueError) as error:
        raise DatasetError(
            f"{path}: cannot decode image ({error}); the file is damaged or truncated"
        ) from error
    width, height = image.size
    scale = size / min(width, height)
    new_width, new_height = max(size, round(width * scale)), max(size, round(height * scale))
    if (new_width, new_height) != (width, height):
        image = image.resize((new_width, new_height), Image.Resampling.BILINEAR)
    left, top = (new_width - size) // 2, (new_height - size) // 2
    image = image.crop((left, top, left + size, top + size))
    array = np.asarray(image, dtype=np.uint8).reshape(size, size, channels)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def resize_images(images: torch.Tensor, size: int, chunk: int = 1024) -> torch.Tensor:
    """Bilinear, antialiased resize of uint8 [N, C, H, W] to [N, C, size, size], back to uint8."""
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((len(images), images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, len(images), chunk):  # chunks bound the float32 copy's memory
        batch = images[start : start + chunk].float()
        resized = F.interpolate(
            batch, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[start : start + chunk] = resized.round().clamp(0, 255).to(torch.uint8)
    return out


def _in_memory(images: np.ndarray, labels: np.ndarray) -> ImageSet:
    images = torch.from_numpy(np.ascontiguousarray(images, dtype=np.uint8))
    return ImageSet(labels=torch.from_numpy(labels.astype(np.int64)), images=images, channels=images.shape[1])


# --------------------------------------------------------------------------- locating files


def _torchvision_download(class_name: str, root: Path, *variants: dict) -> None:
    """Download with torchvision's dataset class (which verifies the archive's MD5), once per variant."""
    import torchvision.datasets

    root.mkdir(parents=True, exist_ok=True)
    for arguments in variants:
        getattr(torchvision.datasets, class_name)(str(root), download=True, **arguments)


def _locate_or_download(spec: FileSpec, download: bool, fetch: Callable[[], None]) -> dict[str, Path]:
    try:
        return locate(spec)
    except DatasetError:
        if not download:
            raise
    fetch()
    return locate(spec)


# --------------------------------------------------------------------------- digits


def _load_digits(root=None, download=False, image_size=None) -> Dataset:
    """scikit-learn's bundled 8x8 digits; fixed stratified 75/25 split (1347 / 450).

    Read from the file scikit-learn ships (the one its load_digits reads), split by the row lists in
    digits_split.txt (its stratified train_test_split, random_state 0): importing scikit-learn would
    cost every job that loads digits more than a second.
    """
    import importlib.util

    package = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if package is None or not package.submodule_search_locations:
        raise DatasetError("dataset digits: scikit-learn is not installed; `pip install scikit-learn`")
    path = Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",")  # 64 pixels (0..16) and the label per row
    images = np.rint(rows[:, :-1].reshape(-1, 1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    labels = rows[:, -1].astype(np.int64)
    split = datafiles.digits_split()
    train, test = (np.array(split[name], dtype=np.int64) for name in ("train", "test"))
    return Dataset(
        name="digits",
        train=_in_memory(images[train], labels[train]),
        test=_in_memory(images[test], labels[test]),
        num_classes=10,
        channels=1,
        image_size=8,
        class_names=[str(d) for d in range(10)],
    )


# --------------------------------------------------------------------------- fashion_mnist (IDX)

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


def read_idx(path, expected_ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes (optionally gzipped): magic 0x0000 08 <ndim>, "
    "big-endian dims, data."""
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
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise DatasetError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    return _in_memory(images[:, None], labels)


def _load_fashion_mnist(root=None, download=False, image_size=None) -> Dataset:
    download_root = datafiles.data_root(root)
    found = _locate_or_download(
        datafiles.fashion_mnist_files(root, download),
        download,
        lambda: _torchvision_download("FashionMNIST", download_root, {"train": True}, {"train": False}),
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


# ------------------------------------------------------------------ cifar10 / cifar100 (python pickles)

CIFAR_PIXELS = 3 * 32 * 32


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
    batches = [_read_cifar_batch(path, label_key) for path in paths]
    return _in_memory(np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))


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
    base = datafiles.data_root(root)
    found = _locate_or_download(
        spec, download, lambda: _torchvision_download(torchvision_class, base, {"train": True})
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


def _load_cifar10(root=None, download=False, image_size=None) -> Dataset:
    return _load_cifar(
        datafiles.cifar10_files(root),
        CIFAR10_FILES,
        "labels",
        "batches.meta",
        "label_names",
        10,
        "CIFAR10",
        root,
        download,
    )


def _load_cifar100(root=None, download=False, image_size=None) -> Dataset:
    return _load_cifar(
        datafiles.cifar100_files(root),
        CIFAR100_FILES,
        "fine_labels",
        "meta",
        "fine_label_names",
        100,
        "CIFAR100",
        root,
        download,
    )


# --------------------------------------------------------------------------- stl10 (binary)

STL_SHAPE = (3, 96, 96)
STL_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def _read_stl_split(images_path: Path, labels_path: Path) -> ImageSet:
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
    return _in_memory(images, labels - 1)


def _load_stl10(root=None, download=False, image_size=None) -> Dataset:
    base = datafiles.data_root(root)
    found = _locate_or_download(
        datafiles.stl10_files(root),
        download,
        lambda: _torchvision_download("STL10", base, {"split": "train"}),
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


# ---------------------------------------------------- imagefolder (ImageNet, ImageNet-100, Places205)


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


def _load_imagefolder(
    root=None, download=False, image_size=None, classes_file=None, train_dir="train", test_dir="val"
) -> Dataset:
    """root/<train_dir>/<class>/* and root/<test_dir>/<class>/*; classes sorted; decoded lazily."""
    found = locate(datafiles.imagefolder_files(root, train_dir=train_dir, test_dir=test_dir))
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


# --------------------------------------------------------------------------- voc07 (multilabel)

VOC_CLASSES = [
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
]
VOC_PRESENT, VOC_DIFFICULT_ONLY, VOC_ABSENT = 1, 0, -1


def voc_labels(annotation_path) -> np.ndarray:
    """int8 [20] from one VOC XML: 1 = a non-difficult object, 0 = only difficult ones, -1 = absent."""
    try:
        tree = ET.parse(annotation_path)
    except (ET.ParseError, OSError) as error:
        raise DatasetError(
            f"{annotation_path}: cannot parse annotation ({error}); the file is missing or damaged"
        ) from error
    labels = np.full(len(VOC_CLASSES), VOC_ABSENT, dtype=np.int8)
    for obj in tree.getroot().iter("object"):
        name = (obj.findtext("name") or "").strip()
        if name not in VOC_CLASSES:
            raise DatasetError(f"{annotation_path}: unknown VOC class {name!r}")
        difficult = (obj.findtext("difficult") or "0").strip() == "1"
        k = VOC_CLASSES.index(name)
        if not difficult:
            labels[k] = VOC_PRESENT
        elif labels[k] == VOC_ABSENT:
            labels[k] = VOC_DIFFICULT_ONLY
    return labels


def _voc_split(voc: Path, ids_file: Path, image_size: int) -> ImageSet:
    ids = [line.strip() for line in ids_file.read_text().splitlines() if line.strip()]
    if not ids:
        raise DatasetError(f"{ids_file}: lists no images")
    paths = [str(voc / "JPEGImages" / f"{i}.jpg") for i in ids]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise DatasetError(f"{len(missing)} images listed in {ids_file} are missing, e.g. {missing[0]}")
    labels = np.stack([voc_labels(voc / "Annotations" / f"{i}.xml") for i in ids])
    return ImageSet(labels=torch.from_numpy(labels), paths=paths, image_size=image_size)


def _load_voc07(root=None, download=False, image_size=None) -> Dataset:
    """VOC 2007 in torchvision's layout: trainval as train, test as test; multilabel, decoded lazily."""
    base = datafiles.data_root(root)
    found = _locate_or_download(
        datafiles.voc07_files(root),
        download,
        lambda: _torchvision_download(
            "VOCDetection",
            base,
            {"year": "2007", "image_set": "trainval"},
            {"year": "2007", "image_set": "test"},
        ),
    )
    voc = found["JPEGImages"].parent
    size = image_size or DEFAULT_LAZY_IMAGE_SIZE
    return Dataset(
        name="voc07",
        train=_voc_split(voc, found[VOC_SPLIT_FILES["train"]], size),
        test=_voc_split(voc, found[VOC_SPLIT_FILES["test"]], size),
        num_classes=len(VOC_CLASSES),
        channels=3,
        image_size=size,
        multilabel=True,
        class_names=list(VOC_CLASSES),
    )


# --------------------------------------------------------------------------- registry

DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": _load_digits,
    "fashion_mnist": _load_fashion_mnist,
    "cifar10": _load_cifar10,
    "cifar100": _load_cifar100,
    "stl10": _load_stl10,
    "imagefolder": _load_imagefolder,
    "voc07": _load_voc07,
}
_COMMON_ARGUMENTS = {"root", "download", "image_size"}


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
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}")
    loader = DATASETS[name]
    accepted = set(inspect.signature(loader).parameters) - _COMMON_ARGUMENTS
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
        dataset = _resized(dataset, int(image_size))
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


# --------------------------------------------------------------------------- prepared files
# One .npz per in-memory dataset section: each split's images (uint8 [N, C, H, W], as ImageSet holds
# them) and labels as arrays, everything else of the Dataset and a meta record in `meta_json`.
PREPARED_FORMAT = 1  # the layout below; a file of another layout is refused, not misread
SPLITS = ("train", "test")
SPLIT_ARRAYS = ("images", "labels")  # ImageSet's tensors; its other fields (but paths) go in the meta


def prepare_dataset(section: dict, out_path: str | Path) -> Path:
    """Load a dataset section as ``load_data`` does and write it, atomically, to one file that
    ``load_prepared`` reads back bit for bit. Only for datasets held in memory: a folder dataset
    decodes its images per batch, and a copy of them is what it avoids."""
    from sslbench.provenance import code_record, provenance

    if section["name"] in LAZY_DATASETS:
        raise DatasetError(
            f"dataset {section['name']!r} decodes its images from their files as they are used; there "
            f"is nothing to prepare (only {sorted(set(DATASETS) - set(LAZY_DATASETS))} are held in memory)"
        )
    data = load_data({"dataset": section})
    arrays, splits = {}, {}
    for split in SPLITS:
        images = getattr(data, split)
        arrays |= {f"{split}_{field}": getattr(images, field).numpy() for field in SPLIT_ARRAYS}
        splits[split] = {
            f.name: getattr(images, f.name)
            for f in dataclasses.fields(ImageSet)
            if f.name not in (*SPLIT_ARRAYS, "paths")
        }
    meta = {
        "format": PREPARED_FORMAT,
        "section": section,
        "dataset": {
            f.name: getattr(data, f.name) for f in dataclasses.fields(Dataset) if f.name not in SPLITS
        },
        "splits": splits,
        "prepared_with": provenance("cpu"),
        "code": code_record("prepare"),  # what `rerun_on_code_change` and `sslbench status` compare
    }
    buffer = io.BytesIO()
    np.savez(buffer, meta_json=np.array(json.dumps(meta)), **arrays)
    return atomic.write_bytes(out_path, buffer.getvalue())


def load_prepared(path: str | Path, section: dict) -> Dataset:
    """The Dataset of ``section`` from its file written by ``prepare_dataset``: the tensors, labels
    and attributes ``load_data`` gives for it, bit for bit. A file of another section is refused."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta_json"]))
            if meta.get("format") != PREPARED_FORMAT:
                raise DatasetError(
                    f"{path}: not a prepared dataset file of this code (its format: "
                    f"{meta.get('format')!r}, expected {PREPARED_FORMAT}). Prepare it again: "
                    f"{rebuild_command(path)}"
                )
            _check_prepared_section(path, meta["section"], section)
            arrays = {name: npz[name] for name in npz.files if name != "meta_json"}
            splits = {
                split: ImageSet(
                    **{field: torch.from_numpy(arrays[f"{split}_{field}"]) for field in SPLIT_ARRAYS},
                    **meta["splits"][split],
                )
                for split in SPLITS
            }
            return Dataset(**meta["dataset"], **splits)
    except DatasetError:
        raise
    except Exception as err:  # a truncated zip, a missing array, a damaged record: each its own error
        raise unreadable(path, "prepared dataset file", err) from err


def _check_prepared_section(path, prepared: dict, section: dict) -> None:
    if load_arguments(prepared) != load_arguments(section):
        raise DatasetError(
            f"{path}: prepared from the dataset section {json.dumps(prepared, sort_keys=True)}, not "
            f"from this job's {json.dumps(section, sort_keys=True)}. Prepare it again: "
            f"{rebuild_command(path)}, or run the job without --prepared to read the dataset's own files"
        )


def stratified_subset(dataset: Dataset, sizes: dict[str, int]) -> Dataset:
    """The same dataset with ``sizes[split]`` images of each named split (every class in proportion,
    a fixed draw: scikit-learn's stratified split with random_state 0), kept in their order."""
    if dataset.multilabel:
        raise DatasetError(f"{dataset.name}: `subset` needs one class per image; this dataset is multi-label")
    splits = {}
    for split, size in sizes.items():
        images = getattr(dataset, split)
        labels = images.labels.numpy()
        if size > len(labels):  # the planner checks the sizes it can know before loading
            too_large = datafiles.subset_too_large(dataset.name, split, size, len(labels))
            raise DatasetError(f"{dataset.name}: `subset.{split}`: {too_large}")
        if size == len(labels):
            continue
        from sklearn.model_selection import train_test_split  # a second's import: only to draw

        keep, _ = train_test_split(np.arange(len(labels)), train_size=size, stratify=labels, random_state=0)
        splits[split] = images.subset(np.sort(keep))
    return dataclasses.replace(dataset, **splits)


# What a transfer target's images go through to fit an encoder trained on other channels (stored in
# every result row as `transfer_channels`).
CHANNEL_CONVERSIONS = {
    (1, 3): "grey repeated to 3 channels",
    (3, 1): "ITU-R 601-2 luma, L = (299 R + 587 G + 114 B) / 1000 (PIL's convert('L'))",
}


def channel_conversion(source: int, channels: int) -> str:
    return "none" if source == channels else CHANNEL_CONVERSIONS[source, channels]


def convert_channels(dataset: Dataset, channels: int) -> Dataset:
    """The dataset as ``channels``-channel images. Folder sets decode to it (PIL's own conversion);
    in-memory sets are converted here with PIL's integer arithmetic, so both give the same pixels."""
    if channels == dataset.channels:
        return dataset
    channel_conversion(dataset.channels, channels)  # a KeyError for anything but 1 <-> 3

    def convert(split: ImageSet) -> ImageSet:
        if split.images is None:
            return dataclasses.replace(split, channels=channels)
        if channels == 3:
            images = split.images.expand(-1, 3, -1, -1).contiguous()
        else:  # PIL's RGB -> L: (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16
            weights = torch.tensor([19595, 38470, 7471], dtype=torch.int64).view(1, 3, 1, 1)
            luma = ((split.images.to(torch.int64) * weights).sum(1, keepdim=True) + 0x8000) >> 16
            images = luma.to(torch.uint8)
        return dataclasses.replace(split, images=images, channels=channels)

    return dataclasses.replace(
        dataset, train=convert(dataset.train), test=convert(dataset.test), channels=channels
    )


def _resized(dataset: Dataset, size: int) -> Dataset:
    def resize(split: ImageSet) -> ImageSet:
        return dataclasses.replace(split, images=resize_images(split.images, size))

    return dataclasses.replace(
        dataset, train=resize(dataset.train), test=resize(dataset.test), image_size=size
    )


# --- statistics: what the views are normalised with

# ITU-R 601-2 luma weights (torchvision's rgb_to_grayscale rounds red to 0.2989).
LUMA_WEIGHTS = (0.299, 0.587, 0.114)

IMAGENET_MEAN = (0.485, 0.456, 0.406)

IMAGENET_STD = (0.229, 0.224, 0.225)

# ImageNet's grey statistics, derived with the same luma weights: the mean is
# exact; the std assumes fully correlated channels (an upper bound, ~0.226).
IMAGENET_GREY_MEAN = sum(w * m for w, m in zip(LUMA_WEIGHTS, IMAGENET_MEAN))

IMAGENET_GREY_STD = sum(w * s for w, s in zip(LUMA_WEIGHTS, IMAGENET_STD))


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
    check_uint8_batch(images, channels, "dataset_stats(images=...)")
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


def check_uint8_batch(images: torch.Tensor, channels: int, where: str) -> None:
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
