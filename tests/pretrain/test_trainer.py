import json
import math
import os
import shutil

import pytest
import torch
from support import METHODS_DIR, TINY_IJEPA, require

from sslbench import atomic, cli
from sslbench.optim import TrainingDiverged, learning_rate, make_optimizer, uses_fused_optimizer
from sslbench.pretrain.checkpoints import CheckpointMismatch
from sslbench.pretrain.trainer import Trainer, pretrain


def schedule(**kw):
    return {
        "lr": 1.0,
        "epochs": 10,
        "warmup_epochs": 0,
        "warmup_ramp": "linear",
        "schedule": "cosine",
        "milestones": [],
        **kw,
    }


def test_cosine_schedule_endpoints_and_midpoint():
    train = schedule()
    assert learning_rate(train, 0, 10) == pytest.approx(1.0)
    assert learning_rate(train, 50, 10) == pytest.approx(0.5)
    assert learning_rate(train, 100, 10) == pytest.approx(0.0, abs=1e-12)


def test_warmup_is_linear_from_zero_then_cosine_starts_at_base():
    train = schedule(warmup_epochs=2)
    steps = [learning_rate(train, s, 10) for s in range(20)]
    assert steps == pytest.approx([s / 20 for s in range(20)])
    assert learning_rate(train, 20, 10) == pytest.approx(1.0)
    steps = [learning_rate({**train, "warmup_ramp": "linspace"}, s, 10) for s in range(20)]
    assert steps == pytest.approx([s / 19 for s in range(20)])  # numpy's linspace(0, 1, 20)


def test_step_schedule_multiplies_by_tenth_at_milestones():
    train = schedule(schedule="step", milestones=[6, 8])
    assert learning_rate(train, 59, 10) == pytest.approx(1.0)
    assert learning_rate(train, 60, 10) == pytest.approx(0.1)
    assert learning_rate(train, 80, 10) == pytest.approx(0.01)


def encoder_state(path):
    return torch.load(path, weights_only=False)["encoder"]


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


class Killed(Exception):
    """Stands for a kill between epochs: raised at the start of epoch `at` (0-based)."""


def kill_at_epoch(trainer, at: int) -> None:
    hook = trainer.method.on_epoch_start

    def on_epoch_start(ctx):
        if ctx.epoch == at:
            raise Killed
        hook(ctx)

    trainer.method.on_epoch_start = on_epoch_start


def live_state(method) -> dict:
    """Every parameter and buffer, non-persistent ones included (what a resume must restore)."""
    return {name: t.detach().clone() for name, t in [*method.named_parameters(), *method.named_buffers()]}


@pytest.mark.parametrize(
    "method,overrides",
    [
        ("simclr", {}),
        ("pcl", {"warmup_epochs": 0, "queue_size": 128}),  # PCL: E-steps in both epochs
        ("lejepa", {"num_slices": 16}),  # random directions drawn inside every step's loss
        ("visreg", {"num_slices": 16}),
        # masks drawn inside every step, the teacher temperature warming up per step
        ("dinov2", {"out_dim": 32, "hidden_dim": 24, "bottleneck_dim": 12, "warmup_teacher_temp_epochs": 2}),
        # the Gram teacher loaded in epoch 0 and refreshed twice in epoch 1
        (
            "dinov3",
            {
                "out_dim": 32,
                "ibot_out_dim": 24,
                "hidden_dim": 24,
                "bottleneck_dim": 12,
                "gram_start": 0.3,
                "gram_first_update": 0.6,
                "gram_update_every": 0.1,
                "gram_max_updates": 2,
            },
        ),
        (
            "franca",
            {"out_dim": 32, "ibot_out_dim": 32, "hidden_dim": 24, "bottleneck_dim": 12},
        ),  # masks, levels
        ("ijepa", TINY_IJEPA),  # masks drawn inside every step, the warm-up from warmup_start_lr
        ("capi", {"num_clusters": 16}),  # masks drawn inside every step, the momentum's own warm-up
    ],
)
def test_fit_resumes_a_killed_run_rather_than_retraining_it(tmp_path, method_config, method, overrides):
    """Training re-seeds every epoch, so a retrain ends where a resume does: what only a resume keeps is
    the killed run's epoch-1 log row (its timings), and the state the next epoch starts from is the
    checkpointed one (PCL: prototypes, concentrations, assignments, queue)."""
    cfg = method_config(method, **overrides)
    full = pretrain(METHODS_DIR / method, cfg, 0, tmp_path / "full", progress=False)

    run = tmp_path / "run"
    killed = Trainer(METHODS_DIR / method, cfg, 0, run, progress=False)
    kill_at_epoch(killed, 1)
    with pytest.raises(Killed):
        killed.fit()
    killed_log = (run / "train_log.csv").read_text()
    at_kill = live_state(killed.method)
    if method == "pcl":
        assert (at_kill["assignments"] >= 0).all()  # the epoch-0 E-step's clustering is in the state

    resumed = Trainer(METHODS_DIR / method, cfg, 0, run, progress=False)
    starts, hook = [], resumed.method.on_epoch_start

    def on_epoch_start(ctx):  # notes where each epoch starts from, then runs the method's own hook
        starts.append((ctx.epoch, live_state(resumed.method)))
        hook(ctx)

    resumed.method.on_epoch_start = on_epoch_start
    path = resumed.fit()  # no resume() by hand: fit must find the checkpoint itself
    assert [epoch for epoch, _ in starts] == [1]  # epoch 1 (0-based) only: epoch 0 was not redone
    assert_same_state(starts[0][1], at_kill)
    log = (run / "train_log.csv").read_text().splitlines(keepends=True)
    assert len(killed_log.splitlines()) == 2 and log[:2] == killed_log.splitlines(keepends=True)
    assert len(log) == 3
    assert_same_state(encoder_state(full), encoder_state(path))
    assert_same_state(
        torch.load(full, weights_only=False)["method_state"],
        torch.load(path, weights_only=False)["method_state"],
    )
    again = pretrain(METHODS_DIR / method, cfg, 0, tmp_path / "again", progress=False)
    assert_same_state(encoder_state(full), encoder_state(again))


def test_a_checkpoint_of_other_method_code_is_refused_by_name_and_nothing_is_loaded(tmp_path, method_config):
    cfg = method_config("supervised")
    killed = Trainer(METHODS_DIR / "supervised", cfg, 0, tmp_path, progress=False)
    kill_at_epoch(killed, 1)
    with pytest.raises(Killed):
        killed.fit()
    path = tmp_path / "checkpoints" / "epoch_0001.pt"
    ckpt = torch.load(path, weights_only=False)
    state = ckpt["method_state"]
    # As if method.py had renamed the classifier's weight and grown its output; the backbone's keys
    # still match, so a load without the check would copy them before failing.
    state["classifier.kernel"] = state.pop("classifier.weight")
    state["classifier.bias"] = torch.cat([state["classifier.bias"], torch.zeros(3)])
    atomic.save_torch(path, ckpt, record_digest=True)  # as that code's trainer wrote it

    fresh = Trainer(METHODS_DIR / "supervised", cfg, 0, tmp_path, progress=False)
    before = live_state(fresh.method)
    with pytest.raises(CheckpointMismatch) as err:
        fresh.fit()
    message = str(err.value)
    assert str(path) in message and "methods/supervised/method.py" in message
    assert "the checkpoint lacks: classifier.weight" in message
    assert "the code lacks: classifier.kernel" in message
    assert "classifier.bias (13,) instead of (10,)" in message
    assert f"delete {path.parent}" in message and "restore the method code" in message
    assert_same_state(live_state(fresh.method), before)  # not half-loaded
    assert fresh.state.epoch == 0 and path.exists()  # nothing trained, nothing removed
    args = ["pretrain", "--method-dir", str(METHODS_DIR / "supervised"), "--config-json", json.dumps(cfg)]
    with pytest.raises(SystemExit) as exit_:  # what the console script prints, without a traceback
        cli.main([*args, "--seed", "0", "--out", str(tmp_path), "--device", "cpu", "--quiet"])
    assert str(exit_.value).startswith("sslbench pretrain: error: ")
    assert "the code lacks: classifier.kernel" in str(exit_.value)


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path, method_config):
    cfg = method_config("simclr")
    trainer = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path, progress=False)
    for _ in range(2):
        trainer.train_epoch()
        trainer.save_epoch_checkpoint()
    newest = tmp_path / "checkpoints" / "epoch_0002.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as by a full disk
    fresh = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path, progress=False)
    assert fresh.resume()
    assert fresh.state.epoch == 1


def test_checkpoints_of_other_settings_are_set_aside_not_pruned_in_place_of_the_new_runs(
    tmp_path, method_config
):
    old = Trainer(METHODS_DIR / "simclr", method_config("simclr"), 0, tmp_path, progress=False)
    for _ in range(3):
        old.train_epoch()
        old.save_epoch_checkpoint()
    new_cfg = method_config("simclr", train={"lr": 0.01})
    new = Trainer(METHODS_DIR / "simclr", new_cfg, 0, tmp_path, progress=False)
    assert not new.resume()
    new.train_epoch()
    new.save_epoch_checkpoint()  # epoch 1 sorts before the old run's epochs 2 and 3
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.glob("epoch_*.pt")) == ["epoch_0001.pt"]
    assert sorted(p.name for p in (folder / "superseded").glob("*.pt")) == ["epoch_0002.pt", "epoch_0003.pt"]
    again = Trainer(METHODS_DIR / "simclr", new_cfg, 0, tmp_path, progress=False)
    assert again.resume() and again.state.epoch == 1


def test_log_has_one_row_per_epoch(tmp_path, method_config):
    import pandas as pd

    pretrain(METHODS_DIR / "simclr", method_config("simclr"), 0, tmp_path, progress=False)
    log = pd.read_csv(tmp_path / "train_log.csv")
    assert list(log["epoch"]) == [1, 2]
    assert {"loss", "lr", "images_per_s", "seconds"} <= set(log.columns)
    assert log["loss"].map(math.isfinite).all()


def test_random_floor_is_seeded_and_untrained(tmp_path, method_config):
    cfg = method_config("random")
    a = encoder_state(pretrain(METHODS_DIR / "random", cfg, 0, tmp_path / "a", progress=False))
    b = encoder_state(pretrain(METHODS_DIR / "random", cfg, 0, tmp_path / "b", progress=False))
    c = encoder_state(pretrain(METHODS_DIR / "random", cfg, 1, tmp_path / "c", progress=False))
    assert_same_state(a, b)
    first = next(iter(a))
    assert not torch.equal(a[first], c[first])
    assert torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)["meta"]["epochs_trained"] == 0


NAN_METHOD = """
import torch
from sslbench import Method

class Diverges(Method):
    num_views = 1
    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        self.calls = 0
    def training_loss(self, views, labels, indices):
        self.calls += 1
        loss = self.backbone(views[0]).pow(2).mean()
        return loss * float("nan") if self.calls > 30 else loss
"""


def test_nan_loss_stops_with_a_diagnostic_and_keeps_the_last_good_checkpoint(tmp_path, suite_config):
    from sslbench.plan.settings import resolve_method_config

    folder = tmp_path / "methods" / "diverges"
    folder.mkdir(parents=True)
    (folder / "method.py").write_text(NAN_METHOD)
    suite_config["train"]["epochs"] = 5
    cfg = resolve_method_config(suite_config, tmp_path / "methods", "diverges")
    with pytest.raises(TrainingDiverged) as err:
        pretrain(folder, cfg, 0, tmp_path / "run", progress=False)
    message = str(err.value)
    assert "diverges" in message and "epoch 2" in message and "last finite loss" in message
    assert (tmp_path / "run" / "checkpoints" / "epoch_0001.pt").exists()
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def write_imagefolder(root, classes=3, per_class=12, size=12):
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = (torch.rand(size, size, 3, generator=g) * 80 + 60 * c).clamp(0, 255).byte()
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")


@pytest.mark.parametrize("workers", [0, 2])
def test_folder_dataset_trains_through_dataloader_workers(tmp_path, method_config, workers):
    from sslbench.pretrain.batches import FolderBatches

    write_imagefolder(tmp_path / "data")
    cfg = method_config("simclr", train={"epochs": 1, "batch_size": 12, "workers": workers})
    cfg["dataset"].update(name="imagefolder", root=str(tmp_path / "data"), image_size=8)
    trainer = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path / "run", progress=False)
    assert isinstance(trainer.images, FolderBatches)
    path = trainer.fit()
    assert torch.load(path, weights_only=False)["meta"]["epochs_trained"] == 1
    # The folder path feeds the same images as decoding them by hand, in the order asked.
    idx = [torch.tensor([5, 0, 7])]
    batch = next(trainer.images.iterate(idx))
    assert torch.equal(batch, trainer.data.train.load(idx[0]))


# --- fast paths: fused optimiser, torch.compile -----------------------------------------------


def test_fused_optimizer_is_cuda_only_by_default_and_can_be_forced():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not uses_fused_optimizer({}, cpu) and uses_fused_optimizer({"fused_optimizer": "auto"}, cuda)
    assert uses_fused_optimizer({"fused_optimizer": True}, cpu)
    assert not uses_fused_optimizer({"fused_optimizer": False}, cuda)
    train = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}
    params = [torch.nn.Parameter(torch.ones(3))]
    assert make_optimizer(params, {**train, "fused_optimizer": True}, cpu).defaults["fused"] is True
    assert not make_optimizer(params, train, cpu).defaults.get("fused")
    adamw = make_optimizer(params, {**train, "optimizer": "adamw", "fused_optimizer": True}, cpu)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["fused"] is True


def meta_and_encoder(path):
    ckpt = torch.load(path, weights_only=False)
    return ckpt["meta"], ckpt["encoder"]


def assert_close_state(a, b, rtol, atol):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


def test_fused_sgd_trains_as_the_default_update_does(tmp_path, method_config):
    # The same update in other kernels: the runs part only by rounding, and the checkpoint says which ran.
    default_meta, default = meta_and_encoder(
        pretrain(METHODS_DIR / "simclr", method_config("simclr"), 0, tmp_path / "default", progress=False)
    )
    cfg = method_config("simclr", train={"fused_optimizer": True})
    fused_meta, fused = meta_and_encoder(
        pretrain(METHODS_DIR / "simclr", cfg, 0, tmp_path / "fused", progress=False)
    )
    assert default_meta["fast_paths"] == {
        "bf16_autocast": False,
        "channels_last": False,
        "fused_optimizer": False,
        "compiled_backbone": False,
    }
    assert fused_meta["fast_paths"]["fused_optimizer"] is True
    assert_close_state(default, fused, rtol=1e-4, atol=1e-5)


def test_compiled_backbone_steps_as_the_eager_one_and_keeps_checkpoint_names(tmp_path, method_config):
    cxx = os.environ.get("CXX", "g++")  # the compiler inductor's CPU kernels are built with
    require("cxx_compiler", None if shutil.which(cxx) else f"{cxx} is absent (inductor compiles C++)")
    eager = Trainer(METHODS_DIR / "simclr", method_config("simclr"), 0, tmp_path / "eager", progress=False)
    compiled = Trainer(
        METHODS_DIR / "simclr",
        method_config("simclr", train={"compile": True}),
        0,
        tmp_path / "compiled",
        progress=False,
    )
    assert compiled.method.backbone._compiled_call_impl is not None  # nn.Module.compile took effect
    assert eager.method.backbone._compiled_call_impl is None
    before = [p.detach().clone() for p in eager.method.parameters()]
    idx = torch.arange(64)
    views = eager.make_views(eager.data.train.images[idx], torch.Generator().manual_seed(0))
    losses = [t.train_step([v.clone() for v in views], idx, t.epoch_context()) for t in (eager, compiled)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    # One step, compared as updates. Inductor fuses the backbone's kernels and sums its float32
    # reductions (batch norm's over the batch, the convolutions') in another order, so every gradient
    # carries rounding of a few 1e-6 of its own size (measured here: at most 7e-5 of a tensor's update,
    # most near 3e-6); over several steps SimCLR on this tiny set amplifies it ~10x per step, which is why
    # comparing parameters after a few steps fails with no fault. A wrong compiled graph (a dropped term,
    # a wrong op) errs by the order of the update itself: 1e-3 of each tensor's update sits between.
    # Zero-initialised residual branches get no gradient at step 0: their update must then agree exactly.
    for (name, a), b, start in zip(eager.method.named_parameters(), compiled.method.parameters(), before):
        update, other = a.detach() - start, b.detach() - start
        assert (other - update).norm() <= 1e-3 * update.norm(), (name, float((other - update).norm()))
    meta, state = meta_and_encoder(compiled.save_final(0.0))
    assert meta["fast_paths"]["compiled_backbone"] is True
    assert state.keys() == eager.method.encoder().state_dict().keys()  # no _orig_mod. prefixes
