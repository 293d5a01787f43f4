"""I-JEPA (methods/ijepa): the loss against train.py's step written out image by image (the context's
patches encoded alone, the predictor on them and one target's mask tokens, the layer-normed target patches,
smooth L1), the context encoding blind to every other patch, the predictor's initialisation, the fixed
positions, the evaluated target encoder and its momentum, the parameter groups and the settings refused. The
masks are pinned in tests/kit/test_vit.py; under 2 processes everything is one process's on the whole batch:
tests/methods/test_distributed.py."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, TINY_IJEPA, random_views

from sslbench.errors import ConfigError
from sslbench.kit.vit import encode_kept, masked_tokens, sincos_pos_embed
from sslbench.plugins import load_method_class

ijepa = inspect.getmodule(load_method_class(METHODS_DIR / "ijepa"))

BATCH = 6


@pytest.fixture
def method(build):
    return build("ijepa", 0, **TINY_IJEPA).eval()  # eval: no dropout; the same outputs on every call


def test_repeat_interleave_batch_repeats_each_chunk_of_the_batch_in_place():
    x = torch.arange(4)
    assert ijepa.repeat_interleave_batch(x, 2, 2).tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert ijepa.repeat_interleave_batch(x, 2, 1).tolist() == [0, 1, 2, 3]


def loss_by_the_formula(method, images, context, targets):
    """train.py's step for each (image, context mask, target mask) on its own: the context's patches (their
    positions added first) through the encoder; the predictor on [its embedding + the context's positions,
    the mask token + the target's positions]; the target encoder's layer-normed tokens at the target's
    patches; smooth L1 averaged over every prediction's entries."""
    vit, pred = method.backbone, method.predictor
    pos = sincos_pos_embed(pred.embed.out_features, method.grid, cls_token=False)
    errors = []
    for b in range(images.shape[0]):
        image = images[b : b + 1]
        tokens = vit.patch_embed(image).flatten(1, -2) + vit.pos_embed
        h = masked_tokens(method.target_encoder[0], image)[0]
        h = F.layer_norm(h, h.shape[-1:])
        for c in context:
            z = vit.norm(vit.blocks(tokens[0, c[b]][None]))[0]
            for t in targets:
                x = torch.cat([pred.embed(z) + pos[c[b]], pred.mask_token[0] + pos[t[b]]])
                out = pred.proj(pred.norm(pred.blocks(x[None]))[0, len(c[b]) :])
                errors.append(F.smooth_l1_loss(out, h[t[b]], reduction="none"))
    return torch.cat(errors).mean()


@pytest.mark.parametrize("num_enc_masks", [1, 2])
def test_the_loss_is_train_py_s_step_written_out_image_by_image(build, num_enc_masks):
    method = build("ijepa", 0, num_enc_masks=num_enc_masks, **TINY_IJEPA).eval()
    with torch.no_grad():  # a target encoder apart from the encoder, as after some momentum steps, and a
        for p in method.target_encoder.parameters():  # predictor whose outputs depend on the context more
            p.add_(0.05 * torch.randn_like(p))  # than at its 0.02-std initialisation
        for p in method.predictor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    images = random_views(0, BATCH)[0]
    torch.manual_seed(3)
    context, targets = method.draw_masks(BATCH, "cpu")
    assert len(context) == num_enc_masks and len(targets) == 4
    torch.manual_seed(3)
    loss = method.training_loss([images], None, None)
    torch.testing.assert_close(loss, loss_by_the_formula(method, images, context, targets))


def test_the_context_encoding_sees_the_context_s_patches_only(method):
    images = random_views(0, BATCH)[0]
    torch.manual_seed(0)
    context, _ = method.draw_masks(BATCH, "cpu")
    patch = images.shape[-1] // method.grid[1]
    inside = int(context[0][0, 0])
    outside = next(i for i in range(method.grid[0] * method.grid[1]) if i not in context[0][0].tolist())
    z = encode_kept(method.backbone, images, context)

    def edited(index):
        x = images.clone()
        row, col = divmod(index, method.grid[1])
        x[0, :, row * patch : (row + 1) * patch, col * patch : (col + 1) * patch] += 1.0
        return encode_kept(method.backbone, x, context)

    assert torch.equal(edited(outside), z)
    assert not torch.allclose(edited(inside)[0], z[0])


def test_the_predictor_is_initialised_as_vision_transformer_predictor():
    torch.manual_seed(0)
    pred = ijepa.Predictor((8, 8), 96, 48, 3, 3)
    assert torch.equal(pred.pos_embed[0], sincos_pos_embed(48, (8, 8), cls_token=False))
    assert not any(p is pred.pos_embed for p in pred.parameters())  # fixed: a buffer
    for layer, block in enumerate(pred.blocks, start=1):  # trunc_normal 0.02 / sqrt(2 x layer)
        for weight in (block.attn.proj.weight, block.mlp.fc2.weight):
            assert weight.std().item() == pytest.approx(0.02 / (2 * layer) ** 0.5, rel=0.1)
        assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
        assert not block.attn.qkv.bias.any()
    assert pred.mask_token.std().item() == pytest.approx(0.02, rel=0.25)


def test_the_encoder_s_positions_are_fixed_and_the_target_encoder_is_evaluated_and_moved(method):
    grid_table = sincos_pos_embed(method.feature_dim, method.grid, cls_token=False)
    for vit in (method.backbone, method.target_encoder[0]):
        assert vit.cls_token is None and torch.equal(vit.pos_embed[0], grid_table)
        assert not vit.pos_embed.requires_grad
    assert method.encoder() is method.target_encoder[0]
    assert all(not p.requires_grad for p in method.target_encoder.parameters())
    [(online, target)] = method.momentum_pairs()
    assert online == [method.backbone] and target is method.target_encoder
    images = random_views(0, BATCH)[0]
    torch.testing.assert_close(  # the features: the target's patch tokens after the final norm, averaged
        method.encoder()(images), masked_tokens(method.target_encoder[0], images).mean(dim=1)
    )


def test_weight_decay_spares_biases_and_1d_tensors_of_encoder_and_predictor(method):
    decayed, spared = method.param_groups()
    assert spared["weight_decay"] == 0.0
    assert any(p is method.predictor.mask_token for p in decayed["params"])  # 3-D: decayed, as init_opt
    assert all(p.ndim > 1 for p in decayed["params"]) and all(p.ndim <= 1 for p in spared["params"])
    trained = [p for p in [*method.backbone.parameters(), *method.predictor.parameters()] if p.requires_grad]
    assert len(decayed["params"]) + len(spared["params"]) == len(trained)


def test_settings_it_cannot_run_are_refused_naming_the_key(build):
    with pytest.raises(ConfigError, match="min_keep 4"):
        build("ijepa", 0, pred_mask_scale=[0.2, 0.3])  # 2 x 2 target blocks of the 8-px digits' 4 x 4 grid
    with pytest.raises(ConfigError, match="pred_dim 40 must be divisible by the encoder's 3 heads"):
        build("ijepa", 0, pred_dim=40, **TINY_IJEPA)
    with pytest.raises(ConfigError, match="class_token false"):
        build("ijepa", 0, backbone={"args": {"class_token": True, "global_pool": "token"}}, **TINY_IJEPA)
