"""What every loader returns: a ``Dataset`` whose ``train`` and ``test`` are ``ImageSet``s.

Small datasets are held in memory as uint8 tensors; folder datasets (ImageNet, Places205, VOC07) keep
file paths and decode in ``ImageSet.load``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from sslbench.data.files import DatasetError
from sslbench.data.images import decode_image


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


def in_memory(images: np.ndarray, labels: np.ndarray) -> ImageSet:
    """A split held in memory: uint8 images [N, C, H, W] and int64 labels, from numpy arrays."""
    images = torch.from_numpy(np.ascontiguousarray(images, dtype=np.uint8))
    return ImageSet(labels=torch.from_numpy(labels.astype(np.int64)), images=images, channels=images.shape[1])


def stratified_subset(dataset: Dataset, sizes: dict[str, int]) -> Dataset:
    """The same dataset with ``sizes[split]`` images of each named split (every class in proportion,
    a fixed draw: scikit-learn's stratified split with random_state 0), kept in their order."""
    from sslbench.data.registry import subset_too_large

    if dataset.multilabel:
        raise DatasetError(f"{dataset.name}: `subset` needs one class per image; this dataset is multi-label")
    splits = {}
    for split, size in sizes.items():
        images = getattr(dataset, split)
        labels = images.labels.numpy()
        if size > len(labels):  # the planner checks the sizes it can know before loading
            too_large = subset_too_large(dataset.name, split, size, len(labels))
            raise DatasetError(f"{dataset.name}: `subset.{split}`: {too_large}")
        if size == len(labels):
            continue
        from sklearn.model_selection import train_test_split  # a second's import: only to draw

        keep, _ = train_test_split(np.arange(len(labels)), train_size=size, stratify=labels, random_state=0)
        splits[split] = images.subset(np.sort(keep))
    return dataclasses.replace(dataset, **splits)
