"""Low-shot linear SVMs on frozen features: the VOC07 / Places205 low-shot protocol of
Goyal et al. 2019 (facebookresearch/fair_self_supervision_benchmark, VISSL's svm_low_shot).

As there: features L2-normalised (norm + 1e-5); one-vs-rest sklearn LinearSVC per class with
squared hinge, L2 penalty, tol 1e-4, max_iter 2000, class_weight {+1: 2, -1: 1};
k labelled train samples per class for each k in `ks`, `num_draws` independent draws per k;
liblinear's dual solver where samples <= dims (VISSL's case), else
its primal solver (same objective, far faster there at large C: sklearn's dual="auto");
mean / std / min / max over draws of the test mAP (the mean of per-class AP of the decision
scores). Single-label: k samples of every class, AP from sklearn's average_precision_score,
plus top-1 of the argmax over class scores. Multilabel (VOC07, targets [N, C]): for each
class its own k positives and (C - 1) * k negatives, as VISSL samples them; difficult
samples never train and are left out of that class's AP, computed as VISSL does (area under
the interpolated, monotone precision-recall curve).

Deviation, on purpose: VISSL / fair_ssl train every cost and report the cost whose mean
*test* AP is best. Here one cost per draw is chosen on the low-shot training set alone, by
stratified cross-validation (folds = min(cv_folds, k), one positive per class per fold at
k = 2) maximising the class-mean AP; ties go to the smaller cost. At k = 1 no split leaves a
positive on both sides, so the fixed `fallback_cost` is used and recorded.
"""
from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import average_precision_score
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import LinearSVC

from .common import check_metrics, resolve_settings, seed_for, to_numpy, unpack_features

PROTOCOL = "lowshot_svm"
DEFAULTS: dict = {
    "ks": [1, 2, 4, 8, 16, 32, 64, 96],
    "num_draws": 5,
    "cost_grid": [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0],
    "cv_folds": 3,
    "pos_weight": 2.0,        # class_weight {+1: pos_weight, -1: 1}
    "fallback_cost": 1.0,     # k = 1: cross-validation impossible
}
SVM_TOL, SVM_MAX_ITER = 1e-4, 2000          # fair_ssl / VISSL values
# VOC07 multilabel targets, the VOC devkit's codes: present, absent, difficult.
POSITIVE, NEGATIVE, DIFFICULT = 1, -1, 0


# ---------------------------------------------------------------- sampling
def sample_lowshot(labels, k: int, num_draws: int, seed: int) -> list[np.ndarray]:
    """`num_draws` index arrays into `labels`, each holding exactly k indices of every class
    (classes in ascending order, without replacement). Same seed and k: same draws."""
    labels = to_numpy(labels, "labels")
    if labels.ndim != 1:
        raise ValueError("sample_lowshot takes a vector of class ids; use sample_lowshot_multilabel for [N, C]")
    members = [np.flatnonzero(labels == cls) for cls in np.unique(labels)]
    smallest = min(len(m) for m in members)
    if not 1 <= k <= smallest:
        raise ValueError(f"sample_lowshot: k={k}, but the smallest class has {smallest} samples")
    rng = np.random.default_rng(seed_for(seed, k))
    return [np.concatenate([rng.choice(m, size=k, replace=False) for m in members])
            for _ in range(num_draws)]


def sample_lowshot_multilabel(targets, k: int, num_draws: int, seed: int) -> list[list[np.ndarray]]:
    """For each draw and class: indices of k positives then (C - 1) * k negatives of that class
    (difficult samples never drawn), as VISSL's VOC07 low-shot sampler."""
    targets = to_numpy(targets, "targets")
    num_classes = targets.shape[1]
    positives = [np.flatnonzero(targets[:, c] == POSITIVE) for c in range(num_classes)]
    negatives = [np.flatnonzero(targets[:, c] == NEGATIVE) for c in range(num_classes)]
    n_neg = (num_classes - 1) * k
    if k < 1 or k > min(map(len, positives)) or n_neg > min(map(len, negatives)):
        raise ValueError(f"sample_lowshot_multilabel: k={k} needs {k} positives and {n_neg} negatives "
                         "in every class")
    rng = np.random.default_rng(seed_for(seed, k))
    return [[np.concatenate([rng.choice(positives[c], size=k, replace=False),
                             rng.choice(negatives[c], size=n_neg, replace=False)])
             for c in range(num_classes)]
            for _ in range(num_draws)]


def max_feasible_k(train_labels: np.ndarray) -> int:
    """The largest k every class can supply (multilabel: k positives and (C-1)k negatives)."""
    if train_labels.ndim == 1:
        return int(np.bincount(train_labels).min())
    num_classes = train_labels.shape[1]
    positives = (train_labels == POSITIVE).sum(0).min()
    negatives = (train_labels == NEGATIVE).sum(0).min()
    return int(min(positives, negatives // (num_classes - 1)))


# ---------------------------------------------------------------- SVMs and AP
def l2_normalise_like_vissl(x: np.ndarray) -> np.ndarray:
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5)


def fit_svm(x: np.ndarray, y: np.ndarray, cost: float, pos_weight: float, seed: int) -> LinearSVC:
    svm = LinearSVC(C=cost, loss="squared_hinge", penalty="l2", dual=False, tol=SVM_TOL,
                    max_iter=SVM_MAX_ITER, class_weight={1: pos_weight, -1: 1.0},
                    intercept_scaling=1.0, random_state=seed)
    return svm.fit(x, y)


def voc_ap(is_positive: np.ndarray, scores: np.ndarray) -> float:
    """VOC AP as VISSL computes it: area under the precision-recall curve after making
    precision monotone (each precision replaced by the best precision at higher recall)."""
    order = np.argsort(-scores, kind="stable")
    hits = np.asarray(is_positive, dtype=np.float64)[order]
    true_pos = np.cumsum(hits)
    precision = true_pos / np.arange(1, len(hits) + 1)
    recall = true_pos / hits.sum()
    precision = np.concatenate([[0.0], precision, [0.0]])
    recall = np.concatenate([[0.0], recall, [1.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.flatnonzero(recall[1:] != recall[:-1]) + 1
    return float(np.sum((recall[steps] - recall[steps - 1]) * precision[steps]))


# ---------------------------------------------------------------- one draw
class Task:
    """One binary one-vs-rest problem: train rows of the normalised train matrix, targets +-1."""

    def __init__(self, rows: np.ndarray, y: np.ndarray):
        self.rows, self.y = rows, y


def draw_tasks(train_labels: np.ndarray, draw) -> list[Task]:
    if train_labels.ndim == 1:  # one shared low-shot set; class c against the rest
        sub = train_labels[draw]
        return [Task(draw, np.where(sub == c, 1, -1)) for c in np.unique(train_labels)]
    return [Task(rows, np.where(train_labels[rows, c] == POSITIVE, 1, -1)) for c, rows in enumerate(draw)]


def fit_svm_counted(x: np.ndarray, y: np.ndarray, cost: float, used: dict, seed: int, counter: dict):
    svm = fit_svm(x, y, cost, used["pos_weight"], seed)
    counter["fits"] += 1
    counter["not_converged"] += int(svm.n_iter_ >= SVM_MAX_ITER)
    return svm


def choose_cost(x: np.ndarray, tasks: list[Task], k: int, used: dict, seed: int,
                counter: dict) -> tuple[float, str]:
    """The grid cost with the best class-mean cross-validated AP on the low-shot set."""
    folds = min(int(used["cv_folds"]), k)
    if folds < 2:
        return float(used["fallback_cost"]), "fallback"
    cv_ap = np.zeros(len(used["cost_grid"]))
    for t, task in enumerate(tasks):
        splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed_for(seed, t))
        for fit, val in splitter.split(task.rows, task.y):
            for i, cost in enumerate(used["cost_grid"]):
                svm = fit_svm_counted(x[task.rows[fit]], task.y[fit], cost, used, seed, counter)
                cv_ap[i] += average_precision_score(task.y[val] == 1, svm.decision_function(x[task.rows[val]]))
    best = int(np.argmax(cv_ap))  # first maximum: the smallest cost among ties
    return float(used["cost_grid"][best]), "cv"


def test_scores(x: np.ndarray, tasks: list[Task], x_test: np.ndarray, cost: float, used: dict, seed: int,
                counter: dict) -> np.ndarray:
    """Decision scores [n_test, n_classes] of each class's SVM trained at `cost`."""
    return np.stack([fit_svm_counted(x[task.rows], task.y, cost, used, seed, counter).decision_function(x_test)
                     for task in tasks], axis=1)


def mean_ap(scores: np.ndarray, test_labels: np.ndarray) -> float:
    """Mean over classes of test AP (classes with no test positive are left out)."""
    aps = []
    for c in range(scores.shape[1]):
        if test_labels.ndim == 1:
            positive = test_labels == c
            if positive.any():
                aps.append(average_precision_score(positive, scores[:, c]))
        else:
            keep = test_labels[:, c] != DIFFICULT
            positive = test_labels[keep, c] == POSITIVE
            if positive.any():
                aps.append(voc_ap(positive, scores[keep, c]))
    return float(np.mean(aps))


# ---------------------------------------------------------------- protocol
def evaluate(features: dict, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    used["ks"] = sorted(int(k) for k in used["ks"])
    used["cost_grid"] = sorted(float(c) for c in used["cost_grid"])
    if not used["ks"] or not used["cost_grid"] or int(used["num_draws"]) < 1 or int(used["cv_folds"]) < 2:
        raise ValueError("lowshot_svm: ks and cost_grid must be non-empty, num_draws >= 1, cv_folds >= 2")
    data = unpack_features(features, allow_multilabel=True)
    train_labels, test_labels = data["train_labels"], data["test_labels"]
    multilabel = train_labels.ndim == 2
    if multilabel and (train_labels == DIFFICULT).sum() > (train_labels == NEGATIVE).sum():
        raise ValueError(
            "lowshot_svm: multilabel train targets hold more 0 (difficult) than -1 (absent) entries; "
            "expected the VOC devkit codes 1 present / -1 absent / 0 difficult (VISSL's files use "
            "0 absent / -1 difficult: convert them)"
        )
    if not multilabel and np.bincount(train_labels, minlength=data["num_classes"]).min() == 0:
        raise ValueError("lowshot_svm: some class has no train sample, so no k-shot set exists")
    x = l2_normalise_like_vissl(data["train"].astype(np.float64))
    x_test = l2_normalise_like_vissl(data["test"].astype(np.float64))
    sampler = sample_lowshot_multilabel if multilabel else sample_lowshot

    largest = max_feasible_k(train_labels)
    ks_run = [k for k in used["ks"] if k <= largest]
    if not ks_run:
        raise ValueError(f"lowshot_svm: no k in {used['ks']} fits; the smallest class allows k <= {largest}")

    def run_draw(k: int, d: int, draw) -> dict:
        """Choose the cost, fit, and score one low-shot draw (independent of every other draw)."""
        draw_seed, counter = seed_for(seed, k, d), {"fits": 0, "not_converged": 0}
        tasks = draw_tasks(train_labels, draw)
        cost, rule = choose_cost(x, tasks, k, used, draw_seed, counter)
        scores = test_scores(x, tasks, x_test, cost, used, draw_seed, counter)
        top1 = None if multilabel else float(np.mean(scores.argmax(1) == test_labels))
        return {"k": k, "cost": cost, "rule": rule, "map": mean_ap(scores, test_labels), "top1": top1, **counter}

    jobs = [(k, d, draw) for k in ks_run
            for d, draw in enumerate(sampler(train_labels, k, int(used["num_draws"]), seed))]
    # liblinear releases the GIL: draws run in threads, as many as torch may use (the CLI's --threads).
    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        warnings.simplefilter("ignore", ConvergenceWarning)  # counted and recorded instead
        runs = list(pool.map(lambda job: run_draw(*job), jobs))

    metrics, chosen = {}, {}
    for k in ks_run:
        mine = [r for r in runs if r["k"] == k]
        maps = np.array([r["map"] for r in mine])
        metrics.update({f"map_k{k}_mean": maps.mean(), f"map_k{k}_std": maps.std(),
                        f"map_k{k}_min": maps.min(), f"map_k{k}_max": maps.max()})
        if not multilabel:
            metrics[f"top1_k{k}_mean"] = float(np.mean([r["top1"] for r in mine]))
        chosen[f"k{k}"] = [{"cost": r["cost"], "rule": r["rule"]} for r in mine]
    counter = {name: sum(r[name] for r in runs) for name in ("fits", "not_converged")}

    used.update(
        ks_run=ks_run, ks_skipped=[k for k in used["ks"] if k > largest], chosen_costs=chosen,
        labels="multilabel (VOC codes 1/-1/0)" if multilabel else "single-label",
        cost_rule=f"stratified {used['cv_folds']}-fold CV on the low-shot set (folds = min(cv_folds, k)), "
                  "best class-mean AP, ties -> smaller cost; k = 1: fallback_cost",
        ap="VOC interpolated (VISSL)" if multilabel else "sklearn average_precision_score",
        svm={"loss": "squared_hinge", "penalty": "l2", "dual": "auto (primal when samples > dims)", "tol": SVM_TOL,
             "max_iter": SVM_MAX_ITER, "intercept_scaling": 1.0, "features": "L2-normalised (norm + 1e-5)"},
        svm_fits=counter["fits"], svm_fits_not_converged=counter["not_converged"],
    )
    return check_metrics(metrics, PROTOCOL), used
