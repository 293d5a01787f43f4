"""Linear probe on cached frozen features.

Mode "cached": features standardised with train statistics; a linear layer (multinomial
logistic regression) fitted full-batch with L-BFGS by torch on the features' device, from
zero weights, so the fit is deterministic. The weight decay is chosen from a small grid by
top-1 on a held-out stratified 20% of the train split (never the test split); the probe is
then refitted on the whole train split with the chosen value and scored on the test split.

Mode "paper" (MoCo's main_lincls.py recipe, also PCL's; needs the checkpoint and the images):
the backbone is frozen in eval mode, so neither its weights nor its batch-norm statistics
change; every step embeds a fresh RandomResizedCrop + flip view of each image (ViewAugment's
"supervised" preset: scale (0.08, 1), no colour) and trains a linear layer on the pooled
features, initialised N(0, 0.01) with zero bias, with SGD (lr 30, momentum 0.9, weight decay 0,
batch 256) for 100 epochs, the lr x0.1 at epochs 60 and 80. Top-1/top-5 on the test split use
the evaluation transform. There is no held-out choice here: the recipe's values are used as given.
Settings merged from a config that also holds the cached mode's keys (weight_decay_grid, ...)
are accepted and ignored in paper mode (listed in `ignored_settings`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from sslbench.loop import fit_classifier, make_optimizer

from .common import ProtocolError, check_metrics, resolve_settings, seed_for, topk_accuracy, unpack_features

PROTOCOL = "linear"
NEEDS_CHECKPOINT = True  # mode "paper" reads the checkpoint; mode "cached" ignores it
READS_IMAGES = ["paper"]  # the modes that load the target's images (its prepared file, in the DAG)
DEFAULTS: dict = {
    "mode": "cached",
    "weight_decay_grid": [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1],
    "val_fraction": 0.2,
    "max_iter": 300,  # L-BFGS iterations per fit
    "device": None,  # None: the train features' device
}
PAPER_DEFAULTS: dict = {  # facebookresearch/moco main_lincls.py
    "mode": "paper",
    "lr": 30.0,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "epochs": 100,
    "milestones": [60, 80],  # epochs where the lr is multiplied by 0.1
    "batch_size": 256,
    "augment": {"preset": "supervised"},  # RandomResizedCrop (0.08, 1) + flip: view_config() arguments
    "eval_batch_size": 1024,
    "device": None,  # None: CUDA if available, else CPU
}
CHUNK_ROWS = 65536  # rows per forward/backward chunk: bounds memory on large splits


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


def fit_linear(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, weight_decay: float, max_iter: int
) -> torch.nn.Linear:
    """Minimise mean cross-entropy + weight_decay / 2 * ||W||^2 (bias unpenalised) with L-BFGS."""
    layer = torch.nn.Linear(x.shape[1], num_classes).to(device=x.device, dtype=x.dtype)
    torch.nn.init.zeros_(layer.weight)
    torch.nn.init.zeros_(layer.bias)
    optimiser = torch.optim.LBFGS(
        layer.parameters(),
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=1e-7,
        tolerance_change=1e-10,
        line_search_fn="strong_wolfe",
    )

    def closure():
        optimiser.zero_grad()
        total = 0.0
        for start in range(0, len(x), CHUNK_ROWS):  # gradient accumulation over row chunks
            logits = layer(x[start : start + CHUNK_ROWS])
            loss = F.cross_entropy(logits, y[start : start + CHUNK_ROWS], reduction="sum") / len(x)
            loss.backward()
            total += loss.item()
        penalty = 0.5 * weight_decay * layer.weight.pow(2).sum()
        penalty.backward()
        return torch.tensor(total + penalty.item(), dtype=torch.float64)  # full precision for the line search

    optimiser.step(closure)
    return layer


@torch.no_grad()
def predict(layer: torch.nn.Linear, x: torch.Tensor) -> np.ndarray:
    return torch.cat([layer(x[s : s + CHUNK_ROWS]) for s in range(0, len(x), CHUNK_ROWS)]).cpu().numpy()


def select_weight_decay(
    train: torch.Tensor, labels: np.ndarray, num_classes: int, used: dict, seed: int
) -> tuple[float, list[float]]:
    """The grid value with the best held-out top-1 (ties: the larger, more regularised value).

    Only the train split is seen here: fit and validation parts both come from it.
    """
    fit_idx, val_idx = stratified_holdout(labels, used["val_fraction"], seed)
    if len(val_idx) == 0:
        raise ProtocolError(
            "linear: no class has 2 train samples, so no held-out part can choose weight decay"
        )
    fit_x, val_x = standardise(train[fit_idx], train[val_idx])
    fit_y = torch.as_tensor(labels[fit_idx], device=train.device)
    val_top1 = []
    for weight_decay in used["weight_decay_grid"]:
        layer = fit_linear(fit_x, fit_y, num_classes, float(weight_decay), used["max_iter"])
        val_top1.append(topk_accuracy(predict(layer, val_x), labels[val_idx], ks=(1,))[1])
    best = max(range(len(val_top1)), key=lambda i: (val_top1[i], used["weight_decay_grid"][i]))
    return float(used["weight_decay_grid"][best]), val_top1


def evaluate(
    features: dict, settings: dict, seed: int, checkpoint_path=None, prepared=None
) -> tuple[dict[str, float], dict]:
    """``prepared``: the target's prepared file (``sslbench.data.prepare_dataset``), which mode "paper"
    reads its images from instead of the dataset's own files."""
    if (settings or {}).get("mode") == "paper":
        return evaluate_paper(settings, seed, checkpoint_path, (features or {}).get("meta"), prepared)
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    if used["mode"] != "cached":
        raise ProtocolError(f"linear: unknown mode {used['mode']!r}; known modes are 'cached' and 'paper'")
    if not used["weight_decay_grid"] or not 0 < used["val_fraction"] < 1:
        raise ProtocolError("linear: weight_decay_grid must be non-empty and 0 < val_fraction < 1")
    used["weight_decay_grid"] = sorted(float(w) for w in used["weight_decay_grid"])

    data = unpack_features(features)
    device = torch.device(used["device"] or getattr(features["train"], "device", "cpu"))
    train = torch.as_tensor(data["train"], device=device)
    test = torch.as_tensor(data["test"], device=device)
    num_classes = data["num_classes"]

    weight_decay, val_top1 = select_weight_decay(train, data["train_labels"], num_classes, used, seed)
    train_x, test_x = standardise(train, test)
    layer = fit_linear(
        train_x,
        torch.as_tensor(data["train_labels"], device=device),
        num_classes,
        weight_decay,
        used["max_iter"],
    )
    accuracy = topk_accuracy(predict(layer, test_x), data["test_labels"], ks=(1, 5))

    used.update(
        device=str(device),
        weight_decay=weight_decay,
        val_top1_per_weight_decay=val_top1,
        optimiser="L-BFGS full batch, zero init, strong Wolfe line search",
        selection="top-1 on a stratified held-out part of the train split; ties -> larger value",
    )
    return check_metrics({"top1": accuracy[1], "top5": accuracy[5]}, PROTOCOL), used


# --- mode "paper": frozen backbone, augmented crops, SGD ---------------------------------------


def new_head(dim: int, num_classes: int, generator: torch.Generator) -> torch.nn.Linear:
    """A linear layer with weights ~ N(0, 0.01) and zero bias (MoCo's init), drawn from `generator`."""
    head = torch.nn.Linear(dim, num_classes)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * 0.01)
        head.bias.zero_()
    return head


def paper_schedule(used: dict) -> dict:
    """The lr schedule of sslbench.loop.learning_rate: x0.1 at each milestone epoch, no warm-up."""
    return {"lr": used["lr"], "schedule": "step", "milestones": used["milestones"], "epochs": used["epochs"]}


def freeze(backbone: torch.nn.Module) -> torch.nn.Module:
    """Eval mode (batch-norm uses and keeps its running statistics) and no gradients."""
    backbone.eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    return backbone


def fit_frozen_probe(
    backbone: torch.nn.Module, train, num_classes: int, augment, used: dict, seed: int, device: torch.device
) -> torch.nn.Linear:
    """Train a linear layer on the frozen backbone's features of augmented views of `train`
    (an ImageSet). The backbone is never put in train mode and receives no gradient."""
    freeze(backbone)
    head = new_head(backbone.num_features, num_classes, torch.Generator().manual_seed(seed_for(seed, 0))).to(
        device
    )

    def forward(views: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = backbone(views)
        return head(features.float())

    def diverged(loss: float, epoch: int) -> str:
        return (
            f"linear (paper): the loss became {loss} in epoch {epoch + 1}; "
            f"lower the setting `lr` (now {used['lr']})"
        )

    sgd = {
        "optimizer": "sgd",
        "lr": used["lr"],
        "momentum": used["momentum"],
        "weight_decay": used["weight_decay"],
    }
    optimiser = make_optimizer(head.parameters(), sgd)
    generators = (
        torch.Generator().manual_seed(seed_for(seed, 1)),
        torch.Generator().manual_seed(seed_for(seed, 2)),
    )
    fit_classifier(
        forward,
        optimiser,
        train,
        augment,
        paper_schedule(used),
        used["batch_size"],
        generators,
        device,
        diverged,
    )
    return head


def resolve_paper_settings(settings: dict) -> tuple[dict, list[str]]:
    """Paper-mode settings; the cached mode's own keys are tolerated (a preset merged over
    config/default.yaml keeps them) and returned as ignored."""
    cached_only = set(DEFAULTS) - set(PAPER_DEFAULTS)
    ignored = sorted(set(settings) & cached_only)
    used = resolve_settings(
        {k: v for k, v in settings.items() if k not in cached_only},
        PAPER_DEFAULTS,
        f"{PROTOCOL} (mode 'paper')",
    )
    if used["epochs"] < 0 or used["batch_size"] < 1 or used["lr"] <= 0:
        raise ProtocolError("linear (paper): settings need epochs >= 0, batch_size >= 1 and lr > 0")
    used["milestones"] = sorted(int(m) for m in used["milestones"])
    return used, ignored


def evaluate_paper(
    settings: dict, seed: int, checkpoint_path, features_meta: dict | None = None, prepared=None
) -> tuple[dict[str, float], dict]:
    """The probe on the images of the features' target (their ``eval`` record; the pretraining set
    when there is none), as extracted: its size, the pretraining set's mean and std."""
    from sslbench.augment import EvalTransform, ViewAugment, view_config
    from sslbench.distributed import select_device
    from sslbench.features import embed, evaluation_data, load_encoder, read_checkpoint

    used, ignored = resolve_paper_settings(settings)
    if checkpoint_path is None:
        raise ProtocolError(
            "linear: mode 'paper' trains on images through the frozen backbone and needs the "
            "checkpoint: pass checkpoint_path (`sslbench evaluate --checkpoint ...`)"
        )
    device = select_device(used["device"] or "auto")
    ckpt = read_checkpoint(checkpoint_path, "cpu")
    data = evaluation_data(ckpt, features_meta, prepared)
    if data.multilabel:
        raise ProtocolError(
            f"linear (paper): {data.name} is multilabel; this protocol needs one class per image"
        )
    norm = ckpt["normalisation"]
    views = view_config(**used["augment"])
    augment = ViewAugment(data.image_size, data.channels, norm["mean"], norm["std"], views).to(device)
    backbone = load_encoder(ckpt, data.image_size).to(device)
    head = fit_frozen_probe(backbone, data.train, data.num_classes, augment, used, seed, device)
    transform = EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"]).to(device)
    logits = embed(torch.nn.Sequential(backbone, head), data.test, transform, device, used["eval_batch_size"])
    accuracy = topk_accuracy(logits.numpy(), data.test.labels.numpy(), ks=(1, 5))
    used.update(
        device=str(device),
        ignored_settings=ignored,
        view_config=dataclasses.asdict(views),
        optimiser="SGD on the linear layer only; backbone frozen in eval mode (running BN statistics)",
        head_init="weight ~ N(0, 0.01), bias 0",
        schedule="lr x0.1 at each milestone epoch",
        eval_transform="EvalTransform (centre square crop, resize, normalise)",
    )
    return check_metrics({"top1": accuracy[1], "top5": accuracy[5]}, PROTOCOL), used
