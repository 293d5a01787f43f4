"""InstDisc / NPID (Wu, Xiong, Yu, Lin, CVPR 2018): non-parametric instance discrimination with a
memory bank, as zhirongw/lemniscate.pytorch (main.py, lib/NCEAverage.py, lib/NCECriterion.py).

    memory[N, 128] ~ U(-a, a), a = 1 / sqrt(128 / 3)        one row per training image
    Z = -1                                                  estimated on the first batch, then fixed
    for x, i in loader:                                     i: the images' indices in the train split
        v = normalize(fc(f(aug(x))))                        [B, 128]
        if K > 0:                                           NCE (NCEAverage, NCECriterion)
            rows = [i, K indices drawn uniformly from 0..N-1]   the image's own row, then the noise
            s = exp(memory[rows] · v / T)                   [B, 1 + K]
            if Z < 0: Z = N mean(s)
            loss = NCE(s / Z, N)                            P_n = 1/N (sslbench.kit.losses.instance_nce)
        else:                                               the non-parametric softmax (LinearAverage)
            loss = CE(v · memory^T / T, i)                  over every row: --nce-k 0
        memory[i] = normalize(m memory[i] + (1 - m) v)      m = 0.5, no gradient
        SGD step on f, fc

The paper's objective is its non-parametric softmax over all N rows; NCE approximates it where N
is too large to sum over (1.28M ImageNet images). Under DDP every rank holds the whole bank: the
noise of the whole batch is rank 0's draw, Z is estimated from the whole first batch, and each rank
writes every rank's rows (gathered), so every rank computes its rows of the one-process loss and
the bank stays the one-process bank.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.losses import instance_nce
from sslbench.kit.method import Method


class InstDisc(Method):
    num_views = 1

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        dim, self.num_negatives = int(p["dim"]), int(p["num_negatives"])
        self.temperature, self.memory_momentum = float(p["temperature"]), float(p["memory_momentum"])
        if self.num_negatives < 0 or not self.temperature > 0 or not 0 <= self.memory_momentum < 1:
            raise ConfigError(
                "methods/instdisc/config.yaml: need num_negatives >= 0, temperature > 0 and 0 <= "
                f"memory_momentum < 1; got {self.num_negatives}, {self.temperature}, {self.memory_momentum}"
            )
        self.head = nn.Linear(self.feature_dim, dim)  # fc to the 128-d embedding (models/resnet.py)
        bound = 1 / math.sqrt(dim / 3)  # NCEAverage: E ||row||^2 = 1, rows not normalised at first
        self.register_buffer("memory", torch.rand(info.num_train, dim) * 2 * bound - bound)
        self.register_buffer("z", torch.tensor(-1.0))  # the normalisation constant Z; < 0: not set yet

    def on_epoch_start(self, ctx):
        if self.num_negatives:
            ctx.log["nce_z"] = self.z.item()

    def training_loss(self, views, labels, indices):
        v = F.normalize(self.head(self.backbone(views[0])), dim=1)
        if self.num_negatives:
            rows = torch.cat([indices[:, None], self.noise_rows(len(indices))], dim=1)  # [B, 1 + K]
            scores = torch.exp(torch.einsum("bkd,bd->bk", self.memory[rows], v) / self.temperature)
            if self.z < 0:
                self.estimate_z(scores.detach())
            loss = instance_nce(scores / self.z, self.info.num_train)
        else:  # a copy of the bank: autograd keeps it, and the update below writes the bank in place
            loss = F.cross_entropy(v @ self.memory.clone().T / self.temperature, indices)
        self.update_memory(indices, v.detach())  # after reading the rows, as the official backward
        return loss

    @torch.no_grad()
    def noise_rows(self, batch: int) -> torch.Tensor:
        """[batch, K] row indices drawn uniformly with replacement (the positive may be drawn too, as
        the official alias sampler); the whole batch's draw is rank 0's, and this rank takes its rows."""
        everyone = torch.randint(
            self.info.num_train, (batch * dist.world_size(), self.num_negatives), device=self.memory.device
        )
        return dist.broadcast(everyone)[dist.shard(len(everyone))]

    @torch.no_grad()
    def estimate_z(self, scores: torch.Tensor) -> None:
        """Z = N x the mean of exp(w · v / T) over every entry of the (whole) first batch, then fixed."""
        sum_and_count = torch.stack(
            [scores.double().sum(), scores.new_tensor(scores.numel(), dtype=torch.float64)]
        )
        total, count = dist.all_reduce_sum(sum_and_count).tolist()
        self.z.fill_(self.info.num_train * total / count)

    @torch.no_grad()
    def update_memory(self, indices: torch.Tensor, v: torch.Tensor) -> None:
        indices, v = dist.gather(indices), dist.gather(v.float())
        m = self.memory_momentum
        self.memory[indices] = F.normalize(m * self.memory[indices] + (1 - m) * v, dim=1)
