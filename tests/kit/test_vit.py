"""sslbench/kit/vit.py: SimMIM's mask of random units by hand, its exact count and its uniform marginals,
and the whole batch's draw taken from the global RNG (one process). The ViT checks are pinned through the
methods that use them (tests/methods/test_mae.py, test_simmim.py)."""

import pytest
import torch

from sslbench.kit.vit import batch_draw, random_unit_mask


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
