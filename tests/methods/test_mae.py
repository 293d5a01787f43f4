"""MAE (methods/mae): random masking, patchify, the masked (norm-pix) loss, the encoder on the kept
patches through the backbone's own timm modules, the decoder's unshuffling and sin-cos tables, the
initialisation and parameter groups of models_mae.py / main_pretrain.py, and training on a tiny ViT.

References here are written from the description of facebookresearch/mae (models_mae.py,
util/pos_embed.py), in float64 and plain Python where it helps, not with the method's code."""

import inspect
import math

import pytest
import torch
from support import METHODS_DIR, fixed_batch_losses
from torch import nn

from sslbench.errors import ConfigError
from sslbench.kit.vit import batch_draw
from sslbench.plugins import load_method_class
from sslbench.pretrain.trainer import Trainer, build_backbone

mae = inspect.getmodule(load_method_class(METHODS_DIR / "mae"))  # its functions: masking, patchify, loss

# A tiny ViT on the tiny suite's 8-px digits: patch 2, a 4 x 4 grid of 16 patches (4 kept at 0.75).
VIT_P2 = {
    "name": "vit_tiny_patch16_224",
    "small_stem": False,
    "args": {"patch_size": 2, "depth": 2, "num_heads": 3, "embed_dim": 48},
}


@pytest.fixture
def vit(suite_config, build):
    """make(seed, backbone_args, **overrides): mae built on the tiny ViT (its `backbone` set to it in
    method_overrides, over the one of its config.yaml; ``backbone_args`` added to its args), with these
    method settings."""

    def make(seed=0, backbone_args=None, **overrides):
        backbone = {**VIT_P2, "args": {**VIT_P2["args"], **(backbone_args or {})}}
        return build("mae", seed, backbone=backbone, **overrides)

    return make


# --- masking ---------------------------------------------------------------------------------------


def reference_masking(x, ratio, noise):
    """Per image: the patches sorted by their noise (ascending); the first int(L (1 - ratio)) kept in
    that order; mask 1 for the others; ids_restore[i] = the rank of patch i in the sorted order."""
    n, length, _ = x.shape
    keep = int(length * (1 - ratio))
    kept, masks, restores = [], [], []
    for b in range(n):
        order = sorted(range(length), key=lambda i: float(noise[b, i]))
        rank = {patch: r for r, patch in enumerate(order)}
        kept.append(torch.stack([x[b, i] for i in order[:keep]]))
        masks.append([0.0 if rank[i] < keep else 1.0 for i in range(length)])
        restores.append([rank[i] for i in range(length)])
    return torch.stack(kept), torch.tensor(masks, dtype=torch.float64), torch.tensor(restores)


@pytest.mark.parametrize("length, ratio", [(16, 0.75), (7, 0.5), (49, 0.75), (10, 0.3)])
def test_random_masking_matches_the_reference_on_the_same_noise(length, ratio):
    g = torch.Generator().manual_seed(length)
    x = torch.randn(3, length, 5, generator=g, dtype=torch.float64)
    noise = torch.rand(3, length, generator=g, dtype=torch.float64)
    kept, mask, ids_restore = mae.random_masking(x, ratio, noise)
    want_kept, want_mask, want_restore = reference_masking(x, ratio, noise)
    keep = int(length * (1 - ratio))  # models_mae.py's int(): 7 x 0.5 keeps 3 (round() would keep 4)
    assert kept.shape == (3, keep, 5)
    torch.testing.assert_close(kept, want_kept, rtol=0, atol=0)
    torch.testing.assert_close(mask, want_mask, rtol=0, atol=0)
    assert torch.equal(ids_restore, want_restore)
    assert (mask.sum(dim=1) == length - keep).all()  # exactly `keep` kept in every image


def test_masking_draws_its_noise_from_the_global_rng():
    x = torch.randn(4, 16, 3)
    torch.manual_seed(5)
    _, first, _ = mae.random_masking(x, 0.75)
    torch.manual_seed(5)
    _, again, _ = mae.random_masking(x, 0.75)
    _, other, _ = mae.random_masking(x, 0.75)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert len({tuple(row.tolist()) for row in first}) > 1  # per-image masks


def test_training_draws_the_whole_batch_s_noise_from_the_global_rng(vit):
    # One process: torch.rand(batch, L), as random_masking's own draw. Under DDP every rank takes its rows
    # of rank 0's draw for the whole batch (2 processes = 1 process: tests/methods/test_distributed.py).
    method = vit()
    torch.manual_seed(3)
    noise = batch_draw(4, 16, torch.device("cpu"))
    torch.manual_seed(3)
    assert torch.equal(noise, torch.rand(4, 16))
    x = torch.randn(4, 1, 8, 8)
    torch.manual_seed(3)
    first = method.training_loss([x], None, torch.arange(4))
    torch.manual_seed(3)
    assert method.training_loss([x], None, torch.arange(4)).item() == first.item()
    assert method.training_loss([x], None, torch.arange(4)).item() != first.item()  # another mask


# --- patches ---------------------------------------------------------------------------------------


def test_patchify_orders_each_patch_by_row_then_column_then_channel():
    c, size, p = 3, 4, 2
    channel, row, col = torch.meshgrid(torch.arange(c), torch.arange(size), torch.arange(size), indexing="ij")
    image = (100 * channel + 10 * row + col).float()[None]  # each value says its (c, row, col)
    patches = mae.patchify(image, p)
    assert patches.shape == (1, 4, p * p * c)
    # patch 1 is the grid's row 0, column 1 (pixel columns 2-3): pixels (0,2) (0,3) (1,2) (1,3), each RGB
    assert patches[0, 1].tolist() == [2, 102, 202, 3, 103, 203, 12, 112, 212, 13, 113, 213]
    assert patches[0, 2].tolist()[:3] == [20, 120, 220]  # patch 2: the grid's row 1, column 0
    for k in range(4):  # every patch against the definition
        i, j = divmod(k, 2)
        want = [
            100 * ch + 10 * (i * p + r) + (j * p + q) for r in range(p) for q in range(p) for ch in range(c)
        ]
        assert patches[0, k].tolist() == want


def test_unpatchify_inverts_patchify():
    x = torch.randn(2, 3, 8, 12)
    patches = mae.patchify(x, 4)
    assert patches.shape == (2, 6, 48)
    assert torch.equal(mae.unpatchify(patches, 4, 3, (2, 3)), x)


# --- the loss --------------------------------------------------------------------------------------


def reference_loss(pred, target, mask, norm_pix):
    total, removed = 0.0, 0.0
    for b in range(pred.shape[0]):
        for i in range(pred.shape[1]):
            t = [float(v) for v in target[b, i]]
            if norm_pix:
                mean = sum(t) / len(t)
                var = sum((v - mean) ** 2 for v in t) / (len(t) - 1)
                t = [(v - mean) / math.sqrt(var + 1e-6) for v in t]
            err = sum((float(pv) - tv) ** 2 for pv, tv in zip(pred[b, i], t)) / len(t)
            total += err * float(mask[b, i])
            removed += float(mask[b, i])
    return total / removed


@pytest.mark.parametrize("norm_pix", [False, True])
def test_loss_equals_the_reference_and_only_removed_patches_count(norm_pix):
    g = torch.Generator().manual_seed(1)
    pred = torch.randn(2, 6, 12, generator=g, dtype=torch.float64)
    target = 3 * torch.randn(2, 6, 12, generator=g, dtype=torch.float64) + 1
    mask = torch.tensor([[1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 0]], dtype=torch.float64)
    loss = mae.masked_patch_loss(pred, target, mask, norm_pix)
    assert loss.item() == pytest.approx(reference_loss(pred, target, mask, norm_pix), rel=1e-12)
    visible, removed = pred.clone(), pred.clone()
    visible[0, 1] += 5.0  # a kept patch's prediction
    removed[0, 2] += 5.0  # a removed patch's prediction
    assert mae.masked_patch_loss(visible, target, mask, norm_pix).item() == loss.item()
    assert mae.masked_patch_loss(removed, target, mask, norm_pix).item() != pytest.approx(loss.item())


def test_norm_pix_targets_have_per_patch_mean_0_and_unbiased_variance_1():
    target = 5 * torch.randn(4, 9, 16, dtype=torch.float64) + torch.arange(9.0, dtype=torch.float64)[:, None]
    normed = mae.normalised_patches(target)
    torch.testing.assert_close(normed.mean(-1), torch.zeros(4, 9, dtype=torch.float64))
    torch.testing.assert_close(normed.var(-1, unbiased=True), torch.ones(4, 9, dtype=torch.float64))


# --- the encoder -----------------------------------------------------------------------------------


def test_encoder_without_masking_is_the_backbone_s_own_forward(vit):
    method = vit().eval()
    x = torch.randn(3, 1, 8, 8)
    in_order = torch.arange(16.0).expand(3, 16)  # noise that keeps the patches in their order
    latent, mask, ids_restore = method.forward_encoder(x, 0.0, in_order)
    assert not mask.any() and torch.equal(ids_restore, torch.arange(16).expand(3, 16))
    features = method.backbone.forward_features(x)
    torch.testing.assert_close(latent, features)
    torch.testing.assert_close(latent[:, 0], features[:, 0])  # the class token after the final norm
    torch.testing.assert_close(method.encoder()(x), latent[:, 0])  # what is evaluated


def test_encoder_sees_only_the_kept_patches(vit):
    method = vit().eval()
    x = torch.randn(2, 1, 8, 8)
    noise = torch.rand(2, 16)
    latent, mask, _ = method.forward_encoder(x, 0.75, noise)
    assert latent.shape == (2, 1 + 4, 48)
    patches = mae.patchify(x, 2)
    removed, kept = int(mask[0].nonzero()[0]), int((mask[0] == 0).nonzero()[0])
    for patch, changes in ((removed, False), (kept, True)):
        edited = patches.clone()
        edited[0, patch] += 3.0
        out, _, _ = method.forward_encoder(mae.unpatchify(edited, 2, 1, (4, 4)), 0.75, noise)
        assert torch.equal(out[1], latent[1])  # the other image is untouched
        assert torch.equal(out[0], latent[0]) != changes


def test_decoder_puts_each_kept_token_back_at_its_patch_and_mask_tokens_elsewhere(vit):
    method = vit().eval()
    x = torch.randn(2, 1, 8, 8)
    latent, mask, ids_restore = method.forward_encoder(x, 0.75, torch.rand(2, 16))
    seen = {}
    hook = method.decoder_blocks.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    pred = method.forward_decoder(latent, ids_restore)
    hook.remove()
    assert pred.shape == (2, 16, 4)  # 2 x 2 pixels of 1 channel per patch
    tokens = seen["x"] - method.decoder_pos_embed
    embedded = method.decoder_embed(latent)
    for b in range(2):
        torch.testing.assert_close(tokens[b, 0], embedded[b, 0])  # the class token first
        for i in range(16):
            want = method.mask_token[0, 0] if mask[b, i] else embedded[b, 1 + int(ids_restore[b, i])]
            torch.testing.assert_close(tokens[b, 1 + i], want)
    torch.testing.assert_close(
        method.decoder_pos_embed[0], mae.sincos_pos_embed(64, (4, 4), cls_token=True), rtol=0, atol=0
    )


def test_encoder_position_embedding_fixed_sincos_or_timm_s_learned(vit):
    method = vit()
    pos = method.backbone.pos_embed
    assert not pos.requires_grad
    torch.testing.assert_close(pos[0], mae.sincos_pos_embed(48, (4, 4), cls_token=True), rtol=0, atol=0)
    learned = vit(sincos_pos_embed=False).backbone.pos_embed
    assert learned.requires_grad and learned[0, 0].any()


def test_every_trainable_parameter_gets_a_gradient(vit):
    # Through the kept patches to the patch embedding, the class token and every block: nothing unused
    # (DDP here runs without find_unused_parameters).
    method = vit()
    method.training_loss([torch.randn(4, 1, 8, 8)], None, torch.arange(4)).backward()
    for name, param in method.named_parameters():
        if param.requires_grad:
            assert param.grad is not None and param.grad.abs().sum() > 0, name


# --- initialisation and parameter groups -----------------------------------------------------------


def test_new_modules_are_initialised_as_models_mae_and_the_backbone_keeps_timm_s(vit, digits):
    method = vit()
    assert 0.01 < method.mask_token.std().item() < 0.03  # normal(std 0.02) over 64 values
    new = [m for m in method.modules() if m not in set(method.backbone.modules())]
    linears = [m for m in new if isinstance(m, nn.Linear)]
    assert len(linears) == 2 + 2 * 4  # decoder_embed, decoder_pred, and qkv, proj, fc1, fc2 per block
    for layer in linears:
        bound = math.sqrt(6 / (layer.in_features + layer.out_features))  # xavier_uniform
        assert layer.weight.abs().max().item() <= bound and layer.weight.abs().max().item() > 0.9 * bound
        assert not layer.bias.any()
    norms = [m for m in new if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 1 + 2 * 2 and all(n.eps == 1e-6 for n in norms)
    assert all(n.weight.eq(1).all() and not n.bias.any() for n in norms)
    fresh = build_backbone(method.cfg, digits, 0)  # the same seed: timm's init, position embedding aside
    for (name, got), (_, want) in zip(method.backbone.state_dict().items(), fresh.state_dict().items()):
        if name != "pos_embed":
            assert torch.equal(got, want), name


def test_weight_decay_on_every_tensor_above_one_dimension_tokens_included(vit):
    method = vit()
    decayed, excluded = method.param_groups()
    assert "weight_decay" not in decayed and excluded["weight_decay"] == 0.0
    ids = lambda group: {id(p) for p in group["params"]}
    names = {id(p): n for n, p in method.named_parameters()}
    tokens_and_patches = {"mask_token", "backbone.cls_token", "backbone.patch_embed.proj.weight"}
    assert {names[i] for i in ids(decayed)} >= tokens_and_patches  # add_weight_decay: decayed (3-D, 4-D)
    assert all(p.ndim > 1 for p in decayed["params"]) and all(p.ndim == 1 for p in excluded["params"])
    trainable = {id(p) for p in method.parameters() if p.requires_grad}
    assert ids(decayed) | ids(excluded) == trainable and not ids(decayed) & ids(excluded)
    assert id(method.backbone.pos_embed) not in trainable  # frozen sin-cos: in no group
    assert "decoder_pos_embed" in dict(method.named_buffers())


# --- training and refusals -------------------------------------------------------------------------


def test_training_lowers_the_loss_on_a_fixed_batch(suite_config, method_config, tmp_path):
    suite_config["backbone"] = dict(VIT_P2)
    cfg = method_config("mae", train={"lr": 3.0e-4, "warmup_epochs": 0})
    trainer = Trainer(METHODS_DIR / "mae", cfg, 0, tmp_path, device="cpu", progress=False)
    assert trainer.method.num_views == 1
    assert cfg["augment"] == {"preset": "supervised", "crop_scale": [0.2, 1.0]}  # crop + flip, no colour
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.05, 0.0]
    torch.manual_seed(0)
    losses = fixed_batch_losses(trainer, steps=20, labelled=False)
    assert all(math.isfinite(v) for v in losses)
    # a fresh mask every step (the global RNG); predicting 0 everywhere would give (n - 1) / n = 0.75
    assert sum(losses[-3:]) / 3 < 0.7 * losses[0], losses
    fresh = Trainer(
        METHODS_DIR / "mae", method_config("mae"), 0, tmp_path / "run", device="cpu", progress=False
    )
    fresh.fit()  # the engine's loop: one view per image, the config's own recipe
    assert len(fresh.log_rows) == 2 and all(math.isfinite(row["loss"]) for row in fresh.log_rows)


def test_a_resnet_backbone_is_refused_naming_backbone_name(method_config):
    """MAE's config.yaml names a ViT; a run whose settings name a ResNet instead is refused."""
    import timm

    from sslbench.kit.method import DataInfo

    cfg = method_config("mae")
    cfg["backbone"] = {"name": "test_resnet", "small_stem": False}
    info = DataInfo(num_classes=10, num_train=100, channels=1, image_size=8, batch_size=64, epochs=2)
    named = r"Vision Transformer.*`backbone.name` = 'test_resnet'.*Set `backbone.name`"
    with pytest.raises(ConfigError, match=named):
        load_method_class(METHODS_DIR / "mae")(
            timm.create_model("test_resnet", num_classes=0, in_chans=1), info, cfg
        )


def test_a_mask_ratio_that_keeps_no_patch_is_refused(vit):
    with pytest.raises(ConfigError, match="mask_ratio 0.95 keeps 0 of the 16 patches"):
        vit(mask_ratio=0.95)


def test_a_vit_without_its_class_token_path_is_refused(vit):
    with pytest.raises(ConfigError, match=r"global_pool 'avg'"):
        vit(backbone_args={"global_pool": "avg"})
