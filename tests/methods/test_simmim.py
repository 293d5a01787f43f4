"""SimMIM (methods/simmim): its loss by hand, the mask token standing in for the masked patches (the
reconstruction does not see their pixels), the decoder as one linear map per patch put back in place by
the pixel shuffle, its masks from the global RNG, its parameter groups and its gradient clipping. The mask
is pinned in tests/kit/test_vit.py; tests/methods/test_distributed.py runs SimMIM under 2 real gloo
processes against one on the whole batch."""

import inspect

import pytest
import torch
from support import METHODS_DIR, VIT_P2

from sslbench.kit.vit import random_unit_mask
from sslbench.plugins import load_method_class

simmim = inspect.getmodule(load_method_class(METHODS_DIR / "simmim"))


@pytest.fixture
def vit(build):
    def make(**overrides):
        return build("simmim", 0, backbone=VIT_P2, **overrides)

    return make


def a_mask(n=4, seed=0, count=10):
    return random_unit_mask(
        torch.rand(n, 16, generator=torch.Generator().manual_seed(seed)), count, (4, 4), 1
    )


def test_loss_by_hand_the_l1_error_on_the_masked_pixels_over_their_number_and_the_channels(vit):
    method = vit()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    mask = a_mask()
    with torch.no_grad():
        y = method.reconstruct(x, mask)
    total, count = 0.0, 0
    for n in range(4):
        for i in range(4):
            for j in range(4):
                if mask[n, i, j]:
                    total += float(
                        (
                            x[n, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
                            - y[n, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
                        )
                        .abs()
                        .sum()
                    )
                    count += 4  # the 2 x 2 pixels of a patch
    expected = total / (count + 1e-5) / 1
    assert float(simmim.masked_l1(x, y, mask, 2)) == pytest.approx(expected, rel=1e-5)


def test_the_loss_of_a_three_channel_image_is_the_mean_over_masked_pixels_and_channels_by_hand():
    images = torch.zeros(1, 3, 4, 4)
    reconstruction = torch.zeros(1, 3, 4, 4)
    reconstruction[0, :, :2, :2] = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)  # patch (0, 0), masked
    reconstruction[0, :, 2:, 2:] = 10.0  # patch (1, 1), not masked: no part of the loss
    mask = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    # |error| summed over the masked patch's 4 pixels and 3 channels: 4 x (1 + 2 + 3) = 24;
    # over its 4 pixels and the 3 channels
    assert float(simmim.masked_l1(images, reconstruction, mask, 2)) == pytest.approx(24 / (4 + 1e-5) / 3)


def test_the_reconstruction_does_not_see_the_masked_patches_pixels(vit):
    method = vit().eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    mask = a_mask(n=2, seed=3)
    changed = x.clone()
    pixels = mask.repeat_interleave(2, 1).repeat_interleave(2, 2).unsqueeze(1).bool()
    changed[pixels] = torch.randn(int(pixels.sum()))  # new content under the mask only
    with torch.no_grad():
        torch.testing.assert_close(method.reconstruct(changed, mask), method.reconstruct(x, mask))
        kept = x.clone()
        kept[~pixels] += 1.0  # a visible patch changed: the reconstruction changes
        assert not torch.allclose(method.reconstruct(kept, mask), method.reconstruct(x, mask))


def test_the_decoder_is_one_linear_map_per_patch_token_put_back_in_place(vit):
    method = vit()
    conv, shuffle = method.decoder
    z = torch.randn(1, 48, 4, 4)
    with torch.no_grad():
        out = method.decoder(z)
        weight, bias = conv.weight[:, :, 0, 0], conv.bias  # [p * p * C, D]
        values = weight @ z[0, :, 1, 2] + bias  # patch (1, 2): 4 values, channel c * 4 + row * 2 + column
    assert isinstance(shuffle, torch.nn.PixelShuffle) and out.shape == (1, 1, 8, 8)
    torch.testing.assert_close(out[0, 0, 2:4, 4:6], values.view(2, 2))


def test_training_draws_the_batch_s_masks_from_the_global_rng(vit):
    method = vit()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(5)
    mask = random_unit_mask(torch.rand(4, 16), method.mask_count, (4, 4), 1)
    expected = simmim.masked_l1(x, method.reconstruct(x, mask), mask, 2)
    torch.manual_seed(5)
    torch.testing.assert_close(method.training_loss([x], None, torch.arange(4)), expected)
    assert method.mask_count == 10  # ceil(0.6 x 16)


def test_no_weight_decay_on_biases_norms_class_token_and_positions_but_on_the_mask_token(vit):
    method = vit()
    decayed, free = (group["params"] for group in method.param_groups())
    ids = lambda params: {id(p) for p in params}  # noqa: E731
    vit_ = method.backbone
    assert {id(vit_.cls_token), id(vit_.pos_embed), id(vit_.norm.weight), id(method.decoder[0].bias)} <= ids(
        free
    )
    assert {id(method.mask_token), id(method.decoder[0].weight), id(vit_.patch_embed.proj.weight)} <= ids(
        decayed
    )
    assert ids(decayed) | ids(free) == ids(method.parameters()) and not ids(decayed) & ids(free)


def test_the_gradients_total_norm_is_clipped(vit):
    method = vit(clip_grad=0.5)
    for p in method.parameters():
        p.grad = torch.ones_like(p)
    method.on_before_step(None)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in method.parameters()]))
    assert float(norm) == pytest.approx(0.5, rel=1e-4)
