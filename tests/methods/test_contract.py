"""The method contract (sslbench/kit/method.py) through the engine.

1. Every method folder (discovered, not listed), and the test method tests/methods/exerciser that uses
   every piece of the contract at once: it builds on the tiny backbone, its training lowers nothing to
   NaN, and a run resumed from an epoch checkpoint ends bit-identical to the uninterrupted one. (The DDP
   side of the contract, 2 processes = 1 process, is tests/methods/test_distributed.py, over the same
   folders.)
2. Each piece, pinned through a real Trainer: the method's parameter groups reach the optimiser with
   their options (LARS adapts the weights, not the excluded biases and norms; a fixed-lr group keeps
   its lr through the schedule), the engine moves a momentum pair by exactly (1 - tau)(online - target)
   with tau of the cosine schedule at that step, and multi-crop views reach training_loss in order.
"""

import copy
import math
import shutil
import warnings

import pytest
import torch
from support import METHODS_DIR, TINY_IJEPA, TINY_VIT, VIT_OVERRIDES, contract_folders, tiny_suite_config
from torch import nn

from sslbench.errors import ConfigError
from sslbench.kit import momentum
from sslbench.kit.method import embed_crops
from sslbench.kit.momentum import momentum_at
from sslbench.optim import Lars, learning_rate
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer, pretrain

FOLDERS = contract_folders()
BATCH = 128  # 10 steps per epoch on the 1,347 digits: seconds per method
BACKBONES = {"resnet": None, "vit": TINY_VIT}


def contract_config(name: str, backbone: dict | None = None, **overrides) -> dict:
    suite = tiny_suite_config(batch_size=BATCH)
    if name == "ijepa":
        overrides = TINY_IJEPA | overrides
    if backbone is not None:
        suite["backbone"] |= copy.deepcopy(backbone)
        overrides = VIT_OVERRIDES.get(name, {}) | overrides
    if overrides:
        suite["method_overrides"] = {name: overrides}
    return resolve_method_config(suite, FOLDERS[name].parent, name)


def tensors(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=False)["method_state"]


# --- 1. every method folder -----------------------------------------------------------------


@pytest.fixture(scope="module", params=list(BACKBONES))
def runs(request, tmp_path_factory):
    """On each backbone, a function of a method: its runs' folders (2 epochs straight, and epoch 2 resumed
    from the uninterrupted run's epoch-1 checkpoint by a fresh Trainer), trained when a test first asks,
    so that `-k my_method` trains that folder alone. A method whose runs raise gets its error instead,
    so that it fails its own tests and no other method's."""
    root = tmp_path_factory.mktemp(f"contract_{request.param}")
    done = {}

    def train(name):
        cfg = contract_config(name, BACKBONES[request.param])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MoCo's and PCL's queue shrinks on the digits, with a warning
            pretrain(FOLDERS[name], cfg, 0, root / name / "full", progress=False)
            resumed = root / name / "resumed"
            (resumed / "checkpoints").mkdir(parents=True)
            epoch_1 = root / name / "full" / "checkpoints" / "epoch_0001.pt"
            if epoch_1.exists():  # the untrained floor has no epochs
                shutil.copy(epoch_1, resumed / "checkpoints")
            pretrain(FOLDERS[name], cfg, 0, resumed, progress=False)
        return root / name / "full", resumed

    def trained(name):
        if name not in done:
            try:
                done[name] = train(name)
            except Exception as err:  # reported by the method's own tests
                done[name] = err
        return done[name]

    return trained


def run_folders(runs, name):
    folders = runs(name)
    if isinstance(folders, Exception):
        pytest.fail(f"{name}: training raised {type(folders).__name__}: {folders}")
    return folders


@pytest.mark.parametrize("name", FOLDERS)
def test_training_keeps_every_loss_and_tensor_finite(name, runs):
    import pandas as pd

    full, _ = run_folders(runs, name)
    log = pd.read_csv(full / "train_log.csv")
    state = tensors(full / "checkpoint.pt")
    assert all(t.isfinite().all() for t in state.values() if t.is_floating_point())
    if log.empty:  # the untrained floor: nothing to train
        assert name in ("random", "pixels")  # the floors: nothing to train
        return
    assert list(log["epoch"]) == [1, 2] and log["loss"].map(math.isfinite).all()


@pytest.mark.parametrize("name", FOLDERS)
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(name, runs):
    full, resumed = run_folders(runs, name)
    a, b = tensors(full / "checkpoint.pt"), tensors(resumed / "checkpoint.pt")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    if name != "random":
        rows = (resumed / "train_log.csv").read_text().splitlines()
        assert rows[:2] == (full / "train_log.csv").read_text().splitlines()[:2]  # epoch 1: not redone


@pytest.mark.parametrize("name", sorted(VIT_OVERRIDES))
def test_split_batch_norm_is_refused_on_a_vision_transformer(name, tmp_path):
    cfg = contract_config(name, TINY_VIT, bn_splits=4)
    with pytest.raises(ConfigError, match=r"`bn_splits` = 4: split batch norm .* has none .*`bn_splits: 1`"):
        Trainer(FOLDERS[name], cfg, 0, tmp_path, progress=False)


def test_multi_crop_through_one_vit_equals_separate_forwards():
    """Views of two sizes through one ViT (one batch per size, position embeddings resampled): the class
    tokens of separate forwards, view by view."""
    from sslbench.backbones import create_backbone

    torch.manual_seed(0)
    vit = create_backbone(TINY_VIT["name"], in_chans=1, image_size=8, **TINY_VIT["args"]).eval()
    views = [
        torch.randn(3, 1, 8, 8),
        torch.randn(3, 1, 8, 8),
        torch.randn(3, 1, 4, 4),
        torch.randn(3, 1, 6, 6),
    ]
    together = embed_crops(vit, views)
    for view, out in zip(views, together):
        assert torch.allclose(out, vit(view), atol=1e-6)
    assert together[0].shape == (3, vit.num_features)


# --- 2. each piece through a real Trainer ------------------------------------------------------


def exerciser(tmp_path, **overrides) -> Trainer:
    cfg = contract_config("exerciser", **overrides)
    return Trainer(FOLDERS["exerciser"], cfg, 0, tmp_path, progress=False)


def batch_views(trainer, seed=0):
    idx = torch.randperm(len(trainer.labels), generator=torch.Generator().manual_seed(seed))[:BATCH]
    return trainer.make_views(trainer.data.train.images[idx], torch.Generator().manual_seed(seed)), idx


def test_the_method_s_groups_reach_the_optimiser_with_their_options(tmp_path):
    trainer = exerciser(tmp_path)
    method, optimizer = trainer.method, trainer.optimizer
    assert isinstance(optimizer, Lars)  # train.optimizer: lars
    weights, excluded, predictor = optimizer.param_groups
    online = [*method.backbone.parameters(), *method.projector.parameters()]
    assert {id(p) for p in weights["params"]} == {id(p) for p in online if p.ndim > 1}
    assert {id(p) for p in excluded["params"]} == {id(p) for p in online if p.ndim <= 1}
    assert {id(p) for p in predictor["params"]} == {id(p) for p in method.predictor.parameters()}
    assert (weights["weight_decay"], weights["exclude_from_lars"]) == (1e-4, False)
    assert (excluded["weight_decay"], excluded["exclude_from_lars"]) == (0.0, True)  # no decay, not adapted
    assert (predictor["fixed_lr"], predictor["exclude_from_lars"]) == (True, False)
    settings = (weights["trust_coefficient"], weights["trust_clip"], weights["trust_ratio"])
    assert settings == (0.001, False, "update_norm")  # train's LARS settings
    assert not any(p.requires_grad for p in method.target.parameters())

    row = trainer.train_epoch()  # 10 steps of the cosine schedule over 2 epochs of 10
    scheduled = learning_rate(trainer.train_cfg, trainer.state.step - 1, trainer.steps_per_epoch)
    assert row["lr"] == pytest.approx(scheduled) and scheduled < 0.2 * 0.6
    assert weights["lr"] == excluded["lr"] == pytest.approx(scheduled)
    assert predictor["lr"] == 0.2  # fixed: train.lr, untouched by the schedule


def test_a_lr_scale_multiplies_the_schedule_and_a_group_left_out_is_an_error(tmp_path):
    trainer = exerciser(tmp_path)
    method = trainer.method
    method.param_groups = lambda: [
        {"params": method.backbone.parameters()},
        {"params": [*method.projector.parameters(), *method.predictor.parameters()], "lr_scale": 0.25},
    ]
    from sslbench.kit.method import checked_param_groups
    from sslbench.optim import make_optimizer, set_learning_rate

    optimizer = make_optimizer(checked_param_groups(method), trainer.train_cfg)
    set_learning_rate(optimizer, trainer.train_cfg, 5, 10)  # a quarter into 2 epochs of 10 steps
    quarter = 0.2 * (1 + math.cos(math.pi / 4)) / 2
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([quarter, 0.25 * quarter])
    method.param_groups = lambda: [{"params": method.backbone.parameters()}]
    with pytest.raises(ValueError, match="leaves out trainable parameters: projector.0.weight"):
        checked_param_groups(method)
    method.param_groups = lambda: [{"params": method.parameters(), "lr": 3.0}]
    with pytest.raises(ValueError, match=r"unknown \['lr'\]"):
        checked_param_groups(method)


def test_the_engine_moves_the_target_by_the_scheduled_share_of_the_gap_after_each_step(tmp_path):
    # tau_base 0.5 over 2 epochs of 10 steps: tau_k = 1 - 0.5 (cos(pi k / 20) + 1) / 2 is 0.5 after the
    # first step and moves visibly from step to step, so an off-by-one in k or a tau of the wrong step fails.
    trainer = exerciser(tmp_path, momentum=0.5)
    method = trainer.method
    online = lambda: [p.detach().clone() for m in (method.backbone, method.projector) for p in m.parameters()]
    target = lambda: [p.detach().clone() for p in method.target.parameters()]
    ctx = trainer.epoch_context()
    for k, tau in enumerate([0.5, 1 - 0.5 * (math.cos(math.pi / 20) + 1) / 2]):
        assert momentum_at(0.5, "cosine", k, 20) == pytest.approx(tau)
        views, idx = batch_views(trainer, k)
        before = target()
        trainer.train_step(views, idx, ctx)
        for t_new, t_old, o_new in zip(target(), before, online()):
            torch.testing.assert_close(t_new - t_old, (1 - tau) * (o_new - t_old), rtol=1e-5, atol=1e-6)
        assert all(p.grad is None for p in method.target.parameters())  # no gradient reaches the target
        assert ctx.log["target_momentum"] == pytest.approx(tau)


def test_momentum_schedules_by_hand():
    assert [momentum_at(0.99, "constant", k, 10) for k in (0, 5, 10)] == [0.99] * 3
    cosine = [momentum_at(0.99, "cosine", k, 10) for k in (0, 5, 10, 30)]
    assert cosine == pytest.approx([0.99, 0.995, 1.0, 1.0])  # tau_base, halfway, 1 at the end and after
    by_hand = 1 - 0.004 * (math.cos(math.pi / 100) + 1) / 2
    assert momentum_at(0.996, "cosine", 3, 300) == pytest.approx(by_hand, rel=1e-12)
    linear = [
        momentum_at(0.996, "linear", k, 100) for k in (0, 25, 100, 130)
    ]  # MSN's: 1 at the end and after
    assert linear == pytest.approx([0.996, 0.997, 1.0, 1.0], rel=1e-12)


def test_capi_s_momentum_is_warmup_then_cosine_from_1_to_base_then_a_truncated_cosine_to_1():
    """utils.py WarmupThenCosine(start_warmup_value 1, base 0.999, final 1, warmup W, truncate_cos 0.8):
    np.linspace(1, base, W), then final + (base - final)(1 + cos(pi 0.8 i / (T - W))) / 2 at i = k - W."""
    T, W, base = 200, 20, 0.999
    official = list(torch.linspace(1.0, base, W, dtype=torch.float64)) + [
        1.0 + (base - 1.0) * 0.5 * (1 + math.cos(math.pi * 0.8 * i / (T - W))) for i in range(T - W)
    ]
    got = [momentum_at(base, "cosine", k, T, warmup=0.1, truncate=0.8) for k in range(T)]
    assert got == pytest.approx([float(v) for v in official], rel=0, abs=1e-12)
    assert momentum_at(base, "cosine", T, T, warmup=0.1, truncate=0.8) == pytest.approx(
        1 - 0.001 * 0.0955, abs=1e-6
    )


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"momentum_schedule": "step"}, "momentum_schedule` must be one of"),
        ({"momentum": 1.5}, "momentum` (the momentum target's tau_base) must lie in [0, 1]"),
        ({"augment": {"preset": "simclr", "crops": [{"count": 1, "size": 1.0}]}}, "gives 1 view(s)"),
        ({"augment": {"crops": [{"count": 2, "size": 0.5}, {"count": 2}]}}, "the first 2 view(s) are"),
        ({"augment": {"crops": [{"count": 2}, {"count": 2, "size": 0.1}]}}, "size` = 0.1 gives 1 px"),
    ],
)
def test_a_bad_momentum_or_view_setting_is_a_config_error_naming_it(tmp_path, override, needle):
    with pytest.raises(ConfigError) as err:
        exerciser(tmp_path, **override)
    assert needle in str(err.value)
    if "augment" in override:
        assert "exerciser" in str(err.value) and "method_overrides.exerciser.augment" in str(err.value)


def test_views_reach_training_loss_globals_first_then_local_crops_in_order(tmp_path):
    trainer = exerciser(tmp_path)  # 8-px digits: byol_view1, byol_view2 at 8 px, then 2 x 4-px crops
    assert [(g.count, g.size) for g in trainer.view_groups] == [(1, 8), (1, 8), (2, 4)]
    views, idx = batch_views(trainer)
    trainer.train_step(views, idx, trainer.epoch_context())
    assert trainer.method.last_views == [(BATCH, 1, 8, 8)] * 2 + [(BATCH, 1, 4, 4)] * 2


def test_on_before_step_sees_the_averaged_gradients_and_a_gradient_it_drops_moves_nothing(tmp_path):
    # DINO's last-layer freeze: gradients set to None after the backward pass, before the step.
    trainer = exerciser(tmp_path)
    method = trainer.method
    seen = []

    def drop_predictor_gradients(ctx):
        seen.append(all(p.grad is not None for p in method.parameters() if p.requires_grad))
        for p in method.predictor.parameters():
            p.grad = None

    method.on_before_step = drop_predictor_gradients
    predictor = [p.detach().clone() for p in method.predictor.parameters()]
    projector = [p.detach().clone() for p in method.projector.parameters()]
    views, idx = batch_views(trainer)
    trainer.train_step(views, idx, trainer.epoch_context())
    assert seen == [True]  # called once, after the backward pass
    assert all(
        torch.equal(a, b) for a, b in zip(predictor, method.predictor.parameters())
    )  # no step, no decay
    assert not any(torch.equal(a, b) for a, b in zip(projector, method.projector.parameters()))


def test_embed_crops_runs_the_backbone_once_per_run_of_one_size_and_the_head_once():
    torch.manual_seed(0)
    backbone = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )
    head = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    inputs = {"backbone": [], "head": []}
    for name, module in (("backbone", backbone), ("head", head)):
        module.register_forward_hook(
            lambda m, args, out, name=name: inputs[name].append(tuple(args[0].shape))
        )
    views = [torch.randn(5, 1, side, side) for side in (8, 8, 4, 4, 4, 8)]  # globals, locals, a global again
    out = embed_crops(backbone, views, head)
    assert inputs == {"backbone": [(10, 1, 8, 8), (15, 1, 4, 4), (5, 1, 8, 8)], "head": [(30, 4)]}
    # Train-mode batch norm: the backbone's statistics span one run of a size, the head's every view.
    features = [backbone(torch.cat(views[:2])), backbone(torch.cat(views[2:5])), backbone(views[5])]
    expected = head(torch.cat(features)).split(5)
    assert len(out) == 6 and all(torch.equal(a, b) for a, b in zip(out, expected))
    # Per-sample networks (eval mode): each view's output is its own, in order; no head: the features.
    backbone.eval(), head.eval()
    for got, view in zip(embed_crops(backbone, views, head), views):
        torch.testing.assert_close(got, head(backbone(view)))
    for got, view in zip(embed_crops(backbone, views), views):
        torch.testing.assert_close(got, backbone(view))


@pytest.mark.parametrize(
    "target, needle",
    [
        (lambda online: momentum.freeze(copy.deepcopy(online[0])), "do not match the target's"),
        (
            lambda online: nn.Sequential(*map(copy.deepcopy, online)),
            "the target has parameters that require grad",
        ),
    ],
    ids=["a target of other shapes", "a trainable target"],
)
def test_a_momentum_pair_that_cannot_move_by_ema_is_refused_when_the_trainer_is_built(
    tmp_path, monkeypatch, target, needle
):
    monkeypatch.setattr(momentum, "frozen_copy", target)  # what the exerciser builds its target with
    with pytest.raises(ValueError, match=needle):
        exerciser(tmp_path)


def test_a_two_view_method_takes_exactly_its_views(tmp_path):
    with pytest.raises(ConfigError, match=r"gives 3 view\(s\) but the method takes 2"):
        Trainer(
            METHODS_DIR / "simclr",
            resolve_method_config(
                tiny_suite_config() | {"method_overrides": {"simclr": {"augment": [{}, {}, {}]}}},
                METHODS_DIR,
                "simclr",
            ),
            0,
            tmp_path,
            progress=False,
        )
