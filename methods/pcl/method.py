"""PCL (Li et al., ICLR 2021): prototypical contrastive learning, as salesforce/PCL main_pcl.py.

MoCo (v2 by default) plus prototypes found by k-means on momentum features (an EM view):

    for epoch in range(epochs):
        if epoch >= warmup_epochs:                        # E-step, on_epoch_start
            v = normalize(f_k(x)) for every training image (evaluation transform)
            for each granularity m with k_m clusters:
                C_m, assignments_m = kmeans(v, k_m)
                phi_m = concentration(v, C_m, assignments_m, T, alpha)   # mean T; or fixed_concentration
                prototypes_m = normalize(C_m)
        for x in loader:                                  # M-step
            q, k = normalize(f_q(aug(x))), normalize(f_k(aug(x)))
            loss = InfoNCE(q, k, queue, T)
            if E-step done:  # candidates: the batch's positives, one per image (pcl/builder.py), then others
                loss += mean_m ProtoNCE(q, prototypes_m, assignments_m[x], phi_m, r or all negatives)
            enqueue(queue, k); SGD step on f_q; f_k = m f_k + (1 - m) f_q

MoCo's machinery (split BN, key encoder, queue) comes from sslbench/pretrain/ (moco.py, queue.py); the maths
from sslbench.kit.losses (info_nce, proto_nce) and sslbench.kit.clustering (kmeans, concentration).
"""

import time

import torch
import torch.nn.functional as F

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import concentration, kmeans
from sslbench.kit.losses import PROTO_NCE_FORMS, info_nce, proto_nce, sample_negative_prototypes
from sslbench.kit.method import Method
from sslbench.kit.moco import check_version, query_head_and_key_encoder, temperature_of
from sslbench.kit.queue import KeyQueue, fit_queue_size


class PCL(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        check_version(cfg)  # PCL v1 / v2 build on MoCo v1 / v2 (pcl/builder.py)
        self.projector, self.key_encoder = query_head_and_key_encoder(
            self.backbone, p["version"], p["dim"], p["bn_splits"], info.batch_size
        )
        self.queue = KeyQueue(fit_queue_size(p["queue_size"], info.batch_size, info.num_train), p["dim"])
        self.temperature = temperature_of(p)
        self.warmup_epochs = int(p["warmup_epochs"])
        self.num_clusters = check_num_clusters(p["num_clusters"], info.num_train)
        self.num_negatives = check_num_negatives(p["num_negatives"], self.num_clusters, info.batch_size)
        self.proto_logits = check_proto_logits(p["proto_logits"])
        self.alpha = float(p["alpha"])
        self.fixed_concentration = check_fixed_concentration(p["fixed_concentration"])
        self.kmeans_settings = dict(p["kmeans"])
        dim = int(p["dim"])
        for m, k in enumerate(self.num_clusters):
            self.register_buffer(f"prototypes_{m}", torch.zeros(k, dim))
            self.register_buffer(f"concentration_{m}", torch.full((k,), self.temperature))
        # The last E-step's cluster of every training image, one row per granularity; -1 before it.
        self.register_buffer("assignments", torch.full((len(self.num_clusters), info.num_train), -1))
        self.last_negative_ids: list[torch.Tensor] = []  # per granularity, the last step's draw

    # --- E-step ---------------------------------------------------------------------------
    def on_epoch_start(self, ctx):
        ctx.log["queue_size"] = len(self.queue)
        if ctx.epoch >= self.warmup_epochs:
            start = time.perf_counter()
            self.e_step(ctx.forward_train_set(lambda x: F.normalize(self.key_encoder.embed(x), dim=1)))
            ctx.log["estep_seconds"] = time.perf_counter() - start
            ctx.log.update(self.cluster_size_stats())

    @torch.no_grad()
    def e_step(self, features: torch.Tensor) -> None:
        """Cluster the momentum features at every granularity (main_pcl.py run_kmeans)."""
        for m, k in enumerate(self.num_clusters):
            found = kmeans(features, k, seed=m, **self.kmeans_settings)
            if self.fixed_concentration is None:
                phi = concentration(
                    features, found.centroids, found.assignments, self.temperature, self.alpha
                )
            else:  # the paper's ablation: one phi for every prototype
                phi = torch.full((k,), self.fixed_concentration, device=features.device)
            self.prototype(m).copy_(F.normalize(found.centroids, dim=1))
            self.phi(m).copy_(phi)
            self.assignments[m].copy_(found.assignments)
        for m in range(len(self.num_clusters)):  # rank 0's clustering for every rank, as main_pcl.py
            dist.broadcast(self.prototype(m))
            dist.broadcast(self.phi(m))
        dist.broadcast(self.assignments)

    def cluster_size_stats(self) -> dict:
        stats = {}
        for m, k in enumerate(self.num_clusters):
            sizes = torch.bincount(self.assignments[m], minlength=k).float()
            stats.update(
                {
                    f"k{k}_size_min": sizes.min().item(),
                    f"k{k}_size_median": sizes.median().item(),
                    f"k{k}_size_max": sizes.max().item(),
                    f"k{k}_empty": int((sizes == 0).sum()),
                }
            )
        return stats

    def prototype(self, m: int) -> torch.Tensor:
        return getattr(self, f"prototypes_{m}")

    def phi(self, m: int) -> torch.Tensor:
        return getattr(self, f"concentration_{m}")

    # --- M-step ---------------------------------------------------------------------------
    def training_loss(self, views, labels, indices):
        q = F.normalize(self.projector(self.backbone(views[0])), dim=1)
        k = F.normalize(self.key_encoder(views[1]), dim=1)
        loss = info_nce(q, k, self.queue.negatives(), self.temperature)
        self.queue.push(k)
        if self.assignments[0, 0] < 0:  # warm-up: no E-step yet, InfoNCE only
            return loss
        proto_terms = [
            self.proto_nce_term(q, m, self.assignments[m][indices]) for m in range(len(self.num_clusters))
        ]
        return loss + torch.stack(proto_terms).mean()

    def proto_nce_term(self, q, m, positives):
        # Candidates from the whole batch (every rank's positives), so that under DDP each rank's loss
        # is its rows of the one-process loss.
        batch = dist.gather(positives)
        first_row = dist.rank() * positives.shape[0]
        common = dict(form=self.proto_logits, batch_assignments=batch, first_row=first_row)
        if self.num_negatives is None:
            return proto_nce(q, self.prototype(m), positives, self.phi(m), **common)
        # A fresh generator seeded from the global RNG (re-seeded per epoch by the engine, so resumes
        # repeat the draw), rank 0's seed on every rank: one draw for the whole batch. The same seed
        # replays the draw to keep the ids for inspection.
        seed = int(dist.broadcast(torch.randint(0, 2**62, ())))
        k = self.num_clusters[m]
        if len(self.last_negative_ids) < len(self.num_clusters):
            self.last_negative_ids = [None] * len(self.num_clusters)
        self.last_negative_ids[m] = sample_negative_prototypes(
            batch, k, self.num_negatives, torch.Generator().manual_seed(seed)
        )
        return proto_nce(
            q,
            self.prototype(m),
            positives,
            self.phi(m),
            self.num_negatives,
            torch.Generator().manual_seed(seed),
            **common,
        )

    def momentum_pairs(self):  # f_k = m f_k + (1 - m) f_q after every step (the engine's EMA)
        return [([self.backbone, self.projector], self.key_encoder)]


def check_num_clusters(num_clusters, num_train: int) -> list[int]:
    if not isinstance(num_clusters, (list, tuple)) or not num_clusters:
        raise ConfigError(
            f"config key `num_clusters` must be a non-empty list of cluster counts, got {num_clusters!r}"
        )
    counts = [int(k) for k in num_clusters]
    if any(not 1 <= k <= num_train for k in counts):
        raise ConfigError(
            f"config key `num_clusters` = {counts}: each count must lie in [1, {num_train}] "
            f"(the number of training images); lower the counts for this dataset"
        )
    return counts


def check_num_negatives(r, num_clusters: list[int], batch_size: int) -> int | None:
    """r must leave enough clusters that no image of a batch is assigned to: r <= min k - batch."""
    if r is None:
        return None
    limit = min(num_clusters) - batch_size
    if not isinstance(r, int) or not 1 <= r <= limit:
        raise ConfigError(
            f"config key `num_negatives` = {r!r}: negatives are drawn from the prototypes no image of the "
            "batch is assigned to, so r must lie in [1, min(num_clusters) - batch_size = "
            f"{limit}]; lower it, "
            "or set it to null to contrast with every prototype that is no image's positive"
        )
    return r


def check_fixed_concentration(phi) -> float | None:
    if phi is None:
        return None
    if isinstance(phi, bool) or not isinstance(phi, (int, float)) or not phi > 0:
        raise ConfigError(
            f"config key `fixed_concentration` = {phi!r}: a positive number (every prototype's phi), "
            "or null to estimate phi per cluster as main_pcl.py does"
        )
    return float(phi)


def check_proto_logits(form) -> str:
    if form not in PROTO_NCE_FORMS:
        raise ConfigError(
            f"config key `proto_logits` = {form!r}: choose one of {list(PROTO_NCE_FORMS)} "
            "(official: one column per image of the batch, as pcl/builder.py; paper_eq10: each "
            "prototype once)"
        )
    return form
