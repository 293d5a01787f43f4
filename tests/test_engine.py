import math
import shutil

import pytest
import torch
from conftest import METHODS_DIR

from sslbench.engine import Trainer, pretrain
from sslbench.loop import TrainingDiverged, learning_rate, make_optimizer, uses_fused_optimizer


def schedule(**kw):
    return {"lr": 1.0, "epochs": 10, "warmup_epochs": 0, "schedule": "cosine", "milestones": [], **kw}


def test_cosine_schedule_endpoints_and_midpoint():
    train = schedule()
    assert learning_rate(train, 0, 10) == pytest.approx(1.0)
    assert learning_rate(train, 50, 10) == pytest.approx(0.5)
    assert learning_rate(train, 100, 10) == pytest.approx(0.0, abs=1e-12)


def test_warmup_is_linear_then_cosine_starts_at_base():
    train = schedule(warmup_epochs=2)
    steps = [learning_rate(train, s, 10) for s in range(20)]
    assert steps == pytest.approx([(s + 1) / 20 for s in range(20)])
    assert learning_rate(train, 20, 10) == pytest.approx(1.0)


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


def test_training_is_deterministic_and_resume_is_exact(tmp_path, method_config):
    cfg = method_config("simclr")
    full = pretrain(METHODS_DIR / "simclr", cfg, 0, tmp_path / "full", progress=False)

    # Interrupted after one epoch (as a kill between epochs leaves it), then resumed.
    first = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path / "resumed", progress=False)
    first.train_epoch()
    first._save_epoch_checkpoint()
    resumed = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path / "resumed", progress=False)
    assert resumed.resume() and resumed.state.epoch == 1
    path = resumed.fit()
    assert_same_state(encoder_state(full), encoder_state(path))

    again = pretrain(METHODS_DIR / "simclr", cfg, 0, tmp_path / "again", progress=False)
    assert_same_state(encoder_state(full), encoder_state(again))


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path, method_config):
    cfg = method_config("simclr")
    trainer = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path, progress=False)
    for _ in range(2):
        trainer.train_epoch()
        trainer._save_epoch_checkpoint()
    newest = tmp_path / "checkpoints" / "epoch_0002.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as by a full disk
    fresh = Trainer(METHODS_DIR / "simclr", cfg, 0, tmp_path, progress=False)
    assert fresh.resume()
    assert fresh.state.epoch == 1


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
    from sslbench.config import resolve_method_config

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
    from sslbench.batches import FolderBatches

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


@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler"
)
def test_compiled_backbone_steps_as_the_eager_one_and_keeps_checkpoint_names(tmp_path, method_config):
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
    ctx = {t: t.epoch_context() for t in (eager, compiled)}
    # The same views through both for a few steps. Only a few: SimCLR on this tiny set amplifies
    # rounding ~10x per step after five or so, so whole runs part however faithful the compiled graph is.
    for step in range(3):
        idx = torch.arange(step * 64, (step + 1) * 64)
        views = eager.make_views(eager.data.train.images[idx], torch.Generator().manual_seed(step))
        losses = [t.train_step([v.clone() for v in views], idx, 0.06, ctx[t]) for t in (eager, compiled)]
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for (name, a), (_, b) in zip(eager.method.named_parameters(), compiled.method.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)
    meta, state = meta_and_encoder(compiled._save_final(0.0))
    assert meta["fast_paths"]["compiled_backbone"] is True
    assert state.keys() == eager.method.encoder().state_dict().keys()  # no _orig_mod. prefixes
