"""torch.distributed helpers: one process per device, launched by ``torchrun``.

Everything here is a no-op in a single process, so methods call these helpers
unconditionally and read the same on one device as on many.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def select_device(requested: str = "auto") -> torch.device:
    """``auto``: CUDA when there is one, else the CPU; otherwise the device named."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def init_from_env(device: str = "auto") -> torch.device:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); NCCL on CUDA, gloo on CPU.

    Returns this process's device. Without torchrun's variables, a single process on ``device``.
    """
    chosen = select_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return chosen
    if chosen.type == "cuda":  # one GPU per process: the one torchrun's LOCAL_RANK names
        chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(chosen)
    if not is_initialized():
        dist.init_process_group("nccl" if chosen.type == "cuda" else "gloo", timeout=timedelta(minutes=30))
    return chosen


def shutdown() -> None:
    if is_initialized():
        dist.barrier()
        dist.destroy_process_group()


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums the gradient over ranks and returns this rank's slice.

    Every rank computes the same loss on the gathered batch; summing the gradients of the
    local slice over ranks and then averaging over ranks (DDP) gives exactly the gradient
    of the single-process loss on the whole batch.
    """

    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(world_size())]
        dist.all_gather(out, x.contiguous())
        ctx.rank, ctx.size = rank(), x.shape[0]
        return torch.cat(out)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.size : (ctx.rank + 1) * ctx.size]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from all ranks (rank order); gradients flow to the local part."""
    return _GatherWithGrad.apply(x) if world_size() > 1 else x


@torch.no_grad()
def gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from all ranks (rank order), without gradient. Equal sizes on every rank."""
    if world_size() == 1:
        return x
    out = [torch.zeros_like(x) for _ in range(world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out)


@torch.no_grad()
def gather_uneven(x: torch.Tensor) -> torch.Tensor:
    """Like ``gather`` for shards whose first dimension differs across ranks."""
    if world_size() == 1:
        return x
    sizes = gather(torch.tensor([x.shape[0]], device=x.device))
    longest = int(sizes.max())
    padded = torch.zeros((longest, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    parts = gather(padded).split(longest)
    return torch.cat([part[: int(n)] for part, n in zip(parts, sizes)])


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """``x`` from rank ``src`` on every rank (in place)."""
    if world_size() > 1:
        dist.broadcast(x, src)
    return x


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over ranks (in place)."""
    if world_size() > 1:
        dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over ranks (in place)."""
    if world_size() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def shard(total: int) -> slice:
    """This rank's contiguous part of ``range(total)`` (sizes differ by at most one)."""
    size, r = world_size(), rank()
    base, extra = divmod(total, size)
    start = r * base + min(r, extra)
    return slice(start, start + base + (1 if r < extra else 0))


def barrier() -> None:
    if is_initialized():
        dist.barrier()
