"""semisup's ViT recipe: chosen by the backbone family, iBOT's fine-tuning from the projection head's
first layer where the checkpoint keeps it, each row saying which recipe and start produced it."""

import math

import pytest
import torch
from support import TINY_VIT, tiny_checkpoint

from evaluation import finetune, semisup
from evaluation.common import ProtocolError
from sslbench import atomic

# 8-px digits: the 10% subset holds 136 images, 1% 10; no mixing, so that a few steps learn
FAST = {
    "epochs": {"1pct": 20, "10pct": 20},
    "batch_size": 64,
    "lr": 1.0e-3,
    "min_lr": 1.0e-6,
    "warmup_epochs": 2.0,
    "mixup": 0.0,
    "cutmix": 0.0,
    "random_erasing": 0.0,
    "augment": {"preset": "supervised"},
}
CHANCE_MARGIN = 0.1 + 4.5 * math.sqrt(0.1 * 0.9 / 450)  # 450 test digits, 10 classes


@pytest.fixture(scope="module")
def simclr_vit(tmp_path_factory):
    """SimCLR on the tiny ViT (2 blocks, 48-d), 2 epochs on 8x8 digits: its projector is Linear-BN-ReLU-..."""
    vit = {"name": TINY_VIT["name"], "args": TINY_VIT["args"]}
    return tiny_checkpoint("simclr", tmp_path_factory.mktemp("simclr"), backbone=vit)


@pytest.fixture(scope="module")
def result(simclr_vit):
    return semisup.evaluate({"num_classes": 10}, {"vit": FAST}, 0, checkpoint_path=simclr_vit)


def test_the_checkpoint_keeps_the_projectors_first_layer(simclr_vit):
    ckpt = atomic.load_torch(simclr_vit)
    kept = ckpt["projection_first_layer"]
    assert [m["type"] for m in kept["modules"]] == ["Linear", "BatchNorm1d", "ReLU"]
    for key, value in kept["state"].items():  # the trained projector's, not a fresh layer's
        assert torch.equal(value, ckpt["method_state"][f"projector.{key}"]), key


def test_a_vit_is_fine_tuned_by_the_vit_recipe_from_the_heads_first_layer(result):
    metrics, used = result
    assert used["recipe_used"] == "vit" and used["start"] == "projection head's first layer"
    assert metrics["top1_10pct"] > CHANCE_MARGIN  # 1%: one or two images a class, chance or near it
    sizes = {name: used["subsets"][name]["size"] for name in ("1pct", "10pct")}
    assert sizes == {"1pct": 10, "10pct": 136}  # one image a class; 13-14 a class
    assert used["fits"]["1pct"]["batch_size"] == 10  # at most the subset, and even
    assert used["fits"]["10pct"]["batch_size"] == 64
    assert used["vit"]["lr"] == FAST["lr"] and used["vit"]["head_layer"] == 1
    assert used["deviations"] == semisup.VIT_DEVIATIONS + finetune.DEVIATIONS
    scales = {g["lr_scale"] for fit in used["fits"].values() for g in fit["param_groups"]}
    assert scales == {1.0}  # iBOT's command sets no layer decay


def test_the_new_head_sits_on_the_kept_layer(simclr_vit):
    """The model the recipe trains is backbone, then the checkpoint's first projector layer, then a new
    linear head from that layer's width to the classes."""
    ckpt = atomic.load_torch(simclr_vit)
    used = {**semisup.vit_settings(FAST), "epochs": 1, "batch_size": 64, "eval_batch_size": 64}
    kept = semisup.build_layer(ckpt["projection_first_layer"])
    before = {k: v.clone() for k, v in kept.state_dict().items()}
    _, data = semisup.checkpoint_and_images("test", simclr_vit, None, None)
    model, _ = finetune.finetune(ckpt, data, used, 0, torch.device("cpu"), neck=kept)
    neck, head = model[1]
    assert neck is kept and head.in_features == ckpt["projection_first_layer"]["out_dim"]
    assert head.out_features == 10
    assert not torch.equal(neck.state_dict()["0.weight"], before["0.weight"])  # fine-tuned with the rest


def tensors_trained(used):
    return sum(g["params"] for g in used["fits"]["10pct"]["param_groups"])


def test_head_layer_0_and_a_checkpoint_without_the_layer_start_from_the_backbone(
    simclr_vit, result, tmp_path
):
    _, used = semisup.evaluate(
        {"num_classes": 10},
        {"vit": {**FAST, "head_layer": 0, "epochs": {"1pct": 1, "10pct": 1}}},
        0,
        checkpoint_path=simclr_vit,
        result_dir=tmp_path / "a",
    )
    assert used["start"] == "backbone"
    # from the head's first layer, three more tensors train: its Linear's weight (no bias), BN's two
    assert tensors_trained(result[1]) == tensors_trained(used) + 3
    ckpt = atomic.load_torch(simclr_vit)
    del ckpt["projection_first_layer"]  # as a released checkpoint, or one written before it was kept
    path = tmp_path / "checkpoint.pt"
    atomic.save_torch(path, ckpt, record_digest=True)
    _, used = semisup.evaluate(
        {"num_classes": 10},
        {"vit": {**FAST, "epochs": {"1pct": 1, "10pct": 1}}},
        0,
        checkpoint_path=path,
        result_dir=tmp_path / "b",
    )
    assert used["recipe_used"] == "vit" and used["start"] == "backbone"


def test_recipe_resnet_forces_simclrs_recipe_on_a_vit(simclr_vit, tmp_path):
    settings = {"recipe": "resnet", "epochs": {"1pct": 1, "10pct": 1}, "lr_grid": [0.01]}
    _, used = semisup.evaluate(
        {"num_classes": 10}, settings, 0, checkpoint_path=simclr_vit, result_dir=tmp_path
    )
    assert used["recipe_used"] == "resnet" and "lr_selection" in used and "fits" not in used


@pytest.mark.parametrize(
    "vit, message",
    [
        ({"lr_rate": 1.0}, r"evaluation.semisup.vit`: unknown setting\(s\) \['lr_rate'\]"),
        ({"epochs": {"10pct": 5}}, r"evaluation.semisup.vit.epochs` = \{'10pct': 5\} must map exactly"),
        ({"head_layer": 2}, r"head_layer` = 2: 1 starts from the projection head's first layer"),
        ({"layer_decay": 1.5}, "layer_decay"),
    ],
)
def test_bad_vit_settings_name_the_key(simclr_vit, vit, message):
    with pytest.raises(ProtocolError, match=message):
        semisup.evaluate({"num_classes": 10}, {"vit": vit}, 0, checkpoint_path=simclr_vit)


def test_an_unknown_recipe_is_refused(simclr_vit):
    with pytest.raises(ProtocolError, match="recipe"):
        semisup.evaluate({"num_classes": 10}, {"recipe": "deit"}, 0, checkpoint_path=simclr_vit)
