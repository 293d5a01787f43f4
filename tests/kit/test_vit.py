"""sslbench/kit/vit.py: SimMIM's mask of random units by hand, its exact count and its uniform marginals,
the whole batch's draw taken from the global RNG (one process), BEiT's block-wise mask by hand and its
bounds, and every token of the ViT (the class token its own forward's). The ViT checks are pinned through
the methods that use them (tests/methods/test_mae.py, test_simmim.py, test_msn.py, test_ibot.py)."""

import math
import random

import pytest
import torch
from support import tiny_vit

from sslbench.kit.vit import (
    batch_draw,
    block_mask,
    mask_share_draws,
    masked_tokens,
    random_unit_mask,
    vit_layer_id,
)


def test_the_units_of_smallest_noise_are_masked_each_with_its_patches_by_hand():
    noise = torch.tensor([[0.3, 0.1, 0.9, 0.5]])  # 2 x 2 units of 2 x 2 patches on a 4 x 4 grid
    mask = random_unit_mask(noise, 2, (4, 4), 2)
    expected = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=noise.dtype)
    assert torch.equal(mask[0], expected)  # units 1 and 0: the top half


def test_every_image_has_exactly_count_units_each_masked_whole():
    g = torch.Generator().manual_seed(0)
    mask = random_unit_mask(torch.rand(50, 9, generator=g), 5, (6, 6), 2)
    assert mask.shape == (50, 6, 6)
    units = mask.view(50, 3, 2, 3, 2)
    assert torch.equal(units.amin(dim=(2, 4)), units.amax(dim=(2, 4)))  # a unit is all masked or all kept
    assert torch.equal(units.amax(dim=(2, 4)).sum(dim=(1, 2)), torch.full((50,), 5.0))


def test_each_unit_is_masked_with_probability_count_over_units():
    g = torch.Generator().manual_seed(1)
    mask = random_unit_mask(torch.rand(4000, 16, generator=g), 10, (4, 4), 1)
    assert (mask.mean(dim=0) - 10 / 16).abs().max() < 0.03  # a uniform random subset: every unit alike


def test_units_that_do_not_tile_the_grid_are_refused():
    with pytest.raises(ValueError, match="do not tile"):
        random_unit_mask(torch.rand(1, 4), 2, (5, 5), 2)
    with pytest.raises(ValueError, match="units from noise"):
        random_unit_mask(torch.rand(1, 3), 2, (4, 4), 2)


def test_one_process_draws_the_batch_from_the_global_rng():
    torch.manual_seed(7)
    drawn = batch_draw(3, 5, torch.device("cpu"))
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(3, 5))


class Scripted:
    """A stand-in for random.Random that returns the numbers a test writes down, in order."""

    def __init__(self, *numbers):
        self.numbers = list(numbers)

    def uniform(self, a, b):
        return self.numbers.pop(0)

    def randint(self, a, b):
        value = self.numbers.pop(0)
        assert a <= value <= b
        return value


def test_a_block_by_hand_area_aspect_and_corner_as_drawn():
    # area 4, log-aspect 0 (square): a 2 x 2 block at row 1, column 0; 4 patches reach the count
    mask = block_mask(4, 4, 4.0, (math.log(0.3), math.log(1 / 0.3)), Scripted(4.0, 0.0, 1, 0))
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[1:3, 0:2] = True
    assert torch.equal(mask, expected)
    # area 6, aspect e^log(1.5): 3 rows (round(sqrt(9)) = 3) by 2 columns (round(sqrt(4)) = 2)
    mask = block_mask(4, 4, 6.0, (math.log(0.3), math.log(1 / 0.3)), Scripted(6.0, math.log(1.5), 0, 2))
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[0:3, 2:4] = True
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("count", [0.0, 2.5, 6.4, 9.0])
def test_block_masks_never_pass_the_count_and_mostly_reach_it(count):
    rng = random.Random(0)
    log_aspect = (math.log(0.3), math.log(1 / 0.3))
    masks = [block_mask(6, 6, count, log_aspect, rng) for _ in range(300)]
    counts = torch.tensor([float(m.sum()) for m in masks])
    assert (counts <= count).all()
    assert counts.mean() >= 0.75 * math.floor(count)  # most draws mask nearly all they may


def test_a_block_as_wide_or_as_tall_as_the_grid_is_not_drawn():
    # a 4 x 4 block on a 4 x 4 grid is refused (a block lies strictly inside), the next try's 1 x 1 is taken;
    # then ten 4 x 4 tries in a row add nothing and the draw ends
    numbers = (16.0, 0.0, 1.0, 0.0, 3, 3, *[16.0, 0.0] * 10)
    mask = block_mask(4, 4, 16.0, (math.log(0.3), math.log(1 / 0.3)), Scripted(*numbers))
    assert int(mask.sum()) == 1 and bool(mask[3, 3])


def test_every_token_with_no_mask_is_the_vit_s_own_forward():
    vit = tiny_vit().eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        tokens = masked_tokens(vit, x)
        assert tokens.shape == (3, 17, 48)
        torch.testing.assert_close(tokens[:, 0], vit(x))


@pytest.mark.parametrize("count", [3, 6, 8])
def test_capped_blocks_never_pass_the_cap_and_blocks_of_one_patch_are_drawn_with_a_minimum_of_one(count):
    rng = random.Random(0)
    for _ in range(50):  # max_area 4: every block at most 4 patches, so a mask of 8 takes two or more
        mask = block_mask(4, 4, count, (math.log(0.3), math.log(1 / 0.3)), rng, min_area=4, max_area=4)
        assert int(mask.sum()) <= count
    single = [block_mask(4, 4, 1, (0.0, 0.0), random.Random(s), min_area=1).sum() for s in range(20)]
    assert all(int(n) == 1 for n in single)  # area U(1, 1), aspect 1: one patch, strictly inside the grid


def test_mask_shares_by_hand_one_per_bin_the_rest_zero_shuffled():
    shares = mask_share_draws(6, 0.5, (0.2, 0.5), random.Random(3))
    assert len(shares) == 6 and shares.count(0.0) == 3
    drawn = sorted(s for s in shares if s)
    for i, s in enumerate(drawn):  # bins [0.2, 0.3], [0.3, 0.4], [0.4, 0.5]
        assert 0.2 + 0.1 * i <= s <= 0.3 + 0.1 * i + 1e-12
    assert mask_share_draws(5, 0.0, (0.1, 0.5), random.Random(0)) == [0.0] * 5
    orders = {
        tuple(s > 0 for s in mask_share_draws(6, 0.5, (0.2, 0.5), random.Random(seed))) for seed in range(10)
    }
    assert len(orders) > 1  # shuffled: the masked crops are not always the first


def test_each_vit_parameter_s_layer_embeddings_0_block_i_i_plus_1_the_rest_last():
    vit = tiny_vit()
    blocks = len(vit.blocks)
    layers = {name: vit_layer_id(name, blocks) for name, _ in vit.named_parameters()}
    assert layers["cls_token"] == layers["pos_embed"] == layers["patch_embed.proj.weight"] == 0
    assert layers["blocks.0.attn.qkv.weight"] == 1 and layers[f"blocks.{blocks - 1}.mlp.fc2.bias"] == blocks
    assert layers["norm.weight"] == blocks + 1
    assert set(layers.values()) == set(range(blocks + 2))
