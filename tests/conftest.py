"""Shared fixtures: a tiny configuration of the real suite (digits, timm's test_resnet, 2 epochs)."""

import copy
from pathlib import Path

import pytest
import torch

from sslbench.config import load_config

REPO = Path(__file__).resolve().parent.parent
METHODS_DIR = REPO / "methods"

torch.set_num_threads(1)  # tests share 2 cores; keep each process on one


def tiny_suite_config(**train) -> dict:
    """config/default.yaml shrunk to seconds: 8x8 digits, 2 epochs, batch 64 (loaded as the Snakefile
    loads it, with these as --config overrides)."""
    tiny = {"dataset": {"image_size": 8}, "train": {"epochs": 2, "batch_size": 64, **train}, "seeds": [0]}
    return load_config(REPO / "config", overrides=tiny)


@pytest.fixture
def suite_config():
    return tiny_suite_config()


@pytest.fixture
def method_config(suite_config):
    from sslbench.config import resolve_method_config

    def make(method: str, **overrides) -> dict:
        cfg = copy.deepcopy(suite_config)
        if overrides:
            cfg["method_overrides"] = {method: overrides}
        return resolve_method_config(cfg, METHODS_DIR, method)

    return make


def fixed_batch_losses(trainer, steps: int, labelled: bool, size: int = 64) -> list[float]:
    """Losses of ``steps`` optimiser steps on one fixed batch with fixed views: training must lower them."""
    idx = torch.arange(size)
    g = torch.Generator().manual_seed(0)
    views = [trainer.augment(trainer.data.train.images[idx], g) for _ in range(trainer.method.num_views)]
    labels = trainer.labels[idx] if labelled else None
    losses = []
    for _ in range(steps):
        loss = trainer.method.training_loss(views, labels, idx)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        losses.append(float(loss.detach()))
    return losses
