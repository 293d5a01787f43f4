"""Weighted kNN classifier on frozen features (InstDisc, Wu et al. 2018; MoCo's kNN monitor).

The vote itself (cosine neighbours by faiss, weights exp(similarity / temperature)) is
sslbench.knn's, which the monitor of a run in training shares.
"""

from __future__ import annotations

import numpy as np

from sslbench.knn import nearest_neighbours, vote

from .common import (
    check_metrics,
    check_rules,
    resolve_settings,
    topk_accuracy,
    unpack_features,
)

PROTOCOL = "knn"
DEFAULTS: dict = {
    "variants": [{"k": 200, "temperature": 0.1}, {"k": 20, "temperature": 0.07}],
}
RULES: dict = {  # over the types of DEFAULTS: what the plan and the job judge the settings by
    "variants": {
        "minItems": 1,
        "items": {
            "required": ["k", "temperature"],
            "additionalProperties": False,
            "properties": {"k": {"minimum": 1}, "temperature": {"exclusiveMinimum": 0}},
        },
    },
}


def knn_classify(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    k: int,
    temperature: float,
    num_classes: int,
) -> np.ndarray:
    """Class scores [n_test, num_classes]: sum over the top-k cosine neighbours of exp(sim / T).

    k is capped at the number of train samples.
    """
    check_rules(PROTOCOL, {"variants": [{"k": k, "temperature": temperature}]})
    similarities, neighbours = nearest_neighbours(train_features, test_features, k)
    return vote(similarities, neighbours, train_labels, temperature, num_classes)


def variant_name(k: int, temperature: float) -> str:
    """Suffix of a variant's metric names: k200_t0.1 (the requested k, not the capped one)."""
    return f"k{int(k)}_t{float(temperature):g}"


def evaluate(features: dict, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    """top-1 / top-5 accuracy of each (k, temperature) variant on the test split.

    kNN is deterministic: `seed` is accepted for the common signature and not used.
    """
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    data = unpack_features(features)
    metrics, variants = {}, []
    # One search at the largest k serves every variant: the k nearest are the first k of the list.
    largest = max(int(v["k"]) for v in used["variants"])
    similarities, neighbours = nearest_neighbours(data["train"], data["test"], largest)
    for variant in used["variants"]:
        k, temperature = int(variant["k"]), float(variant["temperature"])
        scores = vote(
            similarities[:, :k], neighbours[:, :k], data["train_labels"], temperature, data["num_classes"]
        )
        accuracy = topk_accuracy(scores, data["test_labels"], ks=(1, 5))
        name = variant_name(k, temperature)
        metrics[f"top1_{name}"], metrics[f"top5_{name}"] = accuracy[1], accuracy[5]
        variants.append({"k": k, "temperature": temperature, "effective_k": min(k, len(data["train"]))})
    used["variants"] = variants
    used["similarity"] = "cosine (L2-normalised, faiss IndexFlatIP)"
    used["vote_weight"] = "exp(similarity / temperature)"
    return check_metrics(metrics, PROTOCOL), used
