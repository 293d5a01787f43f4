"""sslbench/kit/vit.py: SimMIM's mask of random units by hand, its exact count and its uniform marginals,
the whole batch's draw taken from the global RNG (one process), BEiT's block-wise mask by hand and its
bounds, and every token of the ViT (the class token its own forward's). The ViT checks are pinned through
the methods that use them (tests/methods/test_mae.py, test_simmim.py, test_msn.py, test_ibot.py)."""

import math
import random

import pytest
import torch
from support import tiny_vit

from sslbench.kit.vit import batch_draw, block_mask, masked_tokens, random_unit_mask


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
