"""The shared training-loop pieces: batches, per-group learning rates, the divergence check, the
optimiser factory's parameter groups, LARS and each method's warm-up ramp."""

import math

import numpy as np
import pytest
import torch
from support import METHODS_DIR, REPO

from sslbench.errors import ConfigError
from sslbench.kit.method import exclude_bias_and_norm
from sslbench.optim import (
    Lars,
    TrainingDiverged,
    batch_count,
    check_finite,
    learning_rate,
    make_optimizer,
    set_learning_rate,
    set_weight_decay,
    shuffled_batches,
    warmup_steps,
)
from sslbench.plan.settings import load_config, resolve_method_config


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


def test_the_step_factor_multiplies_the_lr_at_each_milestone_and_absent_is_todays_tenth():
    train = {"lr": 0.5, "epochs": 6, "schedule": "step", "milestones": [2, 4], "step_factor": 0.2}
    lrs = [learning_rate(train, s, 5) for s in range(30)]  # 5 steps an epoch: milestones at steps 10, 20
    # by hand: 0.5 up to step 9, 0.5 x 0.2 = 0.1 for steps 10-19, 0.5 x 0.2^2 = 0.5 x 0.04 = 0.02 from 20
    assert lrs == pytest.approx([0.5] * 10 + [0.1] * 10 + [0.02] * 10, rel=1e-15)
    # Absent, today's floats exactly: 0.1 ** k (k multiplications by 0.1 differ from k = 4 on)
    default = {**train, "milestones": [1, 2, 3, 4]}
    del default["step_factor"]
    assert [learning_rate(default, 5 * e, 5) for e in range(5)] == [0.5 * 0.1**k for k in range(5)]
    assert learning_rate(default, 20, 5) != 0.5 * 0.1 * 0.1 * 0.1 * 0.1


def test_the_step_factor_is_checked_in_0_excluded_to_1_and_absent_from_the_default_runs():
    config = load_config(REPO / "config")
    assert "step_factor" not in config["train"]  # so that no finished run's settings change
    assert "step_factor" not in resolve_method_config(config, METHODS_DIR, "instdisc")["train"]
    for fine in (0.2, 1):
        assert (
            load_config(REPO / "config", overrides={"train": {"step_factor": fine}})["train"]["step_factor"]
            == fine
        )
    for bad in (0, -0.1, 1.5, 10):
        with pytest.raises(ConfigError, match="train.step_factor"):
            load_config(REPO / "config", overrides={"train": {"step_factor": bad}})


def test_check_finite_returns_the_loss_or_raises_with_the_callers_message():
    assert check_finite(torch.tensor(1.5), lambda v, e: "unused", 0) == 1.5
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(TrainingDiverged, match=rf"loss {bad} in epoch 3") as err:
            check_finite(torch.tensor(bad), lambda value, epoch: f"loss {value} in epoch {epoch + 1}", 2)
        assert isinstance(err.value, ValueError)  # the CLI prints it without a traceback


# --- parameter groups and LARS ------------------------------------------------------------------


def sgd_settings(**kw):
    lars = {"lars_trust_coefficient": 0.001, "lars_trust_clip": False, "lars_trust_ratio": "update_norm"}
    return {
        "optimizer": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 0.01,
        **lars,
        **kw,
    }  # default.yaml's


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
    assert isinstance(optimizer, Lars)
    for name, p in layer.named_parameters():
        p.grad = grads[name].clone()
    optimizer.step()
    return {name: p.detach().clone() for name, p in layer.named_parameters()}


G = {"weight": torch.tensor([[0.3, -0.2, 0.1], [0.05, 0.4, -0.6]]), "bias": torch.tensor([0.5, -0.25])}
ZERO = {name: torch.zeros_like(g) for name, g in G.items()}


def start_weights():
    torch.manual_seed(0)
    start = dict(torch.nn.Linear(3, 2).named_parameters())
    return start["weight"].detach(), start["bias"].detach()


def test_lars_update_norm_rule_by_hand_at_a_gradient_and_at_zero():
    """BYOL's, Barlow Twins', VICReg's, MoCo v3's and DINO's LARS: q = eta |w| / |g + wd w| on g + wd w."""
    w, b = start_weights()
    lr, wd, eta = 0.5, 0.1, 0.001
    train = {"optimizer": "lars", "lr": lr, "weight_decay": wd, "lars_trust_coefficient": eta}
    new = lars_step(train, G)
    update = G["weight"] + wd * w
    torch.testing.assert_close(new["weight"], w - lr * eta * w.norm() / update.norm() * update)
    torch.testing.assert_close(new["bias"], b - lr * G["bias"])  # excluded: plain SGD, no decay
    # g = 0: q = eta |w| / (wd |w|) = eta / wd, so the update is eta w: the weight still moves.
    still = lars_step(train, ZERO)
    torch.testing.assert_close(still["weight"], w - lr * eta * w)
    assert torch.equal(still["bias"], b)
    # A main group without weight decay is still adapted, as every official LARS does.
    plain = lars_step({**train, "weight_decay": 0.0}, G)
    torch.testing.assert_close(plain["weight"], w - lr * eta * w.norm() / G["weight"].norm() * G["weight"])


def test_lars_larc_rule_by_hand_at_a_gradient_and_at_zero():
    """apex LARC (SwAV): q = eta |w| / (|g| + wd |w| + 1e-8) on g + wd w; a zero gradient left alone."""
    w, b = start_weights()
    lr, wd, eta = 0.5, 0.1, 0.001
    train = {"optimizer": "lars", "lr": lr, "weight_decay": wd, "lars_trust_coefficient": eta}
    larc = {**train, "lars_trust_ratio": "larc"}
    new = lars_step(larc, G)
    ratio = eta * w.norm() / (G["weight"].norm() + wd * w.norm() + 1e-8)
    torch.testing.assert_close(new["weight"], w - lr * ratio * (G["weight"] + wd * w))
    torch.testing.assert_close(new["bias"], b - lr * G["bias"])
    still = lars_step(larc, ZERO)  # apex adds no weight decay where |g| = 0: nothing moves
    assert torch.equal(still["weight"], w) and torch.equal(still["bias"], b)
    # LARC's clipping: the adapted lr never exceeds the group's (eta = 10 makes the ratio >> 1) ...
    clipped = lars_step({**larc, "lars_trust_coefficient": 10.0, "lars_trust_clip": True}, G)
    torch.testing.assert_close(clipped["weight"], w - lr * (G["weight"] + wd * w))
    # ... and a tensor it does not adapt (|w| = 0) keeps its gradient, unclipped, at an lr above 1.
    zero = torch.nn.Parameter(torch.zeros(2, 3))
    optimizer = make_optimizer([zero], {**sgd_settings(), **larc, "lr": 4.0, "lars_trust_clip": True})
    zero.grad = G["weight"].clone()
    optimizer.step()
    torch.testing.assert_close(zero.detach(), -4.0 * G["weight"])


def test_larc_weight_decay_as_a_float32_tensor_is_apex_s_python_float_bit_for_bit():
    """apex LARC adds wd * w with wd a Python float; lars_updates multiplies by a float32 tensor of wd.
    On float32 parameters the products agree exactly, also for a wd float32 cannot hold (1e-6, 0.3)."""
    from sslbench.optim import lars_updates

    w = torch.randn(64, 33, generator=torch.Generator().manual_seed(0))
    g = torch.randn(64, 33, generator=torch.Generator().manual_seed(1))
    for wd in (1e-6, 0.3, 1.5e-6):
        group = {"weight_decay": wd, "trust_coefficient": 0.001, "trust_ratio": "larc", "trust_clip": False}
        (update,) = lars_updates([w], [g], group)
        ratio = 0.001 * w.norm() / (g.norm() + w.norm() * wd + 1e-8)
        torch.testing.assert_close(update, (g + wd * w) * ratio, rtol=1e-6, atol=0)
        assert torch.equal(torch._foreach_mul([w], [torch.tensor(wd)])[0], wd * w)  # the products, exactly


def official_lars(params, grads_per_step, lr, wd, eta, momentum, adapt):
    """The official rule (moco-v3 optimizer.py, barlowtwins main.py, BYOL scale_by_lars), written from its
    definition: per tensor, d = g + wd w and q = eta |w| / |d| (1 where a norm is 0) where it adapts, mu
    from zeros, mu = momentum mu + q d, w -= lr mu. ``adapt[i]``: tensor i is decayed and adapted."""
    params = [p.clone() for p in params]
    mu = [torch.zeros_like(p) for p in params]
    for grads in grads_per_step:
        for i, (p, g) in enumerate(zip(params, grads)):
            d = g
            if adapt[i]:
                d = g + wd * p
                w_norm, d_norm = p.norm(), d.norm()
                q = eta * w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0
                d = q * d
            mu[i] = momentum * mu[i] + d
            params[i] = p - lr * mu[i]
    return params


def test_lars_steps_equal_the_official_rule_in_float64():
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (5, 2, 3), (6,), (3, 3)]
    params = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    params[3].zero_()  # |w| = 0: the ratio is 1 there
    grads = [[torch.randn(s, generator=g, dtype=torch.float64) for s in shapes] for _ in range(3)]
    grads[0][0].zero_()  # a zero gradient on the first step (a residual branch behind a zero BN scale)
    lr, wd, eta, momentum = 0.3, 1e-3, 0.02, 0.9
    tensors = [torch.nn.Parameter(p.clone()) for p in params]
    train = {
        **sgd_settings(optimizer="lars", lr=lr, weight_decay=wd, momentum=momentum),
        "lars_trust_coefficient": eta,
    }
    groups = [
        {"params": [tensors[0], tensors[1], tensors[3]]},
        {"params": [tensors[2]], "weight_decay": 0.0, "exclude_from_lars": True},
    ]
    optimizer = make_optimizer(groups, train)
    for step_grads in grads:
        for t, grad in zip(tensors, step_grads):
            t.grad = grad.clone()
        optimizer.step()
    expected = official_lars(params, grads, lr, wd, eta, momentum, adapt=[True, True, False, True])
    for t, e in zip(tensors, expected):
        torch.testing.assert_close(t.detach(), e, rtol=1e-13, atol=1e-15)
    assert not torch.equal(tensors[0].detach(), params[0])


# --- warm-up ramps --------------------------------------------------------------------------------


def method_train(method: str) -> dict:
    return resolve_method_config(load_config(REPO / "config"), METHODS_DIR, method)["train"]


# Each method's official warm-up at step s of W warm-up steps (base lr b), written from its code.
OFFICIAL_RAMPS = {
    "byol": lambda b, s, W: s / W * b,  # schedules.py learning_schedule
    "barlowtwins": lambda b, s, W: b * s / W,  # main.py adjust_learning_rate
    "vicreg": lambda b, s, W: b * s / W,  # main_vicreg.py adjust_learning_rate
    "dino": lambda b, s, W: np.linspace(0, b, W)[s],  # utils.cosine_scheduler
    "swav": lambda b, s, W: np.linspace(0, b, W)[s],  # main_swav.py, --start_warmup 0
}


@pytest.mark.parametrize("method", [*OFFICIAL_RAMPS, "mocov3"])
def test_each_methods_warmup_ramp_is_its_official_formula_at_the_first_and_last_warmup_step(method):
    train = {**method_train(method), "warmup_epochs": 10, "epochs": 100}
    steps_per_epoch, base = 7, train["lr"]
    W = 10 * steps_per_epoch
    for s in (0, 1, W - 1):
        got = learning_rate(train, s, steps_per_epoch)
        if method == "mocov3":  # main_moco.py: lr x epoch / warmup_epochs, epoch = e + i / iters_per_epoch
            e, i = divmod(s, steps_per_epoch)
            expected = base * (e + i / steps_per_epoch) / 10
        else:
            expected = OFFICIAL_RAMPS[method](base, s, W)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15), (method, s)
    assert learning_rate(train, 0, steps_per_epoch) == 0.0  # every official ramp starts at 0
    assert learning_rate(train, W, steps_per_epoch) == pytest.approx(base)  # then the cosine, from base


def test_ijepa_s_warmup_from_start_lr_and_cosine_to_final_lr_are_warmup_cosine_schedule_s():
    """src/utils/schedulers.py WarmupCosineSchedule at its step counter k (which it has advanced once before
    the first update: here k is the 0-based step, a one-step shift the method's README states): start_lr
    + k / W (lr - start_lr) during W warm-up steps, then final_lr + (lr - final_lr)(1 + cos(pi (k - W) /
    (T - W))) / 2. A group at twice the lr starts and ends at twice the values."""
    train = {**method_train("ijepa"), "warmup_epochs": 4, "epochs": 30}
    steps_per_epoch, W, T = 5, 20, 150
    lr, start, final = train["lr"], train["warmup_start_lr"], train["min_lr"]
    assert (lr, start, final) == (0.001, 0.0002, 1e-6)  # configs/in1k_vith14_ep300.yaml

    def official(k):
        if k < W:
            return start + k / W * (lr - start)
        return final + (lr - final) * 0.5 * (1.0 + math.cos(math.pi * (k - W) / (T - W)))

    for k in range(T):
        assert learning_rate(train, k, steps_per_epoch) == pytest.approx(official(k), rel=1e-12), k
        assert learning_rate(train, k, steps_per_epoch, base=2 * lr) == pytest.approx(
            2 * official(k), rel=1e-12
        )


def test_capi_s_warmup_then_a_cosine_truncated_at_0_8_is_warmup_then_cosine_s():
    """utils.py WarmupThenCosine(base lr, final 0, warmup W, truncate_cos 0.8): np.linspace(0, lr, W), then
    0.5 lr (1 + cos(pi 0.8 i / (T - W))) at i = k - W: it ends near 0.095 lr, not at 0."""
    train = {**method_train("capi"), "epochs": 10}
    steps_per_epoch, W, T = 10, 10, 100
    lr = train["lr"]
    assert (lr, train["warmup_epochs"], train["cosine_truncate"], train["min_lr"]) == (0.001, 1, 0.8, 0.0)
    official = list(torch.linspace(0, lr, W, dtype=torch.float64)) + [
        0.5 * lr * (1 + math.cos(math.pi * 0.8 * i / (T - W))) for i in range(T - W)
    ]
    for k in range(T):
        assert learning_rate(train, k, steps_per_epoch) == pytest.approx(float(official[k]), rel=1e-12), k
    assert learning_rate(train, T, steps_per_epoch) == pytest.approx(lr * 0.5 * (1 + math.cos(0.8 * math.pi)))


def cosine_to(fraction: float, steps: int):
    """VISReg's train.py cosine_factor: the lr's factor at a step of the cosine, from 1 to ``fraction``."""
    return lambda t: fraction + 0.5 * (1 - fraction) * (1 + math.cos(math.pi * min(t, steps) / steps))


# Each method's official schedule as torch's schedulers run it: SequentialLR(LinearLR, then a cosine)
OFFICIAL_SCHEDULERS = {
    # MINIMAL.md: LinearLR(start_factor 0.01), CosineAnnealingLR to eta_min (README.md: lr / 1000)
    "lejepa": lambda opt, lr, W, T: [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=W),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=T - W, eta_min=lr / 1000),
    ],
    # train.py: LinearLR(start_factor 0.001), LambdaLR(cosine_factor) to lr / final_lr_div (1000)
    "visreg": lambda opt, lr, W, T: [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.001, total_iters=W),
        torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=cosine_to(1 / 1000, T - W)),
    ],
}


@pytest.mark.parametrize("method", OFFICIAL_SCHEDULERS)
def test_each_schedule_is_its_official_code_s_torch_schedulers_step_by_step(method):
    train = {**method_train(method), "epochs": 6}
    steps_per_epoch, lr = 7, train["lr"]
    W, T = steps_per_epoch * train["warmup_epochs"], steps_per_epoch * 6
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    official = torch.optim.lr_scheduler.SequentialLR(opt, OFFICIAL_SCHEDULERS[method](opt, lr, W, T), [W])
    for k in range(T):
        assert learning_rate(train, k, steps_per_epoch) == pytest.approx(
            opt.param_groups[0]["lr"], rel=1e-9
        ), k
        opt.step()
        official.step()


def test_fractional_warmups_of_the_default():
    """Barlow Twins / VICReg: 0.3 epochs of 10 steps = 3 steps (0, 1/3, 2/3 of base); DINO's linspace
    over 3 epochs reaches base at step 29; one warm-up step of linspace is its start, 0."""
    assert [warmup_steps(0.3, 10), warmup_steps(3, 10), warmup_steps(0.25, 10), warmup_steps(0.1, 10)] == [
        3,
        30,
        3,
        1,
    ]
    linear = {"lr": 0.3, "epochs": 30, "schedule": "cosine", "warmup_epochs": 0.3, "warmup_ramp": "linear"}
    assert [learning_rate(linear, s, 10) for s in range(4)] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    linspace = {**linear, "warmup_epochs": 3, "warmup_ramp": "linspace"}
    assert (
        learning_rate(linspace, 29, 10) == pytest.approx(0.3) and learning_rate(linspace, 1, 10) == 0.3 / 29
    )
    assert learning_rate({**linspace, "warmup_epochs": 0.1}, 0, 10) == 0.0


def test_lars_refuses_a_decayed_excluded_group_and_a_fused_update():
    p = torch.nn.Parameter(torch.ones(2))
    lars = sgd_settings(optimizer="lars")
    with pytest.raises(ValueError, match="give the excluded group weight_decay 0.0"):
        make_optimizer([{"params": [p], "exclude_from_lars": True}], lars)
    with pytest.raises(ConfigError, match="LARS has no fused update"):
        make_optimizer([p], {**lars, "fused_optimizer": True})
    with pytest.raises(ConfigError, match="known: sgd, adam, adamw, lars"):
        make_optimizer([p], {**lars, "optimizer": "lamb"})


def test_adam_adds_the_weight_decay_to_the_gradient_and_adamw_decays_the_weight_apart():
    # A zero gradient: Adam's step sees g + wd w = wd w, and its first step moves w by lr (m / sqrt(v) = 1);
    # AdamW only shrinks w by lr x wd.
    after = {}
    for name in ("adam", "adamw"):
        w = torch.nn.Parameter(torch.ones(3))
        optimiser = make_optimizer([w], sgd_settings(optimizer=name, lr=0.1, weight_decay=0.01))
        (0 * w.sum()).backward()
        optimiser.step()
        after[name] = w.detach()
    torch.testing.assert_close(after["adam"], torch.full((3,), 0.9), rtol=0, atol=1e-6)
    torch.testing.assert_close(after["adamw"], torch.full((3,), 1 - 0.1 * 0.01))


# --- the weight-decay schedule (train.weight_decay_end) ------------------------------------------


def dino_cosine(base: float, final: float, epochs: int, niter_per_ep: int) -> np.ndarray:
    """facebookresearch/dino utils.cosine_scheduler without warm-up, as main_dino.py builds wd_schedule."""
    iters = np.arange(epochs * niter_per_ep)
    return final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))


def wd_net_groups():
    """exclude_bias_and_norm's two groups of a small net, then a group with its own weight decay 0.08."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    own = torch.nn.Parameter(torch.randn(2, 2))
    return [*exclude_bias_and_norm(net), {"params": [own], "weight_decay": 0.08}]


def test_the_weight_decay_schedule_moves_every_decayed_group_on_dino_s_cosine_and_no_excluded_one():
    train = sgd_settings(optimizer="adamw", lr=0.01, weight_decay=0.04, weight_decay_end=0.4, epochs=4)
    groups = wd_net_groups()
    optimizer = make_optimizer(groups, train)
    expected = dino_cosine(0.04, 0.4, 4, 5)  # 4 epochs of 5 steps
    for k in (0, 10, 19):  # the first step, halfway, the last
        set_weight_decay(optimizer, train, k, 5)
        got = [g["weight_decay"] for g in optimizer.param_groups]
        # train's group on the cosine, biases and norms stay at 0, the own group at its ratio 0.08 / 0.04
        assert got == pytest.approx([expected[k], 0.0, 2 * expected[k]], rel=1e-12, abs=0), k
    assert (expected[0], expected[10]) == pytest.approx((0.04, 0.22)) and 0.39 < expected[19] < 0.4
    # AdamW applies the step's value: with zero gradients a tensor only decays, w <- w (1 - lr wd)
    before = [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]
    for g in optimizer.param_groups:
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    after = [p.detach() for g in optimizer.param_groups for p in g["params"]]
    # the tensors in group order: 2 weights, then 2 biases and the LayerNorm's 2, then the own group's
    factors = [1 - 0.01 * expected[19]] * 2 + [1.0] * 4 + [1 - 0.01 * 2 * expected[19]]
    for old, new, factor in zip(before, after, factors):
        torch.testing.assert_close(new, old * factor, rtol=1e-6, atol=0)


def test_a_resumed_optimiser_keeps_the_schedule_s_start_and_null_keeps_the_decay_constant():
    train = sgd_settings(optimizer="sgd", weight_decay=0.04, weight_decay_end=0.4, epochs=4)
    optimizer = make_optimizer(wd_net_groups(), train)
    set_weight_decay(optimizer, train, 12, 5)
    resumed = make_optimizer(wd_net_groups(), train)
    resumed.load_state_dict(optimizer.state_dict())  # the checkpoint's groups, at step 12's decay
    set_weight_decay(resumed, train, 13, 5)
    expected = dino_cosine(0.04, 0.4, 4, 5)[13]
    assert [g["weight_decay"] for g in resumed.param_groups] == pytest.approx([expected, 0.0, 2 * expected])
    constant = {**train, "weight_decay_end": None}
    optimizer = make_optimizer(wd_net_groups(), constant)
    set_weight_decay(optimizer, constant, 12, 5)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.04, 0.0, 0.08]
    with pytest.raises(ConfigError, match="train.weight_decay_end"):  # no start to scale the groups by
        make_optimizer(wd_net_groups(), {**train, "weight_decay": 0.0})


def test_the_trainer_sets_the_scheduled_weight_decay_before_each_step(tmp_path, method_config):
    from sslbench.pretrain.trainer import Trainer

    cfg = method_config("dino", train={"weight_decay": 0.04, "weight_decay_end": 0.4, "epochs": 2})
    trainer = Trainer(METHODS_DIR / "dino", cfg, 0, tmp_path, device="cpu", progress=False)
    expected = dino_cosine(0.04, 0.4, 2, trainer.steps_per_epoch)
    g = torch.Generator().manual_seed(0)
    for k in (0, len(expected) - 1):
        trainer.state.step = k
        idx = torch.randperm(len(trainer.labels), generator=g)[: trainer.batch_size]
        views = trainer.make_views(trainer.data.train.images[idx], g)
        trainer.train_step(views, idx, trainer.epoch_context())
        weights, excluded = trainer.optimizer.param_groups  # utils.get_params_groups: regularized, not
        assert (weights["weight_decay"], excluded["weight_decay"]) == (pytest.approx(expected[k]), 0.0)
