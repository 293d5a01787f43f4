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
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from sslbench.errors import SslbenchError

BATCHES_TRACKED = "num_batches_tracked"


SHOWN = 5  # keys shown per kind in a mismatch message


class ReleasedWeightsError(SslbenchError, ValueError):
    """A released file that is not the format named, or does not fit the backbone: the message names
    the file, the keys and the fix."""


@dataclass(frozen=True)
class Format:
    """How one repository's released file holds a ResNet backbone. Keys are matched as prefixes."""

    source: str  # the file whose loader this follows
    wrapper: str | None  # the top-level entry holding the weights; None: the file is the state dict
    prefix: str = ""  # of the backbone's keys in the file, stripped
    also_strips: tuple[str, ...] = ()  # other prefixes the loader strips (the first a key starts with)
    drop: tuple[str, ...] = ()  # keys (as in the file) of heads and other networks, dropped
    also_reads: tuple[str, ...] = ()  # other top-level entries the loader accepts, tried after `wrapper`
    parts: tuple[str, ...] = ()  # entries `part` may select, the first by default
    backbone_file: bool = False  # also released as a bare state dict of the backbone, plain keys
    batches_tracked: bool = True  # the file has BatchNorm's num_batches_tracked (else filled with 0)
    legacy_file: bool = False  # written by pytorch < 1.6 (not a zip file)
    foreign_suffix: str | None = None  # files with this suffix are a release this format does not read
    note: str = ""


MOCO = dict(
    wrapper="state_dict",
    prefix="module.encoder_q.",
    drop=("module.encoder_q.fc.", "module.encoder_k.", "module.queue", "module.queue_ptr"),
)


SWAV = dict(
    wrapper=None,
    also_reads=("state_dict",),
    prefix="module.",
    drop=("module.projection_head.", "module.prototypes.", "projection_head.", "prototypes."),
)


TORCHVISION_CLASSIFIER = ("fc.",)


FORMATS: dict[str, Format] = {
    "moco": Format("facebookresearch/moco main_lincls.py (`if args.pretrained`)", **MOCO),
    "pcl": Format("salesforce/PCL eval_cls_imagenet.py (`if args.pretrained`)", **MOCO),
    "mocov3": Format(
        "facebookresearch/moco-v3 main_lincls.py (`if args.pretrained`)",
        wrapper="state_dict",
        prefix="module.base_encoder.",
        drop=("module.base_encoder.fc.", "module.momentum_encoder.", "module.predictor."),
    ),
    "simsiam": Format(
        "facebookresearch/simsiam main_lincls.py (`if args.pretrained`)",
        wrapper="state_dict",
        prefix="module.encoder.",
        drop=("module.encoder.fc.", "module.predictor."),
    ),
    "swav": Format("facebookresearch/swav hubconf.py, eval_linear.py", **SWAV),
    "deepclusterv2": Format("facebookresearch/swav hubconf.py, eval_linear.py", **SWAV),
    "selav2": Format("facebookresearch/swav hubconf.py, eval_linear.py", **SWAV),
    "dino": Format(
        "facebookresearch/dino utils.py load_pretrained_weights (eval_linear.py, eval_knn.py)",
        wrapper="teacher",
        parts=("teacher", "student"),
        backbone_file=True,  # dino_resnet50_pretrain.pth; the full checkpoint holds teacher and student
        prefix="module.backbone.",
        also_strips=("backbone.",),
        drop=("module.head.", "head."),
    ),
    "barlowtwins": Format(
        "facebookresearch/barlowtwins evaluate.py (resnet50.pth), main.py (checkpoint.pth)",
        wrapper="model",
        backbone_file=True,
        prefix="module.backbone.",
        drop=("module.projector.", "module.bn."),
    ),
    "vicreg": Format(
        "facebookresearch/vicreg hubconf.py (resnet50.pth), evaluate.py (resnet50_fullckpt.pth)",
        wrapper="model",
        backbone_file=True,
        prefix="module.backbone.",
        drop=("module.projector.",),
    ),
    "supcon": Format(
        "third-party loaders of HobbitLong/SupContrast's supcon.pth (deeplearning-wisc/knn-ood "
        "util/model_loader.py); the repository itself has no ImageNet loader",
        wrapper="model",
        prefix="module.encoder.",
        also_strips=("encoder.module.", "encoder."),
        drop=("module.head.", "head."),
        note="the layout of supcon.pth comes from third-party loaders, not from the official repository",
    ),
    "instdisc": Format(
        "zhirongw/lemniscate.pytorch main.py (`--resume`)",
        wrapper="state_dict",
        prefix="module.",
        drop=("module.fc.",),
        batches_tracked=False,
        legacy_file=True,
        note="the file also pickles lemniscate's memory bank object (read as a placeholder)",
    ),
    "byol": Format(
        "chigur/byol-convert convert.py (of deepmind-research byol's pretrain_res50x1.pkl)",
        wrapper=None,
        also_reads=("state_dict",),  # linusericsson/ssl-transfer's conversion wraps it
        drop=TORCHVISION_CLASSIFIER,  # BYOL's online linear probe (`classifier`)
        batches_tracked=False,
        foreign_suffix=".pkl",
        note=(
            "BYOL's official pretrain_res50x1.pkl is a dill pickle of JAX/Haiku trees, which this does not "
            "read: convert it with chigur/byol-convert (convert.py writes pretrain_res50x1.pth.tar) and "
            "import that file"
        ),
    ),
    "torchvision": Format(
        "pytorch/vision torchvision/models/resnet.py", wrapper=None, drop=TORCHVISION_CLASSIFIER
    ),
    "timm": Format(
        "huggingface/pytorch-image-models timm/models/_helpers.py load_checkpoint",
        wrapper=None,
        also_reads=("state_dict_ema", "state_dict", "model"),
        also_strips=("module.",),
        drop=("fc.", "head.fc.", "head.weight", "head.bias", "classifier."),
    ),
}


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise ReleasedWeightsError(f"unknown released-weights format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]


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


def rename(weights: Mapping[str, torch.Tensor], fmt: Format) -> dict[str, torch.Tensor]:
    """The format's keys in the backbone's names: declared heads dropped, the prefix stripped."""
    strips = (fmt.prefix, *fmt.also_strips)
    return {strip_prefix(k, strips): v for k, v in weights.items() if not k.startswith(fmt.drop)}


def backbone_state(path: str | Path, format: str, part: str | None = None) -> dict[str, torch.Tensor]:
    """The backbone's state dict in a released file of ``format``, in timm's key names; ``part`` picks
    one of the format's ``parts`` (DINO: ``teacher``, the default, or ``student``)."""
    fmt = get_format(format)
    weights = select_weights(read_file(path, format), format, fmt, path, part)
    return rename(weights, fmt)


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
    expected = backbone.state_dict()
    missing = [k for k in expected if k not in state and not k.endswith(BATCHES_TRACKED)]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {tuple(state[k].shape)} in the file, {tuple(expected[k].shape)} in the backbone"
        for k in expected
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
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
