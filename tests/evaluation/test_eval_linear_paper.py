"""Linear probe, mode "paper" (MoCo's recipe): a frozen backbone, augmented crops, SGD on a linear layer."""

import copy
import math

import numpy as np
import pytest
import torch
from support import METHODS_DIR, tiny_suite_config

from evaluation import linear
from sslbench.augment.pipeline import EvalTransform, ViewAugment
from sslbench.augment.presets import view_config
from sslbench.collect import read_result
from sslbench.data.containers import ImageSet
from sslbench.data.registry import load_dataset
from sslbench.evaluate import run_protocol
from sslbench.extract.features import embed, extract, load_encoder, read_checkpoint
from sslbench.optim import learning_rate
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import pretrain

FAST = {"mode": "paper", "epochs": 3, "milestones": [2], "batch_size": 128}
# Enough to learn on the untrained floor's raw (unstandardised) features of 8x8 digits in ~1 s:
# a lower lr than MoCo's 30 and milder crops than (0.08, 1), which leave little of an 8x8 digit.
LEARNS = {
    "mode": "paper",
    "lr": 3.0,
    "epochs": 10,
    "milestones": [8],
    "batch_size": 64,
    "augment": {"preset": "supervised", "crop_scale": [0.5, 1.0]},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The untrained floor on the tiny suite (8x8 digits): no training, so it is built in a second."""
    cfg = resolve_method_config(tiny_suite_config(), METHODS_DIR, "random")
    return pretrain(
        METHODS_DIR / "random", cfg, 0, tmp_path_factory.mktemp("run"), device="cpu", progress=False
    )


def state_copy(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def same_state(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def digits_part(count=120):
    data = load_dataset("digits")
    return data, ImageSet(labels=data.train.labels[:count], images=data.train.images[:count], channels=1)


def test_backbone_and_batchnorm_statistics_stay_bit_identical(checkpoint):
    ckpt = read_checkpoint(checkpoint)
    backbone = load_encoder(ckpt)
    generator = torch.Generator().manual_seed(0)
    for name, buffer in backbone.named_buffers():  # non-trivial statistics, so any update would show
        if "running_mean" in name:
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
        elif "running_var" in name:
            buffer.copy_(torch.rand(buffer.shape, generator=generator) + 0.5)
        elif "num_batches_tracked" in name:
            buffer.fill_(7)
    before = state_copy(backbone)
    data, train = digits_part()
    norm = ckpt["normalisation"]
    augment = ViewAugment(8, 1, norm["mean"], norm["std"], view_config("supervised"))
    used, _ = linear.resolve_paper_settings({**FAST, "epochs": 2, "lr": 1.0})
    head = linear.fit_frozen_probe(backbone, train, 10, augment, used, seed=0, device=torch.device("cpu"))
    assert same_state(before, state_copy(backbone))
    assert all(p.grad is None and not p.requires_grad for p in backbone.parameters())
    assert not backbone.training
    assert head.weight.abs().max() > 0.05  # the head did train (init is N(0, 0.01))
    # The comparison can fail: one train-mode forward changes the batch-norm statistics.
    backbone.train()
    with torch.no_grad():
        backbone(augment(train.load(torch.arange(8))))
    assert not same_state(before, state_copy(backbone))


def test_one_full_batch_step_is_the_hand_computed_sgd_step(checkpoint):
    # With no augmentation the views are the evaluation transform's images, so one step on one
    # full batch from W0 is W1 = W0 - lr * (grad of mean CE + wd * W0) (momentum's first step).
    ckpt = read_checkpoint(checkpoint)
    backbone = load_encoder(ckpt)
    data, train = digits_part(100)
    norm = ckpt["normalisation"]
    augment = ViewAugment(8, 1, norm["mean"], norm["std"], view_config("none"))
    lr, wd = 0.5, 0.01
    settings = {**FAST, "epochs": 0, "batch_size": len(train), "lr": lr, "weight_decay": wd, "milestones": []}
    used, _ = linear.resolve_paper_settings(settings)
    start = linear.fit_frozen_probe(backbone, train, 10, augment, used, seed=3, device=torch.device("cpu"))
    used["epochs"] = 1
    stepped = linear.fit_frozen_probe(backbone, train, 10, augment, used, seed=3, device=torch.device("cpu"))

    features = embed(
        backbone, train, EvalTransform(8, 1, norm["mean"], norm["std"]), torch.device("cpu")
    ).double()
    w0, b0 = start.weight.detach().double(), start.bias.detach().double()
    residual = (
        torch.softmax(features @ w0.T + b0, 1) - torch.eye(10, dtype=torch.float64)[train.labels]
    ) / len(train)
    expected_w = w0 - lr * (residual.T @ features + wd * w0)
    expected_b = b0 - lr * (residual.sum(0) + wd * b0)
    torch.testing.assert_close(stepped.weight.detach().double(), expected_w, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(stepped.bias.detach().double(), expected_b, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(stepped.weight, start.weight)


def test_learning_rate_drops_tenfold_at_each_milestone():
    used, _ = linear.resolve_paper_settings({"mode": "paper"})
    assert (used["lr"], used["epochs"], used["milestones"], used["momentum"], used["weight_decay"]) == (
        30.0,
        100,
        [60, 80],
        0.9,
        0.0,
    )
    steps_per_epoch = 7  # the lr holds for a whole epoch: its first and last step
    lrs = {
        epoch: {
            learning_rate(linear.paper_schedule(used), epoch * steps_per_epoch + s, steps_per_epoch)
            for s in (0, 6)
        }
        for epoch in (0, 59, 60, 79, 80, 99)
    }
    assert all(len(values) == 1 for values in lrs.values())
    lrs = {epoch: values.pop() for epoch, values in lrs.items()}
    assert lrs[0] == lrs[59] == 30.0
    assert math.isclose(lrs[60], 3.0) and math.isclose(lrs[79], 3.0)
    assert math.isclose(lrs[80], 0.3) and math.isclose(lrs[99], 0.3)


def test_run_protocol_paper_mode_writes_a_result_above_chance(checkpoint, tmp_path):
    features = extract(checkpoint, tmp_path / "features.npz", device="cpu")
    settings = {**LEARNS, "weight_decay_grid": [1e-4], "val_fraction": 0.2}  # merged cached keys: ignored
    out = run_protocol("linear", features, settings, 0, tmp_path / "linear.json", checkpoint_path=checkpoint)
    result = read_result(out)
    metrics, used = result["metrics"], result["settings"]
    # 450 test images, 10 classes: chance top-1 is 0.1 (sd 0.014); a linear probe on even an
    # untrained backbone's features separates digits far better.
    assert metrics["top1"] > 0.1 + 4.5 * math.sqrt(0.09 / 450)
    assert metrics["top1"] <= metrics["top5"] <= 1.0
    assert used["ignored_settings"] == ["val_fraction", "weight_decay_grid"]
    assert (used["epochs"], used["lr"], used["momentum"], used["milestones"]) == (10, 3.0, 0.9, [8])
    assert used["view_config"]["crop_scale"] == [0.5, 1.0] and used["view_config"]["jitter_p"] == 0.0
    assert result["evaluated_with"]["device"].startswith("cpu") and used["device"] == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_run_protocol_records_the_gpu_it_fine_tuned_on(checkpoint, tmp_path):
    features = extract(checkpoint, tmp_path / "features.npz", device="cpu")
    settings = {**LEARNS, "device": "cuda"}
    result = read_result(
        run_protocol("linear", features, settings, 0, tmp_path / "linear.json", checkpoint_path=checkpoint)
    )
    assert result["evaluated_with"]["device"] == torch.cuda.get_device_name(0)


def test_same_seed_same_numbers(checkpoint):
    settings = {**FAST, "epochs": 1}
    first = linear.evaluate(None, settings, 4, checkpoint_path=checkpoint)
    assert linear.evaluate(None, settings, 4, checkpoint_path=checkpoint) == first
    assert first[1]["lr"] == 30.0 and list(first[1]["view_config"]["crop_scale"]) == [
        0.08,
        1.0,
    ]  # MoCo's values


def test_cached_mode_ignores_the_checkpoint(checkpoint, tmp_path):
    features = dict(np.load(extract(checkpoint, tmp_path / "f.npz", device="cpu")))
    features["num_classes"] = int(features["num_classes"])
    settings = {"weight_decay_grid": [1e-3], "max_iter": 50}
    with_ckpt = linear.evaluate(copy.deepcopy(features), settings, 0, checkpoint_path=checkpoint)
    assert with_ckpt == linear.evaluate(copy.deepcopy(features), settings, 0)
    assert with_ckpt[1]["mode"] == "cached" and "lr" not in with_ckpt[1]


def test_paper_mode_errors(checkpoint):
    with pytest.raises(ValueError, match="needs the checkpoint"):
        linear.evaluate(None, {"mode": "paper"}, 0)
    with pytest.raises(ValueError, match=r"'lr_max'.*known settings are"):
        linear.evaluate(None, {"mode": "paper", "lr_max": 1}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match=r"`evaluation\.linear\.lr`: 0 is less than or equal to the minimum"):
        linear.evaluate(None, {"mode": "paper", "lr": 0}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="lower the setting `lr`"):
        linear.evaluate(None, {**FAST, "epochs": 1, "lr": 1e38}, 0, checkpoint_path=checkpoint)


# --- mode "mae" (MAE's main_linprobe.py): BatchNorm(affine=False) + linear head, LARS, warm-up + cosine ---

MAE_FAST = {"mode": "mae", "lr": 50.0, "epochs": 2, "warmup_epochs": 1, "batch_size": 128}
# LARS moves a weight by about lr x 0.001 x ||w|| a step, whatever the gradient: MAE's lr rule (blr 0.1
# x batch / 256) on 1,347 images instead of 1.28M barely moves the head, so the tests use a far larger lr.
MAE_LEARNS = {
    "mode": "mae",
    "lr": 50.0,
    "epochs": 10,
    "warmup_epochs": 1,
    "batch_size": 64,
    "augment": {"preset": "supervised", "crop_scale": [0.5, 1.0]},
}


def mae_lr(step, steps_per_epoch, lr=6.4, warmup=10, epochs=90):
    """MAE's util/lr_sched.adjust_learning_rate (min_lr 0) at the fractional epoch of a step."""
    epoch = step / steps_per_epoch
    if epoch < warmup:
        return lr * epoch / warmup
    return lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup) / (epochs - warmup)))


class Affine(torch.nn.Module):
    """A backbone whose features are scaled and shifted per feature (far from standardised)."""

    def __init__(self, inner, scale, shift):
        super().__init__()
        self.inner, self.num_features = inner, inner.num_features
        self.register_buffer("scale", scale)
        self.register_buffer("shift", shift)

    def forward(self, x):
        return self.inner(x) * self.scale + self.shift


def test_mae_head_is_batchnorm_without_affine_then_linear_and_tests_with_running_statistics(
    checkpoint, monkeypatch
):
    from sslbench.extract.features import evaluation_data

    heads, scores = [], []
    fit, topk = linear.fit_frozen_probe, linear.topk_accuracy
    monkeypatch.setattr(linear, "fit_frozen_probe", lambda *a, **k: heads.append(fit(*a, **k)) or heads[-1])
    monkeypatch.setattr(linear, "topk_accuracy", lambda s, y, ks: scores.append(s) or topk(s, y, ks))
    _, used = linear.evaluate(None, {**MAE_FAST, "eval_batch_size": 7}, 0, checkpoint_path=checkpoint)
    (head,) = heads
    bn, fc = head
    assert type(bn) is torch.nn.BatchNorm1d and not bn.affine and bn.eps == 1e-6 and bn.momentum == 0.1
    assert type(fc) is torch.nn.Linear and [n for n, _ in head.named_parameters()] == ["1.weight", "1.bias"]
    ckpt = read_checkpoint(checkpoint)
    data = evaluation_data(ckpt, None)
    assert int(bn.num_batches_tracked) == 2 * (len(data.train) // 128)  # every step, the last batch dropped
    assert used["last_batch"].startswith("dropped") and "running statistics" in used["head"]

    norm = ckpt["normalisation"]
    transform = EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"])
    features = embed(load_encoder(ckpt, data.image_size), data.test, transform, torch.device("cpu"))
    with torch.no_grad():
        expected = fc((features - bn.running_mean) / torch.sqrt(bn.running_var + 1e-6))
        batch_statistics = head.train()(features)  # what a head left in train mode would score
    torch.testing.assert_close(torch.from_numpy(scores[0]), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(batch_statistics, expected, atol=1e-3)  # the check tells the two apart


def test_mae_head_learns_the_same_on_shifted_and_scaled_features(checkpoint):
    # A fixed random projection of the pixels as the backbone: every feature varies in every batch
    # (the untrained floor's has dead and near-dead features, where the batch norm's eps would show).
    norm = read_checkpoint(checkpoint)["normalisation"]
    _, train = digits_part(200)
    generator = torch.Generator().manual_seed(5)
    pixels = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32))
    pixels[1].weight.data = torch.randn(32, 64, generator=generator) / 8
    pixels[1].bias.data = torch.randn(32, generator=generator)
    pixels.num_features = 32
    # Scales 8 to 128 (powers of two: exact in float32) and offsets up to 64 on features of std ~1.
    scale = 2.0 ** torch.randint(3, 8, (32,), generator=generator)
    shift = 8.0 * torch.randint(-8, 9, (32,), generator=generator)
    augment = ViewAugment(8, 1, norm["mean"], norm["std"], view_config("supervised"))
    used, _ = linear.resolve_paper_settings({**MAE_FAST, "epochs": 3, "batch_size": 64})
    plain, moved = (
        linear.fit_frozen_probe(b, train, 10, augment, used, seed=1, device=torch.device("cpu"))
        for b in (pixels, Affine(pixels, scale, shift))
    )
    weight = plain[1].weight
    assert (weight - moved[1].weight).abs().max() < 1e-3 * weight.abs().max()
    torch.testing.assert_close(plain[1].bias, moved[1].bias, atol=1e-4, rtol=1e-3)
    steps = 3 * (200 // 64)  # the running mean moves by 0.1 of each batch's mean, from 0
    expected_mean = plain[0].running_mean * scale + shift * (1 - 0.9**steps)
    torch.testing.assert_close(moved[0].running_mean, expected_mean, atol=1e-4, rtol=1e-5)


def test_mae_one_full_batch_step_is_the_hand_computed_lars_step(checkpoint):
    # One step on one full batch without augmentation, from the head's init: the batch norm
    # standardises with the batch's statistics (biased variance), the weight's update is LARS's
    # `update_norm` rule, d = (g + wd w) 0.001 ||w|| / ||g + wd w||, and the bias's plain g (no decay).
    ckpt = read_checkpoint(checkpoint)
    backbone = load_encoder(ckpt)
    data, train = digits_part(100)
    norm = ckpt["normalisation"]
    augment = ViewAugment(8, 1, norm["mean"], norm["std"], view_config("none"))
    lr, wd = 200.0, 0.5
    settings = {"mode": "mae", "epochs": 0, "warmup_epochs": 0, "batch_size": len(train), "lr": lr}
    used, _ = linear.resolve_paper_settings({**settings, "weight_decay": wd})
    start = linear.fit_frozen_probe(backbone, train, 10, augment, used, seed=3, device=torch.device("cpu"))
    used["epochs"] = 1  # no warm-up: the cosine's first step is the lr itself
    stepped = linear.fit_frozen_probe(backbone, train, 10, augment, used, seed=3, device=torch.device("cpu"))

    features = embed(
        backbone, train, EvalTransform(8, 1, norm["mean"], norm["std"]), torch.device("cpu")
    ).double()
    z = (features - features.mean(0)) / torch.sqrt(features.var(0, unbiased=False) + 1e-6)
    w0, b0 = start[1].weight.detach().double(), start[1].bias.detach().double()
    onehot = torch.eye(10, dtype=torch.float64)[train.labels]
    residual = (torch.softmax(z @ w0.T + b0, 1) - onehot) / len(train)
    update = residual.T @ z + wd * w0
    expected_w = w0 - lr * 0.001 * w0.norm() / update.norm() * update
    expected_b = b0 - lr * residual.sum(0)
    torch.testing.assert_close(stepped[1].weight.detach().double(), expected_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(stepped[1].bias.detach().double(), expected_b, atol=1e-6, rtol=1e-5)
    assert (stepped[1].weight - start[1].weight).abs().max() > 1e-3  # a step of consequence
    running = stepped[0].running_mean.double(), stepped[0].running_var.double()  # momentum 0.1 from (0, 1)
    torch.testing.assert_close(running[0], 0.1 * features.mean(0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(running[1], 0.9 + 0.1 * features.var(0), atol=1e-6, rtol=1e-5)

    # The bias started at 0, where adaptation and decay do nothing: a second step, from the first's
    # head through a fresh optimiser of the mode (no momentum yet), shows the bias left out of both.
    optimiser = linear.probe_optimizer(stepped, used)
    stepped.zero_grad(set_to_none=True)  # the fit leaves its last step's gradients
    w1, b1 = stepped[1].weight.detach().double().clone(), stepped[1].bias.detach().double().clone()
    torch.nn.functional.cross_entropy(stepped.train()(features.float()), train.labels).backward()
    optimiser.step()
    residual = (torch.softmax(z @ w1.T + b1, 1) - onehot) / len(train)
    update = residual.T @ z + wd * w1
    expected_w = w1 - lr * 0.001 * w1.norm() / update.norm() * update
    torch.testing.assert_close(stepped[1].weight.detach().double(), expected_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        stepped[1].bias.detach().double(), b1 - lr * residual.sum(0), atol=1e-5, rtol=1e-5
    )


def test_mae_learning_rate_warms_up_then_follows_a_cosine_per_step(checkpoint, monkeypatch):
    import evaluation.classifier

    used, _ = linear.resolve_paper_settings({"mode": "mae"})
    assert [used[k] for k in ("epochs", "warmup_epochs", "batch_size", "weight_decay")] == [
        90,
        10,
        16384,
        0.0,
    ]
    assert used["lr"] == 0.1 * 16384 / 256 and used["momentum"] == 0.9  # blr 0.1
    schedule = linear.paper_schedule(used)
    steps = 1281167 // 16384  # 78 steps an epoch: ImageNet's train split, the last batch dropped
    at = {step: learning_rate(schedule, step, steps) for step in (0, 1, 390, 779, 780, 781, 3900, 7019)}
    assert at[0] == 0.0 and math.isclose(at[390], 3.2) and math.isclose(at[780], 6.4)  # 0, half, peak
    assert math.isclose(at[3900], 3.2) and 0 < at[7019] < 1e-4  # cosine: half at epoch 50, ~0 at the end
    assert 0 < at[1] < at[779] < at[780] and at[781] < at[780]  # moved every step, not every epoch
    for step, value in at.items():
        assert math.isclose(value, mae_lr(step, steps), rel_tol=1e-12, abs_tol=1e-15), step

    # A fit sets these at every step, with MAE's drop_last: 120 images in batches of 32 are 3 steps an epoch.
    seen = []
    set_lr = evaluation.classifier.set_learning_rate

    def recording(optimizer, *args):
        set_lr(optimizer, *args)
        seen.append([group["lr"] for group in optimizer.param_groups])

    monkeypatch.setattr(evaluation.classifier, "set_learning_rate", recording)
    ckpt = read_checkpoint(checkpoint)
    norm = ckpt["normalisation"]
    augment = ViewAugment(8, 1, norm["mean"], norm["std"], view_config("none"))
    used, _ = linear.resolve_paper_settings(
        {"mode": "mae", "lr": 2.0, "epochs": 4, "warmup_epochs": 1, "batch_size": 32}
    )
    linear.fit_frozen_probe(load_encoder(ckpt), digits_part()[1], 10, augment, used, 0, torch.device("cpu"))
    expected = [mae_lr(step, 3, lr=2.0, warmup=1, epochs=4) for step in range(12)]
    assert seen == [pytest.approx([value, value], rel=1e-12, abs=1e-15) for value in expected]


def test_mae_mode_settings_of_other_modes(checkpoint):
    from sslbench.plan.protocols import (
        protocol_flag,
        protocol_needs_checkpoint,
        protocol_problems,
        protocol_reads_images,
    )

    merged = {"mode": "mae", "weight_decay_grid": [1e-4], "val_fraction": 0.2, "max_iter": 5}  # cached keys
    used, ignored = linear.resolve_paper_settings(merged)
    assert ignored == ["max_iter", "val_fraction", "weight_decay_grid"] and "weight_decay_grid" not in used
    assert "milestones" not in used and used["warmup_epochs"] == 10
    with pytest.raises(ValueError, match=r"mode 'mae'.*\['milestones'\].*known settings are"):
        linear.evaluate(None, {"mode": "mae", "milestones": [60, 80]}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match=r"mode 'paper'.*\['warmup_epochs'\].*known settings are"):
        linear.evaluate(None, {"mode": "paper", "warmup_epochs": 10}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="mode 'mae' .* needs the checkpoint"):
        linear.evaluate(None, {"mode": "mae"}, 0)
    with pytest.raises(ValueError, match="warmup_epochs <= epochs"):
        linear.evaluate(None, {"mode": "mae", "epochs": 5}, 0, checkpoint_path=checkpoint)
    with pytest.raises(
        ValueError, match=r"`evaluation\.linear\.batch_size` = 1: in mode 'mae' batch_size must be >= 2"
    ):
        linear.evaluate(None, {"mode": "mae", "batch_size": 1}, 0, checkpoint_path=checkpoint)
    # MAE's loader drops the last short batch (DROPS_LAST_BATCH): a batch the train split cannot fill
    with pytest.raises(
        ValueError, match=r"`evaluation\.linear\.batch_size`: .* larger than the 1347 train images"
    ):
        linear.evaluate(None, {**MAE_FAST, "batch_size": 1348}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="unknown mode 'mea'; known modes are 'cached', 'paper', 'mae'"):
        linear.evaluate(None, {"mode": "mea", "lr": 1.0}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="lower the setting `lr`"):
        linear.evaluate(None, {**MAE_FAST, "lr": 1e38}, 0, checkpoint_path=checkpoint)
    # The planner reads the same: the mode's images and checkpoint are its job's inputs, and the
    # section's keys are checked against the mode's own defaults and the cached mode's.
    assert protocol_reads_images("linear", {"mode": "mae"})
    assert protocol_flag("linear", "DROPS_LAST_BATCH", {"mode": "mae"})
    assert not protocol_flag("linear", "DROPS_LAST_BATCH", {"mode": "paper"})
    assert protocol_needs_checkpoint("linear", {"mode": "mae"})
    assert protocol_problems("linear", merged | {"warmup_epochs": 1, "lr": 0.1}, []) == []
    (problem,) = protocol_problems("linear", {"mode": "mae", "milestones": [60]}, [])
    assert "unknown key `evaluation.linear.milestones`" in problem


def test_run_protocol_mae_mode_writes_a_result_above_chance(checkpoint, tmp_path):
    features = extract(checkpoint, tmp_path / "features.npz", device="cpu")
    settings = {**MAE_LEARNS, "weight_decay_grid": [1e-4]}  # a merged cached key: ignored
    out = run_protocol("linear", features, settings, 0, tmp_path / "linear.json", checkpoint_path=checkpoint)
    result = read_result(out)
    metrics, used = result["metrics"], result["settings"]
    assert metrics["top1"] > 0.1 + 4.5 * math.sqrt(0.09 / 450)  # chance: 0.1 (450 test images)
    assert metrics["top1"] <= metrics["top5"] <= 1.0
    assert used["ignored_settings"] == ["weight_decay_grid"] and used["mode"] == "mae"
    assert (used["epochs"], used["warmup_epochs"], used["lr"], used["weight_decay"]) == (10, 1, 50.0, 0.0)
    assert "LARS" in used["optimiser"] and "update_norm" in used["optimiser"]
