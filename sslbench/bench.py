"""``sslbench bench``: how fast every stage runs, as ratios measured side by side in one run.

The machine is shared and noisy, so absolute times mean little; each figure is a ratio of two
things measured in the same run, interleaved (A B A B ...) after a warm-up, with medians over
repeats. Sections (``run_bench(sections=...)``):

- step:     each method's training step (the engine's step: loss, backward, optimiser step,
            on_step_end) against a bare loop on the same backbone, batch, views (one concatenated
            forward) and optimiser (loss = mean of the backbone's outputs). Views are made for both but timed
            apart;
            on_epoch_start hooks (PCL's E-step, SeLa's relabelling) are timed apart, per call.
- views:    the view pipeline's images/s against the backbone's forward+backward images/s.
- knn:      faiss ``knn_classify`` against scikit-learn's brute-force cosine kNN: speed-up and
            prediction agreement, on random float32 features.
- kmeans:   faiss ``sslbench.clustering.kmeans`` against scikit-learn's Lloyd ``KMeans``:
            speed-up and the relative inertia gap (both inertias computed by the same code).
- sinkhorn: ``sslbench.clustering.sinkhorn`` with SeLa's settings: seconds and iterations.
- memory:   peak RSS of one pretrain job, its extract job and its evaluate jobs (the real CLI in
            child processes) against the memory each job declares (config ``resources``).
- dag:      the default DAG's wall time from a clean folder (real snakemake) and a no-op rerun.
            Slow (minutes): only when asked.

Every row is written to ``results/bench.csv`` (atomically) with the device, thread count,
git commit and load average it was measured under.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import atomic
from .config import ConfigError, discover_methods, load_config, resolve_method_config, selected_methods

REPO = Path(__file__).resolve().parent.parent
METHODS_DIR = REPO / "methods"
CONFIG_DIR = REPO / "config"

SECTIONS = ("step", "views", "knn", "kmeans", "sinkhorn", "memory", "dag")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s != "dag")  # dag takes minutes: only when asked
COLUMNS = [
    "section",
    "name",
    "value",
    "unit",
    "reference",
    "ratio",
    "ratio_is",
    "target",
    "meets_target",
    "notes",
    "device",
    "torch_threads",
    "omp_wait_policy",
    "malloc",
    "load_1min",
    "git_commit",
    "quick",
]

# Targets of issue 7, on the ratio column.
STEP_TARGET = ("<=", 1.10)  # method step / bare step
VIEWS_TARGET = (">=", 3.0)  # view images/s / model images/s
KNN_SPEEDUP_TARGET = (">=", 10.0)
KNN_AGREEMENT_TARGET = (">=", 1.0)
KMEANS_SPEEDUP_TARGET = (">=", 5.0)
KMEANS_GAP_TARGET = ("<=", 0.01)  # |relative inertia gap|


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of the synthetic sections (``quick`` divides the counts by 10)."""

    knn_train: int = 50_000
    knn_test: int = 10_000
    dim: int = 512
    classes: int = 10
    kmeans_points: int = 50_000
    # sklearn's Lloyd at 50k x 512, k = 1000, 20 iterations: ~20 s on 2 cores.
    kmeans_k: int = 1000
    kmeans_iters: int = 20  # PCL's niter (methods/pcl/config.yaml)
    sinkhorn_points: int = 50_000
    sinkhorn_clusters: int = 3000

    def quick(self) -> Sizes:
        return dataclasses.replace(
            self,
            knn_train=self.knn_train // 10,
            knn_test=self.knn_test // 10,
            kmeans_points=self.kmeans_points // 10,
            kmeans_k=max(2, self.kmeans_k // 10),
            sinkhorn_points=self.sinkhorn_points // 10,
            sinkhorn_clusters=max(2, self.sinkhorn_clusters // 10),
        )


@dataclass(frozen=True)
class Repeats:
    warmup: int = 3  # untimed rounds before each interleaved measurement
    steps: int = 20  # timed A/B rounds of the step and views sections
    solvers: int = 2  # timed A/B rounds of knn and kmeans
    hook_budget_s: float = 30.0  # stop walking a method's epochs once its hooks took this long

    @classmethod
    def for_mode(cls, quick: bool) -> Repeats:
        return cls(warmup=1, steps=5, solvers=1, hook_budget_s=5.0) if quick else cls()


@dataclass
class Bench:
    """What every section needs."""

    config: dict
    config_files: list[Path] | None  # presets merged over config/default.yaml; None: a config dict
    methods: list[str]
    sizes: Sizes
    repeats: Repeats
    device: str
    threads: int
    seed: int
    workdir: Path
    quick: bool


# --------------------------------------------------------------------------------------------
# Entry point


def run_bench(
    out_csv: str | Path = "results/bench.csv",
    sections: Iterable[str] = DEFAULT_SECTIONS,
    quick: bool = False,
    config: str | Path | dict | None = None,
    *,
    threads: int | None = None,
    methods: list[str] | None = None,
    device: str = "auto",
    sizes: Sizes | None = None,
    repeats: Repeats | None = None,
    seed: int = 0,
    verbose: bool = True,
    pin_malloc: bool = False,
) -> pd.DataFrame:
    """Run the benchmark sections, write ``out_csv`` atomically, print a table; return the rows.

    config: None (config/default.yaml), a preset YAML merged over it (as ``--configfile``), or a
    full config dict. methods: a subset of the config's methods (default: all that have a
    method.py). threads: torch, BLAS, OpenMP and faiss threads (default: every usable core).
    pin_malloc: pin glibc's allocation thresholds for the rest of this process (``sslbench bench``
    does; see pin_malloc_thresholds).
    """
    sections = check_sections(sections)
    cfg, config_files = load_bench_config(config)
    threads = int(threads or usable_cores())
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    sizes = sizes or (Sizes().quick() if quick else Sizes())
    malloc = pin_malloc_thresholds() if pin_malloc else "default"
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sslbench-bench-") as tmp, thread_limits(threads):
        bench = Bench(
            cfg,
            config_files,
            bench_methods(cfg, methods),
            sizes,
            repeats or Repeats.for_mode(quick),
            device,
            threads,
            seed,
            Path(tmp),
            quick,
        )
        for section in sections:
            if verbose:
                print(f"[sslbench bench] {section} ...", flush=True)
            rows += SECTION_RUNNERS[section](bench)
    frame = to_frame(rows, bench).assign(malloc=malloc)
    atomic.write_text(out_csv, frame.to_csv(index=False))
    if verbose:
        print(format_table(frame))
        print(f"[sslbench bench] {len(frame)} rows -> {out_csv}")
    return frame


def pin_malloc_thresholds() -> str:
    """glibc raises its mmap threshold only as large blocks get freed, so the first loops timed in a
    process allocate through page-faulting mmap and later ones do not: measured here, the first
    method's bare loop ran ~10% slower than the same loop timed later. Pinning the mmap and trim
    thresholds puts every section on the same footing. Returns what was done (the `malloc` column)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default (not glibc)"
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    if mallopt(m_mmap_threshold, 1 << 30) == 1 and mallopt(m_trim_threshold, 1 << 30) == 1:
        return "glibc mmap and trim thresholds pinned at 1 GiB"
    return "default (mallopt refused)"


def check_sections(sections: Iterable[str]) -> list[str]:
    wanted = [sections] if isinstance(sections, str) else list(sections)
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown or not wanted:
        raise ValueError(
            f"unknown benchmark section(s) {unknown or '(none given)'}; choose from {list(SECTIONS)}"
        )
    return [s for s in SECTIONS if s in wanted]  # a fixed order, each once


def load_bench_config(config: str | Path | dict | None) -> tuple[dict, list[Path] | None]:
    """The config and the preset files merged over config/default.yaml (None for a dict), which
    the dag section hands to snakemake."""
    if isinstance(config, dict):
        return config, None
    presets = [] if config is None else [Path(config)]
    if config is not None and not Path(config).is_file():
        raise FileNotFoundError(
            f"benchmark config {config}: no such file; pass a preset such as config/<preset>.yaml"
        )
    return load_config(CONFIG_DIR, presets), presets


def bench_methods(config: dict, wanted: list[str] | None) -> list[str]:
    runnable = set(discover_methods(METHODS_DIR))
    names = [m for m in selected_methods(config, METHODS_DIR) if m in runnable]
    if wanted is None:
        return names
    unknown = [m for m in wanted if m not in runnable]
    if unknown:
        raise ConfigError(
            f"benchmark methods {unknown}: no such method folder with a method.py under "
            f"{METHODS_DIR}; known: {sorted(runnable)}"
        )
    return list(wanted)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def thread_limits(threads: int):
    """The same thread count for torch, faiss (OpenMP) and every BLAS / OpenMP pool (threadpoolctl)."""
    import faiss
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])


# --------------------------------------------------------------------------------------------
# Rows and the table


def row(
    section: str,
    name: str,
    value,
    unit: str,
    *,
    reference=None,
    ratio=None,
    ratio_is: str = "",
    target: tuple[str, float] | None = None,
    notes: str = "",
) -> dict:
    return {
        "section": section,
        "name": name,
        "value": value,
        "unit": unit,
        "reference": reference,
        "ratio": ratio,
        "ratio_is": ratio_is,
        "target": f"{target[0]} {target[1]:g}" if target else "",
        "meets_target": meets(ratio, target),
        "notes": notes,
        "load_1min": os.getloadavg()[0],
    }


def meets(ratio, target: tuple[str, float] | None) -> bool | None:
    if target is None or ratio is None or not math.isfinite(ratio):
        return None
    op, bound = target
    return bool(ratio <= bound) if op == "<=" else bool(ratio >= bound)


def to_frame(rows: list[dict], bench: Bench) -> pd.DataFrame:
    from .distributed import select_device
    from .provenance import device_name, git_state

    device = device_name(select_device(bench.device))
    frame = pd.DataFrame(rows)
    frame = frame.assign(
        device=device,
        torch_threads=bench.threads,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "unset"),
        git_commit=git_state()["git_commit"],
        quick=bench.quick,
    )
    return frame.reindex(columns=COLUMNS)


def format_table(frame: pd.DataFrame) -> str:
    def number(x):
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            return ""
        return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)

    shown = frame[
        ["section", "name", "value", "unit", "reference", "ratio", "ratio_is", "target", "meets_target"]
    ]
    shown = shown.assign(
        value=shown["value"].map(number),
        reference=shown["reference"].map(number),
        ratio=shown["ratio"].map(number),
        meets_target=shown["meets_target"].map(
            lambda m: "" if m is None or m != m else ("yes" if m else "NO")
        ),
    )
    first = frame.iloc[0] if len(frame) else None
    header = (
        (
            f"device {first['device']}, {first['torch_threads']} threads, OMP_WAIT_POLICY "
            f"{first['omp_wait_policy']}, malloc {first['malloc']}, commit {first['git_commit']}\n"
        )
        if first is not None
        else ""
    )
    return header + shown.to_string(index=False)


# --------------------------------------------------------------------------------------------
# Timing helpers


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def interleaved(a: Callable[[int], object], b: Callable[[int], object], warmup: int, repeats: int):
    """a(i), b(i) alternated (A B A B ...), after ``warmup`` untimed rounds; [(a_i, b_i)] results."""
    for i in range(warmup):
        a(-1 - i), b(-1 - i)
    return [(a(i), b(i)) for i in range(repeats)]


def median(values) -> float:
    return float(statistics.median(values))


# --------------------------------------------------------------------------------------------
# step and views: the engine's own pieces (Trainer.make_views, loss_fn, optimizer, hooks)


class BareLoop:
    """The floor of a training step: the method's backbone architecture, batch, views (concatenated
    into one forward) and optimiser, with the mean of the backbone's outputs as the loss."""

    def __init__(self, trainer):
        from .engine import build_backbone
        from .loop import make_optimizer

        # The method's initial backbone weights, device and fast paths: like against like.
        self.backbone = build_backbone(trainer.cfg, trainer.data, trainer.seed).to(trainer.device)
        trainer.apply_fast_paths(self.backbone, self.backbone)
        self.backbone.train()
        self.optimizer = make_optimizer(list(self.backbone.parameters()), trainer.train_cfg, trainer.device)
        self.trainer = trainer

    def forward_backward(self, views: list[torch.Tensor]) -> torch.Tensor:
        with self.trainer.autocast():  # every view in one forward: the fastest way through the backbone
            loss = self.backbone(torch.cat(views)).float().mean()
        loss.backward()
        return loss

    def step(self, views: list[torch.Tensor]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(views)
        float(loss.detach())  # the engine reads the loss every step (its finiteness check)
        self.optimizer.step()


def build_trainer(name: str, bench: Bench):
    from .engine import Trainer

    cfg = resolve_method_config(bench.config, METHODS_DIR, name)
    return Trainer(
        METHODS_DIR / name,
        cfg,
        bench.seed,
        bench.workdir / "runs" / name,
        device=bench.device,
        progress=False,
    )


def batch(trainer, round_index: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images, indices on the device) of a random batch, the same for both sides of a round.
    Fetched as the engine fetches them (its batch source), outside the timings."""
    generator = torch.Generator().manual_seed(seed * 7_919 + round_index + 1_000)
    idx = torch.randperm(len(trainer.labels), generator=generator)[: trainer.batch_size]
    images = next(iter(trainer.images.iterate([idx])))
    return images, idx.to(trainer.device)


def make_views(
    trainer, images: torch.Tensor, round_index: int, seed: int
) -> tuple[float, list[torch.Tensor]]:
    """(seconds, views): Trainer.make_views with a generator seeded per round (identical for A and B)."""
    generator = torch.Generator().manual_seed(seed * 104_729 + round_index + 2_000)

    def draw():
        views = trainer.make_views(images, generator)
        sync(trainer.device)
        return views

    return timed(draw)


def method_step(trainer, ctx, views: list[torch.Tensor], idx: torch.Tensor) -> None:
    """The engine's own step (Trainer.train_step), views excluded."""
    from .loop import learning_rate

    trainer.train_step(
        views, idx, learning_rate(trainer.train_cfg, trainer.state.step, trainer.steps_per_epoch), ctx
    )
    sync(trainer.device)


def walk_hooks(trainer, budget_s: float) -> list[float]:
    """Seconds of each on_epoch_start call, epoch 0, 1, ... as training calls them, until the run's
    last epoch or until the calls took ``budget_s``. Leaves the method as that epoch finds it
    (PCL with prototypes, SeLa with relabelled targets), so the steps timed next are typical."""
    from .engine import TrainState
    from .method import Method

    if type(trainer.method).on_epoch_start is Method.on_epoch_start:
        return []
    seconds: list[float] = []
    for epoch in range(int(trainer.train_cfg["epochs"])):
        trainer.state = TrainState(epoch=epoch, step=epoch * trainer.steps_per_epoch)
        *_, hook_seconds = trainer.start_epoch()  # as train_epoch starts an epoch
        seconds.append(hook_seconds)
        if sum(seconds) >= budget_s:
            break
    return seconds


def bench_step(bench: Bench) -> list[dict]:
    rows = []
    for name in bench.methods:
        trainer = build_trainer(name, bench)
        if trainer.optimizer is None:
            rows.append(row("step", name, None, "s/step", notes="no trainable parameters: never trained"))
            continue
        hooks = walk_hooks(trainer, bench.repeats.hook_budget_s)
        ctx = trainer.epoch_context()
        bare = BareLoop(trainer)

        def round_of(step):
            """(view seconds, step seconds) of round i: the same batch and views for both loops."""

            def run(i):
                images, idx = batch(trainer, i, bench.seed)
                view_s, views = make_views(trainer, images, i, bench.seed)
                return view_s, timed(lambda: step(views, idx))[0]

            return run

        run_method = round_of(lambda views, idx: method_step(trainer, ctx, views, idx))
        run_bare = round_of(lambda views, idx: (bare.step(views), sync(trainer.device)))
        pairs = interleaved(run_method, run_bare, bench.repeats.warmup, bench.repeats.steps)
        rows += step_rows(name, trainer, pairs, hooks)
    return rows


def step_rows(name: str, trainer, pairs, hooks: list[float]) -> list[dict]:
    method_model = [m[1] for m, _ in pairs]
    bare_model = [b[1] for _, b in pairs]
    with_views = [(m[0] + m[1]) / (b[0] + b[1]) for m, b in pairs]
    images = trainer.batch_size * trainer.method.num_views
    shape = (
        f"batch {trainer.batch_size} x {trainer.method.num_views} view(s), "
        f"{trainer.cfg['backbone']['name']} at {trainer.data.image_size}px, "
        f"{trainer.train_cfg['optimizer']}; "
        f"images/s: method {images / median(method_model):.0f}, bare {images / median(bare_model):.0f}"
    )
    rows = [
        row(
            "step",
            name,
            median(method_model),
            "s/step",
            reference=median(bare_model),
            ratio=median(m / b for m, b in zip(method_model, bare_model)),
            ratio_is="method step / bare step",
            target=STEP_TARGET,
            notes=(
                f"views excluded; ratio: median over {len(pairs)} interleaved rounds of "
                f"each round's ratio (value, reference: plain medians); {shape}"
            ),
        ),
        row(
            "step",
            f"{name} (with views)",
            median(m[0] + m[1] for m, _ in pairs),
            "s/step",
            reference=median(b[0] + b[1] for _, b in pairs),
            ratio=median(with_views),
            ratio_is="(views + method step) / (views + bare step)",
            notes="the engine's whole step",
        ),
    ]
    if hooks:
        step_s = median(method_model)
        epochs = len(hooks)
        share = sum(hooks) / (sum(hooks) + epochs * trainer.steps_per_epoch * step_s)
        rows.append(
            row(
                "step",
                f"{name} on_epoch_start",
                max(hooks),
                "s/call",
                reference=step_s,
                ratio=max(hooks) / step_s,
                ratio_is="slowest hook call / method step",
                notes=(
                    f"{epochs} calls (epochs 0-{epochs - 1}), median {median(hooks):.3g} s; hooks are "
                    f"{share:.1%} of those epochs' time ({trainer.steps_per_epoch} steps/epoch)"
                ),
            )
        )
    return rows


def bench_views(bench: Bench) -> list[dict]:
    rows = []
    for name in bench.methods:
        trainer = build_trainer(name, bench)
        if trainer.optimizer is None:
            continue  # never trained: no views
        bare = BareLoop(trainer)
        latest: dict = {}

        def run_views(i):
            images, _ = batch(trainer, i, bench.seed)
            seconds, latest["views"] = make_views(trainer, images, i, bench.seed)
            return seconds

        def run_model(i):
            bare.backbone.zero_grad(set_to_none=True)
            return timed(lambda: (bare.forward_backward(latest["views"]), sync(trainer.device)))[0]

        pairs = interleaved(run_views, run_model, bench.repeats.warmup, bench.repeats.steps)
        images = trainer.batch_size * trainer.method.num_views
        views_rate = images / median(v for v, _ in pairs)
        model_rate = images / median(m for _, m in pairs)
        rows.append(
            row(
                "views",
                name,
                views_rate,
                "images/s",
                reference=model_rate,
                ratio=median(m / v for v, m in pairs),
                ratio_is="view images/s / model images/s",
                target=VIEWS_TARGET,
                notes=(
                    f"{trainer.method.num_views} view(s) x batch {trainer.batch_size}, augment "
                    f"{trainer.cfg['augment'].get('preset', 'mocov2')}, image {trainer.data.image_size}px; "
                    "model = backbone forward+backward"
                ),
            )
        )
    return rows


# --------------------------------------------------------------------------------------------
# knn, kmeans, sinkhorn: our solvers against scikit-learn on random data


def random_features(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((n, dim), dtype=np.float32)


def exp_vote_weights(cosine_distances: np.ndarray, temperature: float) -> np.ndarray:
    """knn_classify's vote weight exp(similarity / T), from scikit-learn's cosine distance 1 - sim."""
    return np.exp((1.0 - cosine_distances.astype(np.float64)) / temperature)


def bench_knn(bench: Bench) -> list[dict]:
    from sklearn.neighbors import KNeighborsClassifier

    from .results import protocol_module

    knn = protocol_module("knn")
    s = bench.sizes
    rng = np.random.default_rng(bench.seed)
    train, test = random_features(s.knn_train, s.dim, rng), random_features(s.knn_test, s.dim, rng)
    labels = rng.integers(0, s.classes, s.knn_train)
    variants = bench.config.get("evaluation", {}).get("knn", {}).get("variants", knn.DEFAULTS["variants"])
    shape = f"{s.knn_train} train x {s.knn_test} test x {s.dim}-d, {s.classes} classes, random float32"
    rows = []
    for variant in variants:
        k, temperature = int(variant["k"]), float(variant["temperature"])
        out: dict = {}

        def ours(_):
            seconds, scores = timed(lambda: knn.knn_classify(train, labels, test, k, temperature, s.classes))
            out["ours"] = scores.argmax(axis=1)
            return seconds

        def sklearn(_):
            weights = functools.partial(exp_vote_weights, temperature=temperature)
            clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute", weights=weights)
            seconds, out["sklearn"] = timed(lambda: clf.fit(train, labels).predict(test))
            return seconds

        pairs = interleaved(ours, sklearn, 0, bench.repeats.solvers)
        name = f"k{k} T{temperature:g}"
        faiss_s, sklearn_s = median(a for a, _ in pairs), median(b for _, b in pairs)
        agreement = float(np.mean(out["ours"] == out["sklearn"]))
        rows += [
            row(
                "knn",
                f"{name} speed-up",
                faiss_s,
                "s",
                reference=sklearn_s,
                ratio=sklearn_s / faiss_s,
                ratio_is="sklearn brute s / faiss s",
                target=KNN_SPEEDUP_TARGET,
                notes=f"{shape}; fit+predict vs knn_classify+argmax",
            ),
            row(
                "knn",
                f"{name} agreement",
                agreement,
                "fraction",
                ratio=agreement,
                ratio_is="equal predictions / test points",
                target=KNN_AGREEMENT_TARGET,
                notes=f"{int(round((1 - agreement) * s.knn_test))} of {s.knn_test} predictions differ",
            ),
        ]
    floor = gemm_seconds(test, train)
    rows.append(
        row(
            "knn",
            "similarity GEMM floor",
            floor,
            "s",
            reference=rows[0]["value"],
            ratio=rows[0]["value"] / floor,
            ratio_is="faiss knn s / test @ train.T s",
            notes=f"the matmul every exact kNN does, alone: no exact method beats sklearn by more than "
            f"{rows[0]['reference'] / floor:.2g}x here; a ratio near 1: faiss is GEMM-bound",
        )
    )
    return rows


def gemm_seconds(a: np.ndarray, b: np.ndarray) -> float:
    """Best of two: a @ b.T in float32 (numpy's BLAS), the floor of an exact search or assignment."""
    return min(timed(lambda: a @ b.T)[0] for _ in range(2))


def inertia(points: np.ndarray, centroids: np.ndarray) -> float:
    """Sum of squared distances to the nearest centroid: nearest by float32 GEMM, distance in float64."""
    x, c = torch.from_numpy(points), torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    total = 0.0
    for chunk in x.split(8192):
        nearest = (c.square().sum(1) - 2 * chunk @ c.T).argmin(dim=1)  # ||x||^2 is the same for every c
        total += float((chunk.double() - c[nearest].double()).square().sum())
    return total


def bench_kmeans(bench: Bench) -> list[dict]:
    from sklearn.cluster import KMeans

    from .clustering import kmeans

    s = bench.sizes
    points = random_features(s.kmeans_points, s.dim, np.random.default_rng(bench.seed + 1))
    out: dict = {}

    def ours(_):
        seconds, found = timed(
            lambda: kmeans(
                torch.from_numpy(points),
                s.kmeans_k,
                niter=s.kmeans_iters,
                seed=bench.seed,
                max_points_per_centroid=None,  # every point, as scikit-learn
            )
        )
        out["ours"] = found.centroids.numpy()
        return seconds

    def sklearn(_):
        model = KMeans(
            n_clusters=s.kmeans_k,
            init="random",
            n_init=1,
            max_iter=s.kmeans_iters,
            tol=0.0,
            algorithm="lloyd",
            random_state=bench.seed,
        )
        seconds, fitted = timed(lambda: model.fit(points))
        out["sklearn"], out["sklearn_iters"] = fitted.cluster_centers_, fitted.n_iter_
        return seconds

    pairs = interleaved(ours, sklearn, 0, bench.repeats.solvers)
    faiss_s, sklearn_s = median(a for a, _ in pairs), median(b for _, b in pairs)
    ours_inertia, sklearn_inertia = inertia(points, out["ours"]), inertia(points, out["sklearn"])
    gap = (ours_inertia - sklearn_inertia) / sklearn_inertia
    shape = (
        f"{s.kmeans_points} x {s.dim}-d random float32, k {s.kmeans_k}, {s.kmeans_iters} iterations "
        f"(sklearn ran {out['sklearn_iters']}), random init, every point used by both"
    )
    floor = s.kmeans_iters * gemm_seconds(points, out["ours"])
    return [
        row(
            "kmeans",
            f"k{s.kmeans_k} speed-up",
            faiss_s,
            "s",
            reference=sklearn_s,
            ratio=sklearn_s / faiss_s,
            ratio_is="sklearn lloyd s / faiss s",
            target=KMEANS_SPEEDUP_TARGET,
            notes=shape,
        ),
        row(
            "kmeans",
            "assignment GEMM floor",
            floor,
            "s",
            reference=faiss_s,
            ratio=faiss_s / floor,
            ratio_is="faiss s / iterations x points @ centroids.T s",
            notes=f"the matmul of every Lloyd iteration, alone: no exact Lloyd beats sklearn by more than "
            f"{sklearn_s / floor:.2g}x here; a ratio near 1: faiss is GEMM-bound",
        ),
        row(
            "kmeans",
            f"k{s.kmeans_k} inertia gap",
            ours_inertia,
            "sum sq. dist.",
            reference=sklearn_inertia,
            ratio=abs(gap),
            ratio_is="|faiss - sklearn| / sklearn inertia",
            target=KMEANS_GAP_TARGET,
            notes=f"faiss is {gap:+.3%} against sklearn; both inertias by bench.inertia()",
        ),
    ]


def sela_settings(config: dict) -> dict:
    """lam, sinkhorn_tol and sinkhorn_max_iters as SeLa's resolved config sets them."""
    params = (
        resolve_method_config(config, METHODS_DIR, "sela")["params"]
        if (METHODS_DIR / "sela").is_dir()
        else {}
    )
    return {
        "lam": float(params.get("lam", 10)),
        "tol": float(params.get("sinkhorn_tol", 1e-4)),
        "max_iters": int(params.get("sinkhorn_max_iters", 1000)),
    }


def bench_sinkhorn(bench: Bench) -> list[dict]:
    import warnings

    from .clustering import sinkhorn
    from .distributed import select_device

    s, settings = bench.sizes, sela_settings(bench.config)
    generator = torch.Generator().manual_seed(bench.seed + 2)
    logits = torch.randn(s.sinkhorn_points, s.sinkhorn_clusters, generator=generator, dtype=torch.float64)
    probs = torch.softmax(logits.to(select_device(bench.device)), dim=1)  # on the device SeLa trains on
    del logits
    device = probs.device

    def solve(**kw) -> tuple[float, int]:
        seconds, found = timed(lambda: (sinkhorn(probs, settings["lam"], **kw), sync(device))[0])
        return seconds, found.iterations

    # One run: there is no rival to interleave with (at 50k x 3000 the arrays take ~2.4 GB).
    seconds, iterations = solve(tol=settings["tol"], max_iters=settings["max_iters"])
    full_pass = min(timed(lambda: (torch.exp(probs), sync(device)))[0] for _ in range(3))
    # The log-domain form (the fallback) against the matrix-vector form, the same few iterations each
    # on the same probs, both forming their kernel and plan.
    few = min(3, iterations)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # tol 0: they run out of iterations on purpose
        log_seconds, _ = solve(tol=0.0, max_iters=few, domain="log")
        few_seconds, _ = solve(tol=0.0, max_iters=few)
    per_iteration = seconds / iterations
    name = f"{s.sinkhorn_points}x{s.sinkhorn_clusters}"
    notes = (
        f"SeLa's settings: lam {settings['lam']:g}, tol {settings['tol']:g}, max_iters "
        f"{settings['max_iters']}; probs = softmax of standard normal logits, float64, on {device}"
    )
    return [
        row(
            "sinkhorn",
            f"{name} seconds",
            seconds,
            "s",
            reference=full_pass,
            ratio=per_iteration / full_pass,
            ratio_is="one iteration / one exp over the N x K matrix",
            notes=notes + "; seconds include forming the kernel and the plan",
        ),
        row(
            "sinkhorn",
            f"{name} iterations",
            iterations,
            "iterations",
            notes=f"{per_iteration:.3g} s per iteration",
        ),
        row(
            "sinkhorn",
            f"{name} log-domain iteration",
            log_seconds / few,
            "s/iteration",
            reference=few_seconds / few,
            ratio=log_seconds / few_seconds,
            ratio_is="log-domain s / matrix-vector s, the same iterations",
            notes=f"the fallback form (logsumexp) against SeLa's matrix-vector form, {few} iterations each "
            "on the same probs, each including forming its kernel and plan",
        ),
    ]


# --------------------------------------------------------------------------------------------
# memory and dag: the real CLI and the real Snakefile in child processes


# ru_maxrss is a high-water mark that survives exec: a child forked from this (large) process
# starts with our RSS. So each command runs under a small Python wrapper, and the wrapper's own
# child, forked from a fresh interpreter, is the one measured.
PEAK_RSS_WRAPPER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(command: list[str], log: Path, env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB of the command's largest process) of a command that must succeed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    peak_file = log.with_suffix(".maxrss")
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS_WRAPPER, str(peak_file), *command],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = log.read_text()[-2000:]
        raise RuntimeError(
            f"benchmark command failed (exit {done.returncode}): {' '.join(command)}\n"
            f"last lines of {log}:\n{tail}"
        )
    return wall, int(peak_file.read_text()) / 1024  # Linux reports KiB


def child_env() -> dict:
    """PATH with this interpreter's scripts first (the Snakefile's rules call `sslbench`)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def memory_method(methods: list[str]) -> str:
    """PCL when selected (momentum encoder, queue and k-means: the largest), else the first."""
    if not methods:
        raise ConfigError("the memory section needs at least one method")
    return "pcl" if "pcl" in methods else methods[0]


def bench_memory(bench: Bench) -> list[dict]:
    cli = [sys.executable, "-m", "sslbench.cli"]
    threads = ["--threads", str(bench.threads)]
    folder = bench.workdir / "memory"
    env = child_env()
    _, baseline = run_measured(
        [sys.executable, "-c", "import torch, sslbench.engine, evaluation.common"], folder / "import.log", env
    )
    name = memory_method(bench.methods)
    cfg = resolve_method_config(bench.config, METHODS_DIR, name)
    run = folder / name
    jobs = [
        (
            "pretrain",
            name,
            cli
            + [
                "pretrain",
                "--method-dir",
                str(METHODS_DIR / name),
                "--config-json",
                json.dumps(cfg),
                "--seed",
                str(bench.seed),
                "--out",
                str(run),
                "--quiet",
            ],
        )
    ]
    jobs.append(
        (
            "extract",
            name,
            cli + ["extract", "--checkpoint", str(run / "checkpoint.pt"), "--out", str(run / "features.npz")],
        )
    )
    for protocol in bench.config.get("protocols", []):
        settings = json.dumps(bench.config.get("evaluation", {}).get(protocol, {}))
        jobs.append(
            (
                "evaluate",
                f"{name} {protocol}",
                cli
                + [
                    "evaluate",
                    "--protocol",
                    protocol,
                    "--features",
                    str(run / "features.npz"),
                    "--checkpoint",
                    str(run / "checkpoint.pt"),
                    "--settings-json",
                    settings,
                    "--seed",
                    str(bench.seed),
                    "--out",
                    str(run / "eval" / f"{protocol}.json"),
                ],
            )
        )
    rows = []
    for rule, label, command in jobs:
        wall, peak = run_measured(
            command + threads, folder / "logs" / f"{rule}_{label.replace(' ', '_')}.log", env
        )
        declared = float(bench.config.get("resources", {}).get(rule, {}).get("mem_mb", 4000))
        rows.append(
            row(
                "memory",
                f"{rule} {label}",
                peak,
                "MiB",
                reference=declared,
                ratio=peak / declared,
                ratio_is="peak RSS / declared resources.mem_mb",
                target=("<=", 1.0),
                notes=f"wall {wall:.1f} s; a bare `import torch, sslbench` peaks at {baseline:.0f} MiB",
            )
        )
    return rows


SNAKEMAKE_BENCHMARK_HEADER = re.compile(r"^s\th:m:s\t.*max_rss")


def snakemake_benchmarks(folder: Path) -> pd.DataFrame:
    """Every file a `benchmark:` directive wrote under ``folder`` (its first line is Snakemake's header)."""
    frames = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in (".tsv", ".txt") and path.stat().st_size < 1_000_000:
            with open(path, errors="replace") as f:
                if SNAKEMAKE_BENCHMARK_HEADER.match(f.readline()):
                    frames.append(pd.read_csv(path, sep="\t").assign(file=str(path.relative_to(folder))))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def snakemake_command(bench: Bench, directory: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(directory),
        "--cores",
        "all",
        "--quiet",
    ]
    files = bench.config_files
    if (
        files is None
    ):  # a config dict: hand it to snakemake as a file (merged over default.yaml, which it covers)
        import yaml

        files = [bench.workdir / "bench_config.yaml"]
        files[0].write_text(yaml.safe_dump(bench.config))
    return command + (["--configfile", *map(str, files)] if files else [])


def bench_dag(bench: Bench) -> list[dict]:
    directory = bench.workdir / "dag"
    directory.mkdir(parents=True, exist_ok=True)
    command = snakemake_command(bench, directory)
    env = child_env()
    full_s, largest = run_measured(command, bench.workdir / "logs" / "dag_full.log", env)
    noop_s, _ = run_measured(command, bench.workdir / "logs" / "dag_noop.log", env)
    jobs = snakemake_benchmarks(directory)
    rows = [
        row("dag", "full run", full_s, "s", notes=f"{' '.join(command[1:3])} ... from a clean folder"),
        row(
            "dag",
            "no-op rerun",
            noop_s,
            "s",
            reference=full_s,
            ratio=noop_s / full_s,
            ratio_is="no-op rerun s / full run s",
            notes="nothing to do: planning cost only",
        ),
        row(
            "dag",
            "largest process",
            largest,
            "MiB",
            notes="peak RSS of the largest process in the run (getrusage of snakemake's process tree)",
        ),
    ]
    if jobs.empty:
        rows.append(
            row(
                "dag",
                "peak memory per job",
                None,
                "MiB",
                notes="not measured: the Snakefile has no `benchmark:` directives (add "
                "`benchmark: RUN + '/benchmarks/<rule>.tsv'` to pretrain, extract, evaluate)",
            )
        )
    else:
        for _, job in jobs.iterrows():
            rows.append(
                row(
                    "dag",
                    f"job {job['file']}",
                    float(job["max_rss"]),
                    "MiB",
                    notes=f"wall {float(job['s']):.1f} s (Snakemake benchmark file)",
                )
            )
    shutil.rmtree(directory, ignore_errors=True)
    return rows


SECTION_RUNNERS: dict[str, Callable[[Bench], list[dict]]] = {
    "step": bench_step,
    "views": bench_views,
    "knn": bench_knn,
    "kmeans": bench_kmeans,
    "sinkhorn": bench_sinkhorn,
    "memory": bench_memory,
    "dag": bench_dag,
}
