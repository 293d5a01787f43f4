"""The shared training-loop pieces: batches, per-group learning rates, the divergence check."""

import math

import pytest
import torch

from sslbench.loop import (
    TrainingDiverged,
    batch_count,
    check_finite,
    set_learning_rate,
    shuffled_batches,
)


@pytest.mark.parametrize(
    "count, batch_size, min_size, sizes",
    [
        (1347, 128, 128, [128] * 10),  # the engine: fixed-size batches, the last 67 dropped
        (70, 32, 1, [32, 32, 6]),  # the paper-mode probe: the smaller last batch kept
        (65, 32, 2, [32, 32]),  # semisup: a last batch of one image dropped (batch norm needs two)
        (66, 32, 2, [32, 32, 2]),
        (1, 32, 2, [1]),  # the only batch is never dropped
        (10, 32, 1, [10]),
    ],
)
def test_shuffled_batches_sizes_and_batch_count(count, batch_size, min_size, sizes):
    batches = shuffled_batches(count, batch_size, torch.Generator().manual_seed(0), min_size)
    assert [len(b) for b in batches] == sizes and batch_count(count, batch_size, min_size) == len(sizes)
    seen = torch.cat(batches)
    assert len(set(seen.tolist())) == len(seen) and seen.min() >= 0 and seen.max() < count  # no repeats


def test_shuffled_batches_are_one_permutation_drawn_from_the_generator():
    batches = shuffled_batches(100, 30, torch.Generator().manual_seed(3))
    assert torch.equal(torch.cat(batches), torch.randperm(100, generator=torch.Generator().manual_seed(3)))
    other = shuffled_batches(100, 30, torch.Generator().manual_seed(4))
    assert not torch.equal(torch.cat(batches), torch.cat(other))


def test_each_parameter_group_follows_the_schedule_from_its_own_base():
    backbone, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(
        [{"params": backbone.parameters(), "base_lr": 0.1}, {"params": head.parameters(), "base_lr": 1.0}],
        lr=0.1,
    )
    schedule = {"lr": 0.1, "schedule": "cosine", "epochs": 4}
    set_learning_rate(optimizer, schedule, 10, 5)  # halfway through 4 epochs of 5 steps
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.05, 0.5])
    set_learning_rate(optimizer, {"lr": 0.3, "schedule": "constant", "epochs": 1}, 0, 1)
    plain = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)  # no base_lr: the schedule's lr
    set_learning_rate(plain, {"lr": 0.3, "schedule": "step", "milestones": [1], "epochs": 2}, 5, 4)
    assert plain.param_groups[0]["lr"] == pytest.approx(0.03)


def test_check_finite_returns_the_loss_or_raises_with_the_callers_message():
    assert check_finite(torch.tensor(1.5), lambda v, e: "unused", 0) == 1.5
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(TrainingDiverged, match=rf"loss {bad} in epoch 3") as err:
            check_finite(torch.tensor(bad), lambda value, epoch: f"loss {value} in epoch {epoch + 1}", 2)
        assert isinstance(err.value, ValueError)  # the CLI prints it without a traceback
