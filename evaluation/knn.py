"""Weighted kNN classifier on frozen features (InstDisc, Wu et al. 2018; MoCo's kNN monitor).

The vote itself (cosine neighbours by faiss, weights exp(similarity / temperature)) is
sslbench.knn's, which the monitor of a run in training shares.

Few-shot kNN (`n_per_class`, `n_tries`), as DINOv2's evaluation defines it (facebookresearch/dinov2
dinov2/eval/knn.py): the train split cut to n images of every class, drawn `n_tries` times, each variant
voting with k = min(its k, n) neighbours (DINOv2 keeps the ks not above n, and n itself); the mean and
standard deviation over the draws. The draws are the suite's (evaluation.common.sample_lowshot, from the
run's seed), not DINOv2's; a class with fewer than n train images is an error, where DINOv2 takes all.
"""

from __future__ import annotations

import numpy as np

from sslbench.knn import nearest_neighbours, vote

from .common import (
    ProtocolError,
    check_metrics,
    check_rules,
    resolve_settings,
    sample_lowshot,
    topk_accuracy,
    unpack_features,
)

PROTOCOL = "knn"
DEFAULTS: dict = {
    "variants": [{"k": 200, "temperature": 0.1}, {"k": 20, "temperature": 0.07}],
    "n_per_class": [],  # few-shot kNN: train images of every class, e.g. [1, 2, 5] (none: off)
    "n_tries": 1,  # few-shot draws of each size
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
    "n_per_class": {"items": {"type": "integer", "minimum": 1}},
    "n_tries": {"minimum": 1},
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


def few_shot(data: dict, n: int, used: dict, seed: int) -> dict[str, float]:
    """Each variant's top-1 / top-5 with n train images of every class, over `n_tries` draws."""
    smallest = int(np.bincount(data["train_labels"], minlength=data["num_classes"]).min())
    if n > smallest:
        raise ProtocolError(
            f"config key `evaluation.knn.n_per_class`: {n} images per class, but the smallest class has "
            f"{smallest} train images; use at most {smallest}"
        )
    tries = sample_lowshot(data["train_labels"], n, int(used["n_tries"]), seed)
    found = {}
    for draw in tries:
        similarities, neighbours = nearest_neighbours(data["train"][draw], data["test"], len(draw))
        for variant in used["variants"]:
            k, temperature = min(int(variant["k"]), n), float(variant["temperature"])
            scores = vote(
                similarities[:, :k],
                neighbours[:, :k],
                data["train_labels"][draw],
                temperature,
                data["num_classes"],
            )
            for top, accuracy in topk_accuracy(scores, data["test_labels"], ks=(1, 5)).items():
                found.setdefault(f"top{top}_{variant_name(k, temperature)}_n{n}", []).append(accuracy)
    return {f"{name}_{stat}": float(f(values)) for name, values in found.items() for stat, f in STATS.items()}


STATS = {"mean": np.mean, "std": np.std}


def evaluate(features: dict, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    """top-1 / top-5 accuracy of each (k, temperature) variant on the test split; with `n_per_class`,
    also on few-shot train sets drawn from `seed`. kNN on the whole train split is deterministic."""
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
    for n in used["n_per_class"]:
        metrics.update(few_shot(data, int(n), used, seed))
    used["similarity"] = "cosine (L2-normalised, faiss IndexFlatIP)"
    used["vote_weight"] = "exp(similarity / temperature)"
    return check_metrics(metrics, PROTOCOL), used
