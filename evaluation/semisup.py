"""Semi-supervised fine-tuning on 1% and 10% of the train labels (SimCLR / PCL protocol).

Labelled subsets: from each class, max(1, round(f * n_class)) train images for f = 1% and 10%
(every class keeps the same fraction; at least one image), drawn once per seed from one random
order per class, so the 1% subset is the first part of the 10% one (nested). Only train indices
are ever drawn: the test split cannot leak in. The subsets are written, one train index per line
in ascending order, to ``semisup_subsets/{1pct,10pct}.txt`` beside the result JSON
(``<run>/eval/<target>/``) and their sha256 is recorded in the settings.

On a transfer target (the features' ``eval`` record names it) the checkpoint is fine-tuned on the
target's own labels, splits and image size, normalised with the pretraining set's mean and std and
converted to the encoder's channels, as features are extracted (``sslbench.extract.features.target_data``).

Standard lists (ImageNet's 1% / 10% files): the setting ``subset_files: {1pct: path, 10pct: path}``
replaces the draw. Each file holds one entry per line (blank lines and ``#`` comments skipped):
either integers, read as indices into the train split in its loading order, or image file names
(e.g. ``n01440764_10026.JPEG``), matched to the base names of the train split's files (folder
datasets only). The resolved indices are written as above; the source file's sha256 is recorded too.

Fine-tuning: the checkpoint's backbone plus a new linear head (N(0, 0.01), zero bias), end to end
in train mode, cross-entropy, on augmented views (crop + flip, ViewAugment's "supervised" preset;
no regularisation, as SimCLR's fine-tuning), SGD with momentum, the head's lr ``head_lr_multiplier``
times the backbone's, cosine decay per step to zero without warm-up, ``epochs`` passes over the
labelled subset (SimCLR: 60 for 1%, 30 for 10%). The backbone lr is chosen from ``lr_grid`` by
top-1 on a stratified held-out part (``val_fraction``) of the same labelled subset (ties: the
smaller lr), then the model is refitted from the checkpoint on the whole subset. When the subset
has one image per class, nothing can be held out; the 1% run then reuses the lr chosen on the
10% subset (which contains it), and says so in ``lr_selection``. The test split is used only for
the final top-1 / top-5, with the evaluation transform.

The recipe above is SimCLR's, for ResNets. On a Vision Transformer (``recipe: auto`` picks by the
checkpoint's backbone; ``resnet`` or ``vit`` forces one) the ViT recipe runs instead: iBOT's
semi-supervised fine-tuning (bytedance/ibot evaluation/README.md: ``--epochs 1000 --lr 5e-6
--finetune_head_layer 1`` on SimCLR v2's 1% / 10% splits, the rest evaluation/semi_supervised/eval_cls.py's
DeiT defaults). It is the ``finetune`` protocol's fit (AdamW over layer-wise lr-decay groups, warm-up then
cosine to ``min_lr`` per step, RandAugment crops, random erasing, mixup / cutmix on label-smoothed
targets, drop path) on the labelled subset, with the settings of ``vit`` over ``VIT_RECIPE``. It starts
from the first layer of the method's projection head (Linear, its norm, its activation) where the
checkpoint keeps it (``projection_first_layer``: DINO's teacher head, MoCo v3's and SimCLR's projector;
``head_layer: 0`` starts from the backbone) and puts a new linear head on it; without it, on the backbone.
The lr is fixed (no grid), as iBOT's command. A batch is at most the subset's size (even, for mixup), and
the last short batch of an epoch is dropped. Each row records its recipe (``recipe_used``) and start.
Where the ViT recipe differs from iBOT's, the settings record it (``deviations``).

Same seed, same checkpoint, same machine (CPU): the same numbers; each fit draws its data order
and views from generators seeded by (seed, subset), the same for every lr of the grid.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import torch

from evaluation.classifier import fit_classifier, scores
from evaluation.finetune import DEVIATIONS as FINETUNE_DEVIATIONS
from evaluation.finetune import finetune as finetune_vit
from sslbench import atomic
from sslbench.augment.pipeline import EvalTransform, ViewAugment
from sslbench.augment.presets import view_config
from sslbench.backbones import is_vit
from sslbench.data.containers import Dataset, ImageSet
from sslbench.distributed import select_device
from sslbench.extract.features import load_encoder
from sslbench.kit.headlayer import build_layer
from sslbench.optim import TrainingDiverged, make_optimizer
from sslbench.plan.protocols import setting_problems

from .common import (
    ProtocolError,
    check_metrics,
    checkpoint_and_images,
    resolve_settings,
    seed_for,
)
from .linear import new_head, stratified_holdout

PROTOCOL = "semisup"
NEEDS_CHECKPOINT = True
READS_IMAGES = True  # it fine-tunes on the target's images (its prepared file, in the DAG)
NEEDS_RESULT_DIR = True  # the subset index files go beside the result
FRACTIONS = {"1pct": 0.01, "10pct": 0.10}  # ascending: the smaller subset is nested in the larger
SUBSET_FOLDER = "semisup_subsets"
DEFAULTS: dict = {
    "epochs": {"1pct": 60, "10pct": 30},  # passes over the labelled subset (SimCLR's fine-tuning)
    "batch_size": 32,
    "lr_grid": [0.01, 0.03],  # backbone lr candidates; the head's is head_lr_multiplier times it
    "head_lr_multiplier": 10.0,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "val_fraction": 0.2,  # of each class of the labelled subset, held out to choose the lr
    "augment": {"preset": "supervised"},  # view_config() arguments
    "subset_files": None,  # {1pct: path, 10pct: path}: standard lists instead of a draw
    "eval_batch_size": 1024,
    "device": "auto",
    "recipe": "auto",  # "auto": "vit" on a ViT backbone, "resnet" otherwise (the SGD recipe above)
    "vit": {},  # the ViT recipe's settings over VIT_RECIPE
}
VIT_RECIPE: dict = {  # iBOT's semi-supervised command over eval_cls.py's defaults; finetune's names
    "epochs": {"1pct": 1000, "10pct": 1000},  # --epochs 1000 (both subsets)
    "batch_size": 1024,  # 128 per GPU x 8
    "lr": 1.0e-5,  # --lr 5e-6, scaled by eval_cls.py to 5e-6 x 1024 / 512
    "min_lr": 1.0e-5,  # timm's cosine floor (--min-lr 1e-5): at this lr the schedule is flat after warm-up
    "warmup_epochs": 5.0,
    "weight_decay": 0.05,
    "layer_decay": 1.0,  # --layer_decay default: none
    "adam_betas": [0.9, 0.999],
    "drop_path": 0.1,
    "pool": "token",  # --avgpool_patchtokens 0: the class token, which the projection head was trained on
    "head_init_std": 0.02,  # the ViT's _init_weights on the new head: trunc_normal std 0.02
    "label_smoothing": 0.1,
    "mixup": 0.8,
    "cutmix": 1.0,
    "mixup_prob": 1.0,
    "mixup_switch_prob": 0.5,
    "random_erasing": 0.25,
    "augment": {"preset": "supervised", "policy": "randaugment"},
    "head_layer": 1,  # --finetune_head_layer 1: start from the projection head's first layer; 0: none
}
VIT_DEVIATIONS = [
    "no model EMA (eval_cls.py keeps one, decay 0.99996) and no repeated augmentation (its RASampler)",
    "warm-up from 0, not timm's warmup_lr 1e-6; no cool-down epochs at min_lr",
]
RULES: dict = {  # over the types of DEFAULTS: what the plan and the job judge the settings by
    "epochs": {"properties": {"1pct": {"minimum": 0}, "10pct": {"minimum": 0}}},
    "batch_size": {"minimum": 2},  # batch norm in train mode needs two images a batch
    "lr_grid": {"minItems": 1, "items": {"exclusiveMinimum": 0}},
    "val_fraction": {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "recipe": {"enum": ["auto", "resnet", "vit"]},
}


# --- labelled subsets ------------------------------------------------------------------------


def draw_subsets(labels: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """{name: sorted train indices}: per class max(1, round(f * n_class)) images, nested."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed_for(seed, 0))
    chosen = {name: [] for name in FRACTIONS}
    for cls in np.unique(labels):
        order = rng.permutation(np.flatnonzero(labels == cls))
        for name, fraction in FRACTIONS.items():
            chosen[name].append(order[: min(len(order), max(1, round(fraction * len(order))))])
    return {name: np.sort(np.concatenate(parts)) for name, parts in chosen.items()}


def read_subset_file(path: str | Path, train: ImageSet) -> np.ndarray:
    """Train indices from a list of indices or of image file names (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"semisup: subset file {path} not found (setting `subset_files`)")
    entries = [line.strip() for line in path.read_text().splitlines()]
    entries = [e for e in entries if e and not e.startswith("#")]
    if not entries:
        raise ProtocolError(f"semisup: subset file {path} is empty")
    if all(e.lstrip("-").isdigit() for e in entries):
        indices = np.array([int(e) for e in entries], dtype=np.int64)
        bad = indices[(indices < 0) | (indices >= len(train))]
        if len(bad):
            raise ProtocolError(
                f"semisup: subset file {path} holds indices {bad[:5].tolist()} outside the "
                f"train split [0, {len(train)})"
            )
    else:
        indices = _indices_of_names(entries, train, path)
    if len(np.unique(indices)) != len(indices):
        raise ProtocolError(f"semisup: subset file {path} lists some images twice")
    return np.sort(indices)


def _indices_of_names(names: list[str], train: ImageSet, path: Path) -> np.ndarray:
    if train.paths is None:
        raise ProtocolError(
            f"semisup: subset file {path} lists file names, but this dataset's train split is "
            "held in memory without file names; list train indices instead"
        )
    index_of = {}
    for i, p in enumerate(train.paths):
        index_of.setdefault(Path(p).name, []).append(i)
    missing = [n for n in names if n not in index_of]
    if missing:
        raise ProtocolError(
            f"semisup: subset file {path}: {len(missing)} name(s) are not in the train split, "
            f"e.g. {missing[:3]}"
        )
    ambiguous = [n for n in names if len(index_of[n]) > 1]
    if ambiguous:
        raise ProtocolError(
            f"semisup: subset file {path}: names {ambiguous[:3]} match several train files; "
            "list train indices instead"
        )
    return np.array([index_of[n][0] for n in names], dtype=np.int64)


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_subset(path: str | Path, indices: np.ndarray) -> str:
    """One index per line, atomically; returns the written file's sha256."""
    atomic.write_text(path, "".join(f"{int(i)}\n" for i in indices))
    return sha256_of(path)


def labelled_subsets(train: ImageSet, used: dict, seed: int, out_dir: Path) -> tuple[dict, dict]:
    """({name: indices}, {name: record for the settings}); the index files are written to out_dir."""
    sources = used["subset_files"]
    if sources is None:
        subsets = draw_subsets(train.labels.numpy(), seed)
    else:
        if not isinstance(sources, dict) or set(sources) != set(FRACTIONS):
            raise ProtocolError(
                f"semisup: setting `subset_files` must map exactly {sorted(FRACTIONS)} to files, "
                f"got {sources!r}"
            )
        subsets = {name: read_subset_file(sources[name], train) for name in FRACTIONS}
    labels = train.labels.numpy()
    records = {}
    for name, indices in subsets.items():
        file = out_dir / f"{name}.txt"
        records[name] = {
            "file": str(file),
            "sha256": write_subset(file, indices),
            "size": int(len(indices)),
            "per_class": np.bincount(labels[indices], minlength=int(labels.max()) + 1).tolist(),
        }
        if sources is not None:
            records[name].update(source=str(sources[name]), source_sha256=sha256_of(sources[name]))
    small, large = (subsets[name] for name in FRACTIONS)
    records["nested"] = bool(np.isin(small, large).all())
    return subsets, records


# --- fine-tuning -----------------------------------------------------------------------------


def part(images: ImageSet, indices) -> ImageSet:
    """The rows `indices` of an ImageSet, in memory or lazily decoded alike."""
    return images.subset(np.asarray(indices))


def finetune(
    ckpt: dict,
    labelled: ImageSet,
    num_classes: int,
    lr: float,
    epochs: int,
    augment: ViewAugment,
    used: dict,
    stream_seed: int,
    device: torch.device,
) -> torch.nn.Sequential:
    """Backbone (from the checkpoint) + new linear head, trained end to end on `labelled`."""
    torch.manual_seed(stream_seed)  # anything random inside the backbone (drop-path, dropout)
    backbone = load_encoder(ckpt, augment.image_size)  # the size the views come at
    head = new_head(
        backbone.num_features, num_classes, torch.Generator().manual_seed(seed_for(stream_seed, 0))
    )
    model = torch.nn.Sequential(backbone, head).to(device).train()
    head_lr = lr * used["head_lr_multiplier"]
    optimiser = make_optimizer(
        [
            {"params": backbone.parameters(), "lr": lr, "base_lr": lr},
            {"params": head.parameters(), "lr": head_lr, "base_lr": head_lr},
        ],
        {"optimizer": "sgd", "lr": lr, "momentum": used["momentum"], "weight_decay": used["weight_decay"]},
    )
    generators = (
        torch.Generator().manual_seed(seed_for(stream_seed, 1)),
        torch.Generator().manual_seed(seed_for(stream_seed, 2)),
    )

    def diverged(loss: float, epoch: int) -> str:
        return (
            f"semisup: the loss became {loss} in epoch {epoch + 1} with backbone "
            f"lr {lr}; lower the values of `lr_grid`"
        )

    # cosine per step to 0 over every step of the fit, no warm-up; each group from its own base_lr
    schedule = {"lr": lr, "schedule": "cosine", "epochs": epochs}
    # the last batch of one image is dropped: batch norm in train mode needs two
    fit_classifier(
        model,
        optimiser,
        labelled,
        augment,
        schedule,
        used["batch_size"],
        generators,
        device,
        diverged,
        min_batch=2,
    )
    return model


def choose_lr(
    ckpt: dict,
    labelled: ImageSet,
    num_classes: int,
    epochs: int,
    augment,
    transform,
    used: dict,
    subset_seed: int,
    device: torch.device,
) -> tuple[float | None, list[float], list[float]]:
    """(best backbone lr or None if nothing can be held out, held-out top-1 per lr, diverged lrs).

    Fit and validation parts both come from the labelled subset: the test split is not seen.
    """
    fit_idx, val_idx = stratified_holdout(
        labelled.labels.numpy(), used["val_fraction"], seed_for(subset_seed, 0)
    )
    if len(val_idx) == 0:
        return None, [], []
    fit, val = part(labelled, fit_idx), part(labelled, val_idx)
    val_top1, diverged = [], []
    for lr in used["lr_grid"]:
        try:
            model = finetune(
                ckpt, fit, num_classes, lr, epochs, augment, used, seed_for(subset_seed, 1), device
            )
            val_top1.append(scores(model, val, transform, used, device)[1])
        except TrainingDiverged:
            val_top1.append(0.0)
            diverged.append(lr)
    best = max(range(len(val_top1)), key=lambda i: (val_top1[i], -used["lr_grid"][i]))
    return float(used["lr_grid"][best]), val_top1, diverged


def check_epochs(epochs: dict, key: str = "epochs") -> None:
    """`epochs` names each labelled subset (its values are RULES')."""
    if not isinstance(epochs, dict) or set(epochs) != set(FRACTIONS):
        raise ProtocolError(
            f"config key `evaluation.{PROTOCOL}.{key}` = {epochs!r} must map exactly {sorted(FRACTIONS)} "
            "(the labelled subsets) to their epochs; give both and nothing else"
        )


def run_semisup(
    ckpt: dict, data: Dataset, settings: dict, seed: int, subset_dir: str | Path
) -> tuple[dict[str, float], dict]:
    """The protocol on a loaded checkpoint and dataset; index files go to `subset_dir`."""
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    check_epochs(used["epochs"])
    recipe = chosen_recipe(used["recipe"], ckpt)
    vit = vit_settings(used["vit"]) if recipe == "vit" else None
    used["lr_grid"] = sorted(float(lr) for lr in used["lr_grid"])
    if data.multilabel:
        raise ProtocolError(f"semisup: {data.name} is multilabel; fine-tuning here needs one class per image")
    device = select_device(used["device"])
    subsets, records = labelled_subsets(data.train, used, seed, Path(subset_dir))
    if recipe == "vit":
        metrics, record = vit_recipe(ckpt, data, vit, seed, subsets, device, used["eval_batch_size"])
    else:
        metrics, record = resnet_recipe(ckpt, data, used, seed, subsets, device)
    used.update(record, recipe_used=recipe, device=str(device), subsets=records)
    return check_metrics({k: metrics[k] for k in sorted(metrics)}, PROTOCOL), used


def chosen_recipe(recipe: str, ckpt: dict) -> str:
    """The recipe a setting of `recipe` names; "auto": by the checkpoint's backbone family."""
    if recipe != "auto":
        return recipe
    return "vit" if is_vit(ckpt["cfg"]["backbone"]["name"]) else "resnet"


def vit_settings(settings: dict) -> dict:
    """`vit` over VIT_RECIPE: a key it does not know, or a value the finetune protocol's rules refuse,
    is an error naming it."""
    unknown = sorted(set(settings) - set(VIT_RECIPE))
    if unknown:
        raise ProtocolError(
            f"config key `evaluation.semisup.vit`: unknown setting(s) {unknown}; known settings are "
            f"{sorted(VIT_RECIPE)}. Fix the protocol settings in the config file."
        )
    used = {**copy.deepcopy(VIT_RECIPE), **copy.deepcopy(settings)}
    check_epochs(used["epochs"], "vit.epochs")
    shared = {k: v for k, v in settings.items() if k not in ("epochs", "head_layer")}
    problems = setting_problems("finetune", shared)
    if problems:
        raise ProtocolError(f"config key `evaluation.semisup.vit`: {'; '.join(problems)}")
    if used["head_layer"] not in (0, 1):
        raise ProtocolError(
            f"config key `evaluation.semisup.vit.head_layer` = {used['head_layer']!r}: 1 starts from the "
            "projection head's first layer, 0 from the backbone; give 0 or 1"
        )
    return used


def vit_recipe(
    ckpt: dict, data: Dataset, vit: dict, seed: int, subsets: dict, device: torch.device, eval_batch_size: int
) -> tuple[dict[str, float], dict]:
    """The ViT recipe (module docstring) on each labelled subset: (metrics, what it used)."""
    kept = ckpt.get("projection_first_layer")
    start = "projection head's first layer" if vit["head_layer"] == 1 and kept else "backbone"
    norm = ckpt["normalisation"]
    transform = EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"]).to(device)
    metrics, fits = {}, {}
    for name in FRACTIONS:
        labelled = dataclasses.replace(data, train=part(data.train, subsets[name]))
        size = len(subsets[name])
        batch = min(vit["batch_size"], size - size % 2)  # mixup pairs each image with another
        if batch < 2:
            raise ProtocolError(
                f"semisup: the {name} subset of {data.name} holds {size} image(s); the ViT recipe needs "
                "two a batch"
            )
        used = {
            **vit,
            "epochs": int(vit["epochs"][name]),
            "batch_size": batch,
            "eval_batch_size": eval_batch_size,
        }
        neck = build_layer(kept) if start != "backbone" else None
        subset_seed = seed_for(seed, 1, list(FRACTIONS).index(name))
        model, record = finetune_vit(ckpt, labelled, used, subset_seed, device, neck=neck)
        accuracy = scores(model, data.test, transform, used, device)
        metrics[f"top1_{name}"], metrics[f"top5_{name}"] = accuracy[1], accuracy[5]
        fits[name] = {"epochs": used["epochs"], "batch_size": batch, **record}
    return metrics, {
        "vit": vit,
        "start": start,
        "fits": fits,
        "optimiser": "AdamW over layer-wise lr-decay groups (the finetune protocol's)",
        "schedule": "per step: linear warm-up from 0, then half cosine to min_lr",
        "eval_transform": "EvalTransform (centre square crop, resize, normalise)",
        "deviations": VIT_DEVIATIONS + FINETUNE_DEVIATIONS,
    }


def resnet_recipe(
    ckpt: dict, data: Dataset, used: dict, seed: int, subsets: dict, device: torch.device
) -> tuple[dict[str, float], dict]:
    """SimCLR's recipe (module docstring) on each labelled subset, the larger first: (metrics, record)."""
    norm = ckpt["normalisation"]
    views = view_config(**used["augment"])
    augment = ViewAugment(data.image_size, data.channels, norm["mean"], norm["std"], views).to(device)
    transform = EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"]).to(device)
    metrics, selection = {}, {}
    for name in reversed(FRACTIONS):  # the larger subset first: its lr is the fallback of the smaller
        labelled = part(data.train, subsets[name])
        epochs = int(used["epochs"][name])
        subset_seed = seed_for(seed, 1, list(FRACTIONS).index(name))
        lr, val_top1, diverged = used["lr_grid"][0], [], []
        how = "the only value of lr_grid"
        if len(used["lr_grid"]) > 1:
            lr, val_top1, diverged = choose_lr(
                ckpt, labelled, data.num_classes, epochs, augment, transform, used, subset_seed, device
            )
            how = "top-1 on a stratified held-out part of this labelled subset; ties -> smaller lr"
        if lr is None:
            if not selection:
                raise ProtocolError(
                    f"semisup: the {name} subset has one image per class, so no lr can be chosen on "
                    "held-out labels; give `lr_grid` a single value"
                )
            larger = next(iter(selection))
            lr = selection[larger]["lr"]
            how = f"reused from {larger}: this subset has one image per class, nothing to hold out"
        selection[name] = {
            "lr": lr,
            "head_lr": lr * used["head_lr_multiplier"],
            "how": how,
            "val_top1_per_lr": val_top1,
            "diverged_lrs": diverged,
            "epochs": epochs,
        }
        model = finetune(
            ckpt, labelled, data.num_classes, lr, epochs, augment, used, seed_for(subset_seed, 1), device
        )
        accuracy = scores(model, data.test, transform, used, device)
        metrics[f"top1_{name}"], metrics[f"top5_{name}"] = accuracy[1], accuracy[5]
    return metrics, {
        "lr_selection": selection,
        "view_config": dataclasses.asdict(views),
        "optimiser": "SGD with momentum; backbone lr and head lr (x head_lr_multiplier) as param groups",
        "schedule": "cosine per step to 0, no warm-up",
        "head_init": "weight ~ N(0, 0.01), bias 0",
        "mode": "end to end, train mode (batch-norm statistics update)",
        "eval_transform": "EvalTransform (centre square crop, resize, normalise)",
    }


def evaluate(
    features: dict, settings: dict, seed: int, checkpoint_path=None, result_dir=None, prepared=None
) -> tuple[dict[str, float], dict]:
    """The protocol entry: `features` name the target and are cross-checked (the images are fine-tuned
    on); the subset files go to ``result_dir/semisup_subsets`` (default: the checkpoint's ``eval/``).
    ``prepared``: the target's prepared file, read instead of the dataset's own files."""
    if checkpoint_path is not None:  # unknown keys fail before anything is loaded (none: that error first)
        resolve_settings(settings, DEFAULTS, PROTOCOL)
    meta = (features or {}).get("meta")
    ckpt, data = checkpoint_and_images("semisup fine-tunes the backbone", checkpoint_path, meta, prepared)
    if features is not None and int(features["num_classes"]) != data.num_classes:
        raise ProtocolError(
            f"semisup: the features have {features['num_classes']} classes but their dataset "
            f"{data.name} has {data.num_classes}; re-extract the features"
        )
    result_dir = Path(result_dir) if result_dir is not None else Path(checkpoint_path).parent / "eval"
    return run_semisup(ckpt, data, settings, seed, result_dir / SUBSET_FOLDER)
