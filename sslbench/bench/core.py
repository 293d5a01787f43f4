"""What every benchmark section shares: its settings (sizes, repeats, the config), the rows and
the table they make, and the timing helpers (interleaved rounds, medians)."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from sslbench.errors import ConfigError
from sslbench.plan.runs import discover_methods, selected_methods
from sslbench.plan.settings import load_config

REPO = Path(__file__).resolve().parents[2]
METHODS_DIR = REPO / "methods"
CONFIG_DIR = REPO / "config"

SECTIONS = ("step", "split_bn", "views", "knn", "kmeans", "sinkhorn", "memory", "dag")
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
    dag_results: Path | None = None  # dag: tabulate the run already made in this folder instead


def pin_malloc_thresholds() -> str:
    """glibc raises its mmap threshold only as large blocks get freed, so the first loops timed in a
    process allocate through page-faulting mmap (and run slower) and later ones do not. Pinning the
    mmap and trim thresholds puts every section on the same footing. Returns what was done (the
    `malloc` column)."""
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
        raise ConfigError(
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
    from sslbench.distributed import select_device
    from sslbench.provenance import device_name, git_state

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
