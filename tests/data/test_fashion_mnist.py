"""Fashion-MNIST read back from tiny IDX files (plain and gzipped), and the real Debian files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dataset_files import make_idx_tree
from support import require

from sslbench.data.datasets import fashion_mnist
from sslbench.data.datasets.fashion_mnist import read_idx
from sslbench.data.files import DatasetError
from sslbench.data.registry import load_dataset, split_sizes


@pytest.mark.parametrize("compress", [False, True])
def test_fashion_mnist_idx_round_trip(tmp_path, compress):
    arrays = make_idx_tree(tmp_path, compress=compress)
    ds = load_dataset("fashion_mnist", root=str(tmp_path))
    assert (ds.num_classes, ds.channels, ds.image_size) == (10, 1, 28)
    assert np.array_equal(ds.train.images[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(ds.train.labels.numpy(), arrays["train-labels-idx1-ubyte"].astype(np.int64))
    assert np.array_equal(ds.test.images[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])
    assert np.array_equal(ds.test.labels.numpy(), arrays["t10k-labels-idx1-ubyte"].astype(np.int64))
    assert ds.train.labels.dtype == torch.int64
    assert split_sizes({"name": "fashion_mnist", "root": str(tmp_path)}) == {"train": 7, "test": 5}


def test_read_idx_header_is_big_endian(tmp_path):
    # hand-written header: 2 images of 3 rows x 258 columns (258 = 0x0102 distinguishes byte orders)
    path = tmp_path / "x-idx3-ubyte"
    body = bytes(range(256)) * 6 + bytes(12)  # 2 * 3 * 258 = 1548 bytes
    path.write_bytes(bytes.fromhex("00000803") + bytes.fromhex("00000002 00000003 00000102") + body)
    array = read_idx(path, 3)
    assert array.shape == (2, 3, 258) and array[0, 0, 5] == 5 and array[0, 1, 0] == 2


@pytest.mark.parametrize("compress", [False, True])
def test_fashion_mnist_truncated_file_names_path(tmp_path, compress):
    make_idx_tree(tmp_path, compress=compress)
    name = "train-images-idx3-ubyte" + (".gz" if compress else "")
    victim = tmp_path / name
    victim.write_bytes(victim.read_bytes()[:-30])
    with pytest.raises(DatasetError, match=str(victim).replace(".", r"\.")):
        load_dataset("fashion_mnist", root=str(tmp_path))


def test_fashion_mnist_bad_magic_names_path(tmp_path):
    make_idx_tree(tmp_path)
    victim = tmp_path / "t10k-labels-idx1-ubyte"
    raw = bytearray(victim.read_bytes())
    raw[2] = 0x0D  # float data type: not what the loader accepts
    victim.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte"):
        load_dataset("fashion_mnist", root=str(tmp_path))


def test_fashion_mnist_missing_files_say_where_and_how(tmp_path, monkeypatch):
    empty_system_dir = tmp_path / "system"
    monkeypatch.setattr(fashion_mnist, "FASHION_MNIST_SYSTEM_DIR", empty_system_dir)
    root = tmp_path / "mine"
    root.mkdir()
    (root / "train-images-idx3-ubyte").write_bytes(b"")  # only one of four
    with pytest.raises(DatasetError) as info:
        load_dataset("fashion_mnist", root=str(root))
    message = str(info.value)
    assert str(root) in message and str(empty_system_dir) in message
    assert "t10k-labels-idx1-ubyte" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert split_sizes({"name": "fashion_mnist", "root": str(root)}) is None  # the planner cannot tell


def test_fashion_mnist_real_debian_files():
    files = fashion_mnist.FASHION_MNIST_SYSTEM_DIR / "train-images-idx3-ubyte.gz"
    require(
        "fashion_mnist",
        None if files.exists() else f"{files} is absent (apt-get install dataset-fashion-mnist)",
    )
    ds = load_dataset("fashion_mnist")
    assert ds.train.images.shape == (60000, 1, 28, 28) and ds.test.images.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(ds.train.labels), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(ds.test.labels), torch.full((10,), 1000))
    assert ds.train.images.max() == 255 and ds.train.images.min() == 0
