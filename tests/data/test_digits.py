"""digits: scikit-learn's file split by the stored rows, without importing scikit-learn."""

from __future__ import annotations

import numpy as np
import torch

from sslbench.data.registry import load_dataset, split_sizes


def test_digits_fixed_split_sizes_dtypes_and_range():
    ds = load_dataset("digits")
    assert (len(ds.train), len(ds.test)) == (1347, 450)
    assert (ds.num_classes, ds.channels, ds.image_size, ds.multilabel) == (10, 1, 8, False)
    for split in (ds.train, ds.test):
        assert split.images.dtype == torch.uint8 and split.images.shape[1:] == (1, 8, 8)
        assert split.labels.dtype == torch.int64
    pixels = torch.cat([ds.train.images, ds.test.images])
    assert pixels.min() == 0 and pixels.max() == 255  # 0..16 stretched to the full byte range
    assert split_sizes({"name": "digits"}) == {"train": 1347, "test": 450}  # what the planner reads


def test_digits_split_is_stratified_and_partitions_sklearn_data():
    from sklearn.datasets import load_digits

    ds = load_digits()
    full = load_dataset("digits")
    train_counts = torch.bincount(full.train.labels, minlength=10)
    test_counts = torch.bincount(full.test.labels, minlength=10)
    totals = np.bincount(ds.target)
    assert torch.equal(train_counts + test_counts, torch.from_numpy(totals))
    assert np.abs(test_counts.numpy() - 0.25 * totals).max() <= 1  # stratified: each class 25% +- 1
    # train + test is exactly sklearn's data (pixel value v -> round(v * 255 / 16)), nothing duplicated
    expected = sorted(
        (bytes(np.rint(img * 255 / 16).astype(np.uint8).ravel()), int(y))
        for img, y in zip(ds.images, ds.target)
    )
    ours = sorted(
        (bytes(img.numpy().ravel()), int(y))
        for split in (full.train, full.test)
        for img, y in zip(split.images, split.labels)
    )
    assert ours == expected


def test_digits_is_sklearn_load_digits_split_by_its_stratified_train_test_split():
    """The loader reads sklearn's file and a stored split without importing sklearn: both still are
    what load_digits and train_test_split(test_size=0.25, random_state=0, stratify) give, in order."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    train, test = train_test_split(
        np.arange(len(bunch.target)), test_size=0.25, random_state=0, stratify=bunch.target
    )
    ours = load_dataset("digits")
    for split, rows in ((ours.train, train), (ours.test, test)):
        assert np.array_equal(split.images.numpy(), images[rows])
        assert np.array_equal(split.labels.numpy(), bunch.target[rows])


def test_digits_is_deterministic():
    a, b = load_dataset("digits"), load_dataset("digits")
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.train.labels, b.train.labels)
    assert torch.equal(a.test.images, b.test.images) and torch.equal(a.test.labels, b.test.labels)
