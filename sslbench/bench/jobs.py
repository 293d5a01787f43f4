"""The memory and dag sections: the real Snakefile, run by snakemake in child processes. A job's
peak memory and wall time come from the `benchmark:` file snakemake writes for it, so nothing here
retypes the Snakefile's command lines."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from ..config import ConfigError
from .core import REPO, Bench, row

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
    """Peak memory of one (method, seed)'s real jobs (snakemake on the Snakefile, to results/table.csv)
    against what each rule declares, from the `benchmark:` file of each job."""
    env = child_env()
    _, baseline = run_measured(
        [sys.executable, "-c", "import torch, sslbench.engine, evaluation.common"],
        bench.workdir / "logs" / "import.log",
        env,
    )
    name = memory_method(bench.methods)
    preset = bench.workdir / "memory.yaml"
    preset.write_text(yaml.safe_dump({"methods": [name], "seeds": [bench.seed]}))
    directory = bench.workdir / "memory"
    command = snakemake_command(bench, directory, preset, target="results/table.csv")
    run_measured(command, bench.workdir / "logs" / "memory.log", env)
    jobs = {rule_of(Path(job["file"]).stem): job for _, job in snakemake_benchmarks(directory).iterrows()}
    rows = []
    for rule, protocol in [("pretrain", None), ("extract", None)] + [
        ("evaluate", p) for p in bench.config.get("protocols", [])
    ]:
        job = jobs[rule, protocol]
        declared = float(bench.config.get("resources", {}).get(rule, {}).get("mem_mb", 4000))
        peak = float(job["max_rss"])
        rows.append(
            row(
                "memory",
                " ".join(filter(None, (rule, name, protocol))),
                peak,
                "MiB",
                reference=declared,
                ratio=peak / declared,
                ratio_is="peak RSS / declared resources.mem_mb",
                target=("<=", 1.0),
                notes=f"wall {float(job['s']):.1f} s; snakemake samples a job's memory every 0.5 s for 15 s, "
                f"then every 30 s (a shorter peak is missed); a bare `import torch, sslbench` peaks at "
                f"{baseline:.0f} MiB",
            )
        )
    return rows


def rule_of(benchmark_stem: str) -> tuple[str, str | None]:
    """(rule, protocol) of a job's benchmark file: the Snakefile writes benchmarks/<rule>.tsv, and
    benchmarks/<protocol>.tsv for the evaluate rule."""
    if benchmark_stem in ("pretrain", "extract"):
        return benchmark_stem, None
    return "evaluate", benchmark_stem


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


def snakemake_command(bench: Bench, directory: Path, *presets: Path, target: str | None = None) -> list[str]:
    """snakemake on the repository's Snakefile in ``directory``, with the benchmark's config (and
    ``presets`` over it); the default target (the report) unless ``target`` is given."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        *([target] if target else []),  # before the options: --quiet takes optional values
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
    ):  # a config dict: hand it to snakemake as a file (merged over default.yaml: it covers it)
        files = [bench.workdir / "bench_config.yaml"]
        files[0].write_text(yaml.safe_dump(bench.config))
    files = [*files, *presets]
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
