"""SeLa: the relabelling schedule, the labels (initial, re-optimised, resumed) and the loss."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, fixed_batch_losses, preset_config, tiny_suite_config

from sslbench.augment.presets import VIEW_PRESETS, view_config
from sslbench.kit.clustering import sinkhorn, sinkhorn_labels
from sslbench.optim import learning_rate
from sslbench.plan.settings import resolve_method_config
from sslbench.plugins import load_method_class
from sslbench.pretrain.trainer import Trainer, pretrain

SeLa = load_method_class(METHODS_DIR / "sela")


def gaps(schedule):
    return [later - earlier for earlier, later in zip(schedule, schedule[1:])]


# --- the relabelling schedule -------------------------------------------------------------


@pytest.mark.parametrize(
    "epochs,count,power",
    [
        (30, 15, 2),
        (400, 100, 2),
        (200, 30, 2),
        (1000, 100, 2),
        (50, 7, 3),
        (13, 13, 2),
        (400, 400, 1),
        (60, 9, 1.5),
    ],
)
def test_schedule_has_the_count_lies_within_training_and_is_denser_early(epochs, count, power):
    schedule = SeLa.relabel_schedule(epochs, count, power)
    assert len(schedule) == count
    assert schedule[0] == 0 and schedule[-1] < epochs  # the first before any training, as the official i = 0
    assert all(g >= 1 for g in gaps(schedule))  # one relabelling per epoch boundary at most
    assert gaps(schedule) == sorted(gaps(schedule))  # gaps never shrink: denser early
    # Sorting the gaps keeps the end point of the power law T (i / n)^p at i = n - 1.
    assert schedule[-1] == max(count - 1, math.floor(epochs * ((count - 1) / count) ** power))


def test_schedule_is_the_quadratic_law_where_it_is_exact():
    # T = n^2: the official times T (i / n)^2 = i^2 are whole epochs already.
    assert SeLa.relabel_schedule(100, 10, 2) == tuple(i * i for i in range(10))
    assert SeLa.relabel_schedule(30, 15, 2)[-1] == 26 and gaps(SeLa.relabel_schedule(30, 15, 2))[0] == 1
    assert SeLa.relabel_schedule(12, 4, 1) == (0, 3, 6, 9)  # cifar.py's linear spacing


def test_schedule_caps_the_count_at_one_per_epoch_and_rejects_bad_settings():
    assert SeLa.relabel_schedule(2, 15, 2) == (0, 1)
    with pytest.raises(ValueError, match="relabel_power"):
        SeLa.relabel_schedule(30, 5, 0.5)
    with pytest.raises(ValueError, match="num_relabels"):
        SeLa.relabel_schedule(30, 0, 2)


# --- labels -------------------------------------------------------------------------------


def test_initial_labels_are_a_seeded_exact_equipartition_per_head(build, digits):
    method = build("sela")
    num_train = len(digits.train)
    assert method.labels.shape == (10, num_train) and method.labels.dtype == torch.long
    for head_labels in method.labels:
        counts = torch.bincount(head_labels, minlength=128)
        assert len(counts) == 128 and counts.max() - counts.min() <= 1
    assert all(not torch.equal(method.labels[0], other) for other in method.labels[1:])  # each head its own
    again, other_seed = build("sela"), build("sela", seed=1)
    assert torch.equal(again.labels, method.labels) and not torch.equal(other_seed.labels, method.labels)


def head_logits(method, h, features):
    """Head h alone: rows h*K .. (h+1)*K of the stacked layer."""
    k = method.num_clusters
    return F.linear(
        features, method.heads.weight[h * k : (h + 1) * k], method.heads.bias[h * k : (h + 1) * k]
    )


def test_relabel_is_the_sinkhorn_argmax_of_each_head_on_the_train_set(tmp_path, method_config):
    trainer = Trainer(METHODS_DIR / "sela", method_config("sela"), 0, tmp_path, progress=False)
    method = trainer.method
    before = method.labels.clone()
    ctx = trainer.epoch_context()
    assert ctx.epoch == 0 and 0 in method.relabel_epochs
    method.on_epoch_start(ctx)

    p = trainer.cfg["params"]
    features = trainer.forward_train_set(method.backbone)  # evaluation transform, dataset order
    for h, labels in enumerate(method.labels):
        probs = F.softmax(head_logits(method, h, features).double(), dim=1)
        expected = sinkhorn_labels(probs, p["lam"], tol=p["sinkhorn_tol"], max_iters=p["sinkhorn_max_iters"])
        assert torch.equal(labels, expected)
    assert ctx.log["relabelled"] == 1 and ctx.log["relabel_seconds"] > 0
    assert ctx.log["labels_changed"] == int((before != method.labels).sum()) > 0

    # An epoch that is not in the schedule leaves the labels alone.
    trainer.state.epoch = 2  # tiny config: 2 epochs, schedule (0, 1)
    later = trainer.epoch_context()
    kept = method.labels.clone()
    method.on_epoch_start(later)
    assert torch.equal(method.labels, kept) and later.log["relabelled"] == 0


def test_relabelled_counts_are_balanced(tmp_path, method_config):
    """The plan's columns hold exactly N/K each; the argmax labels follow them up to the mass of the plan
    that is off each row's maximum:  |count_k - N/K| <= sum_i (1 - N max_k Q_ik) + N * tol (the row error).
    With confident heads (standardised features, scaled) that mass is small and the counts are balanced."""
    cfg = method_config(
        "sela", num_clusters=8, num_heads=2, lam=25, sinkhorn_tol=1e-6, sinkhorn_max_iters=5000
    )
    trainer = Trainer(METHODS_DIR / "sela", cfg, 0, tmp_path, progress=False)
    method = trainer.method
    features = trainer.forward_train_set(method.backbone)
    mean, std = features.mean(0), features.std(0) + 1e-6
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for h in range(2):  # logits = 10 * random projection of the standardised features
            weight = 10 * torch.randn(8, method.feature_dim, generator=g) / method.feature_dim**0.5 / std
            method.heads.weight[h * 8 : (h + 1) * 8].copy_(weight)
            method.heads.bias[h * 8 : (h + 1) * 8].copy_(-weight @ mean)
    method.on_epoch_start(trainer.epoch_context())

    num_train = features.shape[0]
    for h, labels in enumerate(method.labels):
        plan = sinkhorn(
            F.softmax(head_logits(method, h, features).double(), dim=1), 25.0, tol=1e-6, max_iters=5000
        ).plan
        off_max_mass = float((1 - num_train * plan.max(dim=1).values).clamp_min(0).sum())
        counts = torch.bincount(labels, minlength=8)
        assert (counts - num_train / 8).abs().max() <= off_max_mass + 1
        assert counts.max() - counts.min() <= 3, counts  # N/K = 168.4


def test_labels_are_restored_exactly_on_resume(tmp_path, method_config):
    cfg = method_config("sela")  # 2 epochs: relabelled at the start of both
    full = torch.load(
        pretrain(METHODS_DIR / "sela", cfg, 0, tmp_path / "full", progress=False), weights_only=False
    )

    first = Trainer(METHODS_DIR / "sela", cfg, 0, tmp_path / "resumed", progress=False)
    first.train_epoch()
    first.save_epoch_checkpoint()
    resumed = Trainer(METHODS_DIR / "sela", cfg, 0, tmp_path / "resumed", progress=False)
    initial = resumed.method.labels.clone()
    assert resumed.resume()
    assert torch.equal(resumed.method.labels, first.method.labels)
    assert not torch.equal(resumed.method.labels, initial)  # they came from the checkpoint

    final = torch.load(resumed.fit(), weights_only=False)
    assert torch.equal(final["method_state"]["labels"], full["method_state"]["labels"])
    for key, value in full["encoder"].items():
        assert torch.equal(final["encoder"][key], value), key


# --- the loss -----------------------------------------------------------------------------


def test_loss_is_the_mean_over_heads_of_cross_entropy(build, digits):
    method = build("sela")
    g = torch.Generator().manual_seed(0)
    indices = torch.randperm(len(digits.train), generator=g)[:16]
    views = [torch.randn(16, 1, 8, 8, generator=g)]
    loss = method.training_loss(views, None, indices)
    features = method.backbone(views[0])
    expected = (
        sum(
            F.cross_entropy(head_logits(method, h, features), method.labels[h, indices])
            for h in range(method.num_heads)
        )
        / method.num_heads
    )
    torch.testing.assert_close(loss, expected)
    # The per-image labels are the targets: other labels, another loss.
    method.labels[:, indices] = (method.labels[:, indices] + 1) % 128
    assert not torch.isclose(method.training_loss(views, None, indices), loss)


def test_trains_on_tiny_config(tmp_path, method_config):
    trainer = Trainer(METHODS_DIR / "sela", method_config("sela"), 0, tmp_path, progress=False)
    trainer.method.on_epoch_start(trainer.epoch_context())
    # A fixed batch and fixed views: SGD steps must lower the loss towards the current labels.
    losses = fixed_batch_losses(trainer, steps=16, labelled=False)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0], losses


# --- the recipes ----------------------------------------------------------------------------


def main_py_lr(epoch: int, lr=0.08, lrdrop=150) -> float:
    """yukimasano/self-label main.py: Optimizer.lr_schedule with its defaults (--lr 0.08, --lrdrop 150)."""
    return (epoch < 350) * (lr * (0.1 ** (epoch // lrdrop))) + (epoch >= 350) * lr * 0.1**3


@pytest.mark.parametrize("preset", ["imagenet", "imagenet100"])
def test_imagenet_presets_run_self_labels_main_py_recipe(preset):
    cfg = resolve_method_config(preset_config(preset), METHODS_DIR, "sela")
    train, p = cfg["train"], cfg["params"]
    # scripts/resnet.sh: bs 256, nepochs 400, hc 10, ncl 3000, nopts 100; main.py: --wd -5 (10^-5),
    # --lamb 25, SGD momentum 0.9, quadratic relabelling times
    assert (train["epochs"], train["batch_size"], train["optimizer"], train["momentum"]) == (
        400,
        256,
        "sgd",
        0.9,
    )
    assert train["weight_decay"] == pytest.approx(10**-5, rel=1e-12) and train["warmup_epochs"] == 0
    steps_per_epoch = 7
    for epoch in range(400):
        for step in (epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch - 1):  # first and last step
            assert learning_rate(train, step, steps_per_epoch) == pytest.approx(main_py_lr(epoch), rel=1e-12)
    assert (p["num_heads"], p["num_clusters"], p["lam"], p["num_relabels"], p["relabel_power"]) == (
        10,
        3000,
        25,
        100,
        2,
    )
    # data.py augs=3: RandomResizedCrop (0.08, 1), RandomGrayscale(0.2), then ColorJitter(0.4, 0.4, 0.4, 0.4)
    views = view_config(**cfg["augment"])
    assert views == VIEW_PRESETS["sela"] and views.crop_scale == (0.08, 1.0) and views.grey_first


def test_default_recipe_uses_cifar_py_views():
    # cifar.py: RandomResizedCrop(scale=(0.2, 1)), ColorJitter(0.4, 0.4, 0.4, 0.4), then RandomGrayscale(0.2)
    cfg = resolve_method_config(tiny_suite_config(), METHODS_DIR, "sela")
    views = view_config(**cfg["augment"])
    assert (views.crop_scale, views.grey_first, views.jitter_p, views.hue, views.gray_p, views.blur_p) == (
        (0.2, 1.0),
        False,
        1.0,
        0.4,
        0.2,
        0.0,
    )
