"""What a run shows while it trains: measures of its encoder's features at the end of an epoch.

None of them changes the training: the trainer runs the encoder in eval mode without gradients on
the evaluation transform of its train split (``Trainer.forward_train_set``), nothing here draws from
torch's generators, and every epoch re-seeds all randomness at its start anyway. Computed on numpy
arrays, without torch.

- ``knn_top1``: the weighted kNN vote (``sslbench.knn``, the kNN protocol's) of a fixed held-out part
  of the labelled train split against the rest of it. Never the test split, which the protocols
  report: a monitor that read it would let the test set steer choices made while watching.
- ``rankme``: RankMe (Garrido et al., ICML 2023), the exponential of the entropy of the features'
  singular values normalised to sum 1: near the feature dimension when the features fill it, 1 when
  they have collapsed onto a line.
- ``feature_std``: the mean over dimensions of the std of the L2-normalised features (SimSiam's
  collapse check): 0 when every image gives the same feature, about 1/√d when they spread evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sslbench.knn import l2_normalize, nearest_neighbours, vote

# The same held-out images for every method and seed, so that their curves compare; numpy's own
# generator, so that the training's generators are never drawn from.
HOLDOUT_SEED = 0
RANKME_EPS = 1e-7  # the paper's ε, added to each normalised singular value
COLUMNS = ("knn_top1", "rankme", "feature_std")


def holdout_split(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(bank, queries): sorted indices of n images, a fixed ``fraction`` of them held out as queries."""
    order = np.random.default_rng(HOLDOUT_SEED).permutation(n)
    cut = min(n - 1, max(1, round(n * fraction)))
    return np.sort(order[cut:]), np.sort(order[:cut])


def rankme(features: np.ndarray) -> float:
    """exp(−Σ p_k log p_k) with p_k = σ_k / Σσ + ε over the singular values σ of ``features`` [N, d];
    0 for all-zero features."""
    singular = np.linalg.svd(np.asarray(features, dtype=np.float64), compute_uv=False)
    if singular.sum() == 0:
        return 0.0
    p = singular / singular.sum() + RANKME_EPS
    return float(np.exp(-(p * np.log(p)).sum()))


def feature_std(features: np.ndarray) -> float:
    """The mean over dimensions of the per-dimension std of the L2-normalised ``features`` [N, d]."""
    return float(l2_normalize(features).astype(np.float64).std(axis=0).mean())


def knn_top1(
    bank: np.ndarray,
    bank_labels: np.ndarray,
    queries: np.ndarray,
    query_labels: np.ndarray,
    k: int,
    temperature: float,
    num_classes: int,
) -> float:
    """The fraction of ``queries`` whose weighted kNN vote over ``bank`` names their class."""
    similarities, neighbours = nearest_neighbours(bank, queries, k)
    scores = vote(similarities, neighbours, bank_labels, temperature, num_classes)
    return float((scores.argmax(axis=1) == np.asarray(query_labels)).mean())


@dataclass(frozen=True)
class Monitor:
    """The config's ``monitor`` section: measure after every ``every``-th epoch and after the last (0:
    never), the kNN with ``k`` and ``temperature`` on a ``holdout`` fraction of the train split."""

    every: int = 0
    k: int | None = None
    temperature: float | None = None
    holdout: float | None = None

    def due(self, epoch: int, epochs: int) -> bool:
        """Whether to measure after ``epoch`` (1-based) of ``epochs``."""
        return self.every > 0 and (epoch % self.every == 0 or epoch == epochs)

    def measure(self, features: np.ndarray, labels: np.ndarray, num_classes: int) -> dict[str, float]:
        """COLUMNS of the train split's ``features`` [N, d] and ``labels`` (class indices; a multilabel
        set's [N, classes] rows have no top-1: its kNN is NaN)."""
        out = {"rankme": rankme(features), "feature_std": feature_std(features)}
        labels = np.asarray(labels)
        if labels.ndim != 1:
            return {"knn_top1": float("nan"), **out}
        bank, queries = holdout_split(len(labels), self.holdout)
        top1 = knn_top1(
            features[bank],
            labels[bank],
            features[queries],
            labels[queries],
            self.k,
            self.temperature,
            num_classes,
        )
        return {"knn_top1": top1, **out}
