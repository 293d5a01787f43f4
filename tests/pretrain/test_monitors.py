"""The monitors of a run in training: each measure against a hand computation or an invariant, and a
run with them equal, bit for bit, to a run without."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from support import METHODS_DIR

from sslbench.pretrain.monitors import Monitor, feature_std, holdout_split, knn_top1, rankme
from sslbench.pretrain.trainer import pretrain


def test_rankme_by_hand():
    """Singular values 3 and 1: p = (0.75, 0.25) (+ε each), RankMe = exp(−0.75 ln 0.75 − 0.25 ln 0.25)."""
    features = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    p = np.array([0.75, 0.25]) + 1e-7
    assert rankme(features) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)
    assert rankme(features) == pytest.approx(1.7548, abs=1e-4)


def test_features_that_fill_their_dimensions_have_rank_d():
    """Equal singular values (orthogonal rows of one norm): RankMe is the dimension, up to ε."""
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(8, 8)))
    assert rankme(5 * q) == pytest.approx(8, rel=1e-5)


def test_a_collapsed_embedding_has_rank_one_and_std_zero():
    """Every image the same feature: one nonzero singular value, and no spread in any dimension."""
    constant = np.tile(np.array([[0.3, -1.2, 2.0, 0.5]], dtype=np.float32), (50, 1))
    assert rankme(constant) == pytest.approx(1.0, abs=1e-4)
    assert feature_std(constant) == 0.0
    assert rankme(np.zeros((10, 4))) == 0.0
    spread = np.random.default_rng(1).normal(size=(4000, 16))
    assert feature_std(spread) == pytest.approx(1 / math.sqrt(16), rel=0.05)  # isotropic: 1/√d


def test_the_held_out_queries_are_fixed_disjoint_and_from_the_train_split_alone():
    bank, queries = holdout_split(100, 0.2)
    again = holdout_split(100, 0.2)
    assert np.array_equal(bank, again[0]) and np.array_equal(queries, again[1])  # the same for every run
    assert len(queries) == 20 and not set(bank) & set(queries) and set(bank) | set(queries) == set(range(100))
    assert len(holdout_split(3, 0.01)[1]) == 1 and len(holdout_split(3, 0.99)[0]) == 1  # both sides kept


def test_knn_monitor_by_hand():
    """Two classes on two far-apart points: every query's neighbours are its own class; with the
    labels of the bank swapped, every query is wrong."""
    rng = np.random.default_rng(2)
    bank = np.concatenate([rng.normal([5, 0], 0.1, (10, 2)), rng.normal([0, 5], 0.1, (10, 2))]).astype(
        np.float32
    )
    labels = np.repeat([0, 1], 10)
    queries = np.array([[4.9, 0.1], [0.2, 5.1]], dtype=np.float32)
    assert knn_top1(bank, labels, queries, np.array([0, 1]), 5, 0.07, 2) == 1.0
    assert knn_top1(bank, 1 - labels, queries, np.array([0, 1]), 5, 0.07, 2) == 0.0


def test_monitor_due_every_n_epochs_and_after_the_last():
    monitor = Monitor(every=2, k=5, temperature=0.1, holdout=0.2)
    assert [e for e in range(1, 6) if monitor.due(e, 5)] == [2, 4, 5]
    assert not any(Monitor(every=0).due(e, 5) for e in range(1, 6))


@pytest.mark.parametrize("method, health", [("moco", []), ("dino", ["teacher_entropy", "teacher_usage"])])
def test_monitors_do_not_change_training(tmp_path, method_config, method, health):
    """The same run with the monitors after every epoch and without: every tensor of the checkpoint
    and every logged loss identical; the monitored one logs its measures each epoch and run.json
    records the last. moco has batch norm, a momentum encoder and a queue, which an encoder run in
    train mode, or a monitor that drew from the training's generators, would move; dino's monitors
    also run its teacher and centre (Method.health). (The whole default with the monitors on gives
    every value of the table without them: benchmarks/RESULTS.md.)"""
    cfg = method_config(method)
    monitor = {"every": 1, "k": 20, "temperature": 0.07, "holdout": 0.2}
    off = pretrain(METHODS_DIR / method, cfg, 0, tmp_path / "off", progress=False)
    on = pretrain(METHODS_DIR / method, cfg, 0, tmp_path / "on", progress=False, monitor=monitor)
    a, b = torch.load(off, weights_only=False), torch.load(on, weights_only=False)
    for part in ("encoder", "method_state"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)
    log_off, log_on = (
        pd.read_csv(tmp_path / "off" / "train_log.csv"),
        pd.read_csv(tmp_path / "on" / "train_log.csv"),
    )
    assert (
        log_off["loss"].tolist() == log_on["loss"].tolist()
        and log_off["lr"].tolist() == log_on["lr"].tolist()
    )
    assert not {"knn_top1", "rankme", "feature_std", *health} & set(log_off.columns)
    assert log_on[health].notna().all().all() and set(health) <= set(log_on.columns)
    assert log_on["knn_top1"].between(0, 1).all() and (log_on["rankme"] >= 1).all()
    assert (log_on["feature_std"] > 0).all() and (log_on["monitor_seconds"] > 0).all()
    assert (log_on["peak_memory_mb"] > 0).all()
    recorded = json.loads((tmp_path / "on" / "run.json").read_text())["meta"]["monitor"]
    assert recorded["settings"] == monitor and recorded["last"]["epoch"] == len(log_on)
    assert recorded["last"]["rankme"] == log_on["rankme"].iloc[-1]
