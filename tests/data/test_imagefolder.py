"""imagefolder read back from a tiny tree of PNG files: sorted classes, lazily decoded."""

from __future__ import annotations

import pytest
import torch
from dataset_files import as_chw, make_imagefolder

from sslbench.data.files import DatasetError
from sslbench.data.registry import load_dataset


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
