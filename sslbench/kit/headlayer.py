"""The first layer of a method's projection head, kept in the final checkpoint for semi-supervised
fine-tuning to start from (SimCLR v2 and iBOT fine-tune from it rather than from the backbone alone).

The layer is written as data, not as a pickled module: a list of plain descriptions (the module's type
and the arguments that rebuild it) beside its state dict. ``build_layer`` makes the same modules again,
so a checkpoint stays readable without the method's code.
"""

from __future__ import annotations

from torch import nn

ACTIVATIONS = (nn.ReLU, nn.GELU)


def first_layer(head: nn.Sequential) -> nn.Sequential:
    """The modules of ``head`` up to and including its first activation: a Linear with its norm and
    non-linearity. A head with no activation (one linear map) has no first layer to start from."""
    for i, module in enumerate(head):
        if isinstance(module, ACTIVATIONS):
            return head[: i + 1]
    raise ValueError(f"the projection head {head} has no activation, so no first layer to start from")


def describe(module: nn.Module) -> dict:
    """The arguments that rebuild ``module`` (one of the types ``build_layer`` knows)."""
    if isinstance(module, nn.Linear):
        return {
            "type": "Linear",
            "in": module.in_features,
            "out": module.out_features,
            "bias": module.bias is not None,
        }
    if isinstance(module, nn.BatchNorm1d):
        return {
            "type": "BatchNorm1d",
            "features": module.num_features,
            "eps": module.eps,
            "momentum": module.momentum,
            "affine": module.affine,
        }
    if isinstance(module, nn.LayerNorm):
        return {"type": "LayerNorm", "features": list(module.normalized_shape), "eps": module.eps}
    if isinstance(module, nn.ReLU):
        return {"type": "ReLU"}
    if isinstance(module, nn.GELU):
        return {"type": "GELU", "approximate": module.approximate}
    raise TypeError(
        f"the projection head's first layer holds a {type(module).__name__}; headlayer.describe knows "
        "Linear, BatchNorm1d, LayerNorm, ReLU and GELU"
    )


def build(description: dict) -> nn.Module:
    kind = description["type"]
    if kind == "Linear":
        return nn.Linear(description["in"], description["out"], bias=description["bias"])
    if kind == "BatchNorm1d":
        return nn.BatchNorm1d(
            description["features"],
            eps=description["eps"],
            momentum=description["momentum"],
            affine=description["affine"],
        )
    if kind == "LayerNorm":
        return nn.LayerNorm(description["features"], eps=description["eps"])
    if kind == "ReLU":
        return nn.ReLU()
    if kind == "GELU":
        return nn.GELU(approximate=description["approximate"])
    raise ValueError(f"unknown layer type {kind!r} in a checkpoint's projection_first_layer")


def layer_record(head: nn.Sequential | None) -> dict | None:
    """{"modules": descriptions, "state": state dict, "out_dim": width} of ``head``'s first layer, as the
    final checkpoint keeps it; None where the method has no projection head."""
    if head is None:
        return None
    layer = first_layer(head)
    state = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    return {"modules": [describe(m) for m in layer], "state": state, "out_dim": out_features(layer)}


def out_features(layer: nn.Sequential) -> int:
    """The width of what ``layer`` outputs: its last Linear's."""
    return [m for m in layer if isinstance(m, nn.Linear)][-1].out_features


def build_layer(record: dict) -> nn.Sequential:
    """The layer ``layer_record`` wrote, with its weights."""
    layer = nn.Sequential(*(build(d) for d in record["modules"]))
    layer.load_state_dict(record["state"])
    return layer
