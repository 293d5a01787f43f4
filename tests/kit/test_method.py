"""sslbench.kit.method's MatryoshkaDINOHead (Franca's MRLDINOHead): each level written out by hand, its widths
and prototype counts, its initialisation and the norms of its last layers. DINOHead is pinned through DINO's,
iBOT's and DINOv2's tests and tests/kit/test_headlayer.py."""

import torch
import torch.nn.functional as F

from sslbench.kit.method import MatryoshkaDINOHead


def test_each_level_is_its_projection_then_a_gelu_mlp_then_its_last_layer_without_normalisation():
    torch.manual_seed(0)
    head = MatryoshkaDINOHead(
        32, 64, hidden_dim=20, bottleneck_dim=8, num_layers=3, nesting=[2, 4, 8, 16, 32]
    )
    x = torch.randn(5, 32)
    out = head(x)
    assert [o.shape for o in out] == [(5, 64 * d // 32) for d in (2, 4, 8, 16, 32)]  # 4, 8, 16, 32, 64
    for level, d in enumerate([2, 4, 8, 16, 32]):
        h = head.projections[level](x)
        assert h.shape == (5, d)
        linears = [m for m in head.mlps[level] if isinstance(m, torch.nn.Linear)]
        assert [m.out_features for m in linears] == [20, 20, 8]
        for linear in linears:  # a GELU after every layer, the last one too
            h = F.gelu(linear(h))
        last = head.last_layer[level]
        v = last.parametrizations.weight.original1
        by_hand = h @ (v / v.norm(dim=1, keepdim=True)).T  # norms g = 1: unit rows, no L2 of h
        assert torch.allclose(out[level], by_hand, atol=1e-6)
    assert head.mlp[0] is head.projections[-1] and head.mlp[-1] is head.mlps[-1][-1]  # the widest level's


def test_linear_layers_start_truncated_normal_0_02_with_zero_bias_and_the_last_norms_at_one_trained():
    torch.manual_seed(0)
    head = MatryoshkaDINOHead(
        96, 256, hidden_dim=512, bottleneck_dim=128, num_layers=3, nesting=[6, 12, 24, 48, 96]
    )
    weights = torch.cat(
        [
            m.weight.flatten()
            for m in [*head.projections, *head.mlps.modules()]
            if isinstance(m, torch.nn.Linear)
        ]
    )
    assert abs(weights.std().item() - 0.02) < 0.002  # torch's trunc_normal_ cuts at +-2, far out at std 0.02
    biases = [m.bias for m in [*head.projections, *head.mlps.modules()] if isinstance(m, torch.nn.Linear)]
    assert all(torch.equal(b, torch.zeros_like(b)) for b in biases)
    for last in head.last_layer:
        g = last.parametrizations.weight.original0
        assert torch.equal(g, torch.ones_like(g)) and g.requires_grad
        assert last.bias is None
