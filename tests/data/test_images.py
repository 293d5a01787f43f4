"""Image utilities: the resize done once at load time, and decoding a file to a centred square."""

from __future__ import annotations

import numpy as np
import torch
from dataset_files import as_chw, save_png

from sslbench.data.images import decode_image, resize_images
from sslbench.data.registry import load_dataset

RNG = np.random.default_rng(0)


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
        out = resize_images(images, size, chunk=3)  # chunk < N exercises the chunking
        assert out.shape == (4, 3, size, size) and out.dtype == torch.uint8
        assert torch.equal(out, values.view(4, 1, 1, 1).expand_as(out))


def test_lazy_load_centre_crops_shorter_side(tmp_path):
    tall = RNG.integers(0, 256, (12, 8, 3), dtype=np.uint8)  # height 12, width 8
    save_png(tmp_path / "tall.png", tall)
    out = decode_image(str(tmp_path / "tall.png"), 8)
    assert torch.equal(out, as_chw(tall[2:10]))  # shorter side already 8: rows 2..9 kept, no resampling
    gray = np.full((30, 20), 77, dtype=np.uint8)  # grayscale, downscaled: constant stays constant, 3 channels
    save_png(tmp_path / "gray.png", gray)
    out = decode_image(str(tmp_path / "gray.png"), 10)
    assert out.shape == (3, 10, 10) and torch.all(out == 77)
