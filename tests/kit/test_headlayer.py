"""The projection head's first layer as the final checkpoint keeps it: data that rebuilds the same layer."""

import pytest
import torch
from torch import nn

from sslbench.kit.headlayer import build_layer, first_layer, layer_record, out_features
from sslbench.kit.method import bn_mlp


def heads():
    torch.manual_seed(0)
    gelu = nn.Sequential(nn.Linear(6, 5), nn.GELU(), nn.Linear(5, 3))  # DINOHead's mlp without BN
    layer_norm = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5, eps=1e-6), nn.GELU(approximate="tanh"))
    return {"bn_mlp": bn_mlp([6, 5, 3]), "gelu": gelu, "layer_norm": layer_norm}


@pytest.mark.parametrize("name", ["bn_mlp", "gelu", "layer_norm"])
def test_the_rebuilt_layer_computes_what_the_heads_first_layer_computes(name):
    head = heads()[name]
    with torch.no_grad():  # batch-norm statistics that are not the initial ones
        for module in head.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    record = layer_record(head)
    rebuilt = build_layer(record).eval()
    x = torch.randn(7, 6)
    assert torch.equal(rebuilt(x), first_layer(head).eval()(x))
    assert record["out_dim"] == out_features(rebuilt) == 5
    assert isinstance(rebuilt[-1], (nn.ReLU, nn.GELU)) and len(rebuilt) == len(first_layer(head))


def test_the_first_layer_ends_at_the_first_activation_and_keeps_no_later_layer():
    head = bn_mlp([6, 5, 4, 3])  # Linear BN ReLU Linear BN ReLU Linear
    assert [type(m) for m in first_layer(head)] == [nn.Linear, nn.BatchNorm1d, nn.ReLU]


def test_a_head_without_activation_and_an_unknown_module_are_refused():
    assert layer_record(None) is None
    with pytest.raises(ValueError, match="no activation"):
        first_layer(nn.Sequential(nn.Linear(4, 3)))
    with pytest.raises(TypeError, match="Dropout"):
        layer_record(nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.1), nn.ReLU()))
