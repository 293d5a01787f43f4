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
from sslbench.data import ImageSet, load_dataset
from sslbench.evaluate import run_protocol
from sslbench.extract.features import embed, extract, load_encoder, read_checkpoint
from sslbench.loop import learning_rate
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
    with pytest.raises(ValueError, match="lr > 0"):
        linear.evaluate(None, {"mode": "paper", "lr": 0}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="lower the setting `lr`"):
        linear.evaluate(None, {**FAST, "epochs": 1, "lr": 1e38}, 0, checkpoint_path=checkpoint)
