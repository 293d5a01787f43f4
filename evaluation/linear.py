"""Linear probe on cached frozen features.

Mode "cached": features standardised with train statistics; a linear layer (multinomial
logistic regression) fitted full-batch with L-BFGS by torch on the features' device, from
zero weights, so the fit is deterministic. The weight decay is chosen from a small grid by
top-1 on a held-out stratified 20% of the train split (never the test split); the probe is
then refitted on the whole train split with the chosen value and scored on the test split.

Mode "paper" (frozen backbone, augmented crops, SGD lr 30 for 100 epochs, x0.1 at 60/80,
as in MoCo / InstDisc) is not implemented here yet.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .common import check_metrics, resolve_settings, topk_accuracy, unpack_features

PROTOCOL = "linear"
DEFAULTS: dict = {
    "mode": "cached",
    "weight_decay_grid": [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1],
    "val_fraction": 0.2,
    "max_iter": 300,          # L-BFGS iterations per fit
    "device": None,           # None: the train features' device
}
CHUNK_ROWS = 65536            # rows per forward/backward chunk: bounds memory on large splits


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit_idx, val_idx): round(fraction * n_c) of each class held out, at least one where
    the class has two or more samples, none where it has one. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    fit, val = [], []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_val = 0 if len(members) < 2 else min(len(members) - 1, max(1, round(fraction * len(members))))
        val.append(members[:n_val])
        fit.append(members[n_val:])
    return np.sort(np.concatenate(fit)), np.sort(np.concatenate(val))


def standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """Every matrix shifted and scaled by the train mean and std (constant columns: std 1)."""
    mean, std = train.mean(0), train.std(0)
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    return [(x - mean) / std for x in (train, *others)]


def fit_linear(x: torch.Tensor, y: torch.Tensor, num_classes: int, weight_decay: float,
               max_iter: int) -> torch.nn.Linear:
    """Minimise mean cross-entropy + weight_decay / 2 * ||W||^2 (bias unpenalised) with L-BFGS."""
    layer = torch.nn.Linear(x.shape[1], num_classes).to(device=x.device, dtype=x.dtype)
    torch.nn.init.zeros_(layer.weight)
    torch.nn.init.zeros_(layer.bias)
    optimiser = torch.optim.LBFGS(layer.parameters(), lr=1.0, max_iter=max_iter, history_size=20,
                                  tolerance_grad=1e-7, tolerance_change=1e-10,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        total = 0.0
        for start in range(0, len(x), CHUNK_ROWS):  # gradient accumulation over row chunks
            logits = layer(x[start:start + CHUNK_ROWS])
            loss = F.cross_entropy(logits, y[start:start + CHUNK_ROWS], reduction="sum") / len(x)
            loss.backward()
            total += loss.item()
        penalty = 0.5 * weight_decay * layer.weight.pow(2).sum()
        penalty.backward()
        return torch.tensor(total + penalty.item(), dtype=torch.float64)  # full precision for the line search

    optimiser.step(closure)
    return layer


@torch.no_grad()
def predict(layer: torch.nn.Linear, x: torch.Tensor) -> np.ndarray:
    return torch.cat([layer(x[s:s + CHUNK_ROWS]) for s in range(0, len(x), CHUNK_ROWS)]).cpu().numpy()


def select_weight_decay(train: torch.Tensor, labels: np.ndarray, num_classes: int, used: dict,
                        seed: int) -> tuple[float, list[float]]:
    """The grid value with the best held-out top-1 (ties: the larger, more regularised value).

    Only the train split is seen here: fit and validation parts both come from it.
    """
    fit_idx, val_idx = stratified_holdout(labels, used["val_fraction"], seed)
    if len(val_idx) == 0:
        raise ValueError("linear: no class has 2 train samples, so no held-out part can choose weight decay")
    fit_x, val_x = standardise(train[fit_idx], train[val_idx])
    fit_y = torch.as_tensor(labels[fit_idx], device=train.device)
    val_top1 = []
    for weight_decay in used["weight_decay_grid"]:
        layer = fit_linear(fit_x, fit_y, num_classes, float(weight_decay), used["max_iter"])
        val_top1.append(topk_accuracy(predict(layer, val_x), labels[val_idx], ks=(1,))[1])
    best = max(range(len(val_top1)), key=lambda i: (val_top1[i], used["weight_decay_grid"][i]))
    return float(used["weight_decay_grid"][best]), val_top1


def evaluate(features: dict, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    if used["mode"] == "paper":
        raise NotImplementedError(
            "linear: mode 'paper' (frozen backbone, augmented crops, SGD lr 30, 100 epochs) is not "
            "implemented yet; use mode 'cached' (the default)"
        )
    if used["mode"] != "cached":
        raise ValueError(f"linear: unknown mode {used['mode']!r}; known modes are 'cached' and 'paper'")
    if not used["weight_decay_grid"] or not 0 < used["val_fraction"] < 1:
        raise ValueError("linear: weight_decay_grid must be non-empty and 0 < val_fraction < 1")
    used["weight_decay_grid"] = sorted(float(w) for w in used["weight_decay_grid"])

    data = unpack_features(features)
    device = torch.device(used["device"] or getattr(features["train"], "device", "cpu"))
    train = torch.as_tensor(data["train"], device=device)
    test = torch.as_tensor(data["test"], device=device)
    num_classes = data["num_classes"]

    weight_decay, val_top1 = select_weight_decay(train, data["train_labels"], num_classes, used, seed)
    train_x, test_x = standardise(train, test)
    layer = fit_linear(train_x, torch.as_tensor(data["train_labels"], device=device), num_classes,
                       weight_decay, used["max_iter"])
    accuracy = topk_accuracy(predict(layer, test_x), data["test_labels"], ks=(1, 5))

    used.update(device=str(device), weight_decay=weight_decay, val_top1_per_weight_decay=val_top1,
                optimiser="L-BFGS full batch, zero init, strong Wolfe line search",
                selection="top-1 on a stratified held-out part of the train split; ties -> larger value")
    return check_metrics({"top1": accuracy[1], "top5": accuracy[5]}, PROTOCOL), used
