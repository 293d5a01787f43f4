"""Run under torchrun: 2 ranks × B/2 give the loss and gradients of 1 process × B (SimCLR/SupCon)."""

import sys

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from sslbench import distributed as dist
from sslbench.losses import supcon

dist.init_from_env("cpu")
torch.manual_seed(0)
B, D, labelled = 8, 5, sys.argv[1] == "labels"
x = torch.randn(B, 2, 3)
y = torch.randint(0, 3, (B,))
layer = torch.nn.Linear(3, D)


def loss_of(module, x, y):
    z = F.normalize(module(x), dim=-1)
    z = dist.gather_with_grad(z)
    labels = dist.gather(y) if labelled else None
    return supcon(z, labels, temperature=0.5, base_temperature=0.07)


# Reference: one process, the whole batch (computed on every rank, no communication).
ref_layer = torch.nn.Linear(3, D)
ref_layer.load_state_dict(layer.state_dict())
ref = supcon(
    F.normalize(ref_layer(x), dim=-1), y if labelled else None, temperature=0.5, base_temperature=0.07
)
ref.backward()

ddp = DistributedDataParallel(layer)
part = dist.shard(B)
loss = loss_of(ddp, x[part], y[part])
loss.backward()
assert torch.allclose(loss, ref, atol=1e-6), (float(loss), float(ref))
assert torch.allclose(layer.weight.grad, ref_layer.weight.grad, atol=1e-6), "weight gradients differ"
assert torch.allclose(layer.bias.grad, ref_layer.bias.grad, atol=1e-6), "bias gradients differ"
print(f"rank {dist.rank()}: loss {float(loss):.6f} == {float(ref):.6f}; gradients equal")
dist.shutdown()
