"""Fine-tuning on every label (MAE's main_finetune.py): layer-wise lr decay, the schedule, the pooling,
mixed targets, and the protocol from a checkpoint."""

import math

import pytest
import torch
from support import tiny_checkpoint, tiny_vit
from torch import nn

from evaluation import finetune, semisup
from evaluation.common import ProtocolError
from sslbench.backbones import backbone_from_config
from sslbench.extract.features import read_checkpoint
from sslbench.optim import learning_rate

FAST = {"epochs": 4, "batch_size": 64, "lr": 5e-4, "warmup_epochs": 1}  # 1,347 8-px digits: 21 steps an epoch
CHANCE_MARGIN = 0.1 + 4.5 * math.sqrt(0.1 * 0.9 / 450)  # 450 test digits, 10 classes


def checkpoint_of(method, tmp_path_factory):
    return tiny_checkpoint(method, tmp_path_factory.mktemp(method))


@pytest.fixture(scope="module")
def mae_checkpoint(tmp_path_factory):
    """MAE on its own tiny ViT (4 blocks), trained on the tiny suite (8x8 digits, 2 epochs)."""
    return checkpoint_of("mae", tmp_path_factory)


@pytest.fixture(scope="module")
def resnet_checkpoint(tmp_path_factory):
    return checkpoint_of("simclr", tmp_path_factory)


def scales_and_decays(groups):
    return {id(p): (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}


# --- layer-wise lr decay -------------------------------------------------------------------------


def test_layer_decay_gives_each_vit_parameter_maes_scale_and_weight_decay():
    """util/lr_decay.py by hand on a 2-block ViT: L = 3; embeddings d^3, block 0 d^2, block 1 d, the rest 1;
    1-D parameters, the class token and the position embedding undecayed."""
    vit, head, d = tiny_vit(global_pool="avg"), nn.Linear(48, 10), 0.5
    got = scales_and_decays(finetune.layer_decay_groups(vit, head, 0.05, d))
    named = dict(vit.named_parameters())
    expected_layer = {
        "cls_token": 0,
        "pos_embed": 0,
        "patch_embed.proj.weight": 0,
        "patch_embed.proj.bias": 0,
        "blocks.0.attn.qkv.weight": 1,
        "blocks.0.norm1.bias": 1,
        "blocks.1.mlp.fc2.weight": 2,
        "blocks.1.norm2.weight": 2,
        "fc_norm.weight": 3,
        "fc_norm.bias": 3,
    }
    for name, layer in expected_layer.items():
        decayed = named[name].ndim > 1 and name not in ("cls_token", "pos_embed")
        assert got[id(named[name])] == (d ** (3 - layer), 0.05 if decayed else 0.0), name
    assert got[id(head.weight)] == (1.0, 0.05) and got[id(head.bias)] == (1.0, 0.0)
    assert len(got) == len(named) + 2  # every parameter in exactly one group


def test_layer_decay_equals_timms_param_groups_layer_decay():
    """timm's own implementation of the BEiT rule, on a ViT with its classifier inside."""
    from timm.optim import param_groups_layer_decay

    vit = tiny_vit(global_pool="avg")
    vit.reset_classifier(7)
    ours = scales_and_decays(finetune.layer_decay_groups(vit, nn.Identity(), 0.05, 0.65))
    timms = param_groups_layer_decay(vit, 0.05, vit.no_weight_decay(), layer_decay=0.65)
    theirs = {id(p): (g["lr_scale"], g["weight_decay"]) for g in timms for p in g["params"]}
    assert ours.keys() == theirs.keys()
    for key, (scale, decay) in theirs.items():
        assert ours[key][0] == pytest.approx(scale, rel=1e-12) and ours[key][1] == decay


def test_a_network_without_blocks_takes_the_lr_everywhere():
    net, head = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), nn.Linear(4, 2)
    groups = finetune.layer_decay_groups(net, head, 0.05, 0.65)
    assert {g["lr_scale"] for g in groups} == {1.0}
    assert scales_and_decays(groups)[id(net[0].weight)] == (1.0, 0.05)


@pytest.mark.parametrize("scale", [1.0, 0.65**3])
def test_the_cosine_ends_at_min_lr_times_the_groups_scale_as_maes_lr_sched(scale):
    """util/lr_sched.py adjust_learning_rate times the group's lr_scale, at every step of the run."""
    lr, min_lr, warmup, epochs, per_epoch = 2e-3, 1e-4, 2, 10, 7
    schedule = {
        "lr": lr,
        "min_lr": min_lr,
        "epochs": epochs,
        "warmup_epochs": warmup,
        "warmup_ramp": "linear",
        "schedule": "cosine",
    }
    for step in range(epochs * per_epoch + 1):
        epoch = step / per_epoch
        if epoch < warmup:
            official = lr * epoch / warmup
        else:
            official = min_lr + (lr - min_lr) * 0.5 * (
                1 + math.cos(math.pi * (epoch - warmup) / (epochs - warmup))
            )
        assert learning_rate(schedule, step, per_epoch, base=lr * scale) == pytest.approx(
            official * scale, rel=1e-12
        )
    assert learning_rate(schedule, epochs * per_epoch, per_epoch, base=lr * scale) == pytest.approx(
        min_lr * scale
    )


# --- the model and the targets -----------------------------------------------------------------


def test_avg_pool_is_maes_global_pool_and_token_the_class_token(mae_checkpoint):
    ckpt = read_checkpoint(mae_checkpoint)
    x = torch.randn(3, 1, 8, 8)
    pooled = finetune.backbone_for_finetuning(ckpt, 8, 0.0, "avg").eval()
    with torch.no_grad():
        tokens = pooled.blocks(pooled._pos_embed(pooled.patch_embed(x)))  # the last block's tokens, no norm
        expected = nn.functional.layer_norm(tokens[:, 1:].mean(1), (tokens.shape[-1],), eps=1e-6)
        assert torch.allclose(pooled(x), expected, atol=1e-6)  # fc_norm starts as the identity LayerNorm
        token = finetune.backbone_for_finetuning(ckpt, 8, 0.0, "token").eval()
        assert torch.allclose(token(x), token.norm(tokens)[:, 0], atol=1e-6)
    assert isinstance(pooled.norm, nn.Identity) and isinstance(token.norm, nn.LayerNorm)


def test_a_beit_is_fine_tuned_as_a_vit_its_avg_pool_simmim_s_mean_pooling():
    # SimMIM's released encoder is BEiT's ViT (timm's Beit, format simmim); its fine-tuning pools the mean
    # patch token through a new norm (USE_MEAN_POOLING), and semisup takes the ViT recipe
    args = {"patch_size": 4, "embed_dim": 12, "depth": 1, "num_heads": 2, "global_pool": "token"}
    section = {
        "name": "beit_base_patch16_224",
        "args": args | {"use_rel_pos_bias": False, "use_shared_rel_pos_bias": True},
    }
    encoder = backbone_from_config({"backbone": section}, 1, 8)
    ckpt = {
        "cfg": {"backbone": section},
        "meta": {"image_size": 8, "channels": 1},
        "encoder": encoder.state_dict(),
    }
    x = torch.randn(3, 1, 8, 8)
    pooled = finetune.backbone_for_finetuning(ckpt, 8, 0.0, "avg").eval()
    with torch.no_grad():
        tokens = encoder.eval().forward_features(x)
        assert torch.allclose(encoder(x), tokens[:, 0])
        patches = pooled.forward_features(x)[:, 1:]  # no final norm now
        expected = nn.functional.layer_norm(patches.mean(1), (12,), eps=1e-6)
        assert torch.allclose(pooled(x), expected, atol=1e-6)
    assert isinstance(pooled.norm, nn.Identity) and pooled.global_pool == "avg"
    assert semisup.chosen_recipe("auto", ckpt) == "vit"


def test_token_pooling_is_refused_on_a_resnet(resnet_checkpoint):
    with pytest.raises(ProtocolError, match="pool: avg"):
        finetune.backbone_for_finetuning(read_checkpoint(resnet_checkpoint), 8, 0.1, "token")


def batch(n=8, classes=4):
    return torch.randn(n, 1, 6, 6, generator=torch.Generator().manual_seed(0)), torch.arange(n) % classes


def settings(**changes):
    return {**finetune.DEFAULTS, **changes}


def test_without_mixing_the_targets_are_label_smoothed_one_hots():
    x, y = batch()
    out, targets = finetune.batch_transform(settings(mixup=0.0, cutmix=0.0, random_erasing=0.0), 4, "cpu")(
        x.clone(), y
    )
    assert torch.equal(out, x)
    expected = torch.full((8, 4), 0.1 / 4)
    expected[torch.arange(8), y] = 1 - 0.1 + 0.1 / 4
    assert torch.allclose(targets, expected)


def test_mixup_mixes_each_image_with_the_reversed_batch_and_the_targets_alike():
    x, y = batch()
    finetune.seed_global_generators(0)
    out, targets = finetune.batch_transform(
        settings(cutmix=0.0, random_erasing=0.0, label_smoothing=0.0), 4, "cpu"
    )(x.clone(), y)
    lam = float(targets[0, y[0]]) if y[0] != y[-1] else None
    assert lam is not None and 0 < lam < 1
    assert torch.allclose(out, lam * x + (1 - lam) * x.flip(0), atol=1e-6)
    assert torch.allclose(targets.sum(1), torch.ones(8))
    assert torch.allclose(targets[torch.arange(8), y.flip(0)], torch.full((8,), 1 - lam))


def test_cutmix_pastes_one_box_whose_area_is_one_minus_lambda():
    x, y = batch()
    finetune.seed_global_generators(1)
    out, targets = finetune.batch_transform(
        settings(mixup=0.0, random_erasing=0.0, label_smoothing=0.0), 4, "cpu"
    )(x.clone(), y)
    pasted = (out != x).any(1)  # [n, h, w]: where an image took its partner's pixels
    assert torch.equal(out[pasted.unsqueeze(1)], x.flip(0)[pasted.unsqueeze(1)])
    lam = float(targets[0, y[0]])
    assert pasted[0].float().mean().item() == pytest.approx(1 - lam)


def test_random_erasing_fills_one_box_per_erased_image_with_noise():
    x, y = batch(n=64)
    finetune.seed_global_generators(2)
    erased = finetune.batch_transform(settings(mixup=0.0, cutmix=0.0, random_erasing=1.0), 4, "cpu")(
        x.clone(), y
    )[0]
    changed = (erased != x).any(1)
    assert changed.flatten(1).any(1).all()  # probability 1: every image
    for mask in changed:  # one axis-aligned rectangle each
        rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
        assert mask[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()


# --- the protocol --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def result(mae_checkpoint):
    return finetune.evaluate({"num_classes": 10}, FAST, 0, checkpoint_path=mae_checkpoint)


def test_fine_tuning_learns_the_digits_and_records_how(result):
    metrics, used = result
    assert metrics["top1"] > CHANCE_MARGIN and metrics["top5"] >= metrics["top1"]
    assert used["epochs"] == 4 and used["layer_decay"] == 0.65 and used["deviations"] == finetune.DEVIATIONS
    scales = sorted({g["lr_scale"] for g in used["param_groups"]})
    assert scales == pytest.approx([0.65**k for k in range(5, -1, -1)])  # 4 blocks: L = 5


def test_the_same_seed_gives_the_same_numbers(result, mae_checkpoint):
    again, _ = finetune.evaluate({"num_classes": 10}, FAST, 0, checkpoint_path=mae_checkpoint)
    assert again == result[0]


def test_layer_decay_moves_the_embeddings_less_than_the_last_block(mae_checkpoint):
    """AdamW moves each weight by about its group's lr per step, so the patch embedding (scale d^5)
    moves far less than the last block (scale d)."""
    from sslbench.data.registry import load_data

    ckpt = read_checkpoint(mae_checkpoint)
    data = load_data(ckpt["cfg"])
    used = {**finetune.DEFAULTS, **FAST, "epochs": 1, "mixup": 0.0, "cutmix": 0.0}
    model, _ = finetune.finetune(ckpt, data, used, 0, torch.device("cpu"))

    def moved(name):
        return (model[0].state_dict()[name] - ckpt["encoder"][name]).abs().mean().item()

    last = f"blocks.{len(model[0].blocks) - 1}.attn.qkv.weight"
    assert moved("patch_embed.proj.weight") < 0.65**3 * moved(last)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_size": 63}, r"`evaluation\.finetune\.batch_size`: 63 is not a multiple of 2"),
        ({"batch_size": 4096}, r"`evaluation\.finetune\.batch_size`: .* larger than the 1347 train images"),
    ],
)
def test_a_batch_mixup_cannot_pair_is_refused(mae_checkpoint, change, message):
    with pytest.raises(ProtocolError, match=message):
        finetune.evaluate({"num_classes": 10}, {**FAST, **change}, 0, checkpoint_path=mae_checkpoint)
