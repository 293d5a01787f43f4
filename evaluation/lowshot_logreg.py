"""Low-shot logistic regression on frozen features, as the ViT papers report label efficiency: MSN's
1, 2 and 5 images per class and 1 % of the labels (facebookresearch/msn logistic_eval.py), with
DINOv2's choice of the regulariser on held-out training images as a setting
(facebookresearch/dinov2 dinov2/eval/log_regression.py).

As MSN: each feature row centred on its own mean and L2-normalised (cyanure's ``preprocess(...,
centering=True, normalize=True, columns=False)``), train and test alike; a multinomial logistic
regression without intercept, L2 penalty λ / n (n: the low-shot set's size, λ `lambd`), i.e. the
objective (1/n) Σ loss + (λ / 2n) ||W||². scikit-learn's objective C Σ loss + ½ ||W||² is the same up
to a factor at C = 1 / λ, which is what is fitted here (lbfgs), solved to `tol` 1e-8 so that the
result is the objective's minimiser whatever the solver: `solver: cyanure` (MSN's, the `cyanure` extra)
gives the same predictions (a test compares them). MSN stops cyanure at a duality gap of 1e-3 or 300
epochs, which on these small sets leaves a draw's top-1 up to 3 points from the minimiser's.

`regulariser: holdout` instead fits C on the grid 10 ** linspace(*c_powers, c_steps) to a random
`holdout_fraction` of the low-shot set (at least one image), scores each on the rest of it by top-1,
and refits the best C (ties: the smaller) on the whole set, as DINOv2 does on its training split.

Each subset (`shots` images of every class; `fractions` of every class's images, at least one) is drawn
`num_draws` times with fixed seeds (evaluation.common.sample_lowshot, shared with lowshot_svm); every
draw is a metric of its own, with their mean and standard deviation. Deviations: MSN reads fixed
ImageNet subset files (three splits at 1/2/5 images per class, one at 1 %) and logs one number per
file; here the draws are the suite's own, on the dataset's train split, solved to the minimiser, by
scikit-learn unless `solver: cyanure`.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

from .common import (
    ProtocolError,
    check_metrics,
    resolve_settings,
    sample_lowshot,
    seed_for,
    unpack_features,
)

PROTOCOL = "lowshot_logreg"
DEFAULTS: dict = {
    "shots": [1, 2, 5],  # images of every class
    "fractions": [0.01],  # of every class's train images (at least one)
    "num_draws": 3,
    "preprocess": "centre_l2",  # MSN: each row centred, then L2-normalised; "l2": normalised only; "none"
    "regulariser": "fixed",  # MSN's lambd / n; "holdout": DINOv2's choice of C on held-out images
    "lambd": 0.00025,  # MSN's default
    "c_powers": [-6.0, 5.0],  # holdout: C = 10 ** linspace(-6, 5, 45), DINOv2's grid
    "c_steps": 45,
    "holdout_fraction": 0.1,  # holdout: DINOv2 holds out a tenth
    "max_iter": 20000,
    "tol": 1e-8,  # solved to this: the objective's minimiser, which any solver reaches
    "solver": "sklearn",  # or "cyanure" (pip install -e '.[cyanure]'): MSN's solver
}
RULES: dict = {  # over the types of DEFAULTS: what the plan and the job judge the settings by
    "shots": {"items": {"minimum": 1}},
    "fractions": {"items": {"exclusiveMinimum": 0, "exclusiveMaximum": 1}},
    "num_draws": {"minimum": 1},
    "preprocess": {"enum": ["centre_l2", "l2", "none"]},
    "regulariser": {"enum": ["fixed", "holdout"]},
    "lambd": {"exclusiveMinimum": 0},
    "c_powers": {"minItems": 2, "maxItems": 2},
    "c_steps": {"minimum": 1},
    "holdout_fraction": {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "max_iter": {"minimum": 1},
    "tol": {"exclusiveMinimum": 0},
    "solver": {"enum": ["sklearn", "cyanure"]},
}


def preprocess(x: np.ndarray, how: str) -> np.ndarray:
    """MSN's (cyanure's) preprocessing: each row minus its own mean, then divided by its L2 norm."""
    x = x.astype(np.float64)
    if how == "centre_l2":
        x = x - x.mean(axis=1, keepdims=True)
    if how in ("centre_l2", "l2"):
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-10)
    return x


def fixed_c(lambd: float) -> float:
    """scikit-learn's C for MSN's penalty (λ / n) / 2 ||W||² on the mean loss over n images: multiplying
    that objective by n gives Σ loss + (λ / 2) ||W||², which is scikit-learn's divided by C when C = 1 / λ,
    whatever n."""
    return 1.0 / lambd


def fit(
    x: np.ndarray,
    y: np.ndarray,
    c: float,
    max_iter: int,
    counter: dict,
    tol: float = 1e-4,
    solver: str = "sklearn",
):
    """The multinomial logistic regression without intercept minimising C Σ loss + ½ ||W||² (cyanure: its
    mean loss + (λ₁ / 2) ||W||² with λ₁ = 1 / (C n), the same minimiser)."""
    if solver == "cyanure":
        from cyanure.estimators import Classifier

        model = Classifier(
            loss="multiclass-logistic",
            penalty="l2",
            fit_intercept=False,
            lambda_1=1.0 / (c * len(y)),
            tol=tol,
            max_iter=max_iter,
            verbose=False,
            random_state=0,
        )
    else:
        model = LogisticRegression(C=c, fit_intercept=False, max_iter=max_iter, tol=tol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # counted and recorded instead
        model.fit(x, y)
    counter["fits"] += 1
    counter["not_converged"] += int(np.max(getattr(model, "n_iter_", 0)) >= max_iter)
    return model


def top1(model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(model.predict(x) == y))


def choose_c(x: np.ndarray, y: np.ndarray, used: dict, seed: int, counter: dict) -> float:
    """DINOv2's choice: the grid C with the best top-1 on a random held-out part of the training set."""
    order = np.random.default_rng(seed).permutation(len(y))
    held = max(1, int(len(y) * used["holdout_fraction"]))
    val, rest = order[:held], order[held:]
    low, high = used["c_powers"]
    grid = 10.0 ** np.linspace(low, high, int(used["c_steps"]))
    scores = [
        top1(
            fit(x[rest], y[rest], c, int(used["max_iter"]), counter, float(used["tol"]), used["solver"]),
            x[val],
            y[val],
        )
        for c in grid
    ]
    return float(grid[int(np.argmax(scores))])  # the first maximum: the smallest C among ties


def subset_name(size: int | float) -> str:
    """n5 (5 images per class), 1pct (1 % of every class)."""
    return f"n{size}" if isinstance(size, int) else f"{size * 100:g}pct"


def evaluate(features: dict, settings: dict, seed: int) -> tuple[dict[str, float], dict]:
    """top-1 on the test split of a logistic regression fitted to each draw of each low-shot subset."""
    used = resolve_settings(settings, DEFAULTS, PROTOCOL)
    data = unpack_features(features)
    train_labels, test_labels = data["train_labels"], data["test_labels"]
    smallest = int(np.bincount(train_labels, minlength=data["num_classes"]).min())
    if smallest == 0:
        raise ProtocolError("lowshot_logreg: some class has no train image, so no low-shot set exists")
    x, x_test = preprocess(data["train"], used["preprocess"]), preprocess(data["test"], used["preprocess"])
    sizes = [int(k) for k in used["shots"] if int(k) <= smallest] + [float(f) for f in used["fractions"]]
    if not sizes:
        raise ProtocolError(
            f"config key `evaluation.lowshot_logreg.shots` = {used['shots']}: the smallest class has "
            f"{smallest} train images; use shots of at most {smallest}"
        )

    metrics, chosen, counter = {}, {}, {"fits": 0, "not_converged": 0}
    for size in sizes:
        name, accuracies, costs = subset_name(size), [], []
        for d, draw in enumerate(sample_lowshot(train_labels, size, int(used["num_draws"]), seed)):
            xs, ys = x[draw], train_labels[draw]
            if used["regulariser"] == "holdout":
                c = choose_c(xs, ys, used, seed_for(seed, d, len(draw)), counter)
            else:
                c = fixed_c(float(used["lambd"]))
            model = fit(xs, ys, c, int(used["max_iter"]), counter, float(used["tol"]), used["solver"])
            accuracies.append(top1(model, x_test, test_labels))
            costs.append(c)
            metrics[f"top1_{name}_draw{d}"] = accuracies[-1]
        metrics[f"top1_{name}_mean"] = float(np.mean(accuracies))
        metrics[f"top1_{name}_std"] = float(np.std(accuracies))
        chosen[name] = {"images": len(draw), "C": costs}

    used.update(
        subsets=chosen,
        shots_skipped=[int(k) for k in used["shots"] if int(k) > smallest],
        solved_by="sklearn LogisticRegression (lbfgs, multinomial, no intercept)"
        if used["solver"] == "sklearn"
        else "cyanure Classifier (multiclass-logistic, no intercept)",
        fits=counter["fits"],
        fits_not_converged=counter["not_converged"],
    )
    return check_metrics(metrics, PROTOCOL), used
