"""Where training batches come from.

Small datasets (digits, Fashion-MNIST, CIFAR, STL-10) are one uint8 tensor on the
training device: a batch is an index into it, and views are made on the device.
Folder datasets (ImageNet, Places205) are decoded by DataLoader workers with pinned
memory and persistent workers; the engine asks both for the same thing: the uint8
images of a list of indices, in the order it chose.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from sslbench.data.containers import ImageSet


class InMemoryBatches:
    def __init__(self, images: ImageSet, device: torch.device):
        self.images = images.images.to(device)

    def __len__(self) -> int:
        return len(self.images)

    def iterate(self, index_batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        for idx in index_batches:
            yield self.images[idx.to(self.images.device)]


class _ListSampler(Sampler):
    """Yields the index batches the engine set for this epoch (workers persist across epochs)."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _Decode(torch.utils.data.Dataset):
    def __init__(self, images: ImageSet):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, batch: list[int]) -> torch.Tensor:
        return self.images.load(torch.as_tensor(batch))


class FolderBatches:
    def __init__(self, images: ImageSet, device: torch.device, workers: int):
        self.device = device
        self.sampler = _ListSampler()
        self.loader = DataLoader(
            _Decode(images),
            sampler=self.sampler,
            batch_size=None,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
        )
        self.size = len(images)

    def __len__(self) -> int:
        return self.size

    def iterate(self, index_batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        self.sampler.batches = [idx.tolist() for idx in index_batches]
        for images in self.loader:
            yield images.to(self.device, non_blocking=True)


def batch_source(images: ImageSet, device: torch.device, workers: int = 4):
    if images.images is not None:
        return InMemoryBatches(images, device)
    return FolderBatches(images, device, workers)
