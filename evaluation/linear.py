"""Linear probe on cached frozen features.

Mode "cached" runs in numpy and scipy on the CPU (no torch): features standardised with the train
mean and std; a multinomial logistic regression (mean cross-entropy + weight_decay / 2 * ||W||^2,
bias unpenalised) fitted full-batch in float64 by scipy's L-BFGS-B with the analytic gradient, from
zero weights, so the fit is deterministic. The weight decay is chosen from a small grid by top-1 on
a held-out stratified 20% of the train split (never the test split); the probe is then refitted on
the whole train split with the chosen value and scored on the test split. The `device` setting is
accepted (presets may set it) and has no effect here.

Mode "paper" (MoCo's main_lincls.py recipe, also PCL's; needs the checkpoint and the images):
the backbone is frozen in eval mode, so neither its weights nor its batch-norm statistics
change; every step embeds a fresh RandomResizedCrop + flip view of each image (ViewAugment's
"supervised" preset: scale (0.08, 1), no colour) and trains a linear layer on the pooled
features, initialised N(0, 0.01) with zero bias, with SGD (lr 30, momentum 0.9, weight decay 0,
batch 256) for 100 epochs, the lr x0.1 at epochs 60 and 80. Top-1/top-5 on the test split use
the evaluation transform. There is no held-out choice here: the recipe's values are used as given.
Settings merged from a config that also holds the cached mode's keys (weight_decay_grid, ...)
are accepted and ignored in paper mode (listed in `ignored_settings`). This mode runs torch,
imported inside its functions so that a cached-mode job never loads it.

Mode "mae" (MAE's main_linprobe.py recipe, facebookresearch/mae; needs the checkpoint and the
images): the paper mode's machinery (the same frozen backbone, augmented views, evaluation and
handling of settings) with MAE's head and optimiser. The head is BatchNorm1d(D, affine=False, eps
1e-6) then a linear layer (weight trunc_normal std 0.01, bias 0): the batch norm has no parameters;
it normalises each training batch with its own statistics and tracks running ones, which the test
split uses (the head in eval mode). The linear layer trains with LARS (MAE's util/lars.py, as
sslbench.optim.Lars with trust ratio `update_norm`: eta ||w|| / ||g + wd w||, eta 0.001, no
clipping, momentum 0.9; the 1-D bias neither adapted nor decayed, MAE's `p.ndim > 1` rule), weight
decay 0, 90 epochs, batch 16384 with lr = blr 0.1 x 16384 / 256 = 6.4, a linear warm-up from 0 over
10 epochs then a half cosine to 0, set at every step (util/lr_sched.py, min_lr 0), and the last
batch of an epoch dropped when smaller than batch_size (its drop_last). The feature is the
encoder's as the checkpoint's `backbone.features` reads it (`pooled` with a ViT's `global_pool:
token` is MAE's default, the class token after the final norm). Where it differs from MAE: MAE puts
the whole model in train mode, which for its ViT (LayerNorm, no dropout or drop-path) is eval mode;
here the backbone stays in eval mode, so a backbone with batch norm keeps its statistics. MAE runs
under fp16 autocast; this runs in float32. Its crops are the suite's ViewAugment "supervised"
preset, as the paper mode's, not MAE's util/crop.py (TF-style, no retry loop, bicubic). The lr is
the absolute one for the batch: a preset that lowers batch_size sets lr = 0.1 x batch_size / 256
with it. LARS moves a weight by about lr x eta x ||w|| a step whatever the gradient's size, so an
epoch moves it by about blr x N / 256 x eta of ||w|| (x 10 with momentum; N the train images): on a
set much smaller than ImageNet's 1.28M images the probe barely leaves its initialisation.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from .common import (
    ProtocolError,
    check_batch_size,
    check_metrics,
    checkpoint_and_images,
    resolve_settings,
    seed_for,
    topk_accuracy,
    unpack_features,
)

if TYPE_CHECKING:  # annotations only
    import torch

PROTOCOL = "linear"
NEEDS_CHECKPOINT = True  # modes "paper" and "mae" read the checkpoint; mode "cached" ignores it
READS_IMAGES = ["paper", "mae"]  # the modes that load the target's images (its prepared file, in the DAG)
DEFAULTS: dict = {
    "mode": "cached",
    "weight_decay_grid": [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1],
    "val_fraction": 0.2,
    "max_iter": 300,  # L-BFGS-B iterations per fit
    "device": None,  # accepted and unused: the cached mode runs on the CPU
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
MAE_DEFAULTS: dict = {  # facebookresearch/mae main_linprobe.py (FINETUNE.md: 32 GPUs x 512 = batch 16384)
    "mode": "mae",
    "lr": 6.4,  # the absolute lr for batch_size: blr 0.1 x 16384 / 256 (lr = blr x batch / 256)
    "momentum": 0.9,  # util/lars.LARS's
    "weight_decay": 0.0,
    "epochs": 90,
    "warmup_epochs": 10,  # linear warm-up from 0, then cosine to 0; per step (util/lr_sched.py)
    "batch_size": 16384,
    "augment": {"preset": "supervised"},  # RandomResizedCrop (0.08, 1) + flip: view_config() arguments
    "eval_batch_size": 1024,
    "device": None,  # None: CUDA if available, else CPU
}
RULES: dict = {  # over the types of every mode's DEFAULTS: what the plan and the job judge the settings by
    "weight_decay_grid": {"minItems": 1, "items": {"minimum": 0}},
    "val_fraction": {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "lr": {"exclusiveMinimum": 0},
    "epochs": {"minimum": 0},
    "warmup_epochs": {"minimum": 0},
    "batch_size": {"minimum": 1},  # mode "mae": 2 (resolve_paper_settings)
}
DROPS_LAST_BATCH = ["mae"]  # the modes whose last short batch of an epoch is dropped (MAE's drop_last)
CHUNK_ROWS = 65536  # rows per float64 logits chunk: bounds memory on large splits
GTOL = 1e-7  # stop when every gradient component is below this (1e-6 stops small-decay fits early)
FTOL = 1e-12  # ... or when the loss falls by less than this fraction in an iteration
HISTORY = 20  # L-BFGS-B memory (pairs of steps and gradient changes)


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


def standardise(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Every matrix shifted and scaled by the train mean and std (ddof 1; constant columns: std 1).
    The statistics are summed in float64 and applied in each matrix's own precision, so float32
    features stay float32 (half the memory; the fit promotes them chunk by chunk)."""
    mean, std = train.mean(0, dtype=np.float64), train.std(0, ddof=1, dtype=np.float64)
    std = np.where(std > 1e-8, std, 1.0)
    return [(x - mean.astype(x.dtype)) / std.astype(x.dtype) for x in (train, *others)]


def loss_and_gradient(
    params: np.ndarray, x: np.ndarray, y: np.ndarray, num_classes: int, weight_decay: float
) -> tuple[float, np.ndarray]:
    """Mean cross-entropy + weight_decay / 2 * ||W||^2 at params = [W (C x D) flattened, b (C)],
    and its gradient [(softmax - onehot)^T X / n + weight_decay * W, sum(softmax - onehot) / n]."""
    n, dim = x.shape
    weight, bias = params[: num_classes * dim].reshape(num_classes, dim), params[num_classes * dim :]
    total, grad_w, grad_b = 0.0, np.zeros_like(weight), np.zeros_like(bias)
    for start in range(0, n, CHUNK_ROWS):
        xc = x[start : start + CHUNK_ROWS].astype(np.float64, copy=False)
        rows, yc = np.arange(len(xc)), y[start : start + CHUNK_ROWS]
        logits = xc @ weight.T + bias
        logits -= logits.max(1, keepdims=True)  # exp cannot overflow
        log_norm = np.log(np.exp(logits).sum(1))
        total += float((log_norm - logits[rows, yc]).sum())
        residual = np.exp(logits - log_norm[:, None])  # softmax ...
        residual[rows, yc] -= 1.0  # ... minus onehot
        grad_w += residual.T @ xc
        grad_b += residual.sum(0)
    loss = total / n + 0.5 * weight_decay * float(np.sum(weight * weight))
    return loss, np.concatenate([(grad_w / n + weight_decay * weight).ravel(), grad_b / n])


def fit_linear(
    x: np.ndarray, y: np.ndarray, num_classes: int, weight_decay: float, max_iter: int
) -> tuple[np.ndarray, np.ndarray]:
    """(W [C, D], b [C]) minimising `loss_and_gradient` by L-BFGS-B from zero, in float64."""
    from scipy.optimize import minimize  # here, not at import: paper mode and semisup never fit this

    dim = x.shape[1]
    if len(x) <= CHUNK_ROWS:  # one chunk: promote it once, not at every evaluation (the same numbers)
        x = x.astype(np.float64, copy=False)
    result = minimize(
        loss_and_gradient,
        np.zeros(num_classes * (dim + 1)),
        args=(x, np.asarray(y, dtype=np.int64), num_classes, float(weight_decay)),
        method="L-BFGS-B",
        jac=True,
        options={"maxiter": max_iter, "gtol": GTOL, "ftol": FTOL, "maxcor": HISTORY},
    )
    return result.x[: num_classes * dim].reshape(num_classes, dim), result.x[num_classes * dim :]


def predict(probe: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Logits [N, C] in float64, row chunk by row chunk."""
    weight, bias = probe
    chunks = (x[s : s + CHUNK_ROWS].astype(np.float64, copy=False) for s in range(0, len(x), CHUNK_ROWS))
    return np.concatenate([chunk @ weight.T + bias for chunk in chunks])


def select_weight_decay(
    train: np.ndarray, labels: np.ndarray, num_classes: int, used: dict, seed: int
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
    val_top1 = []
    for weight_decay in used["weight_decay_grid"]:
        probe = fit_linear(fit_x, labels[fit_idx], num_classes, float(weight_decay), used["max_iter"])
        val_top1.append(topk_accuracy(predict(probe, val_x), labels[val_idx], ks=(1,))[1])
    best = max(range(len(val_top1)), key=lambda i: (val_top1[i], used["weight_decay_grid"][i]))
    return float(used["weight_decay_grid"][best]), val_top1


def evaluate(
    features: dict, settings: dict, seed: int, checkpoint_path=None, prepared=None
) -> tuple[dict[str, float], dict]:
    """``prepared``: the target's prepared file (``sslbench.data.prepared.prepare_dataset``), which the image
    modes ("paper", "mae") read their images from instead of the dataset's own files."""
    mode = (settings or {}).get("mode", DEFAULTS["mode"])
    if mode in IMAGE_MODES:
        return evaluate_paper(settings, seed, checkpoint_path, (features or {}).get("meta"), prepared)
    if mode != DEFAULTS["mode"]:
        known = ", ".join(repr(m) for m in [DEFAULTS["mode"], *IMAGE_MODES])
        raise ProtocolError(f"linear: unknown mode {mode!r}; known modes are {known}")
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    used["weight_decay_grid"] = sorted(float(w) for w in used["weight_decay_grid"])

    data = unpack_features(features)
    num_classes = data["num_classes"]
    weight_decay, val_top1 = select_weight_decay(data["train"], data["train_labels"], num_classes, used, seed)
    train_x, test_x = standardise(data["train"], data["test"])
    probe = fit_linear(train_x, data["train_labels"], num_classes, weight_decay, used["max_iter"])
    accuracy = topk_accuracy(predict(probe, test_x), data["test_labels"], ks=(1, 5))

    used.update(
        device="cpu",
        weight_decay=weight_decay,
        val_top1_per_weight_decay=val_top1,
        optimiser="L-BFGS-B (scipy), float64, full batch, zero init",
        selection="top-1 on a stratified held-out part of the train split; ties -> larger value",
    )
    return check_metrics({"top1": accuracy[1], "top5": accuracy[5]}, PROTOCOL), used


# --- the image modes: "paper" (MoCo) and "mae" (MAE), a frozen backbone and augmented crops -----

IMAGE_MODES = {"paper": PAPER_DEFAULTS, "mae": MAE_DEFAULTS}  # each mode's own settings
MAE_LARS = {  # MAE's util/lars.LARS: sslbench.optim.Lars's rule `update_norm`, no clipping
    "lars_trust_coefficient": 0.001,
    "lars_trust_ratio": "update_norm",
    "lars_trust_clip": False,
}
RECORDED = {  # what each image mode records beside its settings
    "paper": {
        "optimiser": "SGD on the linear layer only; backbone frozen in eval mode (running BN statistics)",
        "head_init": "weight ~ N(0, 0.01), bias 0",
        "schedule": "lr x0.1 at each milestone epoch",
    },
    "mae": {
        "optimiser": (
            "LARS (sslbench.optim.Lars, trust ratio update_norm, eta 0.001, no clipping) on the linear "
            "layer's weight, its bias neither adapted nor decayed (MAE's util/lars.py); backbone frozen "
            "in eval mode (running BN statistics)"
        ),
        "head": (
            "BatchNorm1d(affine=False, eps 1e-6) then a linear layer; the batch norm normalises with "
            "each training batch's statistics and the test split with its running statistics"
        ),
        "head_init": "weight ~ trunc_normal(std 0.01), bias 0",
        "schedule": "per step: linear warm-up from 0 over warmup_epochs, then half cosine to 0",
        "last_batch": "dropped when smaller than batch_size, unless it is the only one (drop_last)",
    },
}


def new_head(dim: int, num_classes: int, generator: torch.Generator) -> torch.nn.Linear:
    """A linear layer with weights ~ N(0, 0.01) and zero bias (MoCo's init), drawn from `generator`."""
    import torch

    head = torch.nn.Linear(dim, num_classes)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * 0.01)
        head.bias.zero_()
    return head


def new_mae_head(dim: int, num_classes: int, generator: torch.Generator) -> torch.nn.Sequential:
    """MAE's probe head: BatchNorm1d(dim, affine=False, eps=1e-6), no parameters, then a linear
    layer, weight trunc_normal_(std=0.01) (timm's bounds +-2, so in effect a normal at this std),
    bias 0 (timm's init of the head it replaces), drawn from `generator`."""
    import torch

    linear = torch.nn.Linear(dim, num_classes)
    with torch.no_grad():
        torch.nn.init.trunc_normal_(linear.weight, std=0.01, a=-2.0, b=2.0, generator=generator)
        linear.bias.zero_()
    return torch.nn.Sequential(torch.nn.BatchNorm1d(dim, eps=1e-6, affine=False), linear)


def paper_schedule(used: dict) -> dict:
    """An image mode's lr schedule, as sslbench.optim.learning_rate takes it. "paper": x0.1 at each
    milestone epoch, no warm-up. "mae": lr x epoch / warmup_epochs on the fractional epoch (0 at
    the first step), then a half cosine to 0 over the remaining epochs, per step (learning_rate's
    `linear` ramp is MAE's util/lr_sched.adjust_learning_rate with min_lr 0)."""
    if used["mode"] == "mae":
        return {
            "lr": used["lr"],
            "schedule": "cosine",
            "warmup_epochs": used["warmup_epochs"],
            "warmup_ramp": "linear",
            "epochs": used["epochs"],
        }
    return {"lr": used["lr"], "schedule": "step", "milestones": used["milestones"], "epochs": used["epochs"]}


def probe_optimizer(head: torch.nn.Module, used: dict) -> torch.optim.Optimizer:
    """An image mode's optimiser over the head. "paper": SGD. "mae": LARS (MAE_LARS) where tensors
    of two or more dimensions are adapted and decayed and 1-D ones (the bias) neither, as MAE's
    util/lars.py (`if p.ndim > 1`)."""
    from sslbench.optim import make_optimizer

    settings = {"lr": used["lr"], "momentum": used["momentum"], "weight_decay": used["weight_decay"]}
    if used["mode"] != "mae":
        return make_optimizer(head.parameters(), {"optimizer": "sgd", **settings})
    params = list(head.parameters())
    groups = [
        {"params": [p for p in params if p.ndim > 1]},
        {"params": [p for p in params if p.ndim <= 1], "exclude_from_lars": True, "weight_decay": 0.0},
    ]
    return make_optimizer(groups, {"optimizer": "lars", **settings, **MAE_LARS})


def freeze(backbone: torch.nn.Module) -> torch.nn.Module:
    """Eval mode (batch-norm uses and keeps its running statistics) and no gradients."""
    backbone.eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    return backbone


def fit_frozen_probe(
    backbone: torch.nn.Module, train, num_classes: int, augment, used: dict, seed: int, device: torch.device
) -> torch.nn.Module:
    """Train the head of the image mode ``used["mode"]`` on the frozen backbone's features of
    augmented views of `train` (an ImageSet). The backbone is never put in train mode and receives
    no gradient; the head is in train mode (MAE's batch norm: batch statistics) and is returned so."""
    import torch

    from evaluation.classifier import fit_classifier

    freeze(backbone)
    make_head = new_mae_head if used["mode"] == "mae" else new_head
    generator = torch.Generator().manual_seed(seed_for(seed, 0))
    head = make_head(backbone.num_features, num_classes, generator).to(device).train()

    def forward(views: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = backbone(views)
        return head(features.float())

    def diverged(loss: float, epoch: int) -> str:
        return (
            f"linear ({used['mode']}): the loss became {loss} in epoch {epoch + 1}; "
            f"lower the setting `lr` (now {used['lr']})"
        )

    generators = (
        torch.Generator().manual_seed(seed_for(seed, 1)),
        torch.Generator().manual_seed(seed_for(seed, 2)),
    )
    fit_classifier(
        forward,
        probe_optimizer(head, used),
        train,
        augment,
        paper_schedule(used),
        used["batch_size"],
        generators,
        device,
        diverged,
        min_batch=used["batch_size"] if used["mode"] in DROPS_LAST_BATCH else 1,
    )
    return head


def resolve_paper_settings(settings: dict) -> tuple[dict, list[str]]:
    """The settings of the image mode ``settings["mode"]`` (default "paper") over its own defaults.
    The cached mode's own keys are tolerated (a preset merged over config/default.yaml keeps them),
    judged by their rules as the plan judges them, and returned as ignored; another image mode's own
    keys are unknown here (as the planner's sslbench.plan.protocols.protocol_problems says)."""
    settings = {"mode": "paper", **settings}
    mode = settings["mode"]
    defaults = IMAGE_MODES[mode]
    cached_only = set(DEFAULTS) - set(defaults)
    used = resolve_settings(settings, defaults, PROTOCOL, ignored=cached_only)
    key = f"config key `evaluation.{PROTOCOL}"
    if mode == "mae":
        if used["batch_size"] < 2:
            raise ProtocolError(
                f"{key}.batch_size` = {used['batch_size']}: in mode 'mae' batch_size must be >= 2 (the "
                "head's batch norm normalises each training batch by its own statistics); raise it"
            )
        if used["warmup_epochs"] > used["epochs"]:
            raise ProtocolError(
                f"{key}.warmup_epochs` = {used['warmup_epochs']} exceeds `evaluation.{PROTOCOL}.epochs` = "
                f"{used['epochs']}: mode 'mae' needs warmup_epochs <= epochs; lower warmup_epochs or "
                "raise epochs"
            )
    else:
        used["milestones"] = sorted(int(m) for m in used["milestones"])
    return used, sorted(set(settings) & cached_only)


def evaluate_paper(
    settings: dict, seed: int, checkpoint_path, features_meta: dict | None = None, prepared=None
) -> tuple[dict[str, float], dict]:
    """An image mode's probe on the images of the features' target (their ``eval`` record; the
    pretraining set when there is none), as extracted: its size, the pretraining set's mean and std.
    The test split goes through the backbone and the head in eval mode (MAE's batch norm: running
    statistics)."""
    import torch

    from sslbench.augment.pipeline import EvalTransform, ViewAugment
    from sslbench.augment.presets import view_config
    from sslbench.distributed import select_device
    from sslbench.extract.features import embed, load_encoder

    used, ignored = resolve_paper_settings(settings)
    mode = used["mode"]
    doing = f"linear: mode {mode!r} trains on images through the frozen backbone"
    ckpt, data = checkpoint_and_images(doing, checkpoint_path, features_meta, prepared)
    device = select_device(used["device"] or "auto")
    if data.multilabel:
        raise ProtocolError(
            f"linear ({mode}): {data.name} is multilabel; this protocol needs one class per image"
        )
    if mode in DROPS_LAST_BATCH:
        check_batch_size(PROTOCOL, used["batch_size"], data)
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
        **RECORDED[mode],
        eval_transform="EvalTransform (centre square crop, resize, normalise)",
    )
    return check_metrics({"top1": accuracy[1], "top5": accuracy[5]}, PROTOCOL), used
