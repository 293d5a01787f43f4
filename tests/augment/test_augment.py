"""Tests of the batched view pipeline (sslbench/augment/).

Reference values come from hand computation and from torchvision's own
per-image functional ops (real torchvision, image by image).
"""

import dataclasses
import math

import pytest
import torch
import torchvision.transforms.v2.functional as TF
from support import METHODS_DIR, REPO

from sslbench.augment import ops, pipeline, presets
from sslbench.augment.ops import (
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    blur_kernel_size,
    gaussian_blur,
)
from sslbench.augment.pipeline import EvalTransform, ViewAugment
from sslbench.augment.presets import VIEW_PRESETS, ViewConfig, view_config
from sslbench.augment.views import CropGroup, check_view_groups, crop_side, describe_views, view_groups
from sslbench.data.images import dataset_stats
from sslbench.plan.settings import load_config, resolve_method_config

IDENTITY = dict(
    crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0
)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_images(n, channels, size, seed=0, height=None):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, height or size, size), generator=g, dtype=torch.uint8)


def constant_images(values, channels, size):
    """One constant image per value (uint8)."""
    values = torch.as_tensor(values, dtype=torch.uint8)
    return values.view(-1, 1, 1, 1).expand(-1, channels, size, size).contiguous()


def unit_stats(channels):
    """mean 0, std 1: the output is the augmented image in [0, 1]."""
    return [0.0] * channels, [1.0] * channels


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def normalised(images, mean, std):
    c = images.shape[1]
    mean_t = torch.tensor(mean, dtype=torch.float32).view(c, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(c, 1, 1)
    return (images.float() / 255 - mean_t) / std_t


# ----------------------------------------------------------------------------- API, shapes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels,in_size,out_size", [(1, 16, 16), (3, 32, 32), (3, 40, 24), (1, 12, 20)])
def test_shapes_dtype_device(device, channels, in_size, out_size):
    images = random_images(6, channels, in_size).to(device)
    mean, std = dataset_stats(channels)
    for preset in VIEW_PRESETS:
        out = ViewAugment(out_size, channels, mean, std, view_config(preset))(images, seeded(0))
        assert out.shape == (6, channels, out_size, out_size)
        assert out.dtype == torch.float32 and out.device.type == device
        assert torch.isfinite(out).all()
    evaluated = EvalTransform(out_size, channels, mean, std)(images)
    assert evaluated.shape == (6, channels, out_size, out_size) and evaluated.device.type == device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_the_same_seed():
    images = random_images(32, 3, 32)
    mean, std = dataset_stats(3, images)
    aug = ViewAugment(32, 3, mean, std, view_config("simclr"))
    on_cpu = aug(images, seeded(5))
    on_gpu = aug.to("cuda")(images.cuda(), seeded(5))
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-4, rtol=1e-4)


def test_rejects_bad_inputs():
    aug = ViewAugment(16, 3, *dataset_stats(3), view_config())
    with pytest.raises(ValueError, match="uint8"):
        aug(torch.rand(2, 3, 16, 16))
    with pytest.raises(ValueError, match="3 channel"):
        aug(random_images(2, 1, 16))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        aug(random_images(2, 3, 16)[0])
    with pytest.raises(ValueError, match="one value per channel"):
        ViewAugment(16, 3, [0.5], [0.2], view_config())
    with pytest.raises(ValueError, match="channels must be 1 or 3"):
        EvalTransform(16, 2, [0.5, 0.5], [0.2, 0.2])


def test_view_config_presets_and_overrides():
    assert view_config() == ViewConfig() == VIEW_PRESETS["mocov2"]
    moco2 = view_config("mocov2")
    assert (moco2.crop_scale, moco2.jitter_p, moco2.gray_p, moco2.blur_p, moco2.blur_sigma) == (
        (0.2, 1.0),
        0.8,
        0.2,
        0.5,
        (0.1, 2.0),
    )
    assert (moco2.brightness, moco2.contrast, moco2.saturation, moco2.hue) == (0.4, 0.4, 0.4, 0.1)
    simclr = view_config("simclr")
    assert (simclr.brightness, simclr.contrast, simclr.saturation, simclr.hue) == (0.8, 0.8, 0.8, 0.2)
    assert simclr.crop_scale == (0.08, 1.0) and simclr.blur_p == 0.5
    moco1 = view_config("mocov1")
    assert (moco1.hue, moco1.jitter_p, moco1.blur_p) == (0.4, 1.0, 0.0)
    supcon = view_config("supcon")
    assert (supcon.hue, supcon.jitter_p, supcon.gray_p, supcon.blur_p) == (0.1, 0.8, 0.2, 0.0)
    assert view_config("sela").crop_scale == (0.08, 1.0)
    assert view_config("none") == ViewConfig(**IDENTITY)
    # overrides, lists from YAML become tuples, presets are not mutated
    custom = view_config("simclr", blur_p=0.0, crop_scale=[0.5, 1.0])
    assert custom.blur_p == 0.0 and custom.crop_scale == (0.5, 1.0)
    assert VIEW_PRESETS["simclr"].blur_p == 0.5


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: view_config("byol"), "'byol'"),
        (lambda: view_config("mocov2", blur=0.3), "blur"),
        (lambda: view_config("mocov2", flip_p=1.5), "flip_p"),
        (lambda: view_config("mocov2", crop_scale=(0.5, 0.2)), "crop_scale"),
        (lambda: view_config("mocov2", hue=0.7), "hue"),
        (lambda: view_config("supcon", policy="randaug"), "policy"),
        (lambda: view_config("supcon", policy="randaugment", policy_ops=0), "policy_ops"),
    ],
)
def test_view_config_errors_name_the_culprit(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def test_blur_kernel_size_follows_simclr_rule():
    # SimCLR data_util.py: kernel_size = side // 10, radius = kernel_size // 2, 2 * radius + 1 taps
    assert [blur_kernel_size(s) for s in (8, 16, 20, 32, 64, 96, 224)] == [1, 1, 3, 3, 7, 9, 23]


# ----------------------------------------------------------------------------- randomness


def test_same_seed_same_views_other_seed_other_views():
    images = random_images(16, 3, 32)
    aug = ViewAugment(32, 3, *dataset_stats(3), view_config("simclr"))
    first, again, other = aug(images, seeded(1)), aug(images, seeded(1)), aug(images, seeded(2))
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)
    # a generator advances: two views from one generator differ (the two-view case)
    g = seeded(1)
    assert not torch.allclose(aug(images, g), aug(images, g))


def test_per_sample_parameters_differ_across_the_batch():
    one = random_images(1, 3, 32)
    batch = one.expand(64, -1, -1, -1).contiguous()
    for preset in ("mocov2", "simclr", "supervised"):
        out = ViewAugment(32, 3, *dataset_stats(3), view_config(preset))(batch, seeded(3))
        flat = out.flatten(1)
        distance = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
        off_diagonal = ~torch.eye(64, dtype=torch.bool)
        assert (distance[off_diagonal] > 1e-3).all(), preset
        assert (distance.diagonal() == 0).all()


def test_probability_gates_hit_their_rate():
    n = 4000
    # flip: an image dark on the left; flipped samples are dark on the right
    left_dark = torch.tensor([[0, 255]], dtype=torch.uint8).view(1, 1, 1, 2).expand(n, 1, 2, 2).contiguous()
    out = ViewAugment(2, 1, *unit_stats(1), view_config("none", flip_p=0.5))(left_dark, seeded(0))
    flipped = out[:, 0, 0, 0] > out[:, 0, 0, 1]
    assert abs(flipped.float().mean().item() - 0.5) < 0.03
    assert torch.equal(out[flipped], left_dark[flipped].flip(-1).float() / 255)
    # grayscale: colour pixels with three different channels become grey at rate gray_p
    colour = torch.tensor([10, 120, 250], dtype=torch.uint8).view(1, 3, 1, 1).expand(n, 3, 2, 2).contiguous()
    out = ViewAugment(2, 3, *unit_stats(3), view_config("none", gray_p=0.3))(colour, seeded(0))
    grey = (out[:, 0] == out[:, 1]).all(dim=(1, 2))
    assert abs(grey.float().mean().item() - 0.3) < 0.03


# ----------------------------------------------------------------------------- geometry


@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32), (3, 7)])
def test_identity_config_returns_exactly_the_normalised_input(channels, size):
    images = random_images(8, channels, size)
    mean, std = dataset_stats(channels, images)
    out = ViewAugment(size, channels, mean, std, ViewConfig(**IDENTITY))(images, seeded(0))
    assert torch.equal(out, normalised(images, mean, std))
    assert torch.equal(out, EvalTransform(size, channels, mean, std)(images))


def test_flip_with_p1_equals_torch_flip():
    images = random_images(8, 3, 32)
    mean, std = dataset_stats(3)
    out = ViewAugment(32, 3, mean, std, view_config("none", flip_p=1.0))(images, seeded(0))
    assert torch.equal(out, torch.flip(normalised(images, mean, std), dims=[-1]))


def test_flip_through_the_resampling_path_mirrors_the_resized_image():
    # input 24 -> output 16: the affine grid path, with a negative x-scale for the flip
    images = random_images(8, 3, 24)
    mean, std = dataset_stats(3)
    plain = ViewAugment(16, 3, mean, std, view_config("none"))(images, seeded(0))
    flipped = ViewAugment(16, 3, mean, std, view_config("none", flip_p=1.0))(images, seeded(0))
    torch.testing.assert_close(flipped, plain.flip(-1), atol=1e-5, rtol=0)


def test_crop_matches_torchvision_resized_crop_with_the_drawn_boxes():
    images = random_images(12, 3, 20)
    cfg = view_config("supervised", flip_p=0.5)
    out = ViewAugment(32, 3, *unit_stats(3), cfg)(images, seeded(7))
    params = pipeline._draw_params(12, 20, 20, cfg, seeded(7))  # the same draws, replayed
    for k in range(12):
        box = [int(v[k]) for v in (params.top, params.left, params.height, params.width)]
        expected = TF.resized_crop(images[k].float() / 255, *box, size=[32, 32], antialias=False)
        if params.flip[k]:
            expected = expected.flip(-1)
        torch.testing.assert_close(out[k], expected, atol=2e-5, rtol=0)


def test_crop_boxes_respect_scale_ratio_and_image_bounds():
    cfg = view_config("mocov2", crop_scale=(0.2, 0.6))
    top, left, height, width = pipeline._draw_crop_boxes(5000, 64, 48, cfg, seeded(0))
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + height <= 64).all() and (left + width <= 48).all()
    area = height * width / (64 * 48)
    assert area.min() > 0.2 - 0.03 and area.max() < 0.6 + 0.03  # rounding to whole pixels
    ratio = width / height
    assert ratio.min() > 3 / 4 - 0.05 and ratio.max() < 4 / 3 + 0.05
    assert height.unique().numel() > 10 and top.unique().numel() > 10  # truly per sample
    # a box that can never fit falls back to torchvision's central crop
    top, left, height, width = pipeline._draw_crop_boxes(4, 10, 40, view_config("none"), seeded(0))
    assert height.tolist() == [10] * 4 and width.tolist() == [10] * 4 and left.tolist() == [15] * 4


@pytest.mark.parametrize(
    "height, width, scale, ratio",
    [
        (16, 16, (0.08, 1.0), (3 / 4, 4 / 3)),  # BYOL's own settings
        (16, 16, (1.0, 1.0), (4 / 3, 4 / 3)),  # the box never fits: always clipped
        (10, 40, (0.5, 1.0), (0.05, 20.0)),  # extreme aspect ratios on a wide image
        (40, 10, (0.9, 1.0), (0.05, 20.0)),
        (2, 3, (0.01, 1.0), (0.1, 10.0)),  # a tiny image: sides floored at 1 px
    ],
)
def test_byol_crop_box_is_one_draw_clipped_to_the_image(height, width, scale, ratio):
    """BYOL's dataset.py crop: area and log-uniform aspect ratio drawn once, the rounded sides clipped to
    the image, offsets uniform over what fits; no retry, no fallback: 4 numbers per box."""
    n = 4000
    cfg = view_config("byol_view1", crop_sampler="byol", crop_scale=scale, crop_ratio=ratio)
    g = seeded(3)
    top, left, h, w = pipeline._draw_crop_boxes(n, height, width, cfg, g)
    assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (top + h <= height).all() and (left + w <= width).all()
    assert ((top == top.round()) & (left == left.round()) & (h == h.round()) & (w == w.round())).all()
    replay = seeded(3)
    torch.rand(4 * n, generator=replay)  # never retried: exactly 4 numbers per box were drawn
    assert torch.equal(g.get_state(), replay.get_state())
    # The boxes of the official formula, from the same uniforms: area U(scale), log-ratio U, round, clip.
    replay = seeded(3)
    u_area, u_ratio, position = (torch.rand(n, generator=replay), torch.rand(n, generator=replay),
                                 torch.rand((n, 2), generator=replay))  # fmt: skip
    for k in range(0, n, 97):
        area = height * width * (scale[0] + (scale[1] - scale[0]) * u_area[k].item())
        log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio[k].item())
        box_w = min(max(round(math.sqrt(area * aspect)), 1), width)
        box_h = min(max(round(math.sqrt(area / aspect)), 1), height)
        assert (h[k].item(), w[k].item()) == (box_h, box_w), k
        assert top[k].item() == min(math.floor(position[k, 0].item() * (height - box_h + 1)), height - box_h)
        assert left[k].item() == min(math.floor(position[k, 1].item() * (width - box_w + 1)), width - box_w)
    # Offsets reach every position a box of its size fits in (no central fallback).
    for size in (h.unique()[:3]).tolist():
        tops = top[h == size]
        if len(tops) > 500:
            assert set(tops.long().tolist()) == set(range(int(height - size) + 1))


def test_byol_crop_clips_where_torchvision_falls_back_to_a_centre_crop():
    # Area 1 x 16 x 16 at ratio 4/3: sides round(18.5) = 18 and round(13.9) = 14. BYOL clips the width to
    # 16 (a 14 x 16 box at random offsets); torchvision's 10 tries all fail and it takes the central 12 x 16.
    cfg = view_config("byol_view1", crop_scale=(1.0, 1.0), crop_ratio=(4 / 3, 4 / 3))
    top, left, h, w = pipeline._draw_crop_boxes(
        200, 16, 16, dataclasses.replace(cfg, crop_sampler="byol"), seeded(0)
    )
    assert set(h.tolist()) == {14} and set(w.tolist()) == {16} and set(top.tolist()) == {0, 1, 2}
    top, left, h, w = pipeline._draw_crop_boxes(200, 16, 16, cfg, seeded(0))
    assert set(h.tolist()) == {12} and set(w.tolist()) == {16} and set(top.tolist()) == {2}


def test_crop_of_a_constant_image_stays_constant():
    values = torch.arange(0, 256, 17)
    images = constant_images(values, 3, 16)
    out = ViewAugment(24, 3, *unit_stats(3), view_config("supervised", crop_scale=(0.08, 1.0)))(
        images, seeded(0)
    )
    expected = (values.float() / 255).view(-1, 1, 1, 1).expand_as(out)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- colour


def test_brightness_scales_a_constant_image_within_the_factor_range():
    b = 0.5
    images = constant_images([60] * 512, 3, 8)
    cfg = view_config("none", jitter_p=1.0, brightness=b, contrast=0.0, saturation=0.0, hue=0.0)
    out = ViewAugment(8, 3, *unit_stats(3), cfg)(images, seeded(0))
    assert (out.flatten(1).amax(1) - out.flatten(1).amin(1)).max() < 1e-6  # still constant
    factor = out[:, 0, 0, 0] / (60 / 255)
    assert factor.min() >= 1 - b - 1e-6 and factor.max() <= 1 + b + 1e-6
    assert factor.min() < 1 - b + 0.02 and factor.max() > 1 + b - 0.02  # the whole range is used
    # hand values: 60/255 * 1.5, and clamping at 1
    torch.testing.assert_close(
        adjust_brightness(constant_images([60, 200], 3, 2).float() / 255, torch.tensor([1.5, 1.5]))[
            :, 0, 0, 0
        ],
        torch.tensor([90 / 255, 1.0]),
    )


def test_grayscale_equals_itu_r_601_luma():
    images = random_images(8, 3, 16)
    cfg = view_config("none", gray_p=1.0)
    out = ViewAugment(16, 3, *unit_stats(3), cfg)(images, seeded(0))
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    rgb = images.float() / 255
    luma = 0.299 * rgb[:, 0] + 0.587 * rgb[:, 1] + 0.114 * rgb[:, 2]
    torch.testing.assert_close(out[:, 0], luma, atol=1e-6, rtol=0)


def test_colour_ops_match_torchvision_per_image():
    g = seeded(4)
    x = torch.rand(6, 3, 9, 9, generator=g)
    x[0, :, :3] = 0.5  # grey pixels
    x[1, 1] = x[1, 0]  # ties between the largest channels
    factors = 0.2 + 1.6 * torch.rand(6, generator=g)
    shifts = torch.rand(6, generator=g) - 0.5
    per_image = lambda fn, values: torch.stack([fn(img, float(v)) for img, v in zip(x, values)])
    # torchvision's grey uses 0.2989 for red (we use ITU-R 601's 0.299): tiny differences
    torch.testing.assert_close(
        adjust_contrast(x, factors), per_image(TF.adjust_contrast, factors), atol=3e-4, rtol=0
    )
    torch.testing.assert_close(
        adjust_saturation(x, factors), per_image(TF.adjust_saturation, factors), atol=3e-4, rtol=0
    )
    torch.testing.assert_close(adjust_hue(x, shifts), per_image(TF.adjust_hue, shifts), atol=5e-6, rtol=0)


def test_jitter_applies_each_samples_ops_in_its_own_order_like_torchvision():
    images = random_images(48, 3, 8, seed=3)
    cfg = view_config("none", jitter_p=0.75, brightness=0.6, contrast=0.6, saturation=0.6, hue=0.3)
    out = ViewAugment(8, 3, *unit_stats(3), cfg)(images, seeded(11))
    params = pipeline._draw_params(48, 8, 8, cfg, seeded(11))  # the same draws, replayed
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    assert 0 < params.jitter.sum() < 48 and params.jitter_order.unique(dim=0).shape[0] > 6
    for k in range(48):
        expected = images[k].float() / 255
        if params.jitter[k]:
            for op_index in params.jitter_order[k].tolist():
                expected = ops[op_index](expected, float(params.jitter_factors[k, op_index])).clamp(0, 1)
        # torchvision's grey uses 0.2989 for red where we use ITU-R 601's 0.299
        torch.testing.assert_close(out[k], expected, atol=5e-4, rtol=0)


def test_hue_rotation_by_zero_and_by_a_full_turn_is_identity():
    x = torch.rand(8, 3, 12, 12, generator=seeded(0))
    torch.testing.assert_close(adjust_hue(x, torch.zeros(8)), x, atol=2e-6, rtol=0)
    torch.testing.assert_close(adjust_hue(x, torch.ones(8)), x, atol=2e-6, rtol=0)
    half = torch.full((8,), 0.5)
    torch.testing.assert_close(adjust_hue(adjust_hue(x, half), half), x, atol=5e-6, rtol=0)
    # a third of a turn maps pure red to pure green
    red = torch.tensor([1.0, 0.0, 0.0]).view(1, 3, 1, 1)
    torch.testing.assert_close(
        adjust_hue(red, torch.tensor([1 / 3])).flatten(), torch.tensor([0.0, 1.0, 0.0]), atol=1e-6, rtol=0
    )


def test_saturation_and_hue_are_no_ops_on_one_channel():
    x = torch.rand(4, 1, 8, 8, generator=seeded(0))
    assert torch.equal(adjust_saturation(x, torch.full((4,), 0.1)), x)
    assert torch.equal(adjust_hue(x, torch.full((4,), 0.3)), x)
    images = random_images(4, 1, 8)
    cfg = view_config("none", jitter_p=1.0, brightness=0.0, contrast=0.0, saturation=0.8, hue=0.4, gray_p=1.0)
    out = ViewAugment(8, 1, *unit_stats(1), cfg)(images, seeded(0))
    assert torch.equal(out, images.float() / 255)


# ----------------------------------------------------------------------------- blur


def test_blur_keeps_a_constant_image_and_its_mean():
    images = constant_images([0, 37, 128, 255], 3, 32)
    cfg = view_config("none", blur_p=1.0, blur_sigma=(0.1, 2.0))
    out = ViewAugment(32, 3, *unit_stats(3), cfg)(images, seeded(0))
    torch.testing.assert_close(out, images.float() / 255, atol=1e-6, rtol=0)


def test_blur_matches_a_hand_computed_kernel_and_torchvision():
    g = seeded(2)
    x = torch.rand(5, 3, 12, 12, generator=g)
    sigma = 0.1 + 1.9 * torch.rand(5, generator=g)
    out = gaussian_blur(x, sigma, kernel_size=5)
    # interior pixel by hand: separable weights exp(-t^2 / 2 sigma^2), normalised
    t = torch.arange(-2, 3, dtype=torch.float32)
    for k in range(5):
        w = torch.exp(-(t**2) / (2 * sigma[k] ** 2))
        w = w / w.sum()
        patch = x[k, :, 4:9, 4:9]
        by_hand = torch.einsum("i,j,cij->c", w, w, patch)
        torch.testing.assert_close(out[k, :, 6, 6], by_hand, atol=1e-6, rtol=0)
        reference = TF.gaussian_blur(x[k], kernel_size=[5, 5], sigma=[float(sigma[k])] * 2)  # reflect padding
        torch.testing.assert_close(out[k], reference, atol=1e-6, rtol=0)


def test_blur_sigma_is_per_sample():
    one = random_images(1, 3, 32)
    batch = one.expand(32, -1, -1, -1).contiguous()
    in_pixels_of_224 = (0.5 * 224 / 32, 2.0 * 224 / 32)  # 0.5 to 2 pixels of the 32-px view
    out = ViewAugment(32, 3, *unit_stats(3), view_config("none", blur_p=1.0, blur_sigma=in_pixels_of_224))(
        batch, seeded(0)
    )
    sharpness = (out[..., 1:] - out[..., :-1]).abs().mean(dim=(1, 2, 3))  # less with a larger sigma
    assert sharpness.unique().numel() == 32
    assert (sharpness < (one.float() / 255).diff(dim=-1).abs().mean()).all()


def blurred_column_profile(side: int, sigma: float) -> torch.Tensor:
    """The blur's horizontal impulse response on a side x side view: one bright column, blur p = 1."""
    image = torch.zeros(1, 1, side, side, dtype=torch.uint8)
    image[..., side // 2] = 255
    cfg = view_config("none", blur_p=1.0, blur_sigma=(sigma, sigma))
    return ViewAugment(side, 1, *unit_stats(1), cfg)(image, seeded(0))[0, 0, side // 2]


def test_blur_scales_with_the_side_as_at_224_pixels():
    # sigma is in pixels of a 224-px view: the same blur relative to the side at every size, over
    # a kernel of about 10% of the side (SimCLR's rule)
    relative_std = []
    for side in (112, 224, 448):
        profile = blurred_column_profile(side, 2.0)
        offsets = torch.arange(side) - side // 2
        assert profile.sum().item() == pytest.approx(1.0, abs=1e-5)
        assert int((profile > 0).sum()) == blur_kernel_size(side)  # the taps: ~10% of the side
        relative_std.append(math.sqrt(float((profile * offsets.square()).sum())) / side)
    assert relative_std == pytest.approx([2.0 / 224] * 3, rel=2e-3)
    # below 20 px SimCLR's rule leaves one tap: the papers' blur (<= 0.9% of the side) is no blur there
    images = random_images(8, 3, 16)
    out = ViewAugment(16, 3, *unit_stats(3), view_config("mocov2", **{**IDENTITY, "blur_p": 1.0}))(
        images, seeded(0)
    )
    assert torch.equal(out, images.float() / 255)


# ----------------------------------------------------------------------------- colour order

# The order of random grey and colour jitter in each preset's official code.
OFFICIAL_GREY_FIRST = {
    "simclr": False,  # google-research/simclr data_util.py random_color_jitter: jitter, then grey
    "mocov1": True,  # facebookresearch/moco main_moco.py (no --aug-plus): RandomGrayscale, then ColorJitter
    "mocov2": False,  # main_moco.py --aug-plus: RandomApply(ColorJitter), then RandomGrayscale
    "moco_cifar_demo": False,  # moco colab/moco_cifar10_demo.ipynb: RandomApply(ColorJitter), then grey
    "supcon": False,  # HobbitLong/SupContrast main_supcon.py: RandomApply(ColorJitter), then grey
    "sela": True,  # yukimasano/self-label data.py augs=3: RandomGrayscale, then ColorJitter
}


def hue_then_grey_setting(preset: str, **extra) -> ViewConfig:
    """The preset's colour order with the jitter reduced to a hue rotation and both steps always on."""
    return view_config(
        preset,
        **{**IDENTITY, "jitter_p": 1.0, "gray_p": 1.0, "hue": 0.5},
        brightness=0.0,
        contrast=0.0,
        saturation=0.0,
        **extra,
    )


def test_grey_then_jitter_differs_from_jitter_then_grey_for_hue_on_colour_images():
    images = random_images(32, 3, 6, seed=5)
    x = images.float() / 255
    grey = ops.grayscale(x).expand(-1, 3, -1, -1)
    params = pipeline._draw_params(32, 6, 6, hue_then_grey_setting("mocov2"), seeded(3))  # replayed draws
    hue_then_grey = ops.grayscale(adjust_hue(x, params.jitter_factors[:, 3])).expand(-1, 3, -1, -1)
    first = ViewAugment(6, 3, *unit_stats(3), hue_then_grey_setting("mocov2", grey_first=True))
    second = ViewAugment(6, 3, *unit_stats(3), hue_then_grey_setting("mocov2", grey_first=False))
    torch.testing.assert_close(first(images, seeded(3)), grey, atol=1e-6, rtol=0)  # hue: no-op on grey
    torch.testing.assert_close(second(images, seeded(3)), hue_then_grey, atol=1e-5, rtol=0)
    assert (hue_then_grey - grey).abs().amax(dim=(1, 2, 3)).min() > 1e-3  # differ for every sample
    # pure red rotated by a third of a turn is green: grey 0.587, not red's 0.299
    red = torch.tensor([1.0, 0.0, 0.0]).view(1, 3, 1, 1)
    assert ops.grayscale(adjust_hue(red, torch.tensor([1 / 3]))).item() == pytest.approx(0.587)


def test_the_colour_order_changes_no_draw():
    # the same seed draws the same parameters under both orders; only their application differs
    cfg = view_config("simclr")
    one = pipeline._draw_params(16, 8, 8, dataclasses.replace(cfg, grey_first=False), seeded(1))
    other = pipeline._draw_params(16, 8, 8, dataclasses.replace(cfg, grey_first=True), seeded(1))
    for field in dataclasses.fields(one):
        assert torch.equal(getattr(one, field.name), getattr(other, field.name)), field.name
    images = random_images(16, 3, 8)
    no_grey = [view_config("simclr", gray_p=0.0, grey_first=order) for order in (False, True)]
    first, second = (ViewAugment(8, 3, *unit_stats(3), cfg)(images, seeded(1)) for cfg in no_grey)
    assert torch.equal(first, second)


@pytest.mark.parametrize("preset", sorted(OFFICIAL_GREY_FIRST))
def test_each_preset_puts_grey_and_jitter_in_its_official_order(preset):
    assert VIEW_PRESETS[preset].grey_first is OFFICIAL_GREY_FIRST[preset]
    images = random_images(16, 3, 6, seed=2)
    out = ViewAugment(6, 3, *unit_stats(3), hue_then_grey_setting(preset))(images, seeded(4))
    grey = ops.grayscale(images.float() / 255).expand(-1, 3, -1, -1)
    assert torch.allclose(out, grey, atol=1e-6) is OFFICIAL_GREY_FIRST[preset]


# ----------------------------------------------------------------------------- eval, stats


def test_eval_transform_is_exact_normalisation():
    images = random_images(8, 3, 32)
    mean, std = dataset_stats(3, images)
    out = EvalTransform(32, 3, mean, std)(images)
    assert torch.equal(out, normalised(images, mean, std))


def test_eval_transform_resizes_and_centre_crops_deterministically():
    # a 20 x 30 image whose central 20 x 20 square is bright and whose side strips are dark
    images = torch.zeros(2, 1, 20, 30, dtype=torch.uint8)
    images[..., 5:25] = 200
    evaluate = EvalTransform(10, 1, *unit_stats(1))
    out = evaluate(images)
    assert out.shape == (2, 1, 10, 10)
    torch.testing.assert_close(out, torch.full_like(out, 200 / 255), atol=1e-6, rtol=0)
    assert torch.equal(evaluate(images), out)


def test_dataset_stats_from_images_and_imagenet_defaults():
    images = random_images(50, 3, 8)
    mean, std = dataset_stats(3, images)
    pixels = images.double().div(255).transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.float64), pixels.mean(1))
    torch.testing.assert_close(torch.tensor(std, dtype=torch.float64), pixels.std(1, unbiased=False))
    assert dataset_stats(3) == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    grey_mean, grey_std = dataset_stats(1)
    assert math.isclose(grey_mean[0], 0.299 * 0.485 + 0.587 * 0.456 + 0.114 * 0.406)
    assert len(grey_std) == 1 and 0.22 < grey_std[0] < 0.23
    with pytest.raises(ValueError, match="3 channel"):
        dataset_stats(3, random_images(4, 1, 8))
    with pytest.raises(ValueError, match="constant"):
        dataset_stats(1, constant_images([7, 7], 1, 4))


# ----------------------------------------------------------------------------- solarisation, several views


def test_solarise_inverts_the_values_at_or_above_the_threshold():
    x = torch.tensor([0.0, 0.25, 0.4999, 0.5, 0.75, 1.0]).view(1, 1, 1, 6)
    expected = torch.tensor([0.0, 0.25, 0.4999, 0.5, 0.25, 0.0]).view(1, 1, 1, 6)
    torch.testing.assert_close(ops.solarise(x, 0.5), expected)
    # PIL's ImageOps.solarize inverts 128 of 255 and above (0.5 itself is its own inverse, so it cannot
    # tell "at or above" from "above").
    pil = torch.tensor([127, 128, 200]) / 255
    torch.testing.assert_close(ops.solarise(pil, 128 / 255), torch.tensor([127, 127, 55]) / 255)


def test_the_pil_threshold_solarises_every_level_as_imageops_solarize():
    from PIL import Image, ImageOps

    levels = torch.arange(256, dtype=torch.uint8)
    image = Image.frombytes("L", (256, 1), bytes(levels.tolist()))
    pil = torch.tensor(list(ImageOps.solarize(image).tobytes()))
    ours = ops.solarise(levels.float() / 255, presets.PIL_SOLARISE_THRESHOLD)
    assert torch.equal((ours * 255).round().long(), pil)  # level 128 is inverted (0.502 would keep it)
    assert VIEW_PRESETS["byol_view2"].solarise_threshold == presets.PIL_SOLARISE_THRESHOLD


# Each solarising method's official threshold and crop sampler (BYOL's own code; the PyTorch codes call
# ImageOps.solarize after torchvision's RandomResizedCrop).
OFFICIAL_VIEWS = {
    "byol": (0.5, "byol"),  # byol/utils/augmentations.py, utils/dataset.py
    "barlowtwins": (128 / 255, "torchvision"),  # main.py Solarization
    "vicreg": (128 / 255, "torchvision"),  # augmentations.py Solarization
    "mocov3": (128 / 255, "torchvision"),  # moco/loader.py Solarize
    "dino": (128 / 255, "torchvision"),  # utils.Solarization
}


@pytest.mark.parametrize("preset", [None, "cifar10", "stl10", "fashion_mnist", "imagenet100", "imagenet"])
def test_each_method_solarises_at_its_official_threshold_and_crops_with_its_sampler(preset):
    config = load_config(REPO / "config", [REPO / "config" / f"{preset}.yaml"] if preset else [])
    for method, (threshold, sampler) in OFFICIAL_VIEWS.items():
        groups = view_groups(resolve_method_config(config, METHODS_DIR, method)["augment"], 16, 2)
        solarised = [g.config.solarise_threshold for g in groups if g.config.solarise_p > 0]
        assert solarised and solarised == [threshold] * len(solarised), (preset, method)
        assert {g.config.crop_sampler for g in groups} == {sampler}, (preset, method)


def test_a_solarised_view_is_the_same_view_solarised_and_its_coin_is_drawn_last():
    images = random_images(64, 3, 24)
    base = view_config("byol_view2", solarise_p=0.0)
    always = ViewAugment(24, 3, *unit_stats(3), dataclasses.replace(base, solarise_p=1.0))(images, seeded(4))
    never = ViewAugment(24, 3, *unit_stats(3), base)(images, seeded(4))  # the same crops, jitter, blur
    torch.testing.assert_close(always, ops.solarise(never, base.solarise_threshold))
    # Without solarisation nothing more is drawn; with it, one coin per sample after everything else.
    g_without, g_with = seeded(5), seeded(5)
    pipeline._draw_params(64, 24, 24, base, g_without)
    pipeline._draw_params(64, 24, 24, dataclasses.replace(base, solarise_p=0.2), g_with)
    torch.rand(64, generator=g_without)
    assert torch.equal(g_without.get_state(), g_with.get_state())


def test_several_views_in_one_call_are_the_views_of_as_many_calls():
    images = random_images(16, 3, 24)
    aug = ViewAugment(24, 3, *dataset_stats(3), view_config("byol_view2"))  # blur and solarisation on
    one_by_one = [aug(images, g) for g in [seeded(6)] * 3]
    at_once = aug.views(images, seeded(6), 3)
    assert len(at_once) == 3 and all(torch.equal(a, b) for a, b in zip(at_once, one_by_one))


def test_byol_views_view_one_always_blurred_view_two_solarised_at_its_rate():
    # Replayed without the blur or the solarisation, the same seed gives the same crops and colours:
    # the samples that differ are exactly those the step touched. The blur's sigma is pinned at its
    # largest (2 px at 224, 0.21 px at 24 px, a 3-tap kernel): the smallest would change no pixel here.
    n, size = 2000, 24
    images = random_images(n, 3, size, seed=1)
    one, two = (
        dataclasses.replace(VIEW_PRESETS[p], blur_sigma=(2.0, 2.0)) for p in ("byol_view1", "byol_view2")
    )

    def views(first: ViewConfig, second: ViewConfig):
        groups = [CropGroup(1, size, first), CropGroup(1, size, second)]
        return pipeline.MultiViewAugment(groups, 3, *unit_stats(3))(images, seeded(7))

    v1, v2 = views(one, two)
    v1_unblurred, v2_unblurred = views(
        dataclasses.replace(one, blur_p=0.0), dataclasses.replace(two, blur_p=0.0)
    )
    _, v2_plain = views(one, dataclasses.replace(two, solarise_p=0.0))
    assert (v1 != v1_unblurred).flatten(1).any(1).all()  # view 1: blur p 1.0
    assert abs((v2 != v2_unblurred).flatten(1).any(1).float().mean().item() - 0.1) < 0.03  # view 2: 0.1
    assert torch.equal(v1, views(one, dataclasses.replace(two, solarise_p=0.0))[0])  # view 1: never solarised
    solarised = (v2 != v2_plain).flatten(1).any(1)
    assert abs(solarised.float().mean().item() - 0.2) < 0.03  # view 2: solarise p 0.2
    torch.testing.assert_close(v2[solarised], ops.solarise(v2_plain[solarised], two.solarise_threshold))


def test_augment_forms_and_their_views():
    byol = view_groups([{"preset": "byol_view1"}, {"preset": "byol_view2"}], 16, 2)
    assert [(g.count, g.size, g.config) for g in byol] == [
        (1, 16, VIEW_PRESETS["byol_view1"]),
        (1, 16, VIEW_PRESETS["byol_view2"]),
    ]
    same = view_groups([{"preset": "simclr"}, {"preset": "simclr"}], 16, 2)  # merged: one call
    assert [(g.count, g.config) for g in same] == [(2, VIEW_PRESETS["simclr"])]
    assert [(g.count, g.size) for g in view_groups({"preset": "supcon"}, 16, 3)] == [(3, 16)]
    swav = {
        "preset": "simclr",
        "blur_p": 0.0,
        "crops": [
            {"count": 2, "size": 1.0, "crop_scale": [0.14, 1]},
            {"count": 6, "size": 96 / 224, "crop_scale": [0.05, 0.14], "preset": "mocov2"},
        ],
    }
    groups = view_groups(swav, 16, 2)
    assert [(g.count, g.size) for g in groups] == [(2, 16), (6, 7)]  # 96 / 224 x 16 = 6.86 px -> 7
    assert groups[0].config == view_config("simclr", blur_p=0.0, crop_scale=(0.14, 1))
    assert groups[1].config == view_config("mocov2", blur_p=0.0, crop_scale=(0.05, 0.14))  # a group's preset
    assert [crop_side(s, 32) for s in (1.0, 96 / 224, 0.5, 0.25)] == [32, 14, 16, 8]
    assert [(g.count, g.size) for g in view_groups(swav, 224, 2)] == [(2, 224), (6, 96)]
    assert crop_side(0.5, 9) == 5  # 4.5 px: halves round up
    assert describe_views(groups) == "2 x 16px + 6 x 7px"
    images = random_images(4, 1, 16)
    views = pipeline.MultiViewAugment(groups, 1, *unit_stats(1))(images, seeded(0))
    assert [tuple(v.shape) for v in views] == [(4, 1, 16, 16)] * 2 + [(4, 1, 7, 7)] * 6
    # Each group's views are the views its own pipeline draws, in turn from the one generator.
    g = seeded(0)
    alone = [
        v
        for group in groups
        for v in ViewAugment(group.size, 1, *unit_stats(1), group.config).views(images, g, group.count)
    ]
    assert all(torch.equal(a, b) for a, b in zip(views, alone))


@pytest.mark.parametrize(
    "setting, needle",
    [
        ({"crops": []}, "`augment.crops` must be a non-empty list"),
        ({"crops": [{"count": 0}]}, "`augment.crops[0].count` must be a positive integer"),
        ({"crops": [{"count": 2, "size": 1.5}]}, "`augment.crops[0].size` is the crop's side as a fraction"),
        (
            {"crops": [{"count": 2}, {"count": 1, "blur": 0.5}]},
            "`augment.crops[1]`: unknown ViewConfig key(s) ['blur']",
        ),
        ([{"preset": "byol"}], "`augment[0]`: unknown view preset 'byol'"),
        ([], "an empty list"),
        ("simclr", "must be one view setting (a mapping)"),
    ],
)
def test_bad_augment_forms_name_the_key(setting, needle):
    from sslbench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        view_groups(setting, 16, 2)
    assert needle in str(err.value)


def test_the_views_must_fit_the_method():
    from sslbench.errors import ConfigError

    two_global_six_local = view_groups({"crops": [{"count": 2}, {"count": 6, "size": 0.5}]}, 16, 2)
    check_view_groups(two_global_six_local, 2, multi_crop=True, image_size=16)
    with pytest.raises(ConfigError, match=r"gives 8 view\(s\) but the method takes 2"):
        check_view_groups(two_global_six_local, 2, multi_crop=False, image_size=16)
    local_first = view_groups({"crops": [{"count": 1, "size": 0.5}, {"count": 2}]}, 16, 2)
    with pytest.raises(ConfigError, match=r"their sides are \[8, 16\]"):
        check_view_groups(local_first, 2, multi_crop=True, image_size=16)
    with pytest.raises(ConfigError, match=r"gives 1 view\(s\)"):
        check_view_groups(view_groups([{}], 16, 2), 2, multi_crop=True, image_size=16)


# ----------------------------------------------------------------------------- augmentation policies


def policy_augment(policy, channels=3, size=16, preset="none", stats=None):
    return ViewAugment(size, channels, *(stats or unit_stats(channels)), view_config(preset, policy=policy))


@pytest.mark.parametrize("policy", ["randaugment", "autoaugment"])
def test_each_image_of_a_batch_gets_its_own_policy_draw(policy):
    # 64 copies of one image, no crop: torchvision's one draw per call would make them all equal.
    batch = random_images(1, 3, 16, seed=5).expand(64, -1, -1, -1).contiguous()
    out = policy_augment(policy)(batch, seeded(0)).flatten(1)
    distinct = torch.unique(out, dim=0).shape[0]
    assert distinct >= 16, f"{policy}: only {distinct} distinct outputs of 64"
    # an image's view depends on its own draw only, not on the other images of the batch
    other = torch.cat([batch[:1], random_images(63, 3, 16, seed=6)])
    assert torch.equal(policy_augment(policy)(other, seeded(0))[0], out[0].view(3, 16, 16))


@pytest.mark.parametrize("policy", ["randaugment", "autoaugment"])
def test_policy_views_are_reproducible_per_seed_and_leave_the_global_rng_alone(policy):
    images = random_images(32, 3, 16)
    aug = policy_augment(policy, preset="supcon")
    state = torch.get_rng_state()
    first, again, other = aug(images, seeded(1)), aug(images, seeded(1)), aug(images, seeded(2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # the seed reaches the policy itself, not just the crops
    uncropped = policy_augment(policy)
    assert not torch.equal(uncropped(images, seeded(1)), uncropped(images, seeded(2)))


@pytest.mark.parametrize("policy", ["randaugment", "autoaugment"])
@pytest.mark.parametrize("channels", [1, 3])
def test_policy_views_keep_dtype_range_and_normalisation(policy, channels):
    images = random_images(32, channels, 16)
    raw = policy_augment(policy, channels, preset="supcon")(images, seeded(3))
    assert raw.dtype == torch.float32 and raw.shape == (32, channels, 16, 16)
    assert raw.min() >= 0 and raw.max() <= 1 and raw.max() > 0.5
    levels = raw * 255
    torch.testing.assert_close(levels, levels.round(), atol=1e-4, rtol=0)  # uint8 levels, as the policy sees
    # The policy's seeds are drawn after every other parameter, so a seed's crops are those of the simclr
    # policy (here without colour steps), rounded to uint8 levels: RandAugment's identity op shows them.
    crops = ViewAugment(16, channels, *unit_stats(channels), view_config("supervised"))(images, seeded(4))
    one_op = view_config("supervised", policy=policy, policy_ops=1)
    views = ViewAugment(16, channels, *unit_stats(channels), one_op)(images, seeded(4))
    levels = crops * 255
    unchanged = (views == levels.round() / 255).flatten(1).all(1)
    between_levels = ((levels - levels.round()).abs() > 0.01).flatten(1).any(1)  # where rounding matters
    assert policy == "autoaugment" or (unchanged & between_levels).any()
    mean, std = [0.3] * channels, [0.2] * channels
    normalised_view = policy_augment(policy, channels, preset="supcon", stats=(mean, std))(images, seeded(3))
    torch.testing.assert_close(normalised_view, (raw - 0.3) / 0.2)


def test_the_readme_lists_every_preset_with_its_crop_and_blur():
    """sslbench/augment/README.md's table of presets is the list a method author reads: every preset of
    VIEW_PRESETS, no other, and the crop scale and blur each row states are the preset's."""
    import re
    from pathlib import Path

    from sslbench.augment.presets import VIEW_PRESETS

    readme = (Path(__file__).parents[2] / "sslbench" / "augment" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", readme, re.M))
    assert sorted(rows) == sorted(VIEW_PRESETS)
    for name, recipe in rows.items():
        preset = VIEW_PRESETS[name]
        crop = re.search(r"crop \(([\d.]+), ([\d.]+)\)", recipe)
        if crop:
            assert preset.crop_scale == (float(crop[1]), float(crop[2])), name
        blur = re.search(r"blur p ([\d.]+)", recipe)
        if blur:
            assert preset.blur_p == float(blur[1]), name
        if "no blur" in recipe or name == "none":
            assert preset.blur_p == 0.0, name
