"""PASCAL VOC 2007 in torchvision's layout: trainval as train, test as test; multi-label (the devkit's
codes), images decoded from their files batch by batch."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
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

VOC_SPLIT_FILES = {"train": "ImageSets/Main/trainval.txt", "test": "ImageSets/Main/test.txt"}
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


def voc07_files(root=None, download=False, **options) -> FileSpec:
    base = data_root(root)
    names = [*VOC_SPLIT_FILES.values(), "JPEGImages", "Annotations"]
    return FileSpec("voc07", [base / "VOCdevkit" / "VOC2007", base], names, download_hint("voc07", base))


def voc_labels(annotation_path) -> np.ndarray:
    """int8 [20] from one VOC XML: 1 = a non-difficult object, 0 = only difficult ones, -1 = absent."""
    import numpy as np

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
    import numpy as np
    import torch

    from sslbench.data.containers import ImageSet

    ids = [line.strip() for line in ids_file.read_text().splitlines() if line.strip()]
    if not ids:
        raise DatasetError(f"{ids_file}: lists no images")
    paths = [str(voc / "JPEGImages" / f"{i}.jpg") for i in ids]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise DatasetError(f"{len(missing)} images listed in {ids_file} are missing, e.g. {missing[0]}")
    labels = np.stack([voc_labels(voc / "Annotations" / f"{i}.xml") for i in ids])
    return ImageSet(labels=torch.from_numpy(labels), paths=paths, image_size=image_size)


def load_voc07(root=None, download=False, image_size=None) -> Dataset:
    """VOC 2007 in torchvision's layout: trainval as train, test as test; multilabel, decoded lazily."""
    from sslbench.data.containers import Dataset
    from sslbench.data.images import DEFAULT_LAZY_IMAGE_SIZE

    base = data_root(root)
    found = locate_or_download(
        voc07_files(root),
        download,
        lambda: torchvision_download(
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


VOC07 = DatasetSpec(
    name="voc07",
    loader=load_voc07,
    source="torchvision's VOCDetection download (VOCdevkit/VOC2007: trainval and test)",
    files=voc07_files,
    lazy=True,
    multilabel=True,
    channels=3,
)
