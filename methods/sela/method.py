"""SeLa (Asano et al., 2020): self-labelling by optimal transport, trained with cross-entropy.

    L[h] = equipartition(N, K)                        for each head h = 1..H   (seeded)
    for each epoch e:
        if e in relabel_epochs:                       # denser early: e_i ~ E (i/n)^power
            f_all = f(x) for every training image     # evaluation transform, no gradient
            for each head h:
                P = softmax(W_h f_all)                # [N, K]
                L[h] = argmax_k  Sinkhorn(P, lam)     # equal-size clusters
        for each batch (x, idx):
            loss = mean_h CE(W_h f(aug(x)), L[h, idx])

f is the backbone (evaluated), W_h the H linear heads, held as one [H*K, D] layer so a step is
one matrix product, not H (the same initialisation per head: uniform with bound 1/sqrt(D)).
The labels L [H, N] are a buffer, so they are checkpointed and restored on resume.
"""

import itertools
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import equipartition_labels, sinkhorn_labels
from sslbench.kit.method import Method


class SeLa(Method):
    num_views = 1
    needs_labels = False

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.num_heads, self.num_clusters = int(p["num_heads"]), int(p["num_clusters"])
        if self.num_heads < 1 or not 1 <= self.num_clusters <= info.num_train:
            raise ConfigError(
                f"methods/sela/config.yaml: need num_heads >= 1 and 1 <= num_clusters <= "
                f"{info.num_train} (the training images); got {self.num_heads}, {self.num_clusters}"
            )
        self.lam = float(p["lam"])
        self.sinkhorn_tol, self.sinkhorn_max_iters = float(p["sinkhorn_tol"]), int(p["sinkhorn_max_iters"])
        self.relabel_epochs = self.relabel_schedule(info.epochs, p["num_relabels"], p["relabel_power"])
        self.heads = nn.Linear(self.feature_dim, self.num_heads * self.num_clusters)  # W_1..W_H stacked
        # The engine seeds torch with the run's seed before building the method: the labels follow it.
        generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))
        initial = [
            equipartition_labels(info.num_train, self.num_clusters, generator) for _ in range(self.num_heads)
        ]
        self.register_buffer("labels", torch.stack(initial))  # [H, N] pseudo-labels, checkpointed

    @staticmethod
    def relabel_schedule(num_epochs: int, count: int, power: float = 2.0) -> tuple[int, ...]:
        """Epoch boundaries (0 = before any training) at which the labels are re-optimised.

        The official code relabels after (E + 1) * N * (i / n)^2 images (main.py; cifar.py uses
        power 1), i.e. at time T (i / n)^power for i = 0..n-1 in a run of T epochs. Here each time
        is floored to an epoch boundary, at most one relabelling per boundary (so the count is
        min(count, num_epochs)), and the integer gaps are sorted, which keeps the first and last
        epochs and undoes the 2-3-2-3 wobble rounding puts into slowly growing gaps.
        """
        if num_epochs < 1 or count < 1:
            raise ConfigError(
                f"SeLa relabel schedule needs train.epochs >= 1 and num_relabels >= 1, "
                f"got {num_epochs} and {count}"
            )
        if power < 1:
            raise ConfigError(
                f"methods/sela/config.yaml: relabel_power must be >= 1 (denser early), got {power}"
            )
        count = min(int(count), int(num_epochs))
        epochs: list[int] = []
        for i in range(count):
            epoch = math.floor(num_epochs * (i / count) ** power + 1e-9)
            epochs.append(max(epoch, epochs[-1] + 1) if epochs else epoch)
        gaps = sorted(later - earlier for earlier, later in zip(epochs, epochs[1:]))
        return tuple(itertools.accumulate(gaps, initial=0))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[N, H, K]: W_h f for every head h."""
        return self.heads(features).view(-1, self.num_heads, self.num_clusters)

    @torch.no_grad()
    def relabel(self, ctx) -> int:
        """Re-optimise every head's labels on the whole train set; returns how many labels changed."""
        features = ctx.forward_train_set(self.backbone)  # [N, D], evaluation transform, dataset order
        probs = F.softmax(self.logits(features).double(), dim=2)  # [N, H, K]
        new = torch.stack(
            [
                sinkhorn_labels(
                    probs[:, h].contiguous(),
                    self.lam,
                    tol=self.sinkhorn_tol,
                    max_iters=self.sinkhorn_max_iters,
                )
                for h in range(self.num_heads)
            ]
        ).to(self.labels.device)
        # Every rank has the same features, but its own arithmetic: rank 0's labels for all, so that no
        # rank trains on labels of its own (non-deterministic GPU kernels can tip an argmax).
        dist.broadcast(new)
        changed = int((new != self.labels).sum())
        self.labels.copy_(new)
        return changed

    def on_epoch_start(self, ctx):
        relabelled, changed, seconds = 0, 0, 0.0
        if ctx.epoch in self.relabel_epochs:
            start = time.perf_counter()
            changed = self.relabel(ctx)
            relabelled, seconds = 1, time.perf_counter() - start
        ctx.log.update(relabelled=relabelled, labels_changed=changed, relabel_seconds=seconds)

    def training_loss(self, views, labels, indices):
        logits = self.logits(self.backbone(views[0]))  # [B, H, K]
        targets = self.labels[:, indices.to(self.labels.device)]  # [H, B]
        # The mean over B x H terms is the mean over heads of each head's mean cross-entropy.
        return F.cross_entropy(logits.flatten(0, 1), targets.T.flatten())
