"""Split batch norm (sslbench/kit/moco.py: SplitBatchNorm2d, use_split_batch_norm), on tiny inputs.

SplitBatchNorm2d is a faster form of MoCo's CIFAR demo layer (colab/moco_cifar10_demo.ipynb,
SplitBatchNorm): it must compute exactly what the demo's formulation computes, bit for bit, and
what one batch norm per sub-batch computes, up to float rounding (batch norm on a sub-batch reduces
in another order than on its channel group, so that comparison cannot be bit for bit).
"""

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR
from torch import nn

from sslbench.backbones import create_backbone
from sslbench.data.registry import load_data
from sslbench.kit.moco import SplitBatchNorm2d, use_split_batch_norm
from sslbench.pretrain.trainer import build_method

BATCH = 64  # the tiny suite's batch size (tests/support.py)


class ReferenceSplitBatchNorm2d(nn.BatchNorm2d):
    """The demo's formulation term by term (and sslbench's layer before it was made faster): the
    running statistics, weight and bias repeated once per split, one batch norm over the batch
    viewed as [n/s, s*c, h, w], and the repeated running statistics averaged back. Unlike the demo
    it counts num_batches_tracked and honours momentum=None, as nn.BatchNorm2d."""

    def __init__(self, num_features, num_splits, **kwargs):
        super().__init__(num_features, **kwargs)
        self.num_splits = num_splits

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        n, c, h, w = x.shape
        s = self.num_splits
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        running_mean = self.running_mean.repeat(s) if self.track_running_stats else None
        running_var = self.running_var.repeat(s) if self.track_running_stats else None
        out = F.batch_norm(
            x.reshape(n // s, s * c, h, w),
            running_mean,
            running_var,
            self.weight.repeat(s) if self.affine else None,
            self.bias.repeat(s) if self.affine else None,
            True,
            factor,
            self.eps,
        )
        if self.track_running_stats:
            with torch.no_grad():
                self.running_mean.copy_(running_mean.view(s, c).mean(0))
                self.running_var.copy_(running_var.view(s, c).mean(0))
        return out.reshape(n, c, h, w)


def random_bn(bn):
    with torch.no_grad():
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
        if bn.track_running_stats:
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    return bn


def batch(shape, generator):
    """Samples on different scales and offsets, so that every split has statistics of its own."""
    n = shape[0]
    scale = torch.rand(n, 1, 1, 1, generator=generator) * 4 + 0.1
    return torch.randn(shape, generator=generator) * scale + torch.randn(n, 1, 1, 1, generator=generator)


CASES = {
    "4 splits": ((16, 3, 5, 5), 4, {}),
    "8 splits, 2x2": ((32, 48, 2, 2), 8, {}),
    "8 splits, 1x1": ((32, 48, 1, 1), 8, {}),  # image size 1: batch norm's channels-last kernels
    "3 splits, cumulative average": ((24, 6, 3, 3), 3, {"momentum": None}),
    "no affine": ((16, 5, 4, 4), 2, {"affine": False}),
    "no running statistics": ((16, 5, 4, 4), 2, {"track_running_stats": False}),
}


@pytest.mark.parametrize("shape, splits, options", CASES.values(), ids=CASES.keys())
def test_split_bn_computes_bit_for_bit_what_the_reference_computes(shape, splits, options):
    fast = random_bn(SplitBatchNorm2d(shape[1], splits, **options))
    reference = ReferenceSplitBatchNorm2d(shape[1], splits, **options)
    reference.load_state_dict(fast.state_dict())
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        fast.train(), reference.train()
        x, grad_out = batch(shape, generator), torch.randn(shape, generator=generator)
        x_fast, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_fast, out_ref = fast(x_fast), reference(x_ref)  # as the query encoder: with a graph
        assert torch.equal(out_fast, out_ref), step
        out_fast.relu_().backward(grad_out)  # in place on the output, as timm's activations
        out_ref.relu_().backward(grad_out)
        assert torch.equal(x_fast.grad, x_ref.grad), step
        for p_fast, p_ref in zip(fast.parameters(), reference.parameters()):
            assert torch.equal(p_fast.grad, p_ref.grad), step
            p_fast.grad = p_ref.grad = None
        with torch.no_grad():  # as the key encoder: no graph, the statistics move again
            assert torch.equal(fast(x * 0.5), reference(x * 0.5)), step
        state_fast, state_ref = fast.state_dict(), reference.state_dict()
        assert state_fast.keys() == state_ref.keys()
        for key in state_fast:  # running statistics and num_batches_tracked
            assert torch.equal(state_fast[key], state_ref[key]), (step, key)
        fast.eval(), reference.eval()
        assert torch.equal(fast(x), reference(x)), step
    if fast.track_running_stats:
        assert int(fast.num_batches_tracked) == 6  # two training forwards per step


def test_split_bn_with_one_split_is_plain_batch_norm_in_train_mode():
    plain = random_bn(nn.BatchNorm2d(3)).train()
    split = SplitBatchNorm2d(3, num_splits=1).train()
    split.load_state_dict(plain.state_dict())
    x = torch.randn(8, 3, 5, 5, requires_grad=True)
    out_split, out_plain = split(x), plain(x)
    torch.testing.assert_close(out_split, out_plain)
    torch.testing.assert_close(split.running_mean, plain.running_mean)
    torch.testing.assert_close(split.running_var, plain.running_var)
    grad_split = torch.autograd.grad(out_split.pow(2).sum(), [x, split.weight])
    grad_plain = torch.autograd.grad(out_plain.pow(2).sum(), [x, plain.weight])
    for a, b in zip(grad_split, grad_plain):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shape, splits", [((16, 3, 5, 5), 4), ((32, 6, 1, 1), 8)], ids=["5x5", "1x1"])
def test_split_bn_is_one_batch_norm_per_sub_batch(shape, splits):
    split = random_bn(SplitBatchNorm2d(shape[1], num_splits=splits)).train()
    start_mean, start_var = split.running_mean.clone(), split.running_var.clone()
    x = batch(shape, torch.Generator().manual_seed(1)).requires_grad_()
    grad_out = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    out = split(x)
    out.backward(grad_out)
    # Sub-batch j: samples j, j + s, j + 2s, ... (moco's CIFAR demo split), each its own batch norm
    # from the shared running statistics, with the shared weight and bias.
    chunk_x = x.detach().clone().requires_grad_()
    weight, bias = (p.detach().clone().requires_grad_() for p in (split.weight, split.bias))
    expected, means, variances = torch.empty_like(out), [], []
    for j in range(splits):
        mean, var = start_mean.clone(), start_var.clone()
        chunk = F.batch_norm(chunk_x[j::splits], mean, var, weight, bias, True, split.momentum, split.eps)
        chunk.backward(grad_out[j::splits])
        expected[j::splits] = chunk.detach()
        means.append(mean)
        variances.append(var)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(split.running_mean, torch.stack(means).mean(0))
    torch.testing.assert_close(split.running_var, torch.stack(variances).mean(0))
    torch.testing.assert_close(x.grad, chunk_x.grad)
    torch.testing.assert_close(split.weight.grad, weight.grad)
    torch.testing.assert_close(split.bias.grad, bias.grad)
    assert int(split.num_batches_tracked) == 1
    split.eval()  # evaluation: plain batch norm with the (averaged) running statistics, state unchanged
    plain = nn.BatchNorm2d(shape[1]).eval()
    plain.load_state_dict(split.state_dict())
    before = {k: v.clone() for k, v in split.state_dict().items()}
    with torch.no_grad():
        assert torch.equal(split(x), plain(x))
    assert all(torch.equal(v, before[k]) for k, v in split.state_dict().items())


def autograd_nodes(tensor) -> set[str]:
    seen, stack, names = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(fn for fn, _ in node.next_functions)
    return names


def test_an_in_place_activation_on_the_output_copies_no_gradient():
    """timm's blocks apply ReLU in place on each batch norm's output (and add the residual in
    place). On a view of the grouped output, autograd would record CopySlices and copy the layer's
    whole gradient three times in backward: the cost split BN used to add to a MoCo step."""
    split = SplitBatchNorm2d(4, num_splits=2).train()
    out = split(torch.randn(8, 4, 3, 3, requires_grad=True))
    out.relu_()
    out += 1.0
    nodes = autograd_nodes(out)
    assert "NativeBatchNormBackward0" in nodes
    assert not {"CopySlices", "AsStridedBackward0"} & nodes, nodes


def test_split_bn_rejects_a_batch_it_cannot_split():
    with pytest.raises(ValueError, match="bn_splits"):
        SplitBatchNorm2d(3, num_splits=4).train()(torch.randn(6, 3, 2, 2))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        SplitBatchNorm2d(3, num_splits=4).train()(torch.randn(4, 3, 1, 1))  # one value per split


def build_moco(method_config, **overrides):
    cfg = method_config("moco", **{"queue_size": 2 * BATCH, **overrides})
    return build_method(METHODS_DIR / "moco", cfg, load_data(cfg), 0)


def test_a_backbone_trained_with_split_bn_loads_into_an_unmodified_timm_model(method_config):
    method = build_moco(method_config, bn_splits=4)
    split_layers = [m for m in method.backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    assert split_layers and all(isinstance(m, SplitBatchNorm2d) for m in split_layers)
    assert all(
        isinstance(m, SplitBatchNorm2d) for m in method.key_encoder.modules() if isinstance(m, nn.BatchNorm2d)
    )
    optimizer = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.1)
    g = torch.Generator().manual_seed(0)
    method.train()
    for _ in range(2):  # the running statistics move away from their initial values
        views = [torch.randn(BATCH, 1, 8, 8, generator=g) for _ in range(2)]
        loss = method.training_loss(views, None, torch.arange(BATCH))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = method.encoder().state_dict()
    plain = create_backbone(method.cfg["backbone"]["name"], in_chans=1)
    assert {k: (v.shape, v.dtype) for k, v in trained.items()} == {
        k: (v.shape, v.dtype) for k, v in plain.state_dict().items()
    }  # BatchNorm2d's keys: nothing per split
    plain.load_state_dict(trained)  # strict
    assert all(int(m.num_batches_tracked) == 2 for m in split_layers)
    x = torch.randn(8, 1, 8, 8, generator=g)
    method.eval(), plain.eval()
    with torch.no_grad():
        assert torch.equal(plain(x), method.encoder()(x))


def test_use_split_batch_norm_rejects_what_it_cannot_split(method_config):
    with pytest.raises(ValueError, match="bn_splits"):
        use_split_batch_norm(nn.Sequential(nn.BatchNorm1d(4)), 2)
    with pytest.raises(ValueError, match="bn_splits"):
        build_moco(method_config, bn_splits=5)  # does not divide the batch of 64
