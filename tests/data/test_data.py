"""Dataset registry: fixed splits, and every loader read back from tiny files in the real on-disk format."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support import assert_same_dataset, require, write_fashion_format, write_idx

from sslbench import data, datafiles
from sslbench.data import DATASETS, Dataset, DatasetError, ImageSet, load_dataset
from sslbench.errors import UnreadableFileError

RNG = np.random.default_rng(0)


# --------------------------------------------------------------------------- digits


def test_digits_fixed_split_sizes_dtypes_and_range():
    ds = load_dataset("digits")
    assert (len(ds.train), len(ds.test)) == (1347, 450)
    assert (ds.num_classes, ds.channels, ds.image_size, ds.multilabel) == (10, 1, 8, False)
    for split in (ds.train, ds.test):
        assert split.images.dtype == torch.uint8 and split.images.shape[1:] == (1, 8, 8)
        assert split.labels.dtype == torch.int64
    pixels = torch.cat([ds.train.images, ds.test.images])
    assert pixels.min() == 0 and pixels.max() == 255  # 0..16 stretched to the full byte range


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


def test_in_memory_resize_happens_once_at_load_time():
    native = load_dataset("digits")
    big = load_dataset("digits", image_size=16)
    assert big.image_size == 16 and big.train.images.shape == (1347, 1, 16, 16)
    assert big.train.images.dtype == torch.uint8
    assert torch.equal(big.train.labels, native.train.labels)
    assert torch.equal(load_dataset("digits", image_size=8).train.images, native.train.images)
    # bilinear upsampling keeps each image's mean intensity (up to rounding) and the value range
    mean_native = native.train.images.float().mean(dim=(1, 2, 3))
    mean_big = big.train.images.float().mean(dim=(1, 2, 3))
    assert (mean_native - mean_big).abs().max() < 4
    assert big.train.load([0, 5]).shape == (2, 1, 16, 16)


def test_resize_images_keeps_constant_images_constant():
    values = torch.tensor([0, 17, 128, 255], dtype=torch.uint8)
    images = values.view(4, 1, 1, 1).expand(4, 3, 20, 12).contiguous()
    for size in (5, 20, 33):
        out = data.resize_images(images, size, chunk=3)  # chunk < N exercises the chunking
        assert out.shape == (4, 3, size, size) and out.dtype == torch.uint8
        assert torch.equal(out, values.view(4, 1, 1, 1).expand_as(out))


def test_imageset_load_accepts_lists_tensors_and_slices():
    images = torch.from_numpy(RNG.integers(0, 256, (6, 3, 4, 4), dtype=np.uint8))
    split = ImageSet(labels=torch.arange(6), images=images)
    assert len(split) == 6
    assert torch.equal(split.load([4, 1]), images[[4, 1]])
    assert torch.equal(split.load(torch.tensor([2])), images[[2]])
    assert torch.equal(split.load(slice(1, 6, 2)), images[1:6:2])
    with pytest.raises(ValueError):
        ImageSet(labels=torch.arange(5), images=images)  # label count mismatch


# --------------------------------------------------------------------------- registry


def test_unknown_dataset_lists_known_names():
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist-but-wrong")
    for name in DATASETS:
        assert name in str(info.value)


def test_unknown_option_is_an_error():
    with pytest.raises(DatasetError, match="classes_file"):
        load_dataset("digits", classes_file="x.txt")


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


def test_read_idx_header_is_big_endian(tmp_path):
    # hand-written header: 2 images of 3 rows x 258 columns (258 = 0x0102 distinguishes byte orders)
    path = tmp_path / "x-idx3-ubyte"
    body = bytes(range(256)) * 6 + bytes(12)  # 2 * 3 * 258 = 1548 bytes
    path.write_bytes(bytes.fromhex("00000803") + bytes.fromhex("00000002 00000003 00000102") + body)
    array = data.read_idx(path, 3)
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
    monkeypatch.setattr(datafiles, "FASHION_MNIST_SYSTEM_DIR", empty_system_dir)
    root = tmp_path / "mine"
    root.mkdir()
    (root / "train-images-idx3-ubyte").write_bytes(b"")  # only one of four
    with pytest.raises(DatasetError) as info:
        load_dataset("fashion_mnist", root=str(root))
    message = str(info.value)
    assert str(root) in message and str(empty_system_dir) in message
    assert "t10k-labels-idx1-ubyte" in message
    assert "apt-get install dataset-fashion-mnist" in message


def test_fashion_mnist_real_debian_files():
    files = datafiles.FASHION_MNIST_SYSTEM_DIR / "train-images-idx3-ubyte.gz"
    require(
        "fashion_mnist",
        None if files.exists() else f"{files} is absent (apt-get install dataset-fashion-mnist)",
    )
    ds = load_dataset("fashion_mnist")
    assert ds.train.images.shape == (60000, 1, 28, 28) and ds.test.images.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(ds.train.labels), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(ds.test.labels), torch.full((10,), 1000))
    assert ds.train.images.max() == 255 and ds.train.images.min() == 0


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


def test_imagefolder_round_trip_sorted_classes(tmp_path):
    pixels = make_imagefolder(tmp_path)
    ds = load_dataset("imagefolder", root=str(tmp_path), image_size=6)
    assert ds.class_names == ["a", "b", "c"] and ds.num_classes == 3 and ds.image_size == 6
    assert ds.train.images is None and ds.train.labels.tolist() == [0, 1, 1, 2]
    expected = ["train/a/y.PNG", "train/b/x0.png", "train/b/x1.png", "train/c/z.png"]
    assert ds.train.paths == [str(tmp_path / e) for e in expected]
    batch = ds.train.load([2, 0])
    assert batch.dtype == torch.uint8 and batch.shape == (2, 3, 6, 6)
    assert torch.equal(batch[0], as_chw(pixels["train/b/x1.png"]))
    assert torch.equal(batch[1], as_chw(pixels["train/a/y.PNG"]))
    assert ds.test.labels.tolist() == [0, 1]
    assert torch.equal(ds.test.load([1])[0], as_chw(pixels["val/b/w.png"]))


def test_lazy_load_centre_crops_shorter_side(tmp_path):
    tall = RNG.integers(0, 256, (12, 8, 3), dtype=np.uint8)  # height 12, width 8
    save_png(tmp_path / "tall.png", tall)
    out = data.decode_image(str(tmp_path / "tall.png"), 8)
    assert torch.equal(out, as_chw(tall[2:10]))  # shorter side already 8: rows 2..9 kept, no resampling
    gray = np.full((30, 20), 77, dtype=np.uint8)  # grayscale, downscaled: constant stays constant, 3 channels
    save_png(tmp_path / "gray.png", gray)
    out = data.decode_image(str(tmp_path / "gray.png"), 10)
    assert out.shape == (3, 10, 10) and torch.all(out == 77)


def test_imagefolder_classes_file_selects_subset(tmp_path):
    pixels = make_imagefolder(tmp_path)
    classes_file = tmp_path / "imagenet100.txt"
    classes_file.write_text("c\nb\n\n")
    ds = load_dataset("imagefolder", root=str(tmp_path), image_size=6, classes_file=str(classes_file))
    assert ds.class_names == ["b", "c"] and ds.num_classes == 2
    assert ds.train.labels.tolist() == [0, 0, 1] and ds.test.labels.tolist() == [0]
    assert torch.equal(ds.train.load([2])[0], as_chw(pixels["train/c/z.png"]))
    classes_file.write_text("b\nn0000000\n")
    with pytest.raises(DatasetError, match="n0000000"):
        load_dataset("imagefolder", root=str(tmp_path), classes_file=str(classes_file))


def test_imagefolder_missing_val_and_truncated_image_name_paths(tmp_path):
    make_imagefolder(tmp_path)
    victim = tmp_path / "train" / "c" / "z.png"
    victim.write_bytes(victim.read_bytes()[:40])
    ds = load_dataset("imagefolder", root=str(tmp_path), image_size=6)
    with pytest.raises(DatasetError, match=str(victim)):
        ds.train.load([3])
    (tmp_path / "val" / "a" / "v.png").unlink()
    (tmp_path / "val" / "b" / "w.png").unlink()
    with pytest.raises(DatasetError, match="no images"):
        load_dataset("imagefolder", root=str(tmp_path))
    with pytest.raises(DatasetError, match=str(tmp_path / "nothere")):
        load_dataset("imagefolder", root=str(tmp_path / "nothere"))


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


def test_voc07_labels_follow_lowshot_encoding_and_pixels_round_trip(tmp_path):
    voc, pixels = make_voc(tmp_path)
    ds = load_dataset("voc07", root=str(tmp_path), image_size=8)
    assert ds.multilabel and ds.num_classes == 20 and ds.class_names[0] == "aeroplane"
    assert ds.train.labels.dtype == torch.int8 and ds.train.labels.shape == (2, 20)
    k = ds.class_names.index
    expected = torch.full((2, 20), -1, dtype=torch.int8)
    expected[0, k("dog")] = 1
    expected[0, k("cat")] = 0  # only a difficult cat
    expected[0, k("person")] = 1  # a non-difficult object wins over a difficult one, in either order
    expected[0, k("horse")] = 1
    expected[1, k("bird")] = 1
    assert torch.equal(ds.train.labels, expected)
    assert ds.test.labels[0, k("tvmonitor")] == 0 and (ds.test.labels == -1).sum() == 19
    assert torch.equal(ds.train.load([1])[0], as_chw(pixels["000007"]))
    assert torch.equal(ds.test.load([0])[0], as_chw(pixels["000009"]))


def test_voc07_real_jpeg_decodes(tmp_path):
    voc, _ = make_voc(tmp_path)
    Image.new("RGB", (16, 24), (200, 40, 90)).save(
        voc / "JPEGImages" / "000009.jpg", format="JPEG", quality=95
    )
    out = load_dataset("voc07", root=str(tmp_path), image_size=16).test.load([0])[0]
    assert out.shape == (3, 16, 16)
    assert (out.float() - torch.tensor([200.0, 40.0, 90.0]).view(3, 1, 1)).abs().max() <= 4  # JPEG is lossy


def test_voc07_missing_and_broken_files_name_paths(tmp_path):
    with pytest.raises(DatasetError) as info:
        load_dataset("voc07", root=str(tmp_path))
    assert str(tmp_path / "VOCdevkit" / "VOC2007") in str(info.value) and "download=True" in str(info.value)
    voc, _ = make_voc(tmp_path)
    (voc / "Annotations" / "000007.xml").write_text("<annotation><object><name>dog")  # truncated XML
    with pytest.raises(DatasetError, match=str(voc / "Annotations" / "000007.xml")):
        load_dataset("voc07", root=str(tmp_path))
    (voc / "Annotations" / "000007.xml").write_text(voc_xml([("dragon", 0)]))
    with pytest.raises(DatasetError, match="dragon"):
        load_dataset("voc07", root=str(tmp_path))
    (voc / "JPEGImages" / "000009.jpg").unlink()
    (voc / "Annotations" / "000007.xml").write_text(voc_xml([("dog", 0)]))
    with pytest.raises(DatasetError, match="000009.jpg"):
        load_dataset("voc07", root=str(tmp_path))


def test_dataset_is_the_public_container():
    ds = load_dataset("digits")
    assert isinstance(ds, Dataset) and isinstance(ds.train, ImageSet) and ds.train.channels == 1


# --------------------------------------------------------------------------- prepared files


def sections(tmp_path) -> dict[str, dict]:
    fashion = str(write_fashion_format(tmp_path / "fashion"))
    return {
        "digits": {"name": "digits", "image_size": 16, "label": "digits"},
        # the default's target: a stratified subset of each split, resized from 28 px
        "fashion_mnist": {
            "name": "fashion_mnist",
            "root": fashion,
            "image_size": 16,
            "subset": {"train": 20, "test": 10},
            "label": "fashion_mnist",
        },
    }


@pytest.mark.parametrize("name", ["digits", "fashion_mnist"])
def test_a_prepared_file_reads_back_as_load_data_gives_it_bit_for_bit(name, tmp_path):
    section = sections(tmp_path)[name]
    path = data.prepare_dataset(section, tmp_path / "prepared" / f"{name}.npz")
    loaded = data.load_data({"dataset": section})
    assert_same_dataset(data.load_data({"dataset": section}, prepared=path), loaded)
    assert loaded.image_size == 16 and loaded.train.images.shape[-2:] == (16, 16)
    with np.load(path) as npz:
        meta = json.loads(str(npz["meta_json"]))
    assert meta["section"] == section and meta["code"]["sslbench/data.py"]
    assert {"git_commit", "versions", "cpu_kernels"} <= set(meta["prepared_with"])


def test_a_prepared_file_of_another_section_or_damaged_is_refused_by_name(tmp_path):
    section = sections(tmp_path)["fashion_mnist"]
    path = data.prepare_dataset(section, tmp_path / "fashion_mnist.npz")
    assert data.load_prepared(path, {**section, "label": "another_label"}).train.images.shape[0] == 20
    for other in ({**section, "image_size": 8}, {**section, "subset": {"train": 30, "test": 10}}):
        with pytest.raises(DatasetError) as info:
            data.load_prepared(path, other)
        message = str(info.value)
        assert (
            message.startswith(f"{path}: prepared from the dataset section") and '"image_size": 16' in message
        )
        assert f"--forcerun {path}" in message and "without --prepared" in message
    features = tmp_path / "features.npz"  # an .npz with a meta record, but no prepared file
    np.savez(features, meta_json=np.array(json.dumps({"dataset": "digits"})), train=np.zeros(3))
    with pytest.raises(DatasetError, match=f"{features}: not a prepared dataset file"):
        data.load_prepared(features, section)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(UnreadableFileError, match=f"{path}: unreadable prepared dataset file.*Rebuild it"):
        data.load_prepared(path, section)


def test_only_the_datasets_held_in_memory_are_prepared(tmp_path):
    """datafiles.LAZY_DATASETS (what the planner reads, without torch) is what the loaders do."""
    make_idx_tree(tmp_path / "fashion_mnist")
    make_cifar10(tmp_path / "cifar10")
    folder = tmp_path / "cifar100" / "cifar-100-python"
    folder.mkdir(parents=True)
    for split, n in (("train", 4), ("test", 2)):
        write_pickle(folder / split, cifar_batch(n, b"fine_labels", 100))
    make_stl10(tmp_path / "stl10")
    make_imagefolder(tmp_path / "imagefolder")
    make_voc(tmp_path / "voc07")
    for name in DATASETS:
        root = None if name == "digits" else str(tmp_path / name)
        lazy = load_dataset(name, root=root, image_size=8).train.images is None
        assert lazy == (name in datafiles.LAZY_DATASETS), name
        if lazy:
            with pytest.raises(DatasetError, match="nothing to prepare"):
                data.prepare_dataset({"name": name, "root": root}, tmp_path / f"{name}.npz")
            assert not (tmp_path / f"{name}.npz").exists()


def test_a_refresh_rebuilds_a_prepared_file_made_by_code_that_has_changed(tmp_path):
    """`sslbench status` forceruns such a file: the jobs it reruns would otherwise read old images."""
    from support import METHODS_DIR

    from sslbench.collect import prepared_states, refresh_command

    path = data.prepare_dataset(sections(tmp_path)["digits"], tmp_path / "digits.npz")
    missing, broken = tmp_path / "missing.npz", tmp_path / "broken.npz"
    broken.write_bytes(path.read_bytes()[:100])
    assert [(s.path, s.state) for s in prepared_states([path, missing, broken], METHODS_DIR)] == [
        (str(broken), "unreadable")
    ]
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays.pop("meta_json")))
    meta["code"]["sslbench/data.py"] = "0" * 64  # what an edit of data.py since would look like
    np.savez(path, meta_json=np.array(json.dumps(meta)), **arrays)
    (state,) = prepared_states([path], METHODS_DIR)
    assert (state.state, state.changed) == ("stale", {"prepare": ["sslbench/data.py"]})
    assert refresh_command([state], []).endswith(f"--forcerun {path}")


def test_one_list_of_datasets_for_the_loaders_the_file_checks_and_the_schema():
    """The schema's dataset names are filled in from datafiles.FILE_SPECS (planning imports no torch);
    every name there has a loader in data.DATASETS and every loader a file spec (None: shipped with a
    package), so a dataset added to both is accepted by the plan and one added to either alone fails here."""
    from sslbench.plan.settings import with_datasets

    assert list(data.DATASETS) == list(datafiles.FILE_SPECS)
    schema = with_datasets({"$defs": {"dataset": {"properties": {"name": {"type": "string"}}}}})
    assert schema["$defs"]["dataset"]["properties"]["name"] == {"enum": list(datafiles.FILE_SPECS)}
    assert set(datafiles.MULTILABEL_DATASETS) | set(datafiles.LAZY_DATASETS) <= set(data.DATASETS)
