"""SwAV (Caron et al., NeurIPS 2020): swapped prediction of online cluster codes, with multi-crop.

    C = prototypes [K, D], normalised at the start of every step (here: at init and after every step)
    for x in loader:
        z_v = normalize(g(f(crop_v(x))))                  # every crop v: 2 global, then local crops
        s_v = z_v C^T                                     # cosines to the prototypes [B, K]
        for i in (0, 1):                                  # the global crops assign (crops_for_assign)
            q_i = sinkhorn(sg([queue_i C^T; s_i]), eps)   # 3 iterations; the batch's rows kept
            push z_i into queue_i                         # once the queue has started
        loss = mean over (i, v != i) of CE(q_i, softmax(s_v / T))
        the prototypes' gradient dropped during the first epoch
        LARS step

f is the backbone (evaluated), g the projection MLP. Sinkhorn is sslbench.kit.clustering.swav_sinkhorn;
under DDP it all-reduces its sums, so every rank's codes are those of one process on the whole batch.
The queues hold every rank's embeddings (pushed gathered, in rank order); each rank prepends its
shard of them, so together the ranks prepend each queued embedding once, as the official per-rank
queues do.
"""

import torch
import torch.nn.functional as F
from torch import nn

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import swav_sinkhorn
from sslbench.kit.health import effective_usage
from sslbench.kit.losses import cross_view_cross_entropy
from sslbench.kit.method import Method, embed_crops
from sslbench.kit.queue import KeyQueue, fit_queue_size

CONFIG = "methods/swav/config.yaml"


class SwAV(Method):
    num_views = 2  # the global crops; they are also the crops that assign codes
    multi_crop = True

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        hidden = p["hidden_dim"] or self.feature_dim
        self.projector = nn.Sequential(
            nn.Linear(self.feature_dim, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, p["feat_dim"]),
        )
        if not isinstance(p["num_prototypes"], int) or p["num_prototypes"] < 1:
            raise ConfigError(
                f"{CONFIG}: num_prototypes must be a positive integer, got {p['num_prototypes']!r}"
            )
        self.prototypes = nn.Linear(p["feat_dim"], p["num_prototypes"], bias=False)
        self.normalise_prototypes()
        self.temperature = float(p["temperature"])
        self.epsilon, self.sinkhorn_iterations = float(p["epsilon"]), int(p["sinkhorn_iterations"])
        if not self.epsilon >= 0.02 or self.sinkhorn_iterations < 1:
            raise ConfigError(
                f"{CONFIG}: need epsilon >= 0.02 (exp(1 / epsilon) must fit float32) and "
                f"sinkhorn_iterations >= 1, got {self.epsilon} and {self.sinkhorn_iterations}"
            )
        self.freeze_prototypes_epochs = int(p["freeze_prototypes_epochs"])
        self.queue_start_epoch = int(p["queue_start_epoch"])
        self.queues = nn.ModuleList()  # one per assigning crop; empty without a queue
        if p["queue_size"]:
            size = fit_queue_size(p["queue_size"], info.batch_size, info.num_train)
            for _ in range(self.num_views):
                queue = KeyQueue(size, p["feat_dim"])
                queue.keys.zero_()  # the official queue starts empty (zeros) and is used once full
                self.queues.append(queue)
        self.queue_started = False  # set by on_epoch_start from the epoch

    @torch.no_grad()
    def normalise_prototypes(self) -> None:
        self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1))

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.projector(features), dim=1)

    def training_loss(self, views, labels, indices):
        z = embed_crops(self.backbone, views, head=self.embed)  # [B, D] per crop
        scores = [self.prototypes(z_v) for z_v in z]
        queues = self.queues if self.queue_started else [None] * self.num_views
        codes = [self.assign(scores[i], z[i], queues[i]) for i in range(self.num_views)]
        return cross_view_cross_entropy(codes, scores, self.temperature)

    @torch.no_grad()
    def assign(self, scores: torch.Tensor, embedding: torch.Tensor, queue: KeyQueue | None) -> torch.Tensor:
        """The codes of one crop's batch: Sinkhorn on its scores, behind the queued embeddings'
        scores (with the current prototypes) once the queue is full; then the batch joins the queue."""
        batch = scores.shape[0]
        scores = scores.detach()
        if queue is not None:
            if queue.keys[-1].any():  # the ring buffer fills its last row last: full
                scores = torch.cat([self.prototypes(queue.keys[dist.shard(len(queue))]), scores])
            queue.push(embedding)
        return swav_sinkhorn(scores, self.epsilon, self.sinkhorn_iterations)[-batch:]

    @torch.no_grad()
    def health(self, forward_train_set):
        """How many of the K prototypes the train split's images use as their nearest (the monitors'):
        1 when every image falls on one prototype."""
        nearest = forward_train_set(
            lambda x: self.prototypes(self.embed(self.backbone(x))).argmax(dim=1).float()
        )
        return {"prototype_usage": effective_usage(nearest, self.prototypes.out_features)}

    def on_epoch_start(self, ctx):
        self.queue_started = len(self.queues) > 0 and ctx.epoch >= self.queue_start_epoch
        ctx.log["queue_size"] = len(self.queues[0]) if self.queue_started else 0

    def on_before_step(self, ctx):
        if ctx.epoch < self.freeze_prototypes_epochs:  # no update, no weight decay, no momentum
            self.prototypes.weight.grad = None

    def on_step_end(self, ctx):
        self.normalise_prototypes()  # the official normalises before each forward: the same weights
