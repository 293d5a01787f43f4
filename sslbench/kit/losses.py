"""Losses shared by the methods: pure functions of torch tensors, each a differentiable 0-d tensor.

The contrastive losses take L2-normalised embeddings and return the mean over anchors:

- info_nce:   MoCo's InfoNCE with a queue of negatives (He et al., 2020).
- relational: ReSSL's relation of a query to a queue of anchors, sharpened from a teacher's key
              (Zheng et al., 2021).
- supcon:     Supervised Contrastive loss (Khosla et al., 2020); with
              labels=None it is SimCLR's NT-Xent (Chen et al., 2020).
- proto_nce:  one clustering's ProtoNCE term of PCL (Li et al., 2021).
- cross_view_cross_entropy: SwAV's swapped prediction (Caron et al., 2020) and
              DINO's loss (Caron et al., 2021): soft targets of some views
              predicted from every other view.
- masked_patch_cross_entropy: iBOT's patch loss (Zhou et al., 2022): the teacher's distribution
              of each masked patch predicted by the student's.
- batch_info_nce:     InfoNCE against the other keys of the (gathered) batch: MoCo v3's
                      contrastive loss (Chen, Xie, He, 2021).
- cosine_regression:  BYOL's 2 - 2 cos(p, z) (Grill et al., 2020); takes unnormalised inputs.
- negative_cosine:    SimSiam's -cos(p, z) (Chen & He, 2021); takes unnormalised inputs.

The redundancy-reduction losses take raw embeddings [N, D] of the whole batch (under DDP the method
gathers them first) and compute in float32 whatever the autocast (their statistics over the batch
lose too much in bf16: a diagonal entry near 1 has a resolution of 2^-8):

- barlow_twins:  the cross-correlation of the batch-standardised embeddings pulled to the identity
                 (Zbontar et al., 2021), with cross_correlation and off_diagonal.
- variance_hinge, covariance_penalty: VICReg's variance and covariance terms (Bardes et al., 2022).
- mmcr:          the negative nuclear norm of the views' centroids (Yerxa et al., 2023).
- instance_nce: InstDisc's (NPID) noise-contrastive estimation against a
              memory bank (Wu et al., 2018).
- me_max:       MSN's mean-entropy maximisation (Assran et al., 2022): how far the batch's mean
                assignment to K prototypes is from uniform.
- centre_prediction: LeJEPA's prediction loss (Balestriero & LeCun, 2025): every view's embedding
                regressed on the centre of the global views' (VISReg's too).
- epps_pulley, sigreg: LeJEPA's SIGReg: the Epps-Pulley statistic of the embeddings' projections on
                random unit directions (random_directions) against a standard normal.
- visreg_terms: VISReg's centre, scale and sliced-Wasserstein shape terms (Wu, Balestriero, Levine, 2026).
- koleo:        DINOv2's KoLeo regulariser (Oquab et al., 2024; Sablayrolles et al., 2019): minus the mean
                log distance of each L2-normalised embedding to its nearest neighbour in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sslbench import distributed as dist

__all__ = [
    "info_nce",
    "relational",
    "supcon",
    "proto_nce",
    "PROTO_NCE_FORMS",
    "sample_negative_prototypes",
    "cross_view_cross_entropy",
    "masked_patch_cross_entropy",
    "barlow_twins",
    "cross_correlation",
    "off_diagonal",
    "variance_hinge",
    "covariance_penalty",
    "batch_info_nce",
    "cosine_regression",
    "negative_cosine",
    "instance_nce",
    "mmcr",
    "me_max",
    "centre_prediction",
    "random_directions",
    "epps_pulley",
    "sigreg",
    "visreg_terms",
    "koleo",
]


def _require_2d(name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor [N, D], got shape {tuple(tensor.shape)}")


def _require_directions(z: torch.Tensor, directions: torch.Tensor) -> None:
    """z [N, D] and unit columns ``directions`` [D, S] to project it on (SIGReg's and VISReg's slices)."""
    _require_2d("z", z)
    if directions.ndim != 2 or directions.shape[0] != z.shape[1]:
        raise ValueError(f"directions must be [{z.shape[1]}, S] for z of shape {tuple(z.shape)}")


def _require_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def info_nce(
    query: torch.Tensor, key: torch.Tensor, negatives: torch.Tensor, temperature: float
) -> torch.Tensor:
    """MoCo's InfoNCE: query/key [B, D] (row i of key is query i's positive),
    negatives [K, D] shared by every query (the queue; K may be 0).

    Logits are [q·k, q·negatives] / T and the target is index 0.
    """
    _require_2d("query", query)
    _require_2d("key", key)
    _require_2d("negatives", negatives)
    if key.shape != query.shape:
        raise ValueError(f"key shape {tuple(key.shape)} must equal query shape {tuple(query.shape)}")
    if negatives.shape[1] != query.shape[1]:
        raise ValueError(f"negatives have dimension {negatives.shape[1]} but query has {query.shape[1]}")
    _require_positive("temperature", temperature)
    positive_logits = (query * key).sum(dim=1, keepdim=True)
    negative_logits = query @ negatives.T
    logits = torch.cat([positive_logits, negative_logits], dim=1) / temperature
    targets = torch.zeros(query.shape[0], dtype=torch.long, device=query.device)
    return F.cross_entropy(logits, targets)


def relational(
    query: torch.Tensor,
    key: torch.Tensor,
    anchors: torch.Tensor,
    student_temperature: float,
    teacher_temperature: float,
) -> torch.Tensor:
    """ReSSL's loss (Zheng et al., NeurIPS 2021; ressl.py): the cross-entropy between the key's relation to
    the anchors [K, D] (the queue), sharpened by the teacher's lower temperature, and the query's, averaged
    over the batch:

        -(1/B) sum_b sum_k softmax(key_b anchors^T / t_t)_k log softmax(query_b anchors^T / t_s)_k

    query/key [B, D] and the anchors are L2-normalised rows. The key's relation is a target: no gradient.
    """
    _require_2d("query", query)
    _require_2d("key", key)
    _require_2d("anchors", anchors)
    if key.shape != query.shape:
        raise ValueError(f"key shape {tuple(key.shape)} must equal query shape {tuple(query.shape)}")
    if anchors.shape[0] < 1 or anchors.shape[1] != query.shape[1]:
        raise ValueError(f"anchors [K >= 1, {query.shape[1]}] expected, got {tuple(anchors.shape)}")
    _require_positive("student_temperature", student_temperature)
    _require_positive("teacher_temperature", teacher_temperature)
    target = F.softmax(key.detach() @ anchors.T / teacher_temperature, dim=1)
    log_prediction = F.log_softmax(query @ anchors.T / student_temperature, dim=1)
    return -(target * log_prediction).sum(dim=1).mean()


def supcon(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    temperature: float = 0.07,
    base_temperature: float = 0.07,
    contrast_mode: str = "all",
) -> torch.Tensor:
    """Supervised contrastive loss, following HobbitLong/SupContrast.

    features: [B, V, D], V views of each of B samples.
    labels:   [B] class ids, or None for SimCLR's NT-Xent (a sample's positives
              are only its own other views).
    contrast_mode: "all" makes every view an anchor, "one" only the first view.

    Each anchor is contrasted against all B*V views except itself; its loss is
    minus the mean log-probability of its positives, scaled by
    temperature / base_temperature. An anchor without any positive contributes
    0 (it still counts in the mean), as in the official code.
    """
    if features.dim() != 3:
        raise ValueError(f"features must be [batch, views, dim], got shape {tuple(features.shape)}")
    if contrast_mode not in ("all", "one"):
        raise ValueError(f"contrast_mode must be 'all' or 'one', got {contrast_mode!r}")
    _require_positive("temperature", temperature)
    _require_positive("base_temperature", base_temperature)
    batch_size, num_views, _ = features.shape
    device = features.device

    if labels is None:
        same_sample = torch.eye(batch_size, dtype=torch.bool, device=device)
    else:
        labels = labels.reshape(-1)
        if labels.shape[0] != batch_size:
            raise ValueError(f"labels has {labels.shape[0]} entries but features has batch {batch_size}")
        same_sample = labels[:, None] == labels[None, :]

    # View-major order (all first views, then all second views, ...), so the
    # first batch_size rows are exactly the first-view anchors of mode "one".
    contrast = features.transpose(0, 1).reshape(batch_size * num_views, -1)
    num_anchor_views = num_views if contrast_mode == "all" else 1
    anchors = contrast[: batch_size * num_anchor_views]

    logits = anchors @ contrast.T / temperature
    num_anchors = anchors.shape[0]
    not_self = torch.ones_like(logits, dtype=torch.bool)
    not_self[torch.arange(num_anchors, device=device), torch.arange(num_anchors, device=device)] = False
    positives = same_sample.repeat(num_anchor_views, num_views) & not_self

    # logsumexp subtracts the row maximum over the contrast set (self removed).
    # The official code subtracts a maximum that includes the self-similarity
    # 1/T, so at small T every other term underflows and the loss turns NaN.
    log_denominator = torch.logsumexp(logits.masked_fill(~not_self, float("-inf")), dim=1, keepdim=True)
    log_prob = torch.where(positives, logits - log_denominator, torch.zeros_like(logits))
    positives_per_anchor = positives.sum(dim=1).clamp_min(1)  # guard anchors without positives
    mean_log_prob_pos = log_prob.sum(dim=1) / positives_per_anchor
    return -(temperature / base_temperature) * mean_log_prob_pos.mean()


def _prototypes_outside(assignments: torch.Tensor, num_prototypes: int) -> torch.Tensor:
    """Ids of the prototypes that no query is assigned to (nobody's positive), in increasing
    order, on assignments' device."""
    assignments = assignments.reshape(-1)
    is_positive = torch.zeros(num_prototypes, dtype=torch.bool, device=assignments.device)
    is_positive[assignments] = True
    return torch.nonzero(~is_positive).flatten()


def sample_negative_prototypes(
    assignments: torch.Tensor,
    num_prototypes: int,
    r: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw r distinct prototype ids that are none of the batch's positives
    (PCL's builder: negatives from the prototypes no sample of the batch is
    assigned to, sampled without replacement). Returns a LongTensor [r] on
    assignments' device; `generator` must be a CPU generator (it drives the
    draw on the CPU)."""
    assignments = assignments.reshape(-1)
    candidates = _prototypes_outside(assignments.cpu(), num_prototypes)
    if r < 0 or r > candidates.numel():
        raise ValueError(
            f"cannot sample num_negatives={r} prototypes: only {candidates.numel()} of "
            f"{num_prototypes} are not a positive of this batch; lower num_negatives or use more clusters"
        )
    chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:r]]
    return chosen.to(assignments.device)


# How the candidate prototypes become logit columns (see proto_nce).
PROTO_NCE_FORMS = ("official", "paper_eq10")


def proto_nce(
    query: torch.Tensor,
    prototypes: torch.Tensor,
    assignments: torch.Tensor,
    concentration: torch.Tensor,
    num_negatives: int | None = None,
    generator: torch.Generator | None = None,
    form: str = "official",
    batch_assignments: torch.Tensor | None = None,
    first_row: int = 0,
) -> torch.Tensor:
    """One clustering's ProtoNCE term.

    query [B, D]; prototypes [k, D]; assignments [B] (long, the cluster of
    each query); concentration [k] (phi of each cluster).

    The batch the candidates come from is ``batch_assignments`` when the
    queries are rows first_row .. first_row + B of a larger batch (under DDP:
    every rank's assignments, gathered in rank order), else the queries'
    own. So a rank's loss is its rows of the one-process loss on the whole
    batch (main_pcl.py builds each GPU's candidates from its own images).

    The candidates are the batch's positive prototypes and the negatives: r
    prototypes drawn from those that are nobody's positive
    (num_negatives=r, `sample_negative_prototypes`), or all of those
    (num_negatives=None). Each logit is q·c_j / phi_j, and the loss is the
    cross-entropy towards the query's own prototype. ``form`` says how the
    positives become columns:

    - "official" (salesforce/PCL pcl/builder.py): one column per query, in
      batch order, so a prototype that is the positive of n queries appears n
      times in every row's denominator; then the negatives. Query i's target
      is column i. Logits [B, B + negatives].
    - "paper_eq10" (the paper's eq. 10): each candidate prototype once; with
      num_negatives=None that is every prototype once, logits [B, k].
    """
    _require_2d("query", query)
    _require_2d("prototypes", prototypes)
    if form not in PROTO_NCE_FORMS:
        raise ValueError(f"form must be one of {PROTO_NCE_FORMS}, got {form!r}")
    assignments = assignments.reshape(-1).long()
    num_prototypes = prototypes.shape[0]
    if assignments.shape[0] != query.shape[0]:
        raise ValueError(
            f"assignments has {assignments.shape[0]} entries but query has {query.shape[0]} rows"
        )
    if concentration.shape != (num_prototypes,):
        raise ValueError(
            f"concentration must have shape [{num_prototypes}] (one phi per prototype), "
            f"got {tuple(concentration.shape)}"
        )
    if assignments.numel() and (assignments.min() < 0 or assignments.max() >= num_prototypes):
        raise ValueError(f"assignments must lie in [0, {num_prototypes}), the prototype ids")

    batch = assignments if batch_assignments is None else batch_assignments.reshape(-1).long()
    rows = slice(first_row, first_row + query.shape[0])
    if not torch.equal(batch[rows], assignments):
        raise ValueError(f"assignments must be rows {rows.start}..{rows.stop} of batch_assignments")
    if num_negatives is None:
        negative_ids = _prototypes_outside(batch, num_prototypes)
    else:
        negative_ids = sample_negative_prototypes(batch, num_prototypes, num_negatives, generator)
    if form == "official":
        positive_ids, targets = batch, torch.arange(rows.start, rows.stop, device=query.device)
    else:
        positive_ids, inverse = torch.unique(batch, return_inverse=True)
        targets = inverse[rows]
    selected = torch.cat([positive_ids, negative_ids.to(assignments.device)])
    logits = query @ prototypes[selected].T / concentration[None, selected]
    return F.cross_entropy(logits, targets.to(query.device))


def cross_view_cross_entropy(
    targets: Sequence[torch.Tensor],
    logits: Sequence[torch.Tensor],
    temperature: float,
    view_weights: Sequence[float] | None = None,
) -> torch.Tensor:
    """The mean over the pairs (i, v), v != i, of the batch mean of the cross-entropy
    -sum_k targets[i]_bk log softmax(logits[v]_b / temperature)_k, each pair's term times view v's weight
    where `view_weights` gives one per view (DINOv3's local crops' weight; the mean is still over the
    pairs).

    targets[i] [B, K] is view i's target distribution (used as given: detach it), logits[v] [B, K]
    view v's scores, for the V >= len(targets) views. SwAV's swapped prediction (main_swav.py: the
    codes of crops_for_assign predicted from every other crop, each sub-loss over V - 1 crops, then
    the mean over the assigned crops) and DINO's loss (main_dino.py DINOLoss: the teacher's outputs
    on the 2 global crops predicted from every other crop, the sum over n_loss_terms pairs) are
    both this mean over the len(targets) x (V - 1) pairs.
    """
    if not 1 <= len(targets) <= len(logits) or len(logits) < 2:
        raise ValueError(
            f"cross_view_cross_entropy needs 1 <= len(targets) <= len(logits) and 2 or more views, "
            f"got {len(targets)} targets and {len(logits)} views"
        )
    _require_positive("temperature", temperature)
    if view_weights is not None and len(view_weights) != len(logits):
        raise ValueError(
            f"cross_view_cross_entropy: {len(view_weights)} view weights for {len(logits)} views"
        )
    log_probs = [F.log_softmax(x / temperature, dim=1) for x in logits]
    terms = [
        -(target * log_probs[v]).sum(dim=1).mean() * (1.0 if view_weights is None else view_weights[v])
        for i, target in enumerate(targets)
        for v in range(len(logits))
        if v != i
    ]
    return torch.stack(terms).mean()


def soft_cross_entropy(targets: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """-sum_k targets log softmax(logits / temperature) over the last dimension, in float32, the mean over
    every other (CAPI's do_student and OnlineClustering losses: rows of patches, or of images x positions)."""
    _require_positive("temperature", temperature)
    return -(targets.float() * F.log_softmax(logits.float() / temperature, dim=-1)).sum(dim=-1).mean()


def masked_patch_cross_entropy(
    teacher_probs: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """iBOT's patch term (main_ibot.py iBOTLoss; DINOv2's iBOTPatchLoss.forward_masked): the cross-entropy of
    each masked patch's student distribution (logits [M, K], already over the student temperature) to the
    teacher's (probabilities [M, K]), the rows in the order of ``mask``'s masked entries (mask [N, L], 1 =
    masked), each weighted by 1 / its image's number of masked patches, summed, over the N images: the mean
    over the images of their masked patches' mean, an image with none counting 0."""
    mask = mask.bool()
    per_patch = torch.sum(-teacher_probs * F.log_softmax(student_logits, dim=-1), dim=-1)
    weights = (1 / mask.sum(dim=-1).clamp(min=1)).unsqueeze(-1).expand_as(mask)[mask]
    return (per_patch * weights).sum() / mask.shape[0]


# --------------------------------------------------------------------------- redundancy reduction


def off_diagonal(matrix: torch.Tensor) -> torch.Tensor:
    """The off-diagonal entries of a square matrix, flattened (row-major, diagonal skipped)."""
    _require_2d("matrix", matrix)
    n = matrix.shape[0]
    if matrix.shape[1] != n:
        raise ValueError(f"matrix must be square, got shape {tuple(matrix.shape)}")
    return matrix.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def full_precision(t: torch.Tensor) -> torch.Tensor:
    """float32 for a half-precision tensor (float64 stays float64)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def cross_correlation(z1: torch.Tensor, z2: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """[D, D] cross-correlation of two views' embeddings [N, D] along the batch: each embedding is
    standardised per dimension over the batch as barlowtwins main.py's BatchNorm1d(affine=False)
    in training mode does (biased variance, ``eps`` 1e-5), then c = z1_std^T z2_std / N."""
    _require_2d("z1", z1)
    if z2.shape != z1.shape:
        raise ValueError(f"z2 shape {tuple(z2.shape)} must equal z1 shape {tuple(z1.shape)}")
    if z1.shape[0] < 2:
        raise ValueError("the cross-correlation needs a batch of at least 2 embeddings")
    with torch.autocast(z1.device.type, enabled=False):
        z1, z2 = full_precision(z1), full_precision(z2)
        return _standardise(z1, eps).T @ _standardise(z2, eps) / z1.shape[0]


def _standardise(z: torch.Tensor, eps: float) -> torch.Tensor:
    return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + eps)


def barlow_twins(z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> torch.Tensor:
    """Barlow Twins' loss on two views' embeddings [N, D] (the whole batch): with c their
    cross-correlation, sum_i (1 - c_ii)^2 + lambd sum_{i != j} c_ij^2 (sums, not means)."""
    c = cross_correlation(z1, z2)
    return (1 - torch.diagonal(c)).pow(2).sum() + lambd * off_diagonal(c).pow(2).sum()


def variance_hinge(z: torch.Tensor, gamma: float = 1.0, eps: float = 1e-4) -> torch.Tensor:
    """VICReg's variance term of embeddings [N, D]: mean_d relu(gamma - sqrt(Var_d + eps)), the
    unbiased variance along the batch (main_vicreg.py). 0 when every dimension's std is >= gamma."""
    _require_2d("z", z)
    with torch.autocast(z.device.type, enabled=False):
        z = full_precision(z)
        return F.relu(gamma - torch.sqrt(z.var(0) + eps)).mean()


def covariance_penalty(z: torch.Tensor) -> torch.Tensor:
    """VICReg's covariance term of embeddings [N, D]: the sum of the squared off-diagonal entries of
    their covariance (centred over the batch, divided by N - 1), divided by D (main_vicreg.py)."""
    _require_2d("z", z)
    with torch.autocast(z.device.type, enabled=False):
        z = full_precision(z)
        z = z - z.mean(0)
        cov = z.T @ z / (z.shape[0] - 1)
        return off_diagonal(cov).pow(2).sum() / z.shape[1]


def batch_info_nce(
    query: torch.Tensor, keys: torch.Tensor, temperature: float, first_row: int = 0
) -> torch.Tensor:
    """InfoNCE against the batch's keys (moco-v3 moco/builder.py contrastive_loss): query [B, D] are
    rows first_row .. first_row + B of a batch whose keys [N, D] (under DDP: every rank's, gathered in
    rank order) hold query i's positive at row first_row + i and its negatives in the N - 1 other rows.
    Cross-entropy of the logits q k^T / T towards the positive, averaged over the B queries."""
    _require_2d("query", query)
    _require_2d("keys", keys)
    if keys.shape[1] != query.shape[1]:
        raise ValueError(f"keys have dimension {keys.shape[1]} but query has {query.shape[1]}")
    if not 0 <= first_row <= keys.shape[0] - query.shape[0]:
        raise ValueError(
            f"rows {first_row}..{first_row + query.shape[0]} are not rows of the {keys.shape[0]} keys"
        )
    _require_positive("temperature", temperature)
    targets = torch.arange(first_row, first_row + query.shape[0], device=query.device)
    return F.cross_entropy(query @ keys.T / temperature, targets)


def cosine_regression(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """BYOL's regression loss (byol/utils/helpers.py regression_loss), averaged over the batch:
    ||p/||p|| - z/||z||||^2 = 2 - 2 cos(p, z) per pair, in [0, 4]. Each row is normalised as there,
    x / max(||x||, 1e-6). The caller stops the target's gradient."""
    _require_2d("prediction", prediction)
    if target.shape != prediction.shape:
        raise ValueError(
            f"target shape {tuple(target.shape)} must equal prediction shape {tuple(prediction.shape)}"
        )
    difference = F.normalize(prediction, dim=1, eps=1e-6) - F.normalize(target, dim=1, eps=1e-6)
    return difference.pow(2).sum(dim=1).mean()


def negative_cosine(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SimSiam's D(p, z) = -cos(p, z), averaged over the batch (main_simsiam.py: nn.CosineSimilarity
    with eps 1e-8), in [-1, 1]. The caller stops the target's gradient."""
    _require_2d("prediction", prediction)
    if target.shape != prediction.shape:
        raise ValueError(
            f"target shape {tuple(target.shape)} must equal prediction shape {tuple(prediction.shape)}"
        )
    return -F.cosine_similarity(prediction, target, dim=1, eps=1e-8).mean()


NCE_EPS = 1e-7  # lemniscate.pytorch lib/NCECriterion.py, in every denominator


def instance_nce(probabilities: torch.Tensor, num_data: int) -> torch.Tensor:
    """InstDisc's NCE loss (Wu et al., 2018, eqs. 5-7; lemniscate.pytorch lib/NCECriterion.py).

    probabilities [B, 1 + K]: the model's P(i|v) = exp(w_i·v / T) / Z of each image's own memory row
    (column 0) and of K noise rows drawn from the noise distribution P_n = 1 / num_data (uniform
    over the memory bank). With h(i, v) = P(i|v) / (P(i|v) + K P_n), the posterior that (i, v)
    came from the data, the loss is

        -(1/B) sum_b [ log h(column 0) + sum_{j=1..K} log(1 - h(column j)) ]

    (a sum over the noise, a mean over the batch), with the official 1e-7 in each denominator.
    """
    _require_2d("probabilities", probabilities)
    if probabilities.shape[1] < 2:
        raise ValueError(
            f"probabilities need the positive and at least one noise column, got {probabilities.shape}"
        )
    _require_positive("num_data", num_data)
    noise_mass = (probabilities.shape[1] - 1) / num_data  # K P_n
    positive = probabilities[:, 0]
    log_h = torch.log(positive / (positive + noise_mass + NCE_EPS))
    log_not_h = torch.log(noise_mass / (probabilities[:, 1:] + noise_mass + NCE_EPS))
    return -(log_h.sum() + log_not_h.sum()) / probabilities.shape[0]


def mmcr(z: torch.Tensor, lmbda: float = 0.0) -> torch.Tensor:
    """MMCR's loss (Yerxa et al., NeurIPS 2023; ThomasYerxa/mmcr loss_mmcr.py) on the embeddings z [B, V, C]
    of V views of B images (under DDP, the whole batch): each row L2-normalised, the centroid of each image's
    views c_b = mean_v z_bv, and

        lmbda x (1/B) sum_b ||Z_b||_*  -  ||[c_1; ...; c_B]||_*

    with ||.||_* the nuclear norm (the sum of singular values) and Z_b [C, V] image b's views (the "local"
    term, off at lmbda 0, the official default). Computed in float32 at least (an SVD in bf16)."""
    if z.ndim != 3:
        raise ValueError(f"mmcr takes z [B, V, C], got shape {tuple(z.shape)}")
    with torch.autocast(z.device.type, enabled=False):
        z = F.normalize(full_precision(z), dim=-1)
        loss = -torch.linalg.svdvals(z.mean(dim=1)).sum()
        if lmbda:
            loss = loss + lmbda * torch.linalg.svdvals(z.transpose(1, 2)).sum() / z.shape[0]
        return loss


def me_max(probs: torch.Tensor) -> torch.Tensor:
    """MSN's me-max regulariser (losses.py): log K - H(p_mean), where p_mean is the mean of the assignments
    ``probs`` [N, K] (rows of probabilities) over the batch; 0 when the batch uses every prototype equally,
    log K when every row puts all its mass on one prototype. Under DDP the method gathers the rows first."""
    _require_2d("probs", probs)
    mean = probs.mean(dim=0)
    return (mean * torch.log(mean)).sum() + math.log(probs.shape[1])


def centre_prediction(z: torch.Tensor, num_global: int) -> torch.Tensor:
    """LeJEPA's prediction loss on the embeddings z [V, N, K] of V views (the first ``num_global`` the global
    ones) of N images: every view, global and local, predicts the centre mu = mean of the global views, the
    mean over views, images and dimensions of (mu - z_v)^2. A mean over the images: under DDP each rank's
    own, which DDP's gradient average makes the batch's."""
    if z.ndim != 3 or not 1 <= num_global <= z.shape[0]:
        raise ValueError(f"z must be [V, N, K] with 1 <= num_global <= V, got {tuple(z.shape)}, {num_global}")
    return (z[:num_global].mean(dim=0) - z).square().mean()


@torch.no_grad()
def random_directions(dim: int, count: int, device=None) -> torch.Tensor:
    """[dim, count] unit columns, uniform on the sphere, from torch's global random stream (the engine seeds
    it per epoch); under DDP rank 0's draw on every rank, so that every rank slices alike."""
    return dist.broadcast(F.normalize(torch.randn(dim, count, device=device), dim=0))


def epps_pulley(x: torch.Tensor, t_max: float = 3.0, knots: int = 17) -> torch.Tensor:
    """The Epps-Pulley statistic of each column of ``x`` [N, S] (N samples of S univariate variables) against
    N(0, 1), as lejepa's univariate/epps_pulley.py computes it:

        T = N * integral over [-t_max, t_max] of |phi_N(t) - exp(-t^2 / 2)|^2 exp(-t^2 / 2) dt

    with phi_N(t) = mean_n exp(i t x_n) the empirical characteristic function. The integrand is even, so
    the trapezoid rule runs on ``knots`` equally spaced points of [0, t_max] with its weights doubled.
    Returns [S]. In float32 at least (cosines of bf16 arguments lose the statistic)."""
    _require_2d("x", x)
    _require_positive("t_max", t_max)
    if knots < 2:
        raise ValueError(f"knots must be at least 2, got {knots}")
    with torch.autocast(x.device.type, enabled=False):
        x = full_precision(x)
        t = torch.linspace(0, t_max, knots, dtype=x.dtype, device=x.device)
        window = torch.exp(-t.square() / 2)  # both N(0, 1)'s characteristic function and the weight
        weights = torch.full_like(t, 2 * t_max / (knots - 1))
        weights[[0, -1]] /= 2
        xt = x.unsqueeze(-1) * t  # [N, S, knots]
        error = (xt.cos().mean(0) - window).square() + xt.sin().mean(0).square()
        return (error @ (weights * window)) * x.shape[0]


def sigreg(z: torch.Tensor, directions: torch.Tensor, t_max: float = 3.0, knots: int = 17) -> torch.Tensor:
    """LeJEPA's SIGReg of embeddings z [N, D] (the whole batch; under DDP the method gathers it): the mean
    over the unit columns of ``directions`` [D, S] of the Epps-Pulley statistic of z's projection on each. 0
    only where every projection's empirical characteristic function is N(0, 1)'s on the grid."""
    _require_directions(z, directions)
    with torch.autocast(z.device.type, enabled=False):
        z = full_precision(z)
        return epps_pulley(z @ directions.to(z.dtype), t_max, knots).mean()


def visreg_terms(
    z: torch.Tensor, directions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VISReg's three regularisers of embeddings z [N, D] (the whole batch; under DDP the method gathers it),
    with mu_d and s_d each dimension's batch mean and standard deviation (biased, + 1e-6):

        centre = mean_d mu_d^2
        scale  = mean_d (s_d - 1)^2                  # its gradient stays -2 as the embeddings collapse
        shape  = mean over i, j of (sort_i(x_j) - q_i)^2,  x_j = ((z - mu) / sg(s)) a_j

    the shape term the squared 2-Wasserstein distance of each projection on a unit column a_j of
    ``directions`` [D, S] to N(0, 1), through its sorted values against the normal quantiles q_i at
    i / (N + 1), i = 1..N; the stop-gradient on s leaves the scale to the scale term. In float32 at least."""
    _require_directions(z, directions)
    with torch.autocast(z.device.type, enabled=False):
        z = full_precision(z)
        n = z.shape[0]
        mean = z.mean(dim=0)
        centred = z - mean
        std = centred.norm(dim=0) / math.sqrt(n) + 1e-6
        projections = (centred / std.detach()) @ directions.to(z.dtype)
        levels = torch.arange(1, n + 1, dtype=z.dtype, device=z.device) / (n + 1)
        quantiles = math.sqrt(2) * torch.erfinv(2 * levels - 1)
        shape = (projections.sort(dim=0).values - quantiles[:, None]).square().mean()
        return mean.square().mean(), (std - 1).square().mean(), shape


def koleo(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """DINOv2's KoLeo regulariser (dinov2/loss/koleo_loss.py) of embeddings x [N, D]: each row L2-normalised,
    its nearest other row found by the largest dot product, then -mean_n log(||x_n - x_nn(n) + eps|| + eps)
    (torch's PairwiseDistance adds eps to the difference). Small when the rows spread over the sphere, large
    when two of them meet. In float32 at least, as the official code turns autocast off for it."""
    _require_2d("x", x)
    if x.shape[0] < 2:
        raise ValueError(f"koleo needs at least 2 embeddings, got {x.shape[0]}")
    with torch.autocast(x.device.type, enabled=False):
        x = F.normalize(full_precision(x), p=2, dim=-1, eps=eps)
        with torch.no_grad():
            dots = x @ x.T
            dots.fill_diagonal_(-1.0)  # never its own neighbour: every other dot product is at least -1
            nearest = dots.argmax(dim=1)
        distances = F.pairwise_distance(x, x[nearest], p=2, eps=eps)
        return -torch.log(distances + eps).mean()


GRAM_NEGATIVES = ("keep", "clip", "clip_teacher")


def gram_loss(student: torch.Tensor, teacher: torch.Tensor, negatives: str = "keep") -> torch.Tensor:
    """DINOv3's Gram anchoring (GramLoss, img_level, normalised): the mean squared difference between each
    image's cosine-similarity matrices of its patch features, student [N, L, D] against teacher [N, L, D]
    (used as given: detach it). `negatives`: "keep" both matrices' negative entries; "clip" set them to 0 in
    both (remove_neg); "clip_teacher" set the teacher's to 0, and the student's where both are negative
    (remove_only_teacher_neg)."""
    if student.dim() != 3 or student.shape != teacher.shape:
        raise ValueError(
            f"gram_loss needs student and teacher [N, L, D] alike, got {student.shape} and {teacher.shape}"
        )
    if negatives not in GRAM_NEGATIVES:
        raise ValueError(f"gram_loss: negatives must be one of {GRAM_NEGATIVES}, got {negatives!r}")
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.float(), dim=-1)
    student_sim, teacher_sim = s @ s.transpose(1, 2), t @ t.transpose(1, 2)
    if negatives == "clip":
        student_sim, teacher_sim = student_sim.clamp(min=0), teacher_sim.clamp(min=0)
    elif negatives == "clip_teacher":
        both = (student_sim < 0) & (teacher_sim < 0)
        student_sim, teacher_sim = student_sim.masked_fill(both, 0.0), teacher_sim.clamp(min=0)
    return F.mse_loss(student_sim, teacher_sim)
