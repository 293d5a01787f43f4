"""CIFAR-10 and CIFAR-100 read back from tiny pickled batches in the python version's layout."""

from __future__ import annotations

import numpy as np
import pytest
from dataset_files import cifar_batch, make_cifar10, write_pickle

from sslbench.data.files import DatasetError
from sslbench.data.registry import load_dataset


def test_cifar10_round_trip(tmp_path):
    _, batches = make_cifar10(tmp_path)
    ds = load_dataset("cifar10", root=str(tmp_path))
    train_data = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    train_labels = sum((batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)), [])
    assert len(ds.train) == 2 + 3 + 4 + 5 + 6 and len(ds.test) == 4
    assert ds.train.images.shape[1:] == (3, 32, 32) and ds.image_size == 32 and ds.num_classes == 10
    assert (
        ds.train.labels.tolist() == train_labels
        and ds.test.labels.tolist() == batches["test_batch"][b"labels"]
    )
    # a row is 1024 red values, then green, then blue, each row-major:
    # pixel (c, r, col) = row[c*1024 + r*32 + col]
    row = train_data[3]
    assert ds.train.images[3, 1, 5, 7] == row[1 * 1024 + 5 * 32 + 7]
    assert ds.train.images[3, 2, 31, 0] == row[2 * 1024 + 31 * 32]
    assert np.array_equal(ds.train.images.reshape(len(ds.train), -1).numpy(), train_data)
    assert np.array_equal(ds.test.images.reshape(4, -1).numpy(), batches["test_batch"][b"data"])
    assert ds.class_names == [f"c{i}" for i in range(10)]


def test_cifar10_missing_batch_names_path_and_download(tmp_path):
    folder, _ = make_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DatasetError) as info:
        load_dataset("cifar10", root=str(tmp_path))
    message = str(info.value)
    assert str(folder) in message and "data_batch_3" in message and "download=True" in message


def test_cifar10_truncated_batch_names_path(tmp_path):
    folder, _ = make_cifar10(tmp_path)
    victim = folder / "test_batch"
    victim.write_bytes(victim.read_bytes()[:2000])
    with pytest.raises(DatasetError, match=str(victim)):
        load_dataset("cifar10", root=str(tmp_path))


def test_cifar10_wrong_keys_are_named(tmp_path):
    folder, _ = make_cifar10(tmp_path)
    write_pickle(folder / "data_batch_2", {b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": [0, 1]})
    with pytest.raises(DatasetError, match="labels"):
        load_dataset("cifar10", root=str(tmp_path))


def test_cifar100_round_trip_with_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train, test = cifar_batch(6, b"fine_labels", 100), cifar_batch(3, b"fine_labels", 100)
    train[b"coarse_labels"] = [0] * 6  # present in the real files; must be ignored
    for name, batch in {"train": train, "test": test}.items():
        write_pickle(folder / name, batch)
    write_pickle(folder / "meta", {b"fine_label_names": [f"f{i}".encode() for i in range(100)]})
    ds = load_dataset("cifar100", root=str(tmp_path))
    assert ds.num_classes == 100 and ds.class_names[99] == "f99"
    assert (
        ds.train.labels.tolist() == train[b"fine_labels"] and ds.test.labels.tolist() == test[b"fine_labels"]
    )
    assert np.array_equal(ds.train.images.reshape(6, -1).numpy(), train[b"data"])
    assert np.array_equal(ds.test.images.reshape(3, -1).numpy(), test[b"data"])
