"""VOC 2007 read back from a tiny devkit tree: the low-shot label codes, lazily decoded images."""

from __future__ import annotations

import pytest
import torch
from dataset_files import as_chw, make_voc, voc_xml
from PIL import Image

from sslbench.data.files import DatasetError
from sslbench.data.registry import load_dataset


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
