"""MSN (methods/msn): its loss by hand (me-max is pinned in tests/kit/test_losses.py), sharpening, the
anchor's dropped patches (the encoder does not see them, and with none dropped it is the evaluated network),
the targets from the momentum encoder balanced by the kit's Sinkhorn, its parameter groups and its gradient
clipping. The linear momentum schedule is pinned in tests/methods/test_contract.py, the Sinkhorn in
tests/methods/test_swav.py; tests/methods/test_distributed.py runs MSN under 2 real gloo processes against
one on the whole batch."""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, VIT_P2

from sslbench.errors import ConfigError
from sslbench.kit.clustering import balanced_assignment
from sslbench.plugins import load_method_class

msn = inspect.getmodule(load_method_class(METHODS_DIR / "msn"))


@pytest.fixture
def vit(build):
    def make(**overrides):
        return build(
            "msn", 0, backbone=VIT_P2, **{"num_proto": 8, "output_dim": 16, "hidden_dim": 32, **overrides}
        )

    return make


def images(n=4, seed=1):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_the_loss_by_hand_cross_entropy_to_the_repeated_targets_plus_me_max():
    # two images, two anchor views (view-major rows), three prototypes
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.6, 0.2, 0.2], [0.2, 0.2, 0.6]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
    ce = -(
        math.log(0.5)
        + 0.5 * math.log(0.8)
        + 0.5 * math.log(0.1)
        + math.log(0.6)
        + 0.5 * math.log(0.2)
        + 0.5 * math.log(0.6)
    )
    ce /= 4
    mean = [(0.5 + 0.1 + 0.6 + 0.2) / 4, (0.3 + 0.8 + 0.2 + 0.2) / 4, (0.2 + 0.1 + 0.2 + 0.6) / 4]
    me_max = sum(m * math.log(m) for m in mean) + math.log(3)
    assert float(msn.msn_loss(probs, targets, 0.0, 0.0)) == pytest.approx(ce, rel=1e-6)
    assert float(msn.msn_loss(probs, targets, 1.0, 0.0)) == pytest.approx(ce + me_max, rel=1e-6)
    entropy = -sum(p * math.log(p) for row in probs.tolist() for p in row) / 4
    assert float(msn.msn_loss(probs, targets, 0.5, 2.0)) == pytest.approx(
        ce + 0.5 * me_max + 2 * entropy, rel=1e-6
    )


def test_sharpening_by_hand_and_its_limits():
    p = torch.tensor([[0.2, 0.8]])
    torch.testing.assert_close(msn.sharpen(p, 0.5), torch.tensor([[0.04 / 0.68, 0.64 / 0.68]]))
    torch.testing.assert_close(msn.sharpen(p, 1.0), p)
    assert msn.sharpen(p, 0.01)[0, 1] > 0.999999


def test_the_kept_count_is_the_floor_of_the_kept_fraction():
    assert msn.kept_count(16, 0.15) == 13  # floor(13.6)
    assert msn.kept_count(20, 0.15) == 17
    assert msn.kept_count(16, 0.0) == 16


def test_with_no_patch_dropped_the_anchor_encoder_is_the_evaluated_network(vit):
    method = vit(patch_drop=0.0).eval()
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(method.masked_forward(x), method.backbone(x))


def test_the_anchor_encoder_does_not_see_the_dropped_patches(vit):
    method = vit(patch_drop=0.25).eval()  # 12 of the 16 patches kept
    x = images()
    torch.manual_seed(7)
    dropped = torch.rand(1, 16)[0].argsort()[12:]  # the draw masked_forward makes from the global RNG
    pixel = torch.zeros(16, dtype=torch.bool)
    pixel[dropped] = True
    pixels = pixel.view(4, 4).repeat_interleave(2, 0).repeat_interleave(2, 1)  # [8, 8]
    changed = x.clone()
    changed[:, :, pixels] = torch.randn(4, 1, int(pixels.sum()))
    with torch.no_grad():
        torch.manual_seed(7)
        reference = method.masked_forward(x)
        torch.manual_seed(7)
        torch.testing.assert_close(method.masked_forward(changed), reference)
        seen = x.clone()
        seen[:, :, ~pixels] += 1.0  # a kept patch changed: the output changes
        torch.manual_seed(7)
        assert not torch.allclose(method.masked_forward(seen), reference)


def test_training_loss_targets_are_the_momentum_encoders_sharpened_balanced_assignment(vit):
    method = vit()
    with torch.no_grad():
        # the anchor encoder moves (not by a constant: the ViT's layer norms remove it); the target must not
        weight = method.backbone.patch_embed.proj.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(9)))
    target_view, anchor_view, focal = images(seed=1), images(seed=2), torch.randn(4, 1, 4, 4)
    with torch.no_grad():
        q = msn.sharpen(method.assign(method.target(target_view)), 0.25)
        targets = balanced_assignment(q, 3)
    torch.manual_seed(3)
    loss = method.training_loss([target_view, anchor_view, focal], None, torch.arange(4))
    torch.manual_seed(3)
    anchors = torch.cat(
        [method.head(method.masked_forward(anchor_view)), method.head(method.backbone(focal))]
    )
    expected = msn.msn_loss(method.assign(anchors), targets, 1.0, 0.0)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is None for p in method.target.parameters())
    assert method.prototypes.grad is not None and method.backbone.patch_embed.proj.weight.grad is not None


def test_the_assignment_is_the_softmax_of_the_cosines_to_the_prototypes_over_tau(vit):
    method = vit(temperature=0.5)
    z = torch.randn(3, 16)
    cosines = F.normalize(z, dim=1) @ F.normalize(method.prototypes.detach(), dim=1).T
    torch.testing.assert_close(method.assign(z), torch.softmax(cosines / 0.5, dim=1))


def test_no_weight_decay_on_biases_norms_and_prototypes_and_the_prototypes_gradient_is_not_clipped(vit):
    method = vit(clip_grad=0.5)
    decayed, free = (group["params"] for group in method.param_groups())
    ids = lambda params: {id(p) for p in params}  # noqa: E731
    assert {id(method.prototypes), id(method.head[1].weight), id(method.backbone.norm.weight)} <= ids(free)
    assert "weight_decay" not in method.param_groups()[0] and method.param_groups()[1]["weight_decay"] == 0.0
    trained = [p for p in method.parameters() if p.requires_grad]
    assert ids(decayed) | ids(free) == ids(trained) and not ids(decayed) & ids(free)
    for p in trained:
        p.grad = torch.ones_like(p)
    method.on_before_step(None)
    encoder = [p.grad.norm() for m in (method.backbone, method.head) for p in m.parameters()]
    assert float(torch.linalg.vector_norm(torch.stack(encoder))) == pytest.approx(0.5, rel=1e-4)
    torch.testing.assert_close(method.prototypes.grad, torch.ones_like(method.prototypes))


def test_the_evaluated_encoder_is_the_target_backbone(vit):
    method = vit()
    assert method.encoder() is method.target[0] and method.projection_head() is method.target[1]


def test_a_drop_that_keeps_no_patch_is_refused_naming_the_config(vit):
    with pytest.raises(
        ConfigError, match="methods/msn/config.yaml: patch_drop 0.95 keeps no patch of the 16"
    ):
        vit(patch_drop=0.95)
