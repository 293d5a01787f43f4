"""Tiny files in each dataset's real on-disk format (``from dataset_files import ...``): what the loaders'
tests in tests/data read back. Fashion-MNIST's IDX writers, which other tests use too, are in support.py."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from support import write_idx

RNG = np.random.default_rng(0)


# --------------------------------------------------------------------------- fashion_mnist (IDX)


def make_idx_tree(folder: Path, n_train=7, n_test=5, compress=False):
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": RNG.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": RNG.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        write_idx(folder / name, array, compress)
    return arrays


# --------------------------------------------------------------------------- cifar10 / cifar100 (pickles)


def write_pickle(path: Path, obj) -> None:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle, protocol=2)  # the official files are protocol-2 Python 2 pickles


def cifar_batch(n, label_key, num_classes):
    return {
        b"batch_label": b"testing batch",
        b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8),
        label_key: RNG.integers(0, num_classes, n).tolist(),
        b"filenames": [b"x.png"] * n,
    }


def make_cifar10(root: Path):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {f"data_batch_{i}": cifar_batch(i + 1, b"labels", 10) for i in range(1, 6)}
    batches["test_batch"] = cifar_batch(4, b"labels", 10)
    for name, batch in batches.items():
        write_pickle(folder / name, batch)
    write_pickle(folder / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    return folder, batches


# --------------------------------------------------------------------------- stl10 (binary, column-major)


def make_stl10(root: Path, n_train=3, n_test=2):
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    images = {
        "train": RNG.integers(0, 256, (n_train, 3, 96, 96), dtype=np.uint8),
        "test": RNG.integers(0, 256, (n_test, 3, 96, 96), dtype=np.uint8),
    }
    labels = {
        "train": RNG.integers(1, 11, n_train, dtype=np.uint8),
        "test": RNG.integers(1, 11, n_test, dtype=np.uint8),
    }
    labels["train"][0] = 10  # the largest stored label must become class 9
    for split in ("train", "test"):
        # the format stores each channel column-major: [N, C, W, H] in C order
        (folder / f"{split}_X.bin").write_bytes(images[split].transpose(0, 1, 3, 2).tobytes())
        (folder / f"{split}_y.bin").write_bytes(labels[split].tobytes())
    return folder, images, labels


# --------------------------------------------------------------------------- imagefolder


def save_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def make_imagefolder(root: Path, size=6):
    """train: b/ 2 images, a/ 1 image, c/ 1 image; val: a/ 1, b/ 1 (class order must come from sorting)."""
    pixels = {}
    layout = {
        "train/b/x1.png": 0,
        "train/b/x0.png": 1,
        "train/a/y.PNG": 2,
        "train/c/z.png": 3,
        "val/a/v.png": 4,
        "val/b/w.png": 5,
    }
    for relative in layout:
        array = RNG.integers(0, 256, (size, size, 3), dtype=np.uint8)
        save_png(root / relative, array)
        pixels[relative] = array
    (root / "train" / "b" / "notes.txt").write_text("not an image")
    return pixels


def as_chw(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array).permute(2, 0, 1)


# --------------------------------------------------------------------------- voc07


def voc_xml(objects):
    parts = ["<annotation><folder>VOC2007</folder><size><width>8</width><height>8</height></size>"]
    for name, difficult in objects:
        tag = "" if difficult is None else f"<difficult>{difficult}</difficult>"
        parts.append(
            f"<object><name>{name}</name><pose>Left</pose><truncated>0</truncated>{tag}"
            "<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>"
        )
    return "".join(parts) + "</annotation>"


def make_voc(root: Path):
    voc = root / "VOCdevkit" / "VOC2007"
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (voc / sub).mkdir(parents=True)
    annotations = {
        "000005": [("dog", 0), ("cat", 1), ("person", 1), ("person", 0), ("horse", 0), ("horse", 1)],
        "000007": [("bird", None)],  # no <difficult> tag: counts as not difficult
        "000009": [("tvmonitor", 1), ("tvmonitor", 1)],
    }
    pixels = {}
    for image_id, objects in annotations.items():
        (voc / "Annotations" / f"{image_id}.xml").write_text(voc_xml(objects))
        pixels[image_id] = RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        # PIL decodes by content: lossless PNG bytes under the .jpg name make an exact round trip
        Image.fromarray(pixels[image_id]).save(voc / "JPEGImages" / f"{image_id}.jpg", format="PNG")
    (voc / "ImageSets/Main/trainval.txt").write_text("000005\n000007\n")
    (voc / "ImageSets/Main/test.txt").write_text("000009\n")
    return voc, pixels
