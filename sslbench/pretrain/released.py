"""Released weights: a published ImageNet checkpoint (MoCo, SwAV, DINO, ...) read as its own repository's
evaluation code reads it, and loaded into the suite's timm backbone.

Each official format is a row of ``FORMATS``: the top-level entry that holds the weights, the prefix
stripped from each key, and the keys dropped (projection heads, prototypes, key or momentum encoders,
queues), each named. Everything else must be a backbone key: ``load_backbone`` loads strictly, so a
wrong format or a wrong backbone name stops with the keys that do not fit. Key names are torchvision's,
which timm's ResNets share (``conv1.weight``, ``layer1.0.bn1.running_mean``, ..., classifier ``fc``).

Files are read with ``torch.load(weights_only=False)``: DINO's checkpoint pickles an
``argparse.Namespace`` and lemniscate's a module object, which ``weights_only`` refuses. Open only
files you trust (their sha256 is recorded with every result). A class the file names that cannot be
imported (lemniscate's ``lib.NCEAverage``) is read as an ``Unimported`` placeholder holding its
pickled state: nothing runs beyond what ``torch.load``'s own unpickling runs.

BYOL's release (``pretrain_res50x1.pkl``) is a dill pickle of JAX/Haiku trees and is not read here:
format ``byol`` is chigur/byol-convert's torch file of it, torchvision names for the online network
(``online_params``), its BatchNorm statistics from ``online_state`` (Haiku's ``mean_ema`` and ``var_ema``
averages as ``running_mean`` and ``running_var``; no ``num_batches_tracked``) and its online linear probe
as ``fc`` (dropped). Haiku pads stride-2 layers as TF's 'SAME' does (asymmetrically), timm symmetrically,
so timm's features differ slightly from the official network's.

Writing a backbone in a format's layout is ``sslbench.pretrain.official_files``."""

from __future__ import annotations

import pickle
import re
import types
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from sslbench.pretrain.checkpoints import key_differences, save_final
from sslbench.weightfiles import FORMATS, Format, ReleasedWeightsError, get_format

BATCHES_TRACKED = "num_batches_tracked"


SHOWN = 5  # keys shown per kind in a mismatch message


class Unimported:
    """Stands for an object of a class the file names but that cannot be imported (lemniscate's
    ``lib.NCEAverage``): it keeps the arguments and the state the pickle gave it, and runs nothing."""

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj.args = args
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state

    def __repr__(self) -> str:
        return f"<unimported {self.__module__}.{type(self).__qualname__}>"


class TolerantUnpickler(pickle.Unpickler):
    """pickle's unpickler, with an ``Unimported`` subclass for a class whose module or name is missing."""

    placeholders: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            key = (module, name)
            if key not in self.placeholders:
                self.placeholders[key] = type(name, (Unimported,), {"__module__": module})
            return self.placeholders[key]


TOLERANT_PICKLE = types.ModuleType("tolerant_pickle")  # torch.load's pickle_module


TOLERANT_PICKLE.Unpickler = TolerantUnpickler


TOLERANT_PICKLE.load = lambda file, **kwargs: TolerantUnpickler(file, **kwargs).load()


def read_file(path: str | Path, name: str | None = None):
    """The unpickled file, on the CPU (``name``: the format it is read as)."""
    fmt = FORMATS.get(name)
    note = f" ({fmt.note})" if fmt is not None and fmt.note else ""
    if fmt is not None and fmt.foreign_suffix and Path(path).suffix == fmt.foreign_suffix:
        raise ReleasedWeightsError(f"{path}: format {name!r} does not read {fmt.foreign_suffix} files{note}")
    try:
        with warnings.catch_warnings():  # a placeholder has no source for the legacy format's check
            warnings.filterwarnings("ignore", "Couldn't retrieve source code for container")
            return torch.load(path, map_location="cpu", weights_only=False, pickle_module=TOLERANT_PICKLE)
    except FileNotFoundError:
        raise ReleasedWeightsError(f"{path}: not found") from None
    except Exception as err:  # whatever a file that is not a torch checkpoint raises
        detail = str(err).split("\n")[0]
        raise ReleasedWeightsError(
            f"{path}: not a torch checkpoint ({type(err).__name__}: {detail}){note}"
        ) from err


def is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def expected_layout(name: str, fmt: Format) -> str:
    entries = [e for e in (fmt.wrapper, *fmt.parts, *fmt.also_reads) if e is not None]
    where = " or ".join(f"a `{e}` entry" for e in dict.fromkeys(entries))
    bare = fmt.wrapper is None or fmt.backbone_file
    what = f"{where} or a bare state dict" if where and bare else where or "a bare state dict"
    return f"format {name!r} ({fmt.source}) expects {what}"


def formats_reading(checkpoint: Mapping) -> str:
    """The formats whose loader finds its weights in ``checkpoint``'s top level, as a hint."""
    bare = is_state_dict(checkpoint)
    names = [
        name
        for name, fmt in FORMATS.items()
        if any(e in checkpoint for e in (fmt.wrapper, *fmt.parts, *fmt.also_reads) if e is not None)
        or (bare and (fmt.wrapper is None or fmt.backbone_file))
    ]
    return f" (its top level fits {', '.join(names)})" if names else ""


def select_weights(checkpoint, name: str, fmt: Format, path, part: str | None) -> Mapping:
    """The state dict the format's loader takes from the file (``part``: which of ``fmt.parts``)."""
    if part is not None and part not in fmt.parts:
        allowed = f"one of {', '.join(fmt.parts)}" if fmt.parts else "none"
        raise ReleasedWeightsError(f"part {part!r} of format {name!r}: its parts are {allowed}")
    if not isinstance(checkpoint, Mapping):
        raise ReleasedWeightsError(
            f"{path}: not a checkpoint: it holds a {type(checkpoint).__name__}, "
            f"where {expected_layout(name, fmt)}"
        )
    candidates = [part or fmt.wrapper, *fmt.also_reads]
    found = next((c for c in candidates if c is not None and c in checkpoint), None)
    if found is not None:
        weights = checkpoint[found]
    elif part is None and (fmt.wrapper is None or fmt.backbone_file) and is_state_dict(checkpoint):
        weights = checkpoint
    else:
        keys = list(checkpoint)
        shown = ", ".join(map(str, keys[:10])) + (f", ... ({len(keys) - 10} more)" if len(keys) > 10 else "")
        asked = f"no `{part}` entry: " if part is not None else ""
        raise ReleasedWeightsError(
            f"{path}: {asked}its top-level keys are [{shown}], where {expected_layout(name, fmt)}. "
            f"Fix: name the format the file was released in{formats_reading(checkpoint)}"
        )
    if not is_state_dict(weights):
        raise ReleasedWeightsError(
            f"{path}: its `{found}` entry is not a state dict of tensors ({type(weights).__name__}), "
            f"where {expected_layout(name, fmt)}"
        )
    return weights


def strip_prefix(key: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if prefix and key.startswith(prefix):
            return key[len(prefix) :]
    return key


def renamed(key: str, fmt: Format) -> str:
    key = strip_prefix(key, (fmt.prefix, *fmt.also_strips))
    for pattern, replacement in fmt.renames:
        key = re.sub(pattern, replacement, key)
    return key


def rename(weights: Mapping[str, torch.Tensor], fmt: Format) -> dict[str, torch.Tensor]:
    """The format's keys in the backbone's names: declared heads dropped (and, for a loader that reads the
    prefixed keys alone, every other key), the prefix stripped, the format's renames applied."""
    read = lambda key: not key.startswith(fmt.drop) and (key.startswith(fmt.prefix) or not fmt.prefixed_only)
    return {renamed(k, fmt): v for k, v in weights.items() if read(k)}


def dinov3_to_timm(state: Mapping[str, torch.Tensor], path) -> dict[str, torch.Tensor]:
    """DINOv3's qkv biases as timm's Eva (``vit_*_dinov3_qkvb``) holds them: each applied as the official
    layer applies it (``LinearKMaskedBias``: bias x bias_mask, the mask zero on k), split into ``q_bias``
    and ``v_bias``."""
    out = {}
    for key, value in state.items():
        if key.endswith("qkv.bias_mask"):
            continue
        if key.endswith("qkv.bias"):
            q, k, v = (value * state[f"{key}_mask"]).chunk(3)
            if k.any():
                raise ReleasedWeightsError(
                    f"{path}: {key}_mask leaves a k bias, which timm's Eva (k bias fixed at 0) cannot hold"
                )
            out[key.replace("qkv.bias", "q_bias")], out[key.replace("qkv.bias", "v_bias")] = q, v
        else:
            out[key] = value
    return out


CONVERSIONS = {"dinov3": dinov3_to_timm}  # Format.convert's: what renaming keys cannot do


def backbone_state(path: str | Path, format: str, part: str | None = None) -> dict[str, torch.Tensor]:
    """The backbone's state dict in a released file of ``format``, in timm's key names; ``part`` picks
    one of the format's ``parts`` (DINO: ``teacher``, the default, or ``student``)."""
    fmt = get_format(format)
    state = rename(select_weights(read_file(path, format), format, fmt, path, part), fmt)
    return CONVERSIONS[fmt.convert](state, path) if fmt.convert else state


def few(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f", ... ({len(items) - SHOWN} more)" if len(items) > SHOWN else "")


def backbone_name(backbone: nn.Module) -> str:
    cfg = getattr(backbone, "pretrained_cfg", None) or {}
    return cfg.get("architecture") or type(backbone).__name__


def fitting_formats(missing: list[str], unexpected: list[str]) -> list[str]:
    """Formats whose renaming turns the unexpected keys into exactly the missing ones."""
    if not missing or not unexpected:
        return []
    fits = []
    for name, fmt in FORMATS.items():
        renamed = {k for k in rename(dict.fromkeys(unexpected), fmt) if not k.endswith(BATCHES_TRACKED)}
        if renamed == set(missing):
            fits.append(name)
    return fits


def mismatch_message(backbone: nn.Module, state: Mapping, path, format: str | None) -> str | None:
    """What keeps ``state`` from loading strictly into ``backbone`` (None: it loads)."""
    missing, unexpected, shapes = key_differences(backbone.state_dict(), state)
    missing = [k for k in missing if not k.endswith(BATCHES_TRACKED)]  # filled in by load_backbone
    shapes = [f"{k} {a} in the file, {b} in the backbone" for k, a, b in shapes]
    if not (missing or unexpected or shapes):
        return None
    problems = [
        f"{len(items)} {what} ({few(items)})"
        for what, items in [
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", shapes),
        ]
        if items
    ]
    read_as = f" read as format {format!r}" if format else ""
    fits = fitting_formats(missing, unexpected)
    fix = (
        f"its keys fit format {' or '.join(map(repr, fits))}: name that `format`"
        if fits
        else "name the `format` the file was released in (one of "
        f"{', '.join(FORMATS)}), or the `backbone` it was trained with (e.g. resnet50)"
    )
    return (
        f"{path}: released weights{read_as} do not fit backbone {backbone_name(backbone)}: "
        f"{'; '.join(problems)}. Fix: {fix}"
    )


def load_backbone(
    backbone: nn.Module, state: Mapping[str, torch.Tensor], path: str | Path, format: str | None = None
) -> nn.Module:
    """Load ``state`` strictly into ``backbone`` (a timm model, num_classes=0). BatchNorm's
    ``num_batches_tracked``, absent from files of pytorch < 0.4.1 and from converted ones, is 0, as
    torch's own BatchNorm fills it in."""
    problem = mismatch_message(backbone, state, path, format)
    if problem:
        raise ReleasedWeightsError(problem)
    full = dict(state)
    for key, value in backbone.state_dict().items():
        if key.endswith(BATCHES_TRACKED) and key not in full:
            full[key] = torch.zeros_like(value)
    backbone.load_state_dict(full, strict=True)
    return backbone


def import_released(cfg: dict, seed: int, out_dir: str | Path, prepared: str | Path | None = None) -> Path:
    """A released file as the checkpoint of the run ``cfg`` (its ``released`` section, from
    ``sslbench.plan.released``): the backbone built as a trained run's would be, the file's weights
    loaded strictly, the normalisation the release was trained with (ImageNet's) or the pretraining
    set's own, and run.json as the trainer writes it, with the file's name, format and sha256."""
    from sslbench.backbones import backbone_from_config
    from sslbench.data.images import dataset_stats
    from sslbench.data.registry import load_data
    from sslbench.plan.settings import dataset_label
    from sslbench.provenance import code_record, provenance, sha256_file

    info = cfg["released"]
    path = Path(info["path"])
    digest = sha256_file(path)
    if info.get("sha256") and digest != info["sha256"]:
        raise ReleasedWeightsError(
            f"{path} changed since the DAG was planned (sha256 {digest}, planned {info['sha256']}); run "
            "snakemake again so that the plan and its results name this file"
        )
    data = load_data(cfg, prepared)
    torch.manual_seed(seed)
    backbone = backbone_from_config(cfg, data.channels, data.image_size)
    load_backbone(
        backbone, backbone_state(path, info["format"], info.get("part")), path, format=info["format"]
    )
    images = data.train.images if info["normalisation"] == "dataset" else None
    mean, std = dataset_stats(data.channels, images)
    meta = {
        "method": cfg["method"],
        "dataset": dataset_label(cfg),
        "seed": seed,
        "epochs_trained": cfg["train"].get("epochs"),
        "steps": None,
        "batch_size": None,
        "world_size": 1,
        "image_size": data.image_size,
        "channels": data.channels,
        "num_classes": data.num_classes,
        "backbone": cfg["backbone"]["name"],
        "small_stem": bool(cfg["backbone"].get("small_stem", False)),
        "train_wall_time_s": None,
        "images_per_s": None,
        "released": {**info, "sha256": digest},
        **provenance(torch.device("cpu")),
        "code": code_record("import"),
    }
    checkpoint = {
        "encoder": backbone.state_dict(),
        "method_state": {},
        "cfg": cfg,
        "seed": seed,
        "meta": meta,
        "normalisation": {"mean": mean, "std": std},
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return save_final(Path(out_dir), checkpoint)
