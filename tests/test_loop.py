"""The shared training-loop pieces: batches, per-group learning rates, the divergence check, the
optimiser factory's parameter groups and LARS."""

import math

import pytest
import torch
from timm.optim import Lars

from sslbench.errors import ConfigError
from sslbench.loop import (
    TrainingDiverged,
    batch_count,
    check_finite,
    make_optimizer,
    set_learning_rate,
    shuffled_batches,
)
from sslbench.method import exclude_bias_and_norm


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


# --- parameter groups and LARS ------------------------------------------------------------------


def sgd_settings(**kw):
    lars = {"lars_trust_coefficient": 0.001, "lars_trust_clip": False}  # config/default.yaml's
    return {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, **lars, **kw}


def test_group_options_set_each_groups_base_lr_and_a_fixed_group_ignores_the_schedule():
    a, b, c = (torch.nn.Parameter(torch.ones(2)) for _ in range(3))
    groups = [
        {"params": [a]},
        {"params": [b], "lr_scale": 0.5},
        {"params": [c], "lr_scale": 2.0, "fixed_lr": True},
    ]
    optimizer = make_optimizer(groups, sgd_settings())
    assert [g["base_lr"] for g in optimizer.param_groups] == pytest.approx([0.1, 0.05, 0.2])
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.01, 0.01]  # train's: none sets it
    schedule = {"lr": 0.1, "schedule": "cosine", "epochs": 2}
    for step, share in [(0, 1.0), (5, 0.5), (10, 0.0)]:  # start, halfway and end of 2 epochs of 5 steps
        set_learning_rate(optimizer, schedule, step, 5)
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.1 * share, 0.05 * share, 0.2])


def lars_step(train: dict, grads: dict) -> dict[str, torch.Tensor]:
    """One step of make_optimizer's LARS on a Linear(3, 2) with the given gradients; new parameters."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = make_optimizer(exclude_bias_and_norm(layer), {**sgd_settings(), **train})
    assert isinstance(optimizer, Lars)  # timm's, not one of ours
    for name, p in layer.named_parameters():
        p.grad = grads[name].clone()
    optimizer.step()
    return {name: p.detach().clone() for name, p in layer.named_parameters()}


def test_lars_adapts_and_decays_the_weights_and_leaves_the_bias_alone_by_hand():
    torch.manual_seed(0)
    start = dict(torch.nn.Linear(3, 2).named_parameters())
    w, b = start["weight"].detach(), start["bias"].detach()
    g = {"weight": torch.tensor([[0.3, -0.2, 0.1], [0.05, 0.4, -0.6]]), "bias": torch.tensor([0.5, -0.25])}
    lr, wd, eta = 0.5, 0.1, 0.001
    new = lars_step({"optimizer": "lars", "lr": lr, "weight_decay": wd, "lars_trust_coefficient": eta}, g)
    # apex LARC's trust ratio (timm): eta ||w|| / (||g|| + wd ||w||), on the decayed gradient; the first
    # momentum step is the update itself.
    ratio = eta * w.norm() / (g["weight"].norm() + wd * w.norm() + 1e-8)
    torch.testing.assert_close(new["weight"], w - lr * ratio * (g["weight"] + wd * w))
    torch.testing.assert_close(new["bias"], b - lr * g["bias"])  # excluded: plain SGD, no decay
    # A main group without weight decay is still adapted (always_adapt), as every official LARS does.
    plain = lars_step({"optimizer": "lars", "lr": lr, "weight_decay": 0.0, "lars_trust_coefficient": eta}, g)
    ratio = eta * w.norm() / (g["weight"].norm() + 1e-8)
    torch.testing.assert_close(plain["weight"], w - lr * ratio * g["weight"])
    # LARC's clipping: the adapted lr never exceeds the group's (eta = 10 makes the ratio >> 1).
    clipped = lars_step(
        {"optimizer": "lars", "lr": lr, "lars_trust_coefficient": 10.0, "lars_trust_clip": True}, g
    )
    torch.testing.assert_close(clipped["weight"], w - lr * (g["weight"] + 0.01 * w))


def test_lars_refuses_a_decayed_excluded_group_and_a_fused_update():
    p = torch.nn.Parameter(torch.ones(2))
    lars = sgd_settings(optimizer="lars")
    with pytest.raises(ValueError, match="give the excluded group weight_decay 0.0"):
        make_optimizer([{"params": [p], "exclude_from_lars": True}], lars)
    with pytest.raises(ConfigError, match="timm's LARS has no fused update"):
        make_optimizer([p], {**lars, "fused_optimizer": True})
    with pytest.raises(ConfigError, match="known: sgd, adamw, lars"):
        make_optimizer([p], {**lars, "optimizer": "lamb"})
