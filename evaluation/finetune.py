"""Fine-tuning on every train label: MAE's end-to-end protocol (facebookresearch/mae @ efb2a80,
main_finetune.py, util/lr_decay.py, util/lr_sched.py, models_vit.py; FINETUNE.md's ViT-B command).

The checkpoint's backbone and a new linear head are trained end to end on the whole train split, then
scored on the test split (top-1, top-5) with the evaluation transform. The defaults are FINETUNE.md's
ViT-B/16 command: 100 epochs, batch 1024, lr = blr 5e-4 x 1024 / 256 = 2e-3 (``lr`` is the absolute lr
for ``batch_size``: a preset that changes the batch sets the lr with it), layer decay 0.65, weight
decay 0.05, drop path 0.1, mixup 0.8, cutmix 1.0, label smoothing 0.1, random erasing 0.25, and
main_finetune.py's defaults for the rest (5 warm-up epochs, min_lr 1e-6, AdamW with torch's betas).

- **Model** (models_vit.py): a ViT pools its patch tokens, without the class token, through a new
  LayerNorm (``pool: avg``, MAE's ``global_pool``; its final norm is dropped) or reads the class token
  after the final norm (``pool: token``, ``--cls_token``). The drop-path rate ``drop_path`` is set on
  the backbone (timm's ``drop_path_rate``; ``pixels`` has none). Other networks use their own pooled
  output (``pool: avg``). The head's weight is trunc_normal std ``head_init_std``, its bias 0. The
  checkpoint's ``backbone.features`` (what the frozen-feature protocols read) plays no part here.
- **Optimiser** (util/lr_decay.py, BEiT's rule): AdamW over parameter groups. A ViT's patch embedding,
  class token and position embedding are layer 0, block i is layer i + 1, everything after the blocks
  (the pooling norm, the head) is layer L = blocks + 1, and a parameter of layer l takes the lr times
  ``layer_decay`` ** (L - l). 1-D parameters and the ViT's ``no_weight_decay()`` names take no weight
  decay. On another network every parameter takes the lr (layer decay is defined for ViTs).
- **Schedule** (util/lr_sched.py): per step, linear warm-up from 0 over ``warmup_epochs`` then a half
  cosine to ``min_lr``, each group's curve times its layer scale (``sslbench.optim.learning_rate``).
- **Views and targets**: each image is cropped and flipped (ViewAugment's ``supervised`` preset, scale
  (0.08, 1)) with RandAugment, normalised, then randomly erased (timm's RandomErasing, probability
  ``random_erasing``, per-pixel normal noise, one box: ``--reprob --remode pixel --recount 1``); each
  batch is then mixed (timm's Mixup in ``batch`` mode: with probability ``mixup_prob`` a mixup with
  lambda ~ Beta(``mixup``) or, with probability ``mixup_switch_prob``, a cutmix with Beta(``cutmix``),
  the batch against its reverse; targets one-hot with ``label_smoothing``, mixed by lambda), and the
  loss is cross-entropy on the soft targets (SoftTargetCrossEntropy). With mixup and cutmix both 0 the
  targets are the label-smoothed one-hots (LabelSmoothingCrossEntropy). The last batch of an epoch is
  dropped when smaller than ``batch_size`` (drop_last), so every mixed batch is full.
- **Randomness**: timm's Mixup and RandomErasing draw from numpy's and Python's global generators and
  drop path from torch's: all three are seeded from the run's seed when the fit starts, and the data
  order and views come from their own generators, so a seed gives the same numbers on one machine.

Where it differs from MAE, stated in the settings it records (``deviations``): RandAugment is
torchvision's (``RandAugment(2, 9)`` on each uint8 crop: ViewAugment's ``policy: randaugment``), not
timm's ``rand-m9-mstd0.5-inc1`` (magnitude noise 0.5, increasing ops); crops are bilinear, not bicubic,
and the evaluation transform is the suite's (centre square crop, resize), not MAE's resize to 1/0.875
then centre crop; training runs in float32 (MAE: fp16 autocast with a grad scaler), on one process.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch
from torch import nn

from evaluation.classifier import fit_classifier, scores
from sslbench.augment.pipeline import EvalTransform, ViewAugment
from sslbench.augment.presets import view_config
from sslbench.backbones import PIXELS, backbone_from_config, is_vit
from sslbench.data.containers import Dataset
from sslbench.distributed import select_device
from sslbench.kit.headlayer import out_features
from sslbench.kit.vit import vit_layer_id
from sslbench.optim import make_optimizer

from .common import (
    ProtocolError,
    check_batch_size,
    check_metrics,
    checkpoint_and_images,
    resolve_settings,
    seed_for,
)

PROTOCOL = "finetune"
NEEDS_CHECKPOINT = True
READS_IMAGES = True  # it fine-tunes on the target's images (its prepared file, in the DAG)
DROPS_LAST_BATCH = True  # drop_last: every mixed batch is full
DEFAULTS: dict = {  # FINETUNE.md's ViT-B/16 command; main_finetune.py's defaults where it sets none
    "epochs": 100,
    "batch_size": 1024,  # 32 per GPU x 32 GPUs
    "lr": 0.002,  # the absolute lr for batch_size: --blr 5e-4 x 1024 / 256
    "min_lr": 1.0e-6,
    "warmup_epochs": 5.0,  # a float: a preset may scale it to part of an epoch
    "weight_decay": 0.05,
    "layer_decay": 0.65,  # ViT-B (ViT-L and ViT-H: 0.75)
    "adam_betas": [0.9, 0.999],  # torch.optim.AdamW(param_groups, lr=args.lr): torch's defaults
    "drop_path": 0.1,
    "pool": "avg",  # models_vit.py global_pool (main_finetune.py's default); "token": --cls_token
    "head_init_std": 2.0e-5,  # trunc_normal_(model.head.weight, std=2e-5)
    "label_smoothing": 0.1,
    "mixup": 0.8,  # Beta(alpha, alpha) of mixup; 0: off
    "cutmix": 1.0,  # Beta(alpha, alpha) of cutmix; 0: off
    "mixup_prob": 1.0,
    "mixup_switch_prob": 0.5,
    "random_erasing": 0.25,  # --reprob (--remode pixel --recount 1)
    "augment": {"preset": "supervised", "policy": "randaugment"},  # view_config() arguments
    "eval_batch_size": 1024,
    "device": "auto",
}
RULES: dict = {  # over the types of DEFAULTS: what the plan and the job judge the settings by
    "epochs": {"minimum": 1},
    "batch_size": {
        "minimum": 2,
        "multipleOf": 2,
        "description": "mixup pairs each image with another of its batch",
    },
    "lr": {"exclusiveMinimum": 0},
    "min_lr": {"minimum": 0},
    "warmup_epochs": {"minimum": 0},
    "weight_decay": {"minimum": 0},
    "layer_decay": {"exclusiveMinimum": 0, "maximum": 1},
    "adam_betas": {"minItems": 2, "maxItems": 2, "items": {"minimum": 0, "exclusiveMaximum": 1}},
    "drop_path": {"minimum": 0, "exclusiveMaximum": 1},
    "pool": {"enum": ["avg", "token"]},  # "token": a ViT's class token
    "head_init_std": {"exclusiveMinimum": 0},
    "label_smoothing": {"minimum": 0, "exclusiveMaximum": 1},
    "mixup": {"minimum": 0},
    "cutmix": {"minimum": 0},
    "mixup_prob": {"minimum": 0, "maximum": 1},
    "mixup_switch_prob": {"minimum": 0, "maximum": 1},
    "random_erasing": {"minimum": 0, "maximum": 1},
    "eval_batch_size": {"minimum": 1},
}
DEVIATIONS = [
    "RandAugment: torchvision's RandAugment(2, 9) per uint8 crop, not timm's rand-m9-mstd0.5-inc1",
    "crops resampled bilinearly (MAE: bicubic); evaluation: centre square crop and resize (MAE: resize "
    "to 1/0.875 of the size, then centre crop)",
    "float32 on one process (MAE: fp16 autocast with a grad scaler, 32 GPUs)",
]


# --- the model ---------------------------------------------------------------------------------


def backbone_for_finetuning(ckpt: dict, image_size: int, drop_path: float, pool: str) -> nn.Module:
    """The checkpoint's backbone with drop path ``drop_path``, pooling as ``pool`` says (module
    docstring): a ViT pooling ``avg`` gets a new LayerNorm after the mean patch token and no final norm.
    ``image_size``: the target's, for ``pixels``; a ViT keeps its position embeddings and resamples them."""
    cfg, meta = ckpt["cfg"], ckpt["meta"]
    section = cfg["backbone"]
    vit = is_vit(section["name"])
    if pool == "token" and not vit:
        raise ProtocolError(
            f"finetune: setting `pool: token` reads a ViT's class token; {section['name']!r} has none. "
            "Use `pool: avg`."
        )
    if section["name"] != PIXELS:
        args = {**(section.get("args") or {}), "drop_path_rate": drop_path}
        cfg = {**cfg, "backbone": {**section, "args": args}}
    size = image_size if section["name"] == PIXELS else meta["image_size"]
    backbone = backbone_from_config(cfg, meta["channels"], size)
    backbone.load_state_dict(ckpt["encoder"])
    if vit and pool == "avg" and backbone.global_pool != "avg":
        norm = backbone.norm
        backbone.global_pool = "avg"
        backbone.fc_norm = type(norm)(backbone.num_features, eps=norm.eps)
        backbone.norm = nn.Identity()
    return backbone


def new_head(dim: int, num_classes: int, std: float, generator: torch.Generator) -> nn.Linear:
    head = nn.Linear(dim, num_classes)
    with torch.no_grad():
        nn.init.trunc_normal_(head.weight, std=std, generator=generator)
        head.bias.zero_()
    return head


# --- layer-wise lr decay -----------------------------------------------------------------------


def layer_decay_groups(
    backbone: nn.Module, head: nn.Module, weight_decay: float, layer_decay: float
) -> list[dict]:
    """AdamW's parameter groups (util/lr_decay.py param_groups_lrd): one per (layer, decayed or not),
    each with its ``lr_scale`` = layer_decay ** (L - layer) and weight decay (0 for 1-D parameters and
    the backbone's ``no_weight_decay()`` names). A network that is not a ViT is one layer, scale 1."""
    vit = hasattr(backbone, "blocks") and hasattr(backbone, "patch_embed")
    num_layers = len(backbone.blocks) + 1 if vit else 0
    no_decay = set(backbone.no_weight_decay()) if hasattr(backbone, "no_weight_decay") else set()
    named = [(n, p, True) for n, p in backbone.named_parameters()] + [
        (n, p, False) for n, p in head.named_parameters()
    ]
    groups: dict[tuple[int, bool], dict] = {}
    for name, param, in_backbone in named:
        if not param.requires_grad:
            continue
        layer = vit_layer_id(name, num_layers - 1) if vit and in_backbone else num_layers
        decay = not (param.ndim == 1 or (in_backbone and name in no_decay))
        group = groups.setdefault(
            (layer, decay),
            {
                "params": [],
                "layer": layer,
                "lr_scale": layer_decay ** (num_layers - layer),
                "weight_decay": weight_decay if decay else 0.0,
            },
        )
        group["params"].append(param)
    return list(groups.values())


# --- views and targets -------------------------------------------------------------------------


def batch_transform(used: dict, num_classes: int, device: torch.device):
    """(views, labels) -> (erased and mixed views, soft targets): timm's RandomErasing on each view,
    then timm's Mixup on the batch (or label smoothing alone when mixup and cutmix are off)."""
    from timm.data import Mixup
    from timm.data.mixup import mixup_target
    from timm.data.random_erasing import RandomErasing

    erase = RandomErasing(used["random_erasing"], mode="pixel", max_count=1, device=device)
    mixing = used["mixup"] > 0 or used["cutmix"] > 0
    mix = Mixup(
        mixup_alpha=used["mixup"],
        cutmix_alpha=used["cutmix"],
        prob=used["mixup_prob"],
        switch_prob=used["mixup_switch_prob"],
        mode="batch",
        label_smoothing=used["label_smoothing"],
        num_classes=num_classes,
    )

    def transform(views: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if used["random_erasing"] > 0:
            views = erase(views)
        if mixing:
            return mix(views, labels)
        return views, mixup_target(labels, num_classes, 1.0, used["label_smoothing"])

    return transform


def seed_global_generators(seed: int) -> None:
    """timm's Mixup and RandomErasing draw from numpy's and Python's global generators, drop path from
    torch's: seeded here so a fit is the same for a seed."""
    torch.manual_seed(seed)
    np.random.seed(seed_for(seed, 0))
    random.seed(seed_for(seed, 1))


# --- the protocol ------------------------------------------------------------------------------


def finetune(
    ckpt: dict, data: Dataset, used: dict, seed: int, device: torch.device, neck: nn.Sequential | None = None
) -> tuple[nn.Module, dict]:
    """(backbone [+ neck] + head trained end to end on the train split of ``data``, what the optimiser
    used). ``neck``: layers between the backbone and the new head (a projection head's first layer, as
    semi-supervised fine-tuning starts from), trained as part of the head's layer."""
    seed_global_generators(seed)
    backbone = backbone_for_finetuning(ckpt, data.image_size, used["drop_path"], used["pool"])
    width = backbone.num_features if neck is None else out_features(neck)
    head = new_head(
        width, data.num_classes, used["head_init_std"], torch.Generator().manual_seed(seed_for(seed, 2))
    )
    top = head if neck is None else nn.Sequential(neck, head)  # everything after the blocks: layer L
    model = nn.Sequential(backbone, top).to(device).train()
    groups = layer_decay_groups(backbone, top, used["weight_decay"], used["layer_decay"])
    train = {
        "optimizer": "adamw",
        "lr": used["lr"],
        "weight_decay": used["weight_decay"],
        "adam_betas": used["adam_betas"],
    }
    optimiser = make_optimizer(groups, train, device)
    norm = ckpt["normalisation"]
    views = view_config(**used["augment"])
    augment = ViewAugment(data.image_size, data.channels, norm["mean"], norm["std"], views).to(device)
    generators = (
        torch.Generator().manual_seed(seed_for(seed, 3)),
        torch.Generator().manual_seed(seed_for(seed, 4)),
    )
    schedule = {
        "lr": used["lr"],
        "min_lr": used["min_lr"],
        "epochs": used["epochs"],
        "warmup_epochs": used["warmup_epochs"],
        "warmup_ramp": "linear",  # util/lr_sched.py: lr x epoch / warmup_epochs on the fractional epoch
        "schedule": "cosine",
    }

    def diverged(loss: float, epoch: int) -> str:
        return f"finetune: the loss became {loss} in epoch {epoch + 1} at lr {used['lr']}; lower `lr`"

    fit_classifier(
        model,
        optimiser,
        data.train,
        augment,
        schedule,
        used["batch_size"],
        generators,
        device,
        diverged,
        min_batch=used["batch_size"],  # drop_last: every mixed batch is full (and even)
        batch_transform=batch_transform(used, data.num_classes, device),
    )
    record = {
        "view_config": dataclasses.asdict(views),
        "param_groups": [
            {
                "layer": g["layer"],
                "lr_scale": g["lr_scale"],
                "weight_decay": g["weight_decay"],
                "params": len(g["params"]),
            }
            for g in groups
        ],
    }
    return model, record


def run_finetune(ckpt: dict, data: Dataset, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    if data.multilabel:
        raise ProtocolError(
            f"finetune: {data.name} is multilabel; fine-tuning here needs one class per image"
        )
    check_batch_size(PROTOCOL, used["batch_size"], data)
    device = select_device(used["device"])
    model, record = finetune(ckpt, data, used, seed, device)
    norm = ckpt["normalisation"]
    transform = EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"]).to(device)
    accuracy = scores(model, data.test, transform, used, device)
    used.update(
        record,
        device=str(device),
        optimiser="AdamW over layer-wise lr-decay groups (util/lr_decay.py)",
        schedule="per step: linear warm-up from 0, then half cosine to min_lr; each group x its lr_scale",
        loss="cross-entropy on mixed, label-smoothed targets (SoftTargetCrossEntropy)",
        eval_transform="EvalTransform (centre square crop, resize, normalise)",
        deviations=DEVIATIONS,
    )
    return check_metrics({"top1": accuracy[1], "top5": accuracy[5]}, PROTOCOL), used


def evaluate(
    features: dict, settings: dict, seed: int, checkpoint_path=None, prepared=None
) -> tuple[dict[str, float], dict]:
    """The protocol entry: `features` name the target (its images are fine-tuned on); ``prepared``:
    the target's prepared file, read instead of the dataset's own files."""
    if checkpoint_path is not None:  # unknown keys fail before anything is loaded (none: that error first)
        resolve_settings(settings, DEFAULTS, PROTOCOL)
    meta = (features or {}).get("meta")
    ckpt, data = checkpoint_and_images("finetune trains the backbone", checkpoint_path, meta, prepared)
    return run_finetune(ckpt, data, settings, seed)
