"""NNCLR (methods/nnclr): the loss of the paper's Algorithm 1 by hand, its reduction to InfoNCE between a
view's projection and the other view's prediction when each embedding's nearest neighbour is itself, the
support set taking z1 after the lookup, and the heads. tests/methods/test_distributed.py runs it under 2
real gloo processes against one on the whole batch."""

import torch
import torch.nn.functional as F
from support import random_views
from torch import nn

from sslbench.kit.losses import batch_info_nce


def embeddings(method, views):
    z1, z2 = (method.projector(method.backbone(v)) for v in views)
    return z1, z2, method.predictor(z1), method.predictor(z2)


def cross_entropy(a, b, temperature):
    logits = F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / temperature
    return F.cross_entropy(logits, torch.arange(len(a)))


def test_loss_by_hand_from_the_support_set_before_the_step(build):
    method = build("nnclr", temperature=0.2)
    views = random_views()
    support = method.support.keys.clone()
    with torch.no_grad():
        z1, z2, p1, p2 = embeddings(method, views)
    nn1 = support[(F.normalize(z1, dim=1) @ support.T).argmax(dim=1)]
    nn2 = support[(F.normalize(z2, dim=1) @ support.T).argmax(dim=1)]
    expected = (cross_entropy(nn1, p2, 0.2) + cross_entropy(nn2, p1, 0.2)) / 2
    torch.testing.assert_close(method.training_loss(views, None, torch.arange(16)), expected)


def test_with_every_embedding_its_own_neighbour_it_is_infonce_of_projection_against_prediction(build):
    method = build("nnclr")
    views = random_views(seed=1)
    with torch.no_grad():
        z1, z2, p1, p2 = embeddings(method, views)
        method.support.keys[:32] = F.normalize(torch.cat([z1, z2]), dim=1)  # NN(z) = z
    t = method.temperature
    expected = (
        batch_info_nce(F.normalize(z1, dim=1), F.normalize(p2, dim=1), t)
        + batch_info_nce(F.normalize(z2, dim=1), F.normalize(p1, dim=1), t)
    ) / 2
    torch.testing.assert_close(method.training_loss(views, None, torch.arange(16)), expected)


def test_the_support_set_takes_the_first_view_s_projections_after_the_lookup(build):
    method = build("nnclr")
    views = random_views(seed=2)
    before = method.support.keys.clone()
    loss = method.training_loss(views, None, torch.arange(16))
    with torch.no_grad():
        z1 = method.projector(method.backbone(views[0]))
    assert torch.allclose(method.support.keys[:16], F.normalize(z1, dim=1), atol=1e-6)
    assert torch.equal(method.support.keys[16:], before[16:]) and int(method.support.pointer) == 16
    # the batch's own z1 were not in the support set when it was searched: the loss is the one of `before`
    method.support.keys.copy_(before)
    method.support.pointer.zero_()
    torch.testing.assert_close(method.training_loss(views, None, torch.arange(16)), loss)


def test_the_loss_is_symmetric_and_only_the_predictions_carry_gradient(build):
    method = build("nnclr")
    v1, v2 = random_views(seed=3)
    before = method.support.keys.clone()
    loss = method.training_loss([v1, v2], None, torch.arange(16))
    method.support.keys.copy_(before)
    torch.testing.assert_close(method.training_loss([v2, v1], None, torch.arange(16)), loss)
    # with the predictions detached nothing in the loss has a gradient: the neighbours carry none
    method.predictor = nn.Sequential(method.predictor, Detach())
    assert not method.training_loss([v1, v2], None, torch.arange(16)).requires_grad


class Detach(nn.Module):
    def forward(self, x):
        return x.detach()


def test_heads_are_the_paper_s_three_and_two_layer_mlps(build):
    method = build("nnclr", proj_hidden_dim=32, pred_hidden_dim=48, proj_dim=24)
    d = method.feature_dim
    assert [type(m) for m in method.projector] == [
        nn.Linear,
        nn.BatchNorm1d,
        nn.ReLU,
        nn.Linear,
        nn.BatchNorm1d,
        nn.ReLU,
        nn.Linear,
        nn.BatchNorm1d,
    ]
    assert [type(m) for m in method.predictor] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    linears = [m for mlp in (method.projector, method.predictor) for m in mlp if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (d, 32),
        (32, 32),
        (32, 24),
        (24, 48),
        (48, 24),
    ]
    assert all(m.bias is not None for m in linears) and method.projector[-1].affine
    assert method.support.keys.shape[1] == 24
