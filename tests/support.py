"""What tests share (``from support import ...``): the repository's folders, a tiny configuration of the
real suite (digits, timm's test_resnet, 2 epochs), and ``require``: what a test does when a real
component of the machine is missing."""

import dataclasses
import gzip
import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from sslbench.data.containers import Dataset, ImageSet
from sslbench.plan.settings import load_config

REPO = Path(__file__).resolve().parent.parent
METHODS_DIR = REPO / "methods"
# tests/methods/exerciser uses every piece of the method contract at once; the contract tests (test_contract,
# test_distributed) run it beside every folder of methods/ (discovered).
EXERCISER_DIR = REPO / "tests" / "methods" / "exerciser"


# The tests' one tiny Vision Transformer: 2 blocks of 48-d, 3 heads, patches of 4 px (2 x 2 of them on the
# tiny suite's 8-px digits), padded where a multi-crop view's side is no multiple of 4.
TINY_VIT = {  # small_stem false: DenseCL's config sets it for its ResNet
    "name": "vit_tiny_patch16_224",
    "small_stem": False,
    "args": {"patch_size": 4, "depth": 2, "num_heads": 3, "embed_dim": 48, "dynamic_img_pad": True},
}


# The masked-image methods' tests' ViT on the tiny suite's 8-px digits: patch 2, a 4 x 4 grid of 16 patches.
VIT_P2 = {
    "name": "vit_tiny_patch16_224",
    "small_stem": False,
    "args": {"patch_size": 2, "depth": 2, "num_heads": 3, "embed_dim": 48},
}
# padded: random_views' 3-px local crops are no multiple of the 2-px patch (multi-crop methods: iBOT, DINOv2)
VIT_P2_PADDED = {**VIT_P2, "args": {**VIT_P2["args"], "dynamic_img_pad": True}}


# I-JEPA's blocks on the tiny suite's 8-px digits: its 2-px patches make a 4 x 4 grid, whose target blocks at
# (0.15, 0.2) of the patches hold 2 (config.yaml's min_keep 4 refuses them); at (0.2, 0.3) they hold 4.
TINY_IJEPA = {"min_keep": 1, "pred_mask_scale": [0.2, 0.3]}


def tiny_vit(**kwargs):
    """TINY_VIT built for 16-px inputs (4 x 4 patches), without a classifier."""
    import timm

    return timm.create_model(TINY_VIT["name"], img_size=16, num_classes=0, **{**TINY_VIT["args"], **kwargs})


# Split batch norm needs BatchNorm2d layers: on a ViT these methods run with one split (and refuse more).
VIT_OVERRIDES = {
    "moco": {"bn_splits": 1},
    "pcl": {"bn_splits": 1},
    "ressl": {"bn_splits": 1},
    "densecl": {"bn_splits": 1, "backbone": {"small_stem": False}},  # its config's small stem is a ResNet's
}


def contract_folders() -> dict[str, Path]:
    """{name: folder} of every method folder under methods/ and the exerciser."""
    from sslbench.plan.runs import discover_methods

    return {name: METHODS_DIR / name for name in discover_methods(METHODS_DIR)} | {"exerciser": EXERCISER_DIR}


# Real components some tests need from the machine. Where one is missing those tests skip and say why,
# unless SSLBENCH_REQUIRE (comma-separated; .ci/run sets it) names it: then they fail, so that CI cannot
# go green with its real-component tests skipped.
COMPONENTS = ("slurm", "chromium", "fashion_mnist", "cxx_compiler")


def required_components() -> set[str]:
    names = {name.strip() for name in os.environ.get("SSLBENCH_REQUIRE", "").split(",") if name.strip()}
    unknown = sorted(names - set(COMPONENTS))
    if unknown:
        raise pytest.UsageError(
            f"SSLBENCH_REQUIRE names unknown components {unknown}; known: {', '.join(COMPONENTS)}"
        )
    return names


def require(component: str, missing: str | None) -> None:
    """Go on if ``missing`` is None; else skip saying why, or fail where SSLBENCH_REQUIRE names it."""
    __tracebackhide__ = True  # the skip / failure is reported at the calling test's line
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; add it to COMPONENTS in tests/support.py")
    if missing is None:
        return
    if component in required_components():
        pytest.fail(f"{component} is required here (SSLBENCH_REQUIRE) but {missing}", pytrace=False)
    pytest.skip(f"no {component}: {missing}")


def pretrain_args(cfg: dict, out, method_dir=METHODS_DIR / "simclr") -> list[str]:
    """`sslbench pretrain`'s arguments for one run of ``cfg`` on the CPU into ``out``."""
    return [
        "pretrain",
        "--method-dir",
        str(method_dir),
        "--config-json",
        json.dumps(cfg),
        "--seed",
        "0",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--quiet",
    ]


def tiny_suite_config(**train) -> dict:
    """config/default.yaml shrunk to seconds: 8x8 digits, 2 epochs, batch 64, evaluated on digits alone
    (loaded as the Snakefile loads it, with these as --config overrides)."""
    tiny = {
        "datasets": {"digits": {"image_size": 8}},
        "evaluation": {"targets": ["pretrain"]},
        "train": {"epochs": 2, "batch_size": 64, **train},
        "seeds": [0],
        "floor": {"seeds": 0},  # floors on `seeds` alone (tests/plan/test_floors.py sets more)
    }
    return load_config(REPO / "config", overrides=tiny)


def tiny_checkpoint(method: str, out_dir: Path, backbone: dict | None = None) -> Path:
    """``method`` trained on the tiny suite (seed 0, CPU) into ``out_dir``, on ``backbone`` (a config
    section, e.g. TINY_VIT's) instead of the suite's where given: its final checkpoint."""
    from sslbench.plan.settings import resolve_method_config
    from sslbench.pretrain.trainer import pretrain

    cfg = tiny_suite_config()
    if backbone is not None:
        cfg["backbone"] = backbone
    cfg = resolve_method_config(cfg, METHODS_DIR, method)
    return pretrain(METHODS_DIR / method, cfg, 0, out_dir, device="cpu", progress=False)


def tiny_digits():
    """The tiny suite's pretraining set (8x8 digits), loaded from the settings a run of it gets."""
    from sslbench.data.registry import load_data
    from sslbench.plan.settings import resolve_method_config

    return load_data(resolve_method_config(tiny_suite_config(), METHODS_DIR, "random"))


def preset_config(name: str) -> dict:
    """config/<name>.yaml merged over config/default.yaml by the one loader, as `--configfile` does."""
    return load_config(REPO / "config", [REPO / "config" / f"{name}.yaml"])


def random_views(seed: int = 0, n: int = 16, local: int = 0) -> list[torch.Tensor]:
    """Views of ``n`` random images as a method's loss takes them: 2 global 8-px views, then ``local``
    3-px ones, all drawn from one generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 1, 8, 8, generator=g) for _ in range(2)] + [
        torch.randn(n, 1, 3, 3, generator=g) for _ in range(local)
    ]


def fixed_batch_losses(
    trainer, steps: int, labelled: bool, size: int = 64, reseed: int | None = None
) -> list[float]:
    """Losses of ``steps`` optimiser steps on one fixed batch with fixed views: training must lower them.
    ``reseed``: the global RNG seeded with it before every step, so that what a loss draws inside (SIGReg's
    and VISReg's directions) is the same at every step and only the training moves the loss."""
    idx = torch.arange(size)
    g = torch.Generator().manual_seed(0)
    views = trainer.make_views(trainer.data.train.images[idx], g)
    labels = trainer.labels[idx] if labelled else None
    losses = []
    for _ in range(steps):
        if reseed is not None:
            torch.manual_seed(reseed)
        loss = trainer.method.training_loss(views, labels, idx)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def assert_trains(method_config, method: str, out: Path, shrink: float) -> list[float]:
    """12 steps on one fixed labelled batch lower the loss of ``method`` below ``shrink`` times the first,
    and the engine's loop runs its 2 epochs with finite losses. Returns those epoch losses."""
    from sslbench.pretrain.trainer import Trainer

    trainer = Trainer(METHODS_DIR / method, method_config(method), 0, out, progress=False)
    losses = fixed_batch_losses(trainer, steps=12, labelled=True)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < shrink * losses[0], losses
    fresh = Trainer(METHODS_DIR / method, method_config(method), 0, out / "run", progress=False)
    fresh.fit()
    epoch_losses = [row["loss"] for row in fresh.log_rows]
    assert len(epoch_losses) == 2 and all(math.isfinite(v) for v in epoch_losses)
    return epoch_losses


def mlp_layout(mlp) -> tuple[list[type], list[tuple[int, int]], list[bool]]:
    """An MLP as plain data to compare: the type of each layer, then the (in, out) features and whether
    there is a bias of each nn.Linear."""
    linears = [m for m in mlp if isinstance(m, torch.nn.Linear)]
    shapes = [(m.in_features, m.out_features) for m in linears]
    return [type(m) for m in mlp], shapes, [m.bias is not None for m in linears]


def lars_groups(trainer) -> tuple[dict, dict]:
    """The trainer's LARS groups (weights, then biases and norms), checked to split the method's parameters
    into its matrices and its vectors."""
    from sslbench.optim import Lars

    optimizer, method = trainer.optimizer, trainer.method
    assert isinstance(optimizer, Lars)
    weights, biases = optimizer.param_groups
    assert {id(p) for p in weights["params"]} == {id(p) for p in method.parameters() if p.ndim > 1}
    assert {id(p) for p in biases["params"]} == {id(p) for p in method.parameters() if p.ndim == 1}
    return weights, biases


def feature_dict(train, train_labels, test, test_labels, num_classes, array=torch.as_tensor) -> dict:
    """A feature file's contents as an evaluation protocol reads them: float32 features and the labels of
    both splits, made by ``array`` (torch.as_tensor, as load_features gives them, or np.asarray)."""
    return {
        "train": array(np.asarray(train, dtype=np.float32)),
        "train_labels": array(train_labels),
        "test": array(np.asarray(test, dtype=np.float32)),
        "test_labels": array(test_labels),
        "num_classes": num_classes,
        "meta": {},
    }


def independent_features(seed, n_train, n_test, dim, num_classes, array=torch.as_tensor) -> dict:
    """feature_dict of Gaussian features with labels drawn independently of them: any protocol scores
    chance on the test split."""
    rng = np.random.default_rng(seed)
    train, train_labels = rng.normal(size=(n_train, dim)), rng.integers(0, num_classes, n_train)
    test, test_labels = rng.normal(size=(n_test, dim)), rng.integers(0, num_classes, n_test)
    return feature_dict(train, train_labels, test, test_labels, num_classes, array)


def hadamard_columns(n: int, d: int) -> torch.Tensor:
    """[n, d]: d columns of the n x n Sylvester Hadamard matrix other than the constant one: entries
    +-1, every column of mean 0 and biased variance 1, columns pairwise orthogonal."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h[:, 1 : d + 1]


def assert_same_dataset(read: Dataset, loaded: Dataset) -> None:
    """Every field of the Dataset and of each split equal; tensors bit for bit, in dtype and layout."""
    for field in dataclasses.fields(Dataset):
        a, b = getattr(read, field.name), getattr(loaded, field.name)
        if field.name not in ("train", "test"):
            assert a == b and type(a) is type(b), field.name
            continue
        for split_field in dataclasses.fields(ImageSet):
            x, y = getattr(a, split_field.name), getattr(b, split_field.name)
            where = f"{field.name}.{split_field.name}"
            if isinstance(y, torch.Tensor):
                assert (x.dtype, x.shape, x.stride()) == (y.dtype, y.shape, y.stride()), where
                assert torch.equal(x, y), where
            else:
                assert x == y, where


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """An array in the IDX format of MNIST-style files (optionally gzipped)."""
    header = b"\x00\x00\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def write_fashion_format(root: Path, n_train=40, n_test=20) -> Path:
    """Fashion-MNIST's four IDX files, every class n / 10 times (a stratified subset needs two of each)."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for images, labels, n in (
        ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", n_train),
        ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", n_test),
    ):
        write_idx(root / images, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(root / labels, rng.permutation(np.arange(n) % 10).astype(np.uint8))
    return root


def copy_workflow(root: Path, *extra: str) -> Path:
    """The Snakefile, rules/, config/ and methods/ (and the ``extra`` folders) copied into ``root``: a
    workflow a test may run or edit without touching the repository."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "Snakefile", root)
    for folder in ("rules", "config", "methods", *extra):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root
