"""Extract features once per (checkpoint, evaluation target): the frozen encoder's pooled output on
the target's train and test splits (evaluation transform), to one file every protocol reads.

A target is evaluated as the transfer literature does: its own splits and image size, the images
normalised with the PRETRAINING set's mean and std (what the encoder was trained with), and grey or
colour images converted to the encoder's channels (``sslbench.data.images.CHANNEL_CONVERSIONS``). What was
done is stored in the file's metadata (``eval``) and in every result row.

The file format lives in ``sslbench.extract.featurefile`` (no torch), re-exported here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sslbench import atomic
from sslbench import distributed as dist
from sslbench.augment.pipeline import EvalTransform
from sslbench.backbones import PIXELS, backbone_from_config, feature_reader
from sslbench.data.containers import Dataset
from sslbench.data.images import channel_conversion, convert_channels
from sslbench.data.registry import load_data
from sslbench.distributed import select_device
from sslbench.extract.featurefile import load_features, save_features  # noqa: F401  (re-exported)
from sslbench.provenance import code_record, provenance


def load_encoder(checkpoint: dict, image_size: int | None = None) -> torch.nn.Module:
    """The checkpoint's encoder as its features are read (``backbone.features``), for images of
    ``image_size`` (default: the pretraining size). Only ``pixels`` is built for that size; a ViT is
    built as it was trained (its position embeddings) and resamples them for other sizes."""
    cfg, meta = checkpoint["cfg"], checkpoint["meta"]
    size = image_size or meta["image_size"] if cfg["backbone"]["name"] == PIXELS else meta["image_size"]
    encoder = backbone_from_config(cfg, meta["channels"], size)
    encoder.load_state_dict(checkpoint["encoder"])
    return feature_reader(encoder, cfg["backbone"])


def read_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    return atomic.load_torch(path, "checkpoint", device)


def target_data(checkpoint: dict, target: dict, prepared: str | Path | None = None) -> tuple[Dataset, dict]:
    """A target's dataset (a dataset section with its ``label``) as the checkpoint's encoder takes it,
    and the record of how: target, image size, channel conversion, normalisation. ``prepared``: the
    target's prepared file (``sslbench.data.prepared.prepare_dataset``): the same images, already loaded, so
    the record names the section either way."""
    data = load_data({"dataset": target}, prepared)
    source_channels = data.channels
    data = convert_channels(data, checkpoint["meta"]["channels"])
    norm = checkpoint["normalisation"]
    record = {
        "dataset": target["label"],
        "settings": dict(target),
        "image_size": data.image_size,
        "channels": source_channels,
        "transfer_channels": channel_conversion(source_channels, data.channels),
        "normalisation": f"pretraining set's mean {norm['mean']} and std {norm['std']}",
    }
    return data, record


def evaluation_data(
    checkpoint: dict, features_meta: dict | None, prepared: str | Path | None = None
) -> Dataset:
    """The images a protocol that needs them (fine-tuning, the paper-mode probe) evaluates on: the
    target its features were extracted from (the pretraining set when they say none), read from its
    prepared file where one is given."""
    if features_meta and "eval" in features_meta:
        target = features_meta["eval"]["settings"]
    else:
        target = pretraining_target(checkpoint)
    return target_data(checkpoint, target, prepared)[0]


def pretraining_target(checkpoint: dict) -> dict:
    """The checkpoint's own pretraining set as an evaluation target (a dataset section and its label)."""
    return {**checkpoint["cfg"]["dataset"], "label": checkpoint["meta"]["dataset"]}


def eval_transform(checkpoint: dict, data: Dataset) -> EvalTransform:
    """The evaluation transform of a target: its image size, the pretraining set's mean and std."""
    norm = checkpoint["normalisation"]
    return EvalTransform(data.image_size, data.channels, norm["mean"], norm["std"])


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


def extract(
    checkpoint_path: str | Path,
    out_path: str | Path,
    target: dict | None = None,
    device: str = "auto",
    prepared: str | Path | None = None,
) -> Path:
    """Features of ``target`` (a dataset section with its label; default: the pretraining set), its
    images read from ``prepared`` where given (its prepared file)."""
    dev = select_device(device)
    ckpt = read_checkpoint(checkpoint_path, "cpu")
    target = target or pretraining_target(ckpt)
    data, record = target_data(ckpt, target, prepared)
    encoder = load_encoder(ckpt, data.image_size).to(dev)
    transform = eval_transform(ckpt, data).to(dev)
    features = {
        "train": embed(encoder, data.train, transform, dev).numpy(),
        "train_labels": data.train.labels.numpy(),
        "test": embed(encoder, data.test, transform, dev).numpy(),
        "test_labels": data.test.labels.numpy(),
        "num_classes": data.num_classes,
        "meta": {
            **ckpt["meta"],
            "cfg": ckpt["cfg"],
            "eval": record,
            "extract_device": (extracted_with := provenance(dev))["device"],
            "extract_cpu_kernels": extracted_with["cpu_kernels"],
            "code_extract": code_record("extract"),
        },
    }
    for split in ("train", "test"):
        if not np.isfinite(features[split]).all():
            raise ValueError(
                f"{checkpoint_path}: the encoder produced non-finite {split} features; "
                "the checkpoint is broken; delete it and retrain"
            )
    return save_features(out_path, features)


def extract_after_training(
    checkpoint_path: str | Path,
    out_path: str | Path,
    device: str = "auto",
    prepared: str | Path | None = None,
) -> None:
    """The pretraining set's features, written by the training job itself (rank 0, after every rank
    has finished): the same code as ``extract``, without a job of its own to start."""
    if dist.is_main():
        extract(checkpoint_path, out_path, device=device, prepared=prepared)
