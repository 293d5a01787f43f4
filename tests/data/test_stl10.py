"""STL-10 read back from tiny binary files (each channel column-major)."""

from __future__ import annotations

import numpy as np
import pytest
from dataset_files import make_stl10

from sslbench.data.files import DatasetError
from sslbench.data.registry import load_dataset, split_sizes


def test_stl10_round_trip_and_transpose(tmp_path):
    folder, images, labels = make_stl10(tmp_path)
    ds = load_dataset("stl10", root=str(tmp_path))
    assert (ds.num_classes, ds.image_size, ds.channels) == (10, 96, 3)
    assert np.array_equal(ds.train.images.numpy(), images["train"])
    assert np.array_equal(ds.test.images.numpy(), images["test"])
    assert np.array_equal(ds.train.labels.numpy(), labels["train"].astype(np.int64) - 1)
    assert ds.train.labels[0] == 9 and ds.test.labels.min() >= 0
    # independently of the writer: byte (n, c, col, row) of the file is pixel (n, c, row, col)
    raw = np.fromfile(folder / "train_X.bin", dtype=np.uint8)
    n, c, row, col = 1, 2, 5, 70
    assert ds.train.images[n, c, row, col] == raw[n * 27648 + c * 9216 + col * 96 + row]
    assert split_sizes({"name": "stl10", "root": str(tmp_path)}) == {"train": 3, "test": 2}


def test_stl10_truncated_images_name_path(tmp_path):
    folder, _, _ = make_stl10(tmp_path)
    victim = folder / "test_X.bin"
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(DatasetError, match=str(victim)):
        load_dataset("stl10", root=str(tmp_path))


def test_stl10_label_count_mismatch_names_path(tmp_path):
    folder, _, _ = make_stl10(tmp_path)
    (folder / "train_y.bin").write_bytes(bytes([1, 2]))
    with pytest.raises(DatasetError, match="train_y.bin"):
        load_dataset("stl10", root=str(tmp_path))


def test_stl10_missing_names_files(tmp_path):
    with pytest.raises(DatasetError) as info:
        load_dataset("stl10", root=str(tmp_path))
    assert str(tmp_path / "stl10_binary") in str(info.value) and "test_y.bin" in str(info.value)
    assert split_sizes({"name": "stl10", "root": str(tmp_path)}) is None
