"""A backbone written in an official format's on-disk layout (``write_official``): the suite's
export of its own checkpoints, and the files the importers' tests read. ``example_heads`` makes
plausible heads for a format where no real ones are at hand."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from timm.models.beit import gen_relative_position_index
from torch import nn

from sslbench import atomic
from sslbench.pretrain.released import BATCHES_TRACKED
from sslbench.weightfiles import ReleasedWeightsError, get_format


def sgd_state(lr: float) -> dict:
    """An optimizer state_dict as torch.optim.SGD writes it (no momentum buffers)."""
    group = {"lr": lr, "momentum": 0.9, "dampening": 0, "weight_decay": 1e-4, "nesterov": False}
    return {"state": {}, "param_groups": [{**group, "params": []}]}


def memory_bank(size: int = 16, dim: int = 128) -> nn.Module:
    """A stand-in for lemniscate's NCEAverage object: a module holding the memory bank."""
    module = nn.Module()
    module.register_buffer("params", torch.tensor([4096.0, 0.07, -1.0, 0.5]))
    module.register_buffer("memory", torch.nn.functional.normalize(torch.randn(size, dim), dim=1))
    return module


# The other top-level entries each official file carries, by format (flat files carry none).
OFFICIAL_FIELDS: dict[str, Callable[[], dict]] = {
    "moco": lambda: {"epoch": 200, "arch": "resnet50", "optimizer": sgd_state(0.03)},
    "pcl": lambda: {"epoch": 200, "arch": "resnet50", "optimizer": sgd_state(0.03)},
    "mocov3": lambda: {
        "epoch": 100,
        "arch": "resnet50",
        "optimizer": sgd_state(0.6),
        "scaler": {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000},
    },
    "simsiam": lambda: {"epoch": 100, "arch": "resnet50", "optimizer": sgd_state(0.05)},
    "dino": lambda: {
        "optimizer": sgd_state(0.03),
        "epoch": 800,
        "args": argparse.Namespace(arch="resnet50", out_dim=60, epochs=800),  # out_dim scaled down
        "dino_loss": {"center": torch.zeros(1, 60)},
    },
    "ibot": lambda: {  # main_ibot.py's save_dict beside the two networks (out_dim scaled down)
        "optimizer": sgd_state(0.0005),
        "epoch": 800,
        "args": argparse.Namespace(arch="vit_small", out_dim=60, epochs=800),
        "ibot_loss": {"center": torch.zeros(1, 60), "center2": torch.zeros(1, 1, 60)},
    },
    "barlowtwins": lambda: {"epoch": 1000, "optimizer": sgd_state(0.2)},
    "vicreg": lambda: {"epoch": 1000, "optimizer": sgd_state(0.2)},
    "supcon": lambda: {
        "opt": argparse.Namespace(model="resnet50"),
        "optimizer": sgd_state(0.5),
        "epoch": 350,
    },
    "ressl": lambda: {"epoch": 200, "optimizer": sgd_state(0.05)},
    "msn": lambda: {  # save_checkpoint's entries beside the two encoders (prototypes scaled down)
        "opt": {"state": {}, "param_groups": []},
        "prototypes": torch.randn(64, 32),
        "epoch": 800,
        "loss": 2.5,
        "batch_size": 64,
        "world_size": 16,
        "lr": 0.001,
        "temperature": 0.1,
    },
    "ijepa": lambda: {  # save_checkpoint's entries beside the two encoders (the predictor scaled down)
        "predictor": linear("module.predictor_embed", 24, 48) | {"module.mask_token": torch.zeros(1, 1, 24)},
        "opt": {"state": {}, "param_groups": []},
        "scaler": None,
        "epoch": 300,
        "loss": 0.1,
        "batch_size": 128,
        "world_size": 16,
        "lr": 0.001,
    },
    "simmim": lambda: {  # utils.py save_checkpoint's entries beside the model (config: a yacs CfgNode there)
        "optimizer": {"state": {}, "param_groups": []},
        "lr_scheduler": {"decay_t": [700], "decay_rate": 0.1},
        "max_accuracy": 0.0,
        "epoch": 799,
        "config": {"MODEL": {"TYPE": "vit", "NAME": "simmim_pretrain"}},
    },
    "franca": lambda: {},  # the README's "backbone only" files: the teacher entry alone
    "densecl": lambda: {"author": "DenseCL"},
    "instdisc": lambda: {
        "epoch": 200,
        "arch": "resnet50",
        "best_prec1": 0.0,
        "optimizer": sgd_state(0.03),
        "lemniscate": memory_bank(),
    },
}


def write_official(
    state: Mapping[str, torch.Tensor],
    format: str,
    path: str | Path,
    heads: Mapping[str, torch.Tensor] | None = None,
    placeholders: bool = True,
    **fields,
) -> Path:
    """Write a backbone state dict (timm names) as ``format``'s official file: its wrapper, its key
    prefix and its other top-level entries (``fields`` overrides them, e.g. ``arch``). ``heads``: the
    file's other networks, named as in the file (``example_heads``). Without heads, a format that is
    also released as a bare backbone file (DINO, Barlow Twins, VICReg) writes that file. Without
    ``placeholders``, the top-level entries are ``fields`` alone, none of OFFICIAL_FIELDS' made-up ones
    (an export writes only what it knows)."""
    fmt = get_format(format)
    for key in heads or {}:
        if not key.startswith(fmt.drop):
            raise ReleasedWeightsError(
                f"head {key!r} is not one of format {format!r}'s dropped keys ({', '.join(fmt.drop)})"
            )
    weights = {k: v for k, v in state.items() if fmt.batches_tracked or not k.endswith(BATCHES_TRACKED)}
    if heads is None and fmt.backbone_file:
        entries, official = weights, None
    else:
        entries = {fmt.prefix + k: v for k, v in weights.items()} | dict(heads or {})
        official = fmt.wrapper
    if official is None:
        if fields:
            raise ReleasedWeightsError(
                f"format {format!r} writes a bare state dict: no fields {sorted(fields)}"
            )
        checkpoint = entries
    else:
        checkpoint = (OFFICIAL_FIELDS[format]() if placeholders else {}) | fields
        for part in fmt.parts or (official,):
            checkpoint[part] = dict(entries)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer, _use_new_zipfile_serialization=not fmt.legacy_file)
    return atomic.write_bytes(path, buffer.getvalue())


def linear(key: str, out: int, into: int, bias: bool = True) -> dict[str, torch.Tensor]:
    layer = {f"{key}.weight": torch.randn(out, into) / into**0.5}
    return layer | ({f"{key}.bias": torch.zeros(out)} if bias else {})


def batch_norm(key: str, n: int, affine: bool = True) -> dict[str, torch.Tensor]:
    stats = {
        f"{key}.running_mean": torch.randn(n) * 0.1,
        f"{key}.running_var": torch.rand(n) + 0.5,
        f"{key}.{BATCHES_TRACKED}": torch.tensor(1000),
    }
    return ({f"{key}.weight": torch.ones(n), f"{key}.bias": torch.zeros(n)} if affine else {}) | stats


def momentum_copy(prefix: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        prefix + k: v.clone() + (0.01 * torch.randn_like(v) if v.is_floating_point() else 0)
        for k, v in state.items()
    }


def moco_heads(state: Mapping, d: int) -> dict:
    """MoCo v2: the MLP projector fc.0/fc.2 of both encoders, the key encoder, the queue."""
    fc = lambda encoder: linear(f"module.{encoder}.fc.0", d, d) | linear(f"module.{encoder}.fc.2", 128, d)
    queue = {"module.queue": torch.randn(128, 16), "module.queue_ptr": torch.zeros(1, dtype=torch.long)}
    return fc("encoder_q") | momentum_copy("module.encoder_k.", state) | fc("encoder_k") | queue


def mocov3_heads(state: Mapping, d: int) -> dict:
    """MoCo v3: the projector fc.{0,1,3,4} of both encoders (last BN without affine), the predictor."""
    hidden, out = 64, 32

    def mlp(key: str, into: int) -> dict:
        return (
            linear(f"{key}.0", hidden, into, bias=False)
            | batch_norm(f"{key}.1", hidden)
            | linear(f"{key}.3", out, hidden, bias=False)
            | batch_norm(f"{key}.4", out, affine=False)
        )

    encoders = mlp("module.base_encoder.fc", d) | mlp("module.momentum_encoder.fc", d)
    return encoders | momentum_copy("module.momentum_encoder.", state) | mlp("module.predictor", out)


def simsiam_heads(state: Mapping, d: int) -> dict:
    """SimSiam: the 3-layer projector encoder.fc.{0,1,3,4,6,7} and the predictor."""
    projector = (
        linear("module.encoder.fc.0", d, d, bias=False)
        | batch_norm("module.encoder.fc.1", d)
        | linear("module.encoder.fc.3", d, d, bias=False)
        | batch_norm("module.encoder.fc.4", d)
        | linear("module.encoder.fc.6", d, d)
        | batch_norm("module.encoder.fc.7", d, affine=False)
    )
    bottleneck = max(d // 4, 1)
    predictor = (
        linear("module.predictor.0", bottleneck, d, bias=False)
        | batch_norm("module.predictor.1", bottleneck)
        | linear("module.predictor.3", d, bottleneck)
    )
    return projector | predictor


def swav_heads(state: Mapping, d: int, heads: int = 1) -> dict:
    """SwAV's projection head and prototypes (DeepCluster-v2: three sets, prototypes.prototypes{i})."""
    head = (
        linear("module.projection_head.0", d, d)
        | batch_norm("module.projection_head.1", d)
        | linear("module.projection_head.3", 128, d)
    )
    if heads == 1:
        return head | linear("module.prototypes", 30, 128, bias=False)
    return head | {
        k: v
        for i in range(heads)
        for k, v in linear(f"module.prototypes.prototypes{i}", 30, 128, False).items()
    }


def dino_heads(state: Mapping, d: int) -> dict:
    """DINO's head: mlp.{0,2,4}, then the weight-normed last layer (weight_g, weight_v)."""
    hidden, bottleneck, out = 64, 32, 60
    mlp = linear("module.head.mlp.0", hidden, d) | linear("module.head.mlp.2", hidden, hidden)
    last = {
        "module.head.last_layer.weight_g": torch.ones(out, 1),
        "module.head.last_layer.weight_v": torch.randn(out, bottleneck),
    }
    return mlp | linear("module.head.mlp.4", bottleneck, hidden) | last


def projector(key: str, d: int, width: int, bias: bool) -> dict:
    """Barlow Twins' and VICReg's projector: Linear, BN, ReLU, Linear, BN, ReLU, Linear (no bias)."""
    return (
        linear(f"{key}.0", width, d, bias)
        | batch_norm(f"{key}.1", width)
        | linear(f"{key}.3", width, width, bias)
        | batch_norm(f"{key}.4", width)
        | linear(f"{key}.6", width, width, bias=False)
    )


EXAMPLE_HEADS: dict[str, Callable[[Mapping, int], dict]] = {
    "moco": moco_heads,
    "pcl": moco_heads,
    "mocov3": mocov3_heads,
    "simsiam": simsiam_heads,
    "swav": swav_heads,
    "deepclusterv2": lambda state, d: swav_heads(state, d, heads=3),
    "selav2": swav_heads,
    "dino": dino_heads,
    "ibot": lambda state, d: dino_heads(state, d) | {"module.backbone.masked_embed": torch.zeros(1, d)},
    "barlowtwins": lambda state, d: (
        projector("module.projector", d, 64, bias=False) | batch_norm("module.bn", 64, False)
    ),
    "vicreg": lambda state, d: projector("module.projector", d, 64, bias=True),
    "supcon": lambda state, d: linear("module.head.0", d, d) | linear("module.head.2", 128, d),
    "instdisc": lambda state, d: linear("module.fc", 128, d),
    "ressl": lambda state, d: (  # network/ressl.py: both encoders' projection heads, the key net, the queue
        linear("module.encoder_q.head.linear1", 64, d)
        | linear("module.encoder_q.head.linear2", 32, 64)
        | momentum_copy("module.encoder_k.net.", state)
        | linear("module.encoder_k.head.linear1", 64, d)
        | linear("module.encoder_k.head.linear2", 32, 64)
        | {"module.queue": torch.randn(32, 16), "module.queue_ptr": torch.zeros(1, dtype=torch.long)}
    ),
    "densecl": lambda state, d: {},  # the released files are the extracted backbone
    "simmim": lambda state, d: (  # the decoder (1x1 conv to 16 x 16 x 3, pixel shuffle), mask token, index
        {
            "decoder.0.weight": torch.randn(16 * 16 * 3, d, 1, 1) / d**0.5,
            "decoder.0.bias": torch.zeros(16 * 16 * 3),
        }
        | {"encoder.mask_token": torch.zeros(1, 1, d)}
        | {"encoder.rel_pos_bias.relative_position_index": gen_relative_position_index((4, 4))}
    ),
    "capi": lambda state, d: (  # EncoderDecoder's decoder (one block here) and its mask token
        {f"backbone.decoder.blocks.0.residual{i}.norm.weight": torch.ones(d) for i in (1, 2)}
        | linear("backbone.decoder.blocks.0.residual1.fn.q_proj", d, d, bias=False)
        | {"backbone.mask_token": torch.zeros(1, d)}
    ),
    "dinov2": lambda state, d: {"mask_token": torch.zeros(1, d)},  # DinoVisionTransformer's [1, D]
    "ijepa": lambda state, d: {},  # an encoder entry holds the encoder alone (the predictor: its own entry)
    "msn": lambda state, d: (  # init_model's fc: Linear, BN, GELU, Linear, BN, GELU, Linear
        linear("module.fc.fc1", 64, d)
        | batch_norm("module.fc.bn1", 64)
        | linear("module.fc.fc2", 64, 64)
        | batch_norm("module.fc.bn2", 64)
        | linear("module.fc.fc3", 32, 64)
    ),
    "byol": lambda state, d: linear("fc", 1000, d),
    "dinov3": lambda state, d: {"mask_token": torch.zeros(1, d)},  # DinoVisionTransformer's [1, D]
    "franca": lambda state, d: (  # the teacher's mask token and heads (Matryoshka levels, scaled down)
        {"backbone.mask_token": torch.zeros(1, d)}
        | linear("dino_head.heads.0.mlp.0", 64, d)
        | linear("ibot_head.heads.0.mlp.0", 64, d)
    ),
    "torchvision": lambda state, d: linear("fc", 1000, d),
    "timm": lambda state, d: linear("fc", 1000, d),
}


def example_heads(
    format: str, state: Mapping[str, torch.Tensor], num_features: int
) -> dict[str, torch.Tensor]:
    """Random heads and other networks of the shapes ``format``'s file has for a backbone of
    ``num_features`` (ResNet-50: 2048), named as in the file; widths scaled down where fixed."""
    get_format(format)
    return EXAMPLE_HEADS[format](state, num_features)


def moco_file_heads(method_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The heads of a methods/moco (or pcl) checkpoint as MoCo's file holds them: the query head as
    encoder_q.fc, the key encoder (backbone and head) as encoder_k, the queue as [dim, K]."""
    renames = {"projector.": "module.encoder_q.fc.", "key_encoder.net.0.": "module.encoder_k."}
    renames["key_encoder.net.1."] = "module.encoder_k.fc."
    heads = {
        new + key[len(old) :]: value
        for key, value in method_state.items()
        for old, new in renames.items()
        if key.startswith(old)
    }
    queue = {"module.queue": method_state["queue.keys"].T.contiguous()}
    return heads | queue | {"module.queue_ptr": method_state["queue.pointer"].reshape(1)}


# The methods whose checkpoint `export` writes with its heads, by format; others are written as the
# backbone alone.
FILE_HEADS: dict[str, tuple[tuple[str, ...], Callable[[Mapping], dict]]] = {
    "moco": (("moco",), moco_file_heads),
    "pcl": (("pcl",), moco_file_heads),
}


def export(checkpoint_path: str | Path, format: str, out: str | Path) -> Path:
    """A checkpoint the suite trained, written as ``format``'s official file (its heads too where the
    method is the format's own: MoCo's and PCL's key encoder, query head and queue, with the epochs
    trained and the backbone's name as `epoch` and `arch`). The official evaluation scripts read the
    weights alone; no optimizer state or other field is made up."""
    ckpt = atomic.load_torch(checkpoint_path)
    methods, heads_of = FILE_HEADS.get(format, ((), None))
    own = ckpt["cfg"]["method_base"] in methods
    heads = heads_of(ckpt["method_state"]) if own else None
    fields = {"epoch": ckpt["meta"]["epochs_trained"], "arch": ckpt["cfg"]["backbone"]["name"]} if own else {}
    return write_official(ckpt["encoder"], format, out, heads=heads, placeholders=False, **fields)
