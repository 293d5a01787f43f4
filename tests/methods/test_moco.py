"""MoCo (methods/moco) and its building blocks (sslbench/kit/moco.py, queue.py), on tiny inputs."""

import datetime
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, preset_config
from torch import nn

from sslbench.augment.presets import ViewConfig, view_config
from sslbench.data.registry import load_data
from sslbench.kit.losses import info_nce
from sslbench.kit.moco import (
    MomentumEncoder,
    check_version,
    moco_head,
    temperature_of,
    use_split_batch_norm,
)
from sslbench.kit.queue import KeyQueue, fit_queue_size
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer, build_method

BATCH = 64  # the tiny suite's batch size (tests/support.py)


def build(method_config, seed=0, **overrides):
    cfg = method_config("moco", **{"queue_size": 2 * BATCH, **overrides})
    return build_method(METHODS_DIR / "moco", cfg, load_data(cfg), seed)


def views(seed, n=BATCH):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 1, 8, 8, generator=g) for _ in range(2)]


def capture_outputs(module):
    """The outputs of module's forward calls, in order (a real forward hook)."""
    outputs = []
    module.register_forward_hook(lambda mod, args, out: outputs.append(out.detach().clone()))
    return outputs


def query_parameters(method):
    return [p.detach().clone() for m in (method.backbone, method.projector) for p in m.parameters()]


def key_parameters(method):
    return [p.detach().clone() for p in method.key_encoder.parameters()]


def trainer_step(tmp_path, method_config, batch_seed=1, steps=1, **overrides):
    """The engine's own steps (Trainer.train_step: optimiser step, then the momentum update)."""
    cfg = method_config("moco", **{"queue_size": 2 * BATCH, **overrides})
    trainer = Trainer(METHODS_DIR / "moco", cfg, 0, tmp_path, progress=False)
    start = query_parameters(trainer.method), key_parameters(trainer.method)
    for step in range(steps):
        trainer.train_step(views(batch_seed + step), torch.arange(BATCH), trainer.epoch_context())
    return trainer.method, start


# --- the key encoder ---------------------------------------------------------------------


def test_momentum_zero_copies_the_query_encoder_after_one_step(tmp_path, method_config):
    method, (before, _) = trainer_step(tmp_path, method_config, momentum=0.0)
    after = query_parameters(method)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # the query encoder did move
    for q, k in zip(after, key_parameters(method)):
        assert torch.equal(q, k)


def test_momentum_one_freezes_the_key_encoder(tmp_path, method_config):
    method, (query, initial) = trainer_step(tmp_path, method_config, steps=2, momentum=1.0)
    for q, k in zip(query, initial):
        assert torch.equal(q, k)  # starts as a copy of the query encoder
    assert all(not p.requires_grad for p in method.key_encoder.parameters())
    for k0, k in zip(initial, key_parameters(method)):
        assert torch.equal(k0, k)


def test_the_key_encoder_is_moco_s_momentum_pair_at_a_constant_momentum(tmp_path, method_config):
    method, (query, keys) = trainer_step(tmp_path, method_config, momentum=0.75)
    assert method.cfg["params"]["momentum_schedule"] == "constant"
    [(online, target)] = method.momentum_pairs()
    assert list(online) == [method.backbone, method.projector] and target is method.key_encoder
    for k_old, k_new, q in zip(keys, key_parameters(method), query_parameters(method)):
        torch.testing.assert_close(k_new, 0.75 * k_old + 0.25 * q, rtol=0, atol=1e-6)


def test_shuffled_key_forward_returns_keys_in_batch_order():
    # With one BN group, shuffling changes nothing but the order, which must be undone.
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 5))
    encoder = MomentumEncoder([net]).train()
    x = torch.randn(16, 1, 8, 8)
    reference = MomentumEncoder([net]).train().embed(x)
    torch.testing.assert_close(encoder(x), reference)


def test_single_process_keys_come_from_a_shuffled_batch_through_split_batch_norm():
    # Two BN groups (samples i mod 2): which images share a group changes the keys, so only a forward
    # of the shuffled batch, unshuffled after, gives net(x[p])[argsort(p)] for the permutation p drawn.
    net = use_split_batch_norm(
        nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 5)), 2
    )
    encoder = MomentumEncoder([net]).train()
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    keys = encoder(x)
    torch.manual_seed(3)
    p = torch.randperm(16)  # the draw the encoder made
    torch.testing.assert_close(keys, encoder.net(x[p])[torch.argsort(p)])
    assert not torch.allclose(keys, encoder.net(x), atol=1e-3)  # an unshuffled forward differs
    assert not torch.allclose(keys, encoder.net(x[p]), atol=1e-3)  # and so do keys left shuffled


# --- the queue ---------------------------------------------------------------------------


def test_queue_holds_the_last_K_keys_in_ring_order(method_config):
    method = build(method_config).train()
    assert len(method.queue) == 2 * BATCH and int(method.queue.pointer) == 0
    keys = capture_outputs(method.key_encoder)
    for step in range(3):
        method.training_loss(views(step), None, torch.arange(BATCH))
    k = [F.normalize(out, dim=1) for out in keys]
    # Steps 0, 1, 2 went to slots [0, 64), [64, 128), [0, 64): step 2 overwrote step 0.
    torch.testing.assert_close(method.queue.keys, torch.cat([k[2], k[1]]))
    assert int(method.queue.pointer) == BATCH


def test_a_batch_is_contrasted_with_the_queue_before_its_own_keys_enter_it(method_config):
    method = build(method_config).train()
    method.training_loss(views(0), None, torch.arange(BATCH))  # some real keys in the queue
    queue_before = method.queue.keys.clone()
    queries, keys = capture_outputs(method.projector), capture_outputs(method.key_encoder)
    loss = method.training_loss(views(1), None, torch.arange(BATCH))
    q, k = F.normalize(queries[0], dim=1), F.normalize(keys[0], dim=1)
    torch.testing.assert_close(loss, info_nce(q, k, queue_before, method.temperature))
    queue_after = method.queue.keys
    torch.testing.assert_close(queue_after[BATCH:], k)  # this batch's keys are in the queue now ...
    assert not torch.allclose(loss, info_nce(q, k, queue_after, method.temperature))  # ... not in its loss


def test_queue_push_rejects_a_batch_that_does_not_divide_it():
    queue = KeyQueue(10, 4)
    with pytest.raises(ValueError, match="multiple"):
        queue.push(torch.randn(4, 4))


def test_effective_queue_size_shrinks_with_a_warning_on_small_data(method_config):
    with pytest.warns(UserWarning, match="shrunk to 1280"):
        method = build(method_config, queue_size=65536)
    num_train = method.info.num_train  # 1347 digits: 1347 - 64 = 1283 -> 20 batches
    assert len(method.queue) == 1280 == (num_train - BATCH) // BATCH * BATCH
    with pytest.warns(UserWarning, match="shrunk to 64"):
        assert fit_queue_size(100, 64, 1000) == 64  # not a multiple of the batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_queue_size(128, 64, 1000) == 128  # fits: no warning
    with pytest.raises(ValueError, match="too few"):
        fit_queue_size(128, 64, 100)


# --- versions ------------------------------------------------------------------------------


def test_version_one_has_a_linear_head_and_warns_about_a_v2_recipe(method_config):
    with pytest.warns(UserWarning, match="mocov1"):
        method = build(method_config, version=1)
    assert [type(m) for m in method.projector] == [nn.Linear]
    assert method.temperature == 0.07
    v2 = build(method_config)
    assert [type(m) for m in v2.projector] == [nn.Linear, nn.ReLU, nn.Linear]
    assert v2.projector[0].out_features == v2.feature_dim and v2.temperature == 0.2
    with pytest.raises(ValueError, match="version"):
        build(method_config, version=3)


# The official CIFAR-10 demo (facebookresearch/moco, colab-notebook branch, colab/moco_cifar10_demo.ipynb):
# its argparse defaults with the notebook's settings (cos on, symmetric off), the run behind its 82.6%.
DEMO = dict(arch="resnet18", lr=0.06, epochs=200, cos=True, batch_size=512, wd=5e-4, sgd_momentum=0.9)
DEMO_MOCO = dict(moco_dim=128, moco_k=4096, moco_m=0.99, moco_t=0.1, bn_splits=8, symmetric=False)
# train_transform: RandomResizedCrop(32) (scale (0.08, 1), ratio (3/4, 4/3)), RandomHorizontalFlip(0.5),
# RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), RandomGrayscale(0.2); no blur.
DEMO_VIEWS = ViewConfig(
    crop_scale=(0.08, 1.0),
    crop_ratio=(3 / 4, 4 / 3),
    flip_p=0.5,
    jitter_p=0.8,
    brightness=0.4,
    contrast=0.4,
    saturation=0.4,
    hue=0.1,
    gray_p=0.2,
    grey_first=False,
    blur_p=0.0,
)


@pytest.mark.parametrize("preset", ["cifar10", "cifar100"])
def test_cifar_presets_run_moco_with_the_official_demo_settings(preset):
    cfg = resolve_method_config(preset_config(preset), METHODS_DIR, "moco")
    train, p = cfg["train"], cfg["params"]
    assert cfg["backbone"] == {"name": DEMO["arch"], "small_stem": True}  # conv1 3x3 stride 1, no max-pool
    assert cfg["dataset"]["image_size"] == 32
    assert (train["optimizer"], train["lr"], train["momentum"], train["weight_decay"]) == (
        "sgd",
        DEMO["lr"],
        DEMO["sgd_momentum"],
        DEMO["wd"],
    )
    assert (train["schedule"], train["warmup_epochs"], train["epochs"], train["batch_size"]) == (
        "cosine",
        0,
        DEMO["epochs"],
        DEMO["batch_size"],
    )
    assert (p["dim"], p["queue_size"], p["momentum"], temperature_of(p), p["bn_splits"]) == (
        DEMO_MOCO["moco_dim"],
        DEMO_MOCO["moco_k"],
        DEMO_MOCO["moco_m"],
        DEMO_MOCO["moco_t"],
        DEMO_MOCO["bn_splits"],
    )
    assert fit_queue_size(p["queue_size"], train["batch_size"], 50_000) == DEMO_MOCO["moco_k"]  # not shrunk
    head = moco_head(p["version"], 512, p["dim"])  # the demo's head: resnet18(num_classes=128)'s fc
    assert [type(m) for m in head] == [nn.Linear] and head[0].bias is not None
    assert view_config(**cfg["augment"]) == DEMO_VIEWS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the version's recipe matches: no warning
        check_version(cfg)


# --- training ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:moco. version 2 uses")  # no augmentation, on purpose
def test_training_lowers_the_loss(tmp_path, method_config):
    # Two identical views make instance discrimination easy, so the loss falls within a few tiny
    # epochs whatever the seed; it can only fall if the gradients reach the query encoder and
    # the key encoder follows it. (With the real augmentation a random network embeds every
    # image alike and the loss stays near log(1 + K) for ~6 tiny epochs.)
    cfg = method_config("moco", queue_size=2 * BATCH, augment={"preset": "none"}, train={"epochs": 3})
    trainer = Trainer(METHODS_DIR / "moco", cfg, 0, tmp_path, progress=False)
    losses = [trainer.train_epoch()["loss"] for _ in range(3)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[0] < math.log(1 + 2 * BATCH)  # below chance from the first epoch on
    assert losses[2] < losses[1] - 0.2 and losses[1] < losses[0] - 0.1
    assert trainer.log_rows[-1]["queue_size"] == 2 * BATCH


def test_resume_restores_the_queue_and_key_encoder_exactly(tmp_path, method_config):
    cfg = method_config("moco", queue_size=2 * BATCH)
    full = Trainer(METHODS_DIR / "moco", cfg, 0, tmp_path / "full", progress=False)
    full.fit()
    first = Trainer(METHODS_DIR / "moco", cfg, 0, tmp_path / "resumed", progress=False)
    first.train_epoch()
    first.save_epoch_checkpoint()
    resumed = Trainer(METHODS_DIR / "moco", cfg, 0, tmp_path / "resumed", progress=False)
    assert resumed.resume() and resumed.state.epoch == 1
    resumed.fit()
    a, b = full.method.state_dict(), resumed.method.state_dict()
    assert a.keys() == b.keys() and {"queue.keys", "queue.pointer"} <= set(a)
    for key in a:
        assert torch.equal(a[key], b[key]), key


# --- shuffle-BN across ranks (real torch.distributed, gloo on CPU) ---------------------------


def _shuffle_bn_worker(rank, world, port, out_dir):
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.manual_seed(0)  # the same network on every rank
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 5))
    encoder = MomentumEncoder([net])
    torch.manual_seed(100 + rank)  # each rank's own images and RNG stream
    x = torch.randn(8, 1, 8, 8)
    # Eval first: the train-mode pass moves each rank's running statistics differently.
    eval_keys, embedded = encoder.eval()(x), encoder.embed(x)
    seen = capture_outputs(encoder.net[0][0])  # what this rank's BN normalises (conv outputs)
    train_keys = encoder.train()(x)
    queue = KeyQueue(32, 5)
    queue.push(eval_keys)
    torch.save(
        {
            "x": x,
            "seen": seen[0],
            "own_conv": encoder.net[0][0](x),
            "train_keys": train_keys,
            "eval_keys": eval_keys,
            "embed": embedded,
            "queue": queue.keys,
            "pointer": queue.pointer,
        },
        f"{out_dir}/rank{rank}.pt",
    )
    torch.distributed.destroy_process_group()


def test_shuffle_bn_across_ranks_mixes_the_global_batch_and_restores_order(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: the workers reuse this process's imports (spawn would re-import torch and timm)
    mp.start_processes(_shuffle_bn_worker, args=(2, port, str(tmp_path)), nprocs=2, start_method="fork")
    r = [torch.load(tmp_path / f"rank{i}.pt") for i in range(2)]
    for i in range(2):
        torch.testing.assert_close(r[i]["eval_keys"], r[i]["embed"])  # keys come back in batch order
        assert not torch.allclose(r[i]["seen"], r[i]["own_conv"])  # BN saw a shuffled mix ...
    own = torch.cat([r[0]["own_conv"], r[1]["own_conv"]])
    seen = torch.cat([r[0]["seen"], r[1]["seen"]])
    # ... of the global batch: every image exactly once across the ranks.
    order = [int((own - row).flatten(1).abs().sum(1).argmin()) for row in seen]
    assert sorted(order) == list(range(16))
    torch.testing.assert_close(seen, own[order])
    for i in range(2):  # every rank's queue holds both ranks' keys, in rank order
        torch.testing.assert_close(r[i]["queue"][:16], torch.cat([r[0]["eval_keys"], r[1]["eval_keys"]]))
        assert int(r[i]["pointer"]) == 16
