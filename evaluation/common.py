"""Small helpers shared by the evaluation protocols: settings, the feature dict, metrics."""

from __future__ import annotations

import copy
import math
import os

import numpy as np

from sslbench.errors import SslbenchError
from sslbench.plan.limits import protocol_batch_problem
from sslbench.plan.protocols import setting_problems

FEATURE_KEYS = ("train", "train_labels", "test", "test_labels", "num_classes")


class ProtocolError(SslbenchError, ValueError):
    """A protocol's settings or inputs do not fit; the message names the setting or the file."""


def available_threads() -> int:
    """The threads this job may use: OMP_NUM_THREADS (the CLI sets it from Snakemake's `threads`),
    else every core."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)


def resolve_settings(settings: dict | None, defaults: dict, protocol: str, ignored=()) -> dict:
    """`defaults` overridden by `settings`, less the keys `ignored` (another mode's, which this one takes
    and leaves out). A key that is neither is a ProtocolError naming the known ones; so is a value its
    rule refuses (``check_rules``)."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(defaults) - set(ignored))
    if unknown:
        label = f"{protocol} (mode {defaults['mode']!r})" if "mode" in defaults else protocol
        raise ProtocolError(
            f"{label}: unknown setting(s) {unknown}; known settings are {sorted(defaults)}. "
            "Fix the protocol settings in the config file."
        )
    check_rules(protocol, settings)
    taken = {k: v for k, v in settings.items() if k not in ignored}
    return {**copy.deepcopy(defaults), **copy.deepcopy(taken)}


def check_rules(protocol: str, settings: dict) -> None:
    """A ProtocolError where a setting's value breaks its rule (the type of its default, the protocol's
    RULES), in the words the plan reports it with before any job: one judge, so the two cannot disagree."""
    problems = setting_problems(protocol, settings)
    if problems:
        raise ProtocolError("\n".join(problems))


def check_batch_size(protocol: str, batch_size: int, data) -> None:
    """A protocol that drops the last short batch of each epoch (its DROPS_LAST_BATCH) needs a
    `batch_size` that the train split of its target (``data``, a Dataset) fills: the plan's check, in
    its words."""
    problem = protocol_batch_problem(protocol, batch_size, len(data.train))
    if problem:
        raise ProtocolError(f"config key `evaluation.{protocol}.batch_size`: {problem} ({data.name})")


def to_numpy(value, name: str) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (copied off any device)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def unpack_features(features: dict, allow_multilabel: bool = False) -> dict:
    """The feature dict as validated numpy arrays: float32 features, int64 labels.

    Single-label labels are [N] class ids in [0, num_classes). With `allow_multilabel`,
    labels may also be [N, num_classes] (the VOC-style {1, 0, -1} targets).
    """
    missing = [key for key in FEATURE_KEYS if key not in features]
    if missing:
        raise ProtocolError(
            f"feature dict is missing key(s) {missing}; it needs {list(FEATURE_KEYS)} "
            "(rerun `sslbench extract` to rebuild features.pt)"
        )
    num_classes = int(features["num_classes"])
    if num_classes < 2:
        raise ProtocolError(f"feature dict: num_classes={num_classes}, a protocol needs at least 2 classes")
    out = {"num_classes": num_classes}
    for split in ("train", "test"):
        x = np.ascontiguousarray(to_numpy(features[split], split), dtype=np.float32)
        y = to_numpy(features[f"{split}_labels"], f"{split}_labels").astype(np.int64)
        if x.ndim != 2 or len(x) == 0:
            raise ProtocolError(
                f"feature dict: '{split}' must be a non-empty [N, D] matrix, got shape {x.shape}"
            )
        if not np.isfinite(x).all():
            raise ProtocolError(f"feature dict: '{split}' holds non-finite values; re-extract the features")
        if len(y) != len(x):
            raise ProtocolError(
                f"feature dict: '{split}' has {len(x)} rows but '{split}_labels' has {len(y)}"
            )
        _check_labels(y, num_classes, f"{split}_labels", allow_multilabel)
        out[split], out[f"{split}_labels"] = x, y
    if out["train"].shape[1] != out["test"].shape[1]:
        raise ProtocolError(
            f"feature dict: train dim {out['train'].shape[1]} != test dim {out['test'].shape[1]}"
        )
    if out["train_labels"].ndim != out["test_labels"].ndim:
        raise ProtocolError("feature dict: train and test labels differ in kind (one multilabel, one not)")
    return out


def _check_labels(y: np.ndarray, num_classes: int, name: str, allow_multilabel: bool) -> None:
    if y.ndim == 2 and allow_multilabel:
        if y.shape[1] != num_classes or not np.isin(y, (-1, 0, 1)).all():
            raise ProtocolError(
                f"feature dict: multilabel '{name}' must be [N, {num_classes}] with values in {{1, 0, -1}}"
            )
        return
    if y.ndim == 2:
        raise ProtocolError(
            f"feature dict: '{name}' is multilabel ({y.shape[1]} columns of VOC codes); this protocol needs "
            "one class per image (lowshot_svm takes multilabel targets)"
        )
    if y.ndim != 1:
        raise ProtocolError(f"feature dict: '{name}' must be a vector of class ids, got shape {y.shape}")
    if y.min() < 0 or y.max() >= num_classes:
        raise ProtocolError(
            f"feature dict: '{name}' holds ids outside [0, {num_classes}) (range {y.min()}..{y.max()})"
        )


def topk_accuracy(scores: np.ndarray, labels: np.ndarray, ks=(1, 5)) -> dict[int, float]:
    """Fraction of rows whose true label is among the k highest scores, for each k.

    k larger than the number of classes counts every row correct (top-5 of 3 classes is 1.0).
    Ties are broken by the lower class index, like a stable sort.
    """
    scores, labels = np.asarray(scores), np.asarray(labels)
    order = np.argsort(-scores, axis=1, kind="stable")
    hits = order == labels[:, None]
    return {k: float(hits[:, :k].any(axis=1).mean()) for k in ks}


def checkpoint_and_images(doing: str, checkpoint_path, features_meta: dict | None, prepared=None):
    """(checkpoint, the target's Dataset) for a protocol that trains on images (``doing`` says how, for
    the error when no checkpoint is given): the target its features were extracted from, read from its
    prepared file where one is given. Imports torch: call it only from such a protocol's code."""
    if checkpoint_path is None:
        raise ProtocolError(
            f"{doing} and needs the checkpoint: pass checkpoint_path (`sslbench evaluate --checkpoint ...`)"
        )
    from sslbench.extract.features import evaluation_data, read_checkpoint

    ckpt = read_checkpoint(checkpoint_path, "cpu")
    return ckpt, evaluation_data(ckpt, features_meta, prepared)


def seed_for(*parts: int) -> int:
    """A 31-bit seed derived from several integers (run seed, draw, restart, ...)."""
    return int(
        np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1
    )  # < 2**31: faiss wants a C int


def sample_lowshot(labels, k: int | float, num_draws: int, seed: int) -> list[np.ndarray]:
    """`num_draws` index arrays into `labels`, each holding k indices of every class (classes in
    ascending order, without replacement): an int k is that many images of each class, a float k in
    (0, 1) that fraction of each class's images (rounded, at least one). Same seed and k: same draws."""
    labels = to_numpy(labels, "labels")
    if labels.ndim != 1:
        raise ValueError(
            "sample_lowshot takes a vector of class ids; use sample_lowshot_multilabel for [N, C]"
        )
    members = [np.flatnonzero(labels == cls) for cls in np.unique(labels)]
    if isinstance(k, float):
        if not 0 < k < 1:
            raise ValueError(f"sample_lowshot: a fraction must lie in (0, 1), got {k}")
        sizes = [max(1, round(k * len(m))) for m in members]
        rng = np.random.default_rng(seed_for(seed, round(k * 1e6), 1))  # not any int k's stream
    else:
        smallest = min(len(m) for m in members)
        if not 1 <= k <= smallest:
            raise ValueError(f"sample_lowshot: k={k}, but the smallest class has {smallest} samples")
        sizes = [k] * len(members)
        rng = np.random.default_rng(seed_for(seed, k))
    return [
        np.concatenate([rng.choice(m, size=n, replace=False) for m, n in zip(members, sizes)])
        for _ in range(num_draws)
    ]


def check_metrics(metrics: dict, protocol: str) -> dict[str, float]:
    """Metrics as plain floats; a non-finite value is a bug we refuse to write."""
    out = {name: float(value) for name, value in metrics.items()}
    bad = {name: value for name, value in out.items() if not math.isfinite(value)}
    if bad:
        raise ValueError(f"{protocol}: non-finite metric(s) {bad}")
    return out
