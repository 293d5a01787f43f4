"""sslbench/kit/vit.py: SimMIM's mask of random units by hand, its exact count and its uniform marginals,
the whole batch's draw taken from the global RNG (one process), BEiT's block-wise mask by hand and its
bounds, Franca's rolled and inverse blocks replayed against its numpy code, and every token of the ViT (the
class token its own forward's). The ViT checks are pinned through the methods that use them
(tests/methods/test_mae.py, test_simmim.py, test_msn.py, test_ibot.py)."""

import math
import random

import numpy as np
import pytest
import torch
from support import tiny_vit

from sslbench.errors import ConfigError
from sslbench.kit.vit import (
    batch_draw,
    block_mask,
    check_masked_vit,
    fix_sincos_positions,
    inverse_block_mask,
    keep_patches,
    mask_share_draws,
    masked_tokens,
    multiblock_block_size,
    multiblock_masks,
    place_block,
    random_unit_mask,
    rolled_block_mask,
    sincos_pos_embed,
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


# --- sin-cos tables --------------------------------------------------------------------------------


def test_sincos_table_is_util_pos_embed_s_layout():
    dim, rows, cols = 8, 2, 3
    table = sincos_pos_embed(dim, (rows, cols), cls_token=True)
    assert table.shape == (1 + rows * cols, dim)
    assert not table[0].any()  # the class token's row: zeros
    omega = [1 / 10000 ** (k / 2) for k in range(2)]  # dim / 4 = 2 frequencies
    for i in range(rows):
        for j in range(cols):  # the first half encodes the column (np.meshgrid(grid_w, grid_h)[0])
            want = [math.sin(j * w) for w in omega] + [math.cos(j * w) for w in omega]
            want += [math.sin(i * w) for w in omega] + [math.cos(i * w) for w in omega]
            torch.testing.assert_close(
                table[1 + i * cols + j].double(), torch.tensor(want, dtype=torch.float64)
            )
    assert sincos_pos_embed(dim, (rows, cols), cls_token=False).shape == (rows * cols, dim)


def test_a_vit_without_class_token_gets_the_sincos_table_without_its_row_and_never_trains_it():
    vit = tiny_vit(class_token=False, global_pool="avg", fc_norm=False)
    fix_sincos_positions(vit)
    assert torch.equal(vit.pos_embed[0], sincos_pos_embed(48, (4, 4), cls_token=False))
    assert not vit.pos_embed.requires_grad
    with_class = tiny_vit()
    fix_sincos_positions(with_class)
    assert torch.equal(with_class.pos_embed[0], sincos_pos_embed(48, (4, 4), cls_token=True))


def test_an_encoder_without_class_token_must_average_its_normed_patch_tokens():
    cfg = {"backbone": {"name": "vit_tiny_patch16_224", "args": {}}}
    info = type("Info", (), {"image_size": 16, "channels": 3})()
    averaged = tiny_vit(class_token=False, global_pool="avg", fc_norm=False)
    assert check_masked_vit(averaged, cfg, info, "I-JEPA", class_token=False) == 4
    for wrong in (tiny_vit(), tiny_vit(class_token=False, global_pool="avg")):  # a class token; a pooled norm
        with pytest.raises(ConfigError, match="class_token false, global_pool 'avg' and fc_norm false"):
            check_masked_vit(wrong, cfg, info, "I-JEPA", class_token=False)
    with pytest.raises(ConfigError, match="one class token"):
        check_masked_vit(averaged, cfg, info, "MAE")


# --- I-JEPA's multi-block masks ------------------------------------------------------------------------


def test_keep_patches_takes_each_mask_s_indices_of_each_image_masks_one_after_another():
    tokens = torch.arange(2 * 4 * 1.0).view(2, 4, 1)  # image b, patch l: 4 b + l
    masks = [torch.tensor([[0, 3], [1, 2]]), torch.tensor([[2, 2], [0, 0]])]
    kept = keep_patches(tokens, masks)
    assert kept[..., 0].tolist() == [[0, 3], [5, 6], [2, 2], [4, 4]]


@pytest.mark.parametrize(
    "u,scale,aspect,size",
    [  # keep = int(64 share); h = round(sqrt(keep ratio)), w = round(sqrt(keep / ratio)), at most 7
        (0.0, (0.15, 0.2), (0.75, 1.5), (3, 3)),  # keep 9, ratio 0.75: sqrt(6.75) 2.6, sqrt(12) 3.46
        (1.0, (0.15, 0.2), (0.75, 1.5), (4, 3)),  # keep int(12.8) 12, ratio 1.5: sqrt(18) 4.24, sqrt(8) 2.83
        (0.5, (0.15, 0.2), (0.75, 1.5), (4, 3)),  # keep int(11.2) 11, ratio 1.125: sqrt(12.4) 3.5 -> 4 ...
        (1.0, (0.85, 1.0), (1.0, 1.0), (7, 7)),  # keep 64: 8 x 8, one less than the grid's side
        (0.0, (0.85, 1.0), (1.0, 1.0), (7, 7)),  # keep int(54.4) 54: round(7.35) 7
    ],
)
def test_a_block_s_size_is_multiblock_s_by_hand(u, scale, aspect, size):
    assert multiblock_block_size(u, (8, 8), scale, aspect) == size


def test_a_block_s_corner_never_reaches_the_last_row_or_column_it_could_and_its_complement_is_the_rest():
    rng = random.Random(0)
    corners = set()
    for _ in range(300):
        indices, outside = place_block((2, 3), (5, 6), 0, rng)
        rows, cols = indices // 6, indices % 6
        top, left = int(rows.min()), int(cols.min())
        corners.add((top, left))
        expected = torch.zeros(5, 6, dtype=torch.bool)
        expected[top : top + 2, left : left + 3] = True
        assert torch.equal(indices, expected.flatten().nonzero().squeeze(1))  # the block, row-major
        assert torch.equal(outside, ~expected)
    assert corners == {(top, left) for top in range(3) for left in range(3)}  # rows and columns 0-2 of 0-3


def test_a_context_block_keeps_only_allowed_patches_and_sheds_a_region_after_every_20_failures():
    rng = random.Random(1)
    left_half = torch.zeros(4, 4, dtype=torch.bool)
    left_half[:, :2] = True
    indices, _ = place_block((3, 3), (4, 4), 2, rng, [left_half])
    assert (indices % 4 < 2).all() and len(indices) > 2
    nothing = torch.zeros(4, 4, dtype=torch.bool)  # never more than 2 kept: after 20 tries the region goes
    indices, _ = place_block((3, 3), (4, 4), 2, rng, [left_half, nothing])  # the last region goes first
    assert (indices % 4 < 2).all() and len(indices) == 6
    with pytest.raises(ValueError, match="never keeps more than min_keep 9"):
        place_block((3, 3), (4, 4), 9, rng)  # 9 patches never keep more than 9: an error, not a loop


def test_the_masks_are_the_collator_s_one_size_per_batch_context_outside_targets_cut_to_the_shortest():
    rng = random.Random(2)
    settings = {"pred_scale": (0.15, 0.2), "enc_scale": (0.85, 1.0), "aspect": (0.75, 1.5), "npred": 4}
    context, targets = multiblock_masks(64, (8, 8), rng, nenc=1, min_keep=4, allow_overlap=False, **settings)
    assert len(context) == 1 and len(targets) == 4
    assert {t.shape[0] for t in [*context, *targets]} == {64}
    sizes = {multiblock_block_size(u, (8, 8), (0.15, 0.2), (0.75, 1.5)) for u in (0.0, 0.5, 1.0)}
    assert targets[0].shape[1] <= max(h * w for h, w in sizes)
    for b in range(64):
        tgt = {int(i) for t in targets for i in t[b]}
        assert not tgt & {int(i) for i in context[0][b]}  # the context holds no target's patch
        assert (context[0][b] < 7 * 8).all() and (context[0][b] % 8 < 7).all()  # the 7 x 7 block at (0, 0)
    for m in [*context, *targets]:
        assert (m.diff(dim=1) > 0).all()  # each a block's first patches, row-major
    overlapping = multiblock_masks(
        64, (8, 8), random.Random(2), nenc=1, min_keep=4, allow_overlap=True, **settings
    )
    assert overlapping[0][0].shape[1] == 49  # allow_overlap: the whole 7 x 7 context block


def test_the_masks_are_cut_to_the_shortest_of_the_batch_by_replaying_the_collator_s_draws():
    settings = {"pred_scale": (0.15, 0.2), "enc_scale": (0.85, 1.0), "aspect": (0.75, 1.5)}
    context, targets = multiblock_masks(
        32, (8, 8), random.Random(3), npred=4, nenc=1, min_keep=4, allow_overlap=False, **settings
    )
    rng = random.Random(3)  # the same draws, in the collator's order, uncut
    pred = multiblock_block_size(rng.random(), (8, 8), settings["pred_scale"], settings["aspect"])
    enc = multiblock_block_size(rng.random(), (8, 8), settings["enc_scale"], (1.0, 1.0))
    whole_contexts, whole_targets = [], []
    for _ in range(32):
        placed = [place_block(pred, (8, 8), 4, rng) for _ in range(4)]
        whole_targets.append([indices for indices, _ in placed])
        whole_contexts.append(place_block(enc, (8, 8), 4, rng, [outside for _, outside in placed])[0])
    shortest = min(len(c) for c in whole_contexts)
    assert context[0].shape == (32, shortest) and len({len(c) for c in whole_contexts}) > 1  # some were cut
    for b in range(32):
        assert torch.equal(context[0][b], whole_contexts[b][:shortest])
        for j in range(4):  # the targets are whole blocks of one size: nothing to cut
            assert torch.equal(targets[j][b], whole_targets[b][j])


# --------------------------------------------------------------------------- Franca's rolled (inverse) blocks


def official_block(h, w, n, log_aspect, rng, roll):
    """franca/data/masking.py BlockMasking.__call__ written out with numpy, drawing from `rng` as it draws
    from `random`."""
    if n == 0:
        return np.zeros((h, w), dtype=bool)
    n = min(n, h * w)
    min_lar = max(log_aspect[0], np.log(n / (w**2)))
    max_lar = min(log_aspect[1], np.log(h**2 / (n + 1e-5)))
    min_lar = min(min_lar, max_lar)
    ratio = math.exp(rng.uniform(min_lar, max_lar))
    bh = min(int(np.ceil(math.sqrt(n * ratio))), h)
    bw = min(int(np.ceil(math.sqrt(n / ratio))), w)
    top = 0 if bh >= h else rng.randint(0, h - bh)
    left = 0 if bw >= w else rng.randint(0, w - bw)
    mask = np.zeros((h, w), dtype=bool)
    mask[top : top + bh, left : left + bw] = True
    ids = np.where(mask.flatten())[0][:n]
    mask = np.zeros(h * w, dtype=bool)
    mask[ids] = True
    mask = mask.reshape(h, w)
    if roll:
        mask = np.roll(mask, (rng.randint(0, h - 1), rng.randint(0, w - 1)), (0, 1))
    return mask


def official_inverse(h, w, n, log_aspect, rng, roll):
    if n == 0:
        return np.zeros((h, w), dtype=bool)
    if n >= h * w:
        return np.ones((h, w), dtype=bool)
    return ~official_block(h, w, max(1, h * w - n), log_aspect, rng, roll)


@pytest.mark.parametrize("roll", [True, False])
@pytest.mark.parametrize("grid", [(4, 4), (8, 8), (6, 10)])
def test_rolled_and_inverse_blocks_replay_franca_s_masking_and_mask_exactly_the_count(grid, roll):
    h, w = grid
    log_aspect = (math.log(0.3), -math.log(0.3))
    for seed in range(30):
        for n in [0, 1, 3, h * w // 2, h * w - 1, h * w]:
            ours, theirs = random.Random(seed), random.Random(seed)
            got = rolled_block_mask(h, w, n, log_aspect, ours, roll)
            assert np.array_equal(got.numpy(), official_block(h, w, n, log_aspect, theirs, roll))
            assert int(got.sum()) == n
            ours, theirs = random.Random(seed), random.Random(seed)
            got = inverse_block_mask(h, w, n, log_aspect, ours, roll)
            assert np.array_equal(got.numpy(), official_inverse(h, w, n, log_aspect, theirs, roll))
            assert int(got.sum()) == n
            assert ours.random() == theirs.random()  # the same numbers drawn


def test_an_unrolled_block_is_a_rectangle_s_first_patches_and_rolling_shifts_it_cyclically():
    log_aspect = (math.log(0.3), -math.log(0.3))
    plain = rolled_block_mask(8, 8, 12, log_aspect, random.Random(3), roll=False)
    rows, cols = plain.nonzero(as_tuple=True)
    box = plain[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    assert box.sum() == 12 and box[:-1].all()  # full rows of the box, then the last row's first patches
    rolled = rolled_block_mask(8, 8, 12, log_aspect, random.Random(3), roll=True)
    shifts = [
        (a, b) for a in range(8) for b in range(8) if torch.equal(torch.roll(plain, (a, b), (0, 1)), rolled)
    ]
    assert shifts  # the same block, shifted with wrap-around
