"""MoCo v3, ResNet form (methods/mocov3): InfoNCE against the batch's keys, the 2 tau scaling, the
symmetric sum, keys without gradient, the momentum encoder moved by exactly the scheduled m, and the rows
of a rank (the DDP decomposition; tests/methods/test_distributed.py runs it under 2 real gloo processes)."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, random_views, tiny_vit
from torch import nn

from sslbench.kit.losses import batch_info_nce
from sslbench.pretrain.trainer import Trainer


def test_batch_info_nce_by_hand():
    keys = torch.eye(3)  # orthogonal unit keys; each query is its own key
    # logits / T: 1/T on the diagonal, 0 elsewhere: CE = log(1 + 2 exp(-1/T))
    for t in (1.0, 0.5):
        assert batch_info_nce(keys, keys, t).item() == pytest.approx(
            math.log(1 + 2 * math.exp(-1 / t)), rel=1e-6
        )
    assert batch_info_nce(keys, keys, 0.01).item() < 1e-40  # perfectly aligned, T -> 0: L -> 0
    # rows 1..2 of the batch: query i's positive is key first_row + i
    assert batch_info_nce(keys[1:], keys, 1.0, first_row=1).item() == pytest.approx(math.log(1 + 2 / math.e))
    # with the wrong offset each query's "positive" is an orthogonal key: logits (0 | 1, 0)
    assert batch_info_nce(keys[1:], keys, 1.0, first_row=0).item() == pytest.approx(math.log(2 + math.e))
    with pytest.raises(ValueError, match="are not rows"):
        batch_info_nce(keys[1:], keys, 1.0, first_row=2)


def test_a_rank_s_rows_average_to_the_whole_batch_loss():
    # What every DDP rank computes, its queries against the gathered keys with its row offset, averages to
    # the one-process loss over the whole batch (equal shards).
    g = torch.Generator().manual_seed(0)
    q, k = (F.normalize(torch.randn(12, 5, generator=g, dtype=torch.float64), dim=1) for _ in range(2))
    whole = batch_info_nce(q, k, 0.2)
    ranks = [batch_info_nce(q[r * 4 : (r + 1) * 4], k, 0.2, first_row=r * 4) for r in range(3)]
    assert (sum(ranks) / 3).item() == pytest.approx(whole.item(), rel=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.2])
def test_loss_is_2_tau_times_the_summed_cross_entropies(build, temperature):
    method = build("mocov3", temperature=temperature)
    v1, v2 = random_views()
    loss = method.training_loss([v1, v2], None, torch.arange(16))
    q1, q2 = (F.normalize(method.predictor(method.projector(method.backbone(v))), dim=1) for v in (v1, v2))
    k1, k2 = (F.normalize(method.momentum_encoder(v), dim=1) for v in (v1, v2))
    labels = torch.arange(16)
    ce = F.cross_entropy(q1 @ k2.T / temperature, labels) + F.cross_entropy(q2 @ k1.T / temperature, labels)
    torch.testing.assert_close(loss, 2 * temperature * ce)  # builder.py: CrossEntropyLoss x (2 T), summed
    torch.testing.assert_close(method.training_loss([v2, v1], None, labels), loss)  # symmetric


def test_heads_are_moco_v3_s_mlps_and_the_keys_get_no_gradient(build):
    method = build("mocov3", mlp_dim=32, dim=24)
    d = method.feature_dim
    assert [type(m) for m in method.projector] == [
        nn.Linear,
        nn.BatchNorm1d,
        nn.ReLU,
        nn.Linear,
        nn.BatchNorm1d,
    ]
    assert [type(m) for m in method.predictor] == [
        nn.Linear,
        nn.BatchNorm1d,
        nn.ReLU,
        nn.Linear,
    ]  # no last BN
    assert not method.projector[-1].affine  # BatchNorm1d(dim, affine=False)
    linears = [m for mlp in (method.projector, method.predictor) for m in mlp if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(d, 32), (32, 24), (24, 32), (32, 24)]
    assert all(m.bias is None for m in linears)  # _build_mlp: no bias anywhere
    online = [*method.backbone.parameters(), *method.projector.parameters()]
    keys = list(method.momentum_encoder.parameters())
    assert all(torch.equal(k, o) and not k.requires_grad for k, o in zip(keys, online))  # a frozen copy
    method.training_loss(random_views(), None, torch.arange(16)).backward()
    assert all(p.grad is None for p in keys)
    assert all(p.grad is not None for p in [*online, *method.predictor.parameters()] if p.requires_grad)


def test_the_momentum_encoder_moves_by_exactly_the_scheduled_m(tmp_path, method_config):
    # m_0 0.9 over 2 epochs x 21 steps: m_k = 1 - 0.1 (cos(pi k / 42) + 1) / 2, by hand, at steps 0 and 30
    cfg = method_config("mocov3", momentum=0.9)
    trainer = Trainer(METHODS_DIR / "mocov3", cfg, 0, tmp_path, device="cpu", progress=False)
    method, g = trainer.method, torch.Generator().manual_seed(0)
    weights, excluded = trainer.optimizer.param_groups  # LARS adapts the weights, not biases and norms
    assert (weights["exclude_from_lars"], excluded["exclude_from_lars"], excluded["weight_decay"]) == (
        False,
        True,
        0.0,
    )
    assert weights["trust_ratio"] == "update_norm"  # moco/optimizer.py: eta |w| / |g + wd w|
    for k in (0, 30):
        trainer.state.step = k
        idx = torch.randperm(len(trainer.labels), generator=g)[:64]
        batch = trainer.make_views(trainer.data.train.images[idx], g)
        before = [p.detach().clone() for p in method.momentum_encoder.parameters()]
        trainer.train_step(batch, idx, trainer.epoch_context())
        m = 1 - 0.1 * (math.cos(math.pi * k / 42) + 1) / 2
        online = [p.detach() for mod in (method.backbone, method.projector) for p in mod.parameters()]
        for new, old, o in zip(method.momentum_encoder.parameters(), before, online):
            torch.testing.assert_close(new.detach(), m * old + (1 - m) * o, rtol=1e-5, atol=1e-7)


def test_views_are_byol_s_pair_with_crop_min_0_2(tmp_path, method_config):
    trainer = Trainer(
        METHODS_DIR / "mocov3", method_config("mocov3"), 0, tmp_path, device="cpu", progress=False
    )
    first, second = (group.config for group in trainer.view_groups)
    assert (first.blur_p, first.solarise_p, second.blur_p, second.solarise_p) == (1.0, 0.0, 0.1, 0.2)
    assert first.crop_scale == second.crop_scale == (0.2, 1.0)  # --crop-min .2 in every R50 command


# --- the ViT form (moco/builder.py MoCo_ViT, vits.py, main_moco.py's AdamW) -------------------------------


def vit_mocov3(method_config, **params):
    """methods/mocov3 on a tiny timm ViT (3-channel 16-px images), with these settings."""
    from sslbench.kit.method import DataInfo
    from sslbench.plugins import load_method_class

    torch.manual_seed(0)
    info = DataInfo(num_classes=10, num_train=64, channels=3, image_size=16, batch_size=8, epochs=1)
    cfg = method_config("mocov3", mlp_dim=32, dim=16, **params)
    return load_method_class(METHODS_DIR / "mocov3")(tiny_vit(), info, cfg)


VIT_FORM = {"proj_layers": 3, "pred_last_bn": True, "exclude_bias_and_norm": False, "stop_grad_conv1": True}


def test_stop_grad_conv1_freezes_exactly_the_vit_s_patch_projection(method_config):
    from sslbench.kit.method import checked_param_groups
    from sslbench.kit.momentum import checked_momentum_pairs
    from sslbench.optim import make_optimizer

    method = vit_mocov3(method_config, **VIT_FORM)
    frozen = {n for n, p in method.named_parameters() if not p.requires_grad and "momentum_encoder" not in n}
    assert frozen == {"backbone.patch_embed.proj.weight", "backbone.patch_embed.proj.bias"}
    unfrozen = {n for n, p in vit_mocov3(method_config).named_parameters() if not p.requires_grad}
    assert all(n.startswith("momentum_encoder") for n in unfrozen)  # the default (false) freezes nothing
    checked_momentum_pairs(method.momentum_pairs())  # the key encoder pairs every parameter, frozen or not
    # main_moco.py's AdamW(model.parameters(), weight_decay=.1): one group, every trainable tensor decayed
    groups = checked_param_groups(method)
    assert len(groups) == 1 and len(groups[0]["params"]) == sum(p.requires_grad for p in method.parameters())
    train = {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.1}
    optimizer = make_optimizer(groups, train)
    projection = method.backbone.patch_embed.proj
    before = {n: p.detach().clone() for n, p in method.backbone.named_parameters()}
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(8, 3, 16, 16, generator=g) for _ in range(2)]
    method.training_loss(views, None, torch.arange(8)).backward()
    assert projection.weight.grad is None and projection.bias.grad is None
    optimizer.step()
    after = dict(method.backbone.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved == set(before) - {"patch_embed.proj.weight", "patch_embed.proj.bias"}  # norms and biases too


def test_the_vit_form_s_heads_are_moco_vit_s_mlps(method_config):
    method = vit_mocov3(method_config, **VIT_FORM)
    assert [type(m) for m in method.projector] == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * 2 + [
        nn.Linear,
        nn.BatchNorm1d,
    ]  # _build_mlp(3, 48, 32, 16)
    predictor = [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d]
    assert [type(m) for m in method.predictor] == predictor
    assert not method.projector[-1].affine and not method.predictor[-1].affine  # last_bn: BN without affine
    linears = [m for mlp in (method.projector, method.predictor) for m in mlp if isinstance(m, nn.Linear)]
    sizes = [(48, 32), (32, 32), (32, 16), (16, 32), (32, 16)]
    assert [(m.in_features, m.out_features) for m in linears] == sizes


def test_stop_grad_conv1_on_a_resnet_is_a_config_error_naming_the_setting(build):
    from sslbench.errors import ConfigError

    with pytest.raises(ConfigError, match="stop_grad_conv1.*patch_embed.proj.*test_resnet"):
        build("mocov3", stop_grad_conv1=True)
