"""Extract features once per checkpoint: the frozen encoder's pooled output on
the train and test splits (evaluation transform), to one file every protocol reads.

The file format lives in ``sslbench.featurefile`` (no torch), re-exported here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .augment import EvalTransform
from .backbones import backbone_from_config
from .data import load_data
from .distributed import select_device
from .errors import unreadable
from .featurefile import load_features, save_features  # noqa: F401  (re-exported)
from .provenance import provenance


def load_encoder(checkpoint: dict) -> torch.nn.Module:
    cfg, meta = checkpoint["cfg"], checkpoint["meta"]
    encoder = backbone_from_config(cfg, meta["channels"])
    encoder.load_state_dict(checkpoint["encoder"])
    return encoder


def read_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # whatever a truncated zip or pickle raises
        raise unreadable(path, "checkpoint", err) from err


@torch.inference_mode()
def embed(
    encoder: torch.nn.Module, images, transform: EvalTransform, device: torch.device, batch_size: int = 1024
) -> torch.Tensor:
    """Pooled features of an ImageSet (or uint8 tensor), in order."""
    encoder.eval()
    total = len(images)
    out = []
    for start in range(0, total, batch_size):
        idx = torch.arange(start, min(total, start + batch_size))
        batch = images.load(idx) if hasattr(images, "load") else images[idx]
        out.append(encoder(transform(batch.to(device))).float().cpu())
    return torch.cat(out)


def extract(checkpoint_path: str | Path, out_path: str | Path, device: str = "auto") -> Path:
    dev = select_device(device)
    ckpt = read_checkpoint(checkpoint_path, "cpu")
    encoder = load_encoder(ckpt).to(dev)
    data = load_data(ckpt["cfg"])
    norm = ckpt["normalisation"]
    transform = EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"]).to(dev)
    features = {
        "train": embed(encoder, data.train, transform, dev).numpy(),
        "train_labels": data.train.labels.numpy(),
        "test": embed(encoder, data.test, transform, dev).numpy(),
        "test_labels": data.test.labels.numpy(),
        "num_classes": data.num_classes,
        "meta": {**ckpt["meta"], "cfg": ckpt["cfg"], "extract_device": provenance(dev)["device"]},
    }
    for split in ("train", "test"):
        if not np.isfinite(features[split]).all():
            raise ValueError(
                f"{checkpoint_path}: the encoder produced non-finite {split} features; "
                "the checkpoint is broken; delete it and retrain"
            )
    return save_features(out_path, features)
