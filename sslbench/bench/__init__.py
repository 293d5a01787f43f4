"""``sslbench bench``: how fast every stage runs, as ratios measured side by side in one run.

The machine is shared and noisy, so absolute times mean little; each figure is a ratio of two
things measured in the same run, interleaved (A B A B ...) after a warm-up, with medians over
repeats. Sections (``run_bench(sections=...)``):

- step:     each method's training step (the engine's step: loss, backward, optimiser step,
            on_step_end) against a bare loop on the same backbone, batch, views (one concatenated
            forward) and optimiser (loss = mean of the backbone's outputs). Views are made for both but timed
            apart;
            on_epoch_start hooks (PCL's E-step, SeLa's relabelling) are timed apart, per call.
- split_bn: MoCo's step with split batch norm (``bn_splits`` 8, the CIFAR demo's, and the
            config's own, each that divides the batch) against the same step with ``bn_splits`` 1,
            and the backbone's batch-norm layers alone, split against plain.
- views:    the view pipeline's images/s against the backbone's forward+backward images/s.
- knn:      faiss ``knn_classify`` against scikit-learn's brute-force cosine kNN: speed-up and
            prediction agreement, on random float32 features.
- kmeans:   faiss ``sslbench.kit.clustering.kmeans`` against scikit-learn's Lloyd ``KMeans``:
            speed-up and the relative inertia gap (both inertias computed by the same code).
- sinkhorn: ``sslbench.kit.clustering.sinkhorn`` with SeLa's settings: seconds and iterations.
- memory:   peak RSS of one (method, seed)'s jobs, pretrain, extract and every protocol, as
            snakemake plans them from the Snakefile, each run alone in a child process, against
            the memory each job declares (config ``resources``).
- dag:      the default DAG's wall time from a clean folder (real snakemake), a no-op rerun and,
            per stage, the jobs' summed, median and slowest wall time. Slow (minutes): only when
            asked. With ``dag_results`` (a folder a DAG ran in), only that run's stage rows.

Every row is written to ``results/bench.csv`` (atomically) with the device, thread count,
git commit and load average it was measured under.

Modules: ``core`` (settings, rows, the table, timing helpers), ``step`` (step, split_bn, views), ``solvers``
(knn, kmeans, sinkhorn), ``jobs`` (memory, dag: snakemake in child processes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from sslbench import atomic
from sslbench.bench.core import (
    COLUMNS,
    DEFAULT_SECTIONS,
    SECTIONS,
    Bench,
    Repeats,
    Sizes,
    bench_methods,
    check_sections,
    format_table,
    load_bench_config,
    pin_malloc_thresholds,
    thread_limits,
    to_frame,
    usable_cores,
)
from sslbench.bench.jobs import bench_dag, bench_memory
from sslbench.bench.solvers import bench_kmeans, bench_knn, bench_sinkhorn
from sslbench.bench.step import bench_split_bn, bench_step, bench_views
from sslbench.errors import ConfigError

__all__ = ["COLUMNS", "DEFAULT_SECTIONS", "SECTIONS", "Repeats", "Sizes", "run_bench"]

SECTION_RUNNERS: dict[str, Callable[[Bench], list[dict]]] = {
    "step": bench_step,
    "split_bn": bench_split_bn,
    "views": bench_views,
    "knn": bench_knn,
    "kmeans": bench_kmeans,
    "sinkhorn": bench_sinkhorn,
    "memory": bench_memory,
    "dag": bench_dag,
}


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
    dag_results: str | Path | None = None,
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
        raise ConfigError(f"--threads must be >= 1, got {threads}")
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
            Path(dag_results) if dag_results is not None else None,
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
