"""SimSiam (methods/simsiam): the symmetrised negative cosine, its stop-gradient, the heads of builder.py
and the predictor's fixed learning rate (--fix-pred-lr) through the engine's schedule."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, random_views
from torch import nn

from sslbench.kit.losses import negative_cosine
from sslbench.pretrain.trainer import Trainer


def grads(method):
    return {name: p.grad.clone() for name, p in method.named_parameters() if p.grad is not None}


def test_negative_cosine_by_hand():
    p = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [1.0, 0.0]])
    z = torch.tensor([[4.0, 0.0], [1.0, 0.0], [-1.0, -1.0], [1.0, 1.0]])
    # -cos = -1, 0, 1, -1/sqrt(2): mean (-1 + 0 + 1 - 0.7071) / 4
    assert negative_cosine(p, z).item() == pytest.approx(-1 / math.sqrt(2) / 4, rel=1e-6)
    assert negative_cosine(z, z).item() == pytest.approx(-1.0)  # the minimum: p = z


def test_loss_is_the_mean_of_both_directions_and_symmetric_in_the_views(build):
    method = build("simsiam")
    v1, v2 = random_views()
    loss = method.training_loss([v1, v2], None, torch.arange(16))
    z1, z2 = (method.projector(method.backbone(v)) for v in (v1, v2))
    p1, p2 = method.predictor(z1), method.predictor(z2)
    expected = (
        -(F.cosine_similarity(p1, z2).mean() + F.cosine_similarity(p2, z1).mean()) * 0.5
    )  # main_simsiam.py
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(method.training_loss([v2, v1], None, torch.arange(16)), loss)
    assert -1 <= loss.item() <= 1


def test_the_projections_enter_the_loss_as_constants(build):
    # The gradient is that of D(p1, sg(z2)) / 2 + D(p2, sg(z1)) / 2: it reaches the encoder only through
    # the predictions. Without the stop-gradient it differs.
    method = build("simsiam")
    v = random_views()
    method.training_loss(v, None, torch.arange(16)).backward()
    got = grads(method)

    def reference(stop_gradient):
        method.zero_grad()
        z1, z2 = (method.projector(method.backbone(x)) for x in v)
        sg = (lambda z: z.detach()) if stop_gradient else (lambda z: z)
        p1, p2 = method.predictor(z1), method.predictor(z2)
        (-(F.cosine_similarity(p1, sg(z2)).mean() + F.cosine_similarity(p2, sg(z1)).mean()) / 2).backward()
        return grads(method)

    expected, without = reference(True), reference(False)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)
    first = next(name for name in expected if name.startswith("backbone."))
    assert not torch.allclose(got[first], without[first])


def test_heads_are_builder_py_s(build):
    method = build("simsiam", dim=48, pred_dim=12)
    d = method.feature_dim
    kinds = [type(m) for m in method.projector]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * 2 + [nn.Linear, nn.BatchNorm1d]  # 3 layers
    linears = [m for m in method.projector if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(d, d), (d, d), (d, 48)]
    assert all(m.bias is None for m in linears)  # the last one's bias is frozen in builder.py: BN removes it
    assert not method.projector[-1].affine  # BatchNorm1d(dim, affine=False) on the output
    first, bn, _, last = method.predictor
    assert (first.in_features, first.out_features, last.out_features) == (48, 12, 48)  # the bottleneck
    assert first.bias is None and last.bias is not None and isinstance(bn, nn.BatchNorm1d)
    assert len(build("simsiam", proj_layers=2).projector) == 5  # the paper's CIFAR variant


def test_the_predictor_keeps_its_lr_while_the_encoder_follows_the_cosine(tmp_path, method_config):
    trainer = Trainer(
        METHODS_DIR / "simsiam", method_config("simsiam"), 0, tmp_path, device="cpu", progress=False
    )
    encoder, predictor = trainer.optimizer.param_groups
    method = trainer.method
    assert {id(p) for p in predictor["params"]} == {id(p) for p in method.predictor.parameters()}
    assert len(encoder["params"]) == len([*method.backbone.parameters(), *method.projector.parameters()])
    assert encoder["weight_decay"] == predictor["weight_decay"] == 1e-4  # every parameter decayed
    g = torch.Generator().manual_seed(0)
    trainer.state.step = 30  # of 2 epochs x 21 steps
    idx = torch.randperm(len(trainer.labels), generator=g)[:64]
    trainer.train_step(trainer.make_views(trainer.data.train.images[idx], g), idx, trainer.epoch_context())
    cosine = 0.06 * (1 + math.cos(math.pi * 30 / 42)) / 2
    assert encoder["lr"] == pytest.approx(cosine)
    assert predictor["lr"] == 0.06  # main_simsiam.py: fix_lr groups keep init_lr
