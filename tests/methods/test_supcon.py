"""SupCon: the loss is `supcon` on the projected views, reduces to SimCLR, and trains."""

import pytest
import torch
import torch.nn.functional as F
from support import assert_trains
from torch import nn

from sslbench.kit.losses import supcon
from sslbench.kit.method import embed_views


def batch(seed=0, size=12, num_classes=3):
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(size, 1, 8, 8, generator=g) for _ in range(2)]
    labels = torch.randint(0, num_classes, (size,), generator=g)
    return views, labels, torch.arange(size)


def test_projection_head_is_supcontrast_mlp(build):
    method = build("supcon")
    d = method.feature_dim
    linears = [m for m in method.projector if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(d, d), (d, 128)]
    assert isinstance(method.projector[1], nn.ReLU)
    assert method.num_views == 2 and method.needs_labels and method.encoder() is method.backbone


def test_loss_is_supcon_on_projected_features(build):
    method = build("supcon")
    views, labels, idx = batch()
    loss = method.training_loss(views, labels, idx)
    z = F.normalize(
        method.projector(method.backbone(torch.cat(views))), dim=1
    )  # SupContrast: cat, then forward
    expected = supcon(torch.stack(z.chunk(2), dim=1), labels, temperature=0.1, base_temperature=0.07)
    torch.testing.assert_close(loss, expected)
    # The labels matter: shuffled labels give another loss.
    other = method.training_loss(views, labels.roll(1), idx)
    assert not torch.isclose(other, loss)


@pytest.mark.parametrize("name", ["supcon", "simclr"])
def test_both_views_share_one_batch_norm_batch(build, name):
    # main_supcon.py forwards cat([view 1, view 2]): in training, batch norm normalises over both views,
    # which one forward per view would not; in evaluation (running statistics) the two agree.
    method = build(name)
    views, _, _ = batch()

    def per_view():
        return torch.stack([F.normalize(method.projector(method.backbone(v)), dim=1) for v in views], dim=1)

    with torch.no_grad():
        joint = embed_views(method.backbone, method.projector, views)
        assert joint.shape == (12, 2, 128)  # both heads end in 128 dimensions
        assert not torch.allclose(joint, per_view(), atol=1e-3)
        method.eval()
        torch.testing.assert_close(embed_views(method.backbone, method.projector, views), per_view())


def test_distinct_labels_equal_simclr_nt_xent(build):
    temperature = 0.2
    supcon_method = build("supcon", temperature=temperature, base_temperature=temperature)
    simclr = build("simclr", temperature=temperature)
    simclr.backbone.load_state_dict(supcon_method.backbone.state_dict())
    simclr.projector = supcon_method.projector  # SimCLR's own head has batch norm: compare the losses
    views, _, idx = batch(size=10)
    distinct = torch.arange(10)
    expected = simclr.training_loss(views, None, idx) / 2  # SimCLR sums its two directions
    torch.testing.assert_close(supcon_method.training_loss(views, distinct, idx), expected)
    # With the official base temperature the loss is the same, scaled by T / T_base.
    scaled = build("supcon", temperature=temperature, base_temperature=0.07)
    scaled.load_state_dict(supcon_method.state_dict())
    torch.testing.assert_close(scaled.training_loss(views, distinct, idx), expected * temperature / 0.07)


def test_gradients_reach_the_backbone(build):
    method = build("supcon")
    views, labels, idx = batch()
    method.training_loss(views, labels, idx).backward()
    for name, p in method.named_parameters():
        assert p.grad is not None, name
    assert sum(p.grad.abs().sum() for p in method.backbone.parameters()) > 0


def test_needs_labels(build):
    method = build("supcon")
    views, _, idx = batch()
    with pytest.raises(ValueError, match="labels"):
        method.training_loss(views, None, idx)


def test_trains_on_tiny_config(tmp_path, method_config):
    assert_trains(method_config, "supcon", tmp_path, shrink=0.9)
