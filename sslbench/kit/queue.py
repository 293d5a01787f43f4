"""A FIFO queue of keys (MoCo's and PCL's negatives, SwAV's stored projections, NNCLR's support set)
and the nearest-neighbour lookup in it."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError


class KeyQueue(nn.Module):
    """K keys [K, dim] in a ring buffer; ``pointer`` is where the next batch of keys goes."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("keys", F.normalize(torch.randn(size, dim), dim=1))  # as moco/builder.py
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return self.keys.shape[0]

    def negatives(self) -> torch.Tensor:
        """A snapshot of the queue: the loss keeps using it after ``push`` overwrites the buffer."""
        return self.keys.clone()

    @torch.no_grad()
    def push(self, keys: torch.Tensor) -> None:
        """Enqueue this step's keys (every rank's) over the oldest ones."""
        keys = dist.gather(keys.detach())
        n, size = keys.shape[0], len(self)
        if size % n:
            raise ValueError(f"queue size {size} is not a multiple of the {n} keys pushed per step")
        slots = (self.pointer + torch.arange(n, device=self.keys.device)) % size  # no host sync
        self.keys.index_copy_(0, slots, keys.to(self.keys.dtype))
        self.pointer.add_(n).remainder_(size)


@torch.no_grad()
def nearest_neighbour(query: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """NNCLR's NN(z, Q): for each row of ``query`` [B, D], the row of ``support`` [K, D] with the largest
    cosine similarity, i.e. the smallest Euclidean distance between the L2-normalised rows (the paper's
    argmin over q of ||z - q||, its rows being unit vectors). Ties go to the first such row; the rows
    returned are ``support``'s own, without gradient."""
    if query.ndim != 2 or support.ndim != 2 or query.shape[1] != support.shape[1]:
        raise ValueError(
            f"query [B, D] and support [K, D] must share D, got {tuple(query.shape)}, {tuple(support.shape)}"
        )
    similarity = F.normalize(query, dim=1) @ F.normalize(support, dim=1).T
    return support[similarity.argmax(dim=1)]


def fit_queue_size(requested: int, keys_per_step: int, num_train: int) -> int:
    """The queue size K actually used: a multiple of the keys pushed per step (moco/builder.py
    asserts it), at most num_train - keys_per_step, so the queue cannot hold a key of every
    training image (otherwise each image's previous-epoch key would always be among its own
    negatives). A change is announced with a warning; a dataset too small for one batch of
    negatives is an error."""
    if not isinstance(requested, int) or requested < 1:
        raise ConfigError(f"config key `queue_size` must be a positive integer, got {requested!r}")
    fitted = min(requested, num_train - keys_per_step) // keys_per_step * keys_per_step
    if fitted < keys_per_step:
        raise ConfigError(
            f"{num_train} training images are too few for a queue of at least one batch of "
            f"{keys_per_step} keys next to the batch itself; lower `train.batch_size`"
        )
    if fitted != requested:
        warnings.warn(
            f"queue_size {requested} shrunk to {fitted}: a multiple of the {keys_per_step} keys pushed per "
            f"step and at most num_train - batch = {num_train - keys_per_step} ({num_train} training images)",
            stacklevel=2,
        )
    return fitted
