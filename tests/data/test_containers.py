"""The containers every loader returns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sslbench.data.containers import Dataset, ImageSet
from sslbench.data.registry import load_dataset

RNG = np.random.default_rng(0)


def test_imageset_load_accepts_lists_tensors_and_slices():
    images = torch.from_numpy(RNG.integers(0, 256, (6, 3, 4, 4), dtype=np.uint8))
    split = ImageSet(labels=torch.arange(6), images=images)
    assert len(split) == 6
    assert torch.equal(split.load([4, 1]), images[[4, 1]])
    assert torch.equal(split.load(torch.tensor([2])), images[[2]])
    assert torch.equal(split.load(slice(1, 6, 2)), images[1:6:2])
    with pytest.raises(ValueError):
        ImageSet(labels=torch.arange(5), images=images)  # label count mismatch


def test_dataset_is_the_public_container():
    ds = load_dataset("digits")
    assert isinstance(ds, Dataset) and isinstance(ds.train, ImageSet) and ds.train.channels == 1
