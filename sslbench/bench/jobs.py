"""The memory and dag sections: the real Snakefile and snakemake in child processes, so nothing
here retypes the Snakefile's command lines. memory: the jobs snakemake plans for one (method, seed),
each run alone under a wrapper that reads its exact peak RSS (snakemake's own `benchmark:` files
sample memory every 0.5 s, then every 30 s, and miss short peaks and short jobs). dag: the whole
DAG run by snakemake, with each job's `benchmark:` file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from sslbench.bench.core import REPO, Bench, row
from sslbench.errors import ConfigError

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


def run_measured(
    command: list[str], log: Path, env: dict | None = None, cwd: Path = REPO
) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB of the command's largest process) of a command that must succeed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    peak_file = log.with_suffix(".maxrss")
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS_WRAPPER, str(peak_file), *command],
            cwd=cwd,
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


@dataclass
class PlannedJob:
    rule: str
    wildcards: dict[str, str]
    files: list[str]  # its output, log and benchmark files
    shell: str  # its command, as snakemake renders it from the Snakefile


def planned_jobs(bench: Bench, directory: Path, *presets: Path, target: str) -> list[PlannedJob]:
    """The jobs snakemake plans for ``target`` in ``directory`` (a dry run of the real Snakefile)."""
    command = [a for a in snakemake_command(bench, directory, *presets, target=target) if a != "--quiet"]
    done = subprocess.run(
        [*command, "--dry-run", "--printshellcmds"], cwd=REPO, env=child_env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"snakemake could not plan {target}:\n{(done.stdout + done.stderr)[-2000:]}")
    jobs, block = [], {}
    for line in done.stdout.splitlines():
        if found := re.match(r"^(?:local)?rule (\w+):$", line):
            block = {"rule": found[1], "wildcards": {}, "files": []}
        elif found := re.match(r"^\s+(?:output|log|benchmark): (.+)$", line):
            # a flagged file is printed with its flags: "path (update)"
            block["files"] += [re.sub(r" \([\w, ]+\)$", "", f) for f in found[1].split(", ")]
        elif found := re.match(r"^\s+wildcards: (.+)$", line):
            block["wildcards"] = dict(pair.split("=", 1) for pair in found[1].split(", "))
        elif line.startswith("Shell command: "):
            jobs.append(PlannedJob(**block, shell=line.removeprefix("Shell command: ")))
    return jobs


def bench_memory(bench: Bench) -> list[dict]:
    """Peak memory of one (method, seed)'s jobs, pretrain, extract (of each transfer target) and every
    protocol on every target, each run alone as snakemake plans it, against what each rule declares
    (config ``resources``)."""
    env = child_env()
    _, baseline = run_measured(
        [sys.executable, "-c", "import torch, sslbench.pretrain.trainer, evaluation.common"],
        bench.workdir / "logs" / "import.log",
        env,
    )
    name = memory_method(bench.methods)
    preset = bench.workdir / "memory.yaml"
    preset.write_text(yaml.safe_dump({"methods": [name], "seeds": [bench.seed]}))
    directory = bench.workdir / "memory"
    planned = planned_jobs(bench, directory, preset, target="results/table.csv")
    # In the order they must run: the prepared datasets (the others' inputs), the pretrain job (it also
    # writes the pretraining set's features), the extraction of each other evaluation target, each
    # protocol on each target.
    order = {"prepare": 0, "pretrain": 1, "extract": 2, "evaluate": 3}
    jobs = sorted(
        (job for job in planned if job.rule in order),
        key=lambda job: (order[job.rule], job.wildcards.get("target", ""), job.wildcards.get("protocol", "")),
    )
    rows = []
    for job in jobs:
        rule, target, protocol = job.rule, job.wildcards.get("target"), job.wildcards.get("protocol")
        for file in job.files:  # as snakemake does before it runs a job
            (directory / file).parent.mkdir(parents=True, exist_ok=True)
        label = " ".join(filter(None, (rule, name, target, protocol, job.wildcards.get("dataset"))))
        wall, peak = run_measured(
            ["bash", "-c", job.shell],
            bench.workdir / "logs" / f"{label.replace(' ', '_')}.log",
            env,
            directory,
        )
        if rule == "prepare":  # a local rule: no resources declared to measure it against
            continue
        declared = float(bench.config.get("resources", {}).get(rule, {}).get("mem_mb", 4000))
        rows.append(
            row(
                "memory",
                label,
                peak,
                "MiB",
                reference=declared,
                ratio=peak / declared,
                ratio_is="peak RSS / declared resources.mem_mb",
                target=("<=", 1.0),
                notes=f"wall {wall:.1f} s; the job's command as snakemake plans it, run alone; a bare "
                f"`import torch, sslbench` peaks at {baseline:.0f} MiB",
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


def stage_costs(jobs: pd.DataFrame) -> pd.DataFrame:
    """Jobs' wall seconds summed per stage, largest first, from ``snakemake_benchmarks`` of a results
    folder (files ``<pretrain>/<method>/seed<s>/benchmarks/<job>.tsv``): ``pretrain``,
    ``extract_<target>``, a protocol on the run's own dataset by its name, on another as
    ``<target>_<protocol>``."""

    def stage(file: str) -> str:
        path = Path(file)
        if path.parts[-3:-2] == ("prepared",):  # prepared/benchmarks/<dataset>.tsv: one per dataset
            return "prepare"
        return path.stem.removeprefix(f"{path.parts[-5]}_")  # parts[-5]: the pretraining dataset

    grouped = jobs.assign(stage=jobs["file"].map(stage)).groupby("stage")["s"]
    stages = grouped.agg(["count", "sum", "median", "max"])
    stages = stages.rename(columns={"count": "jobs", "sum": "wall_s", "median": "median_s", "max": "max_s"})
    stages = stages.sort_values("wall_s", ascending=False)
    return stages.assign(
        share=stages["wall_s"] / stages["wall_s"].sum(), per_job_s=stages["wall_s"] / stages["jobs"]
    )


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


def stage_rows(folder: Path) -> list[dict]:
    """The ``stage ...`` rows of a run's results folder: per stage, the jobs' summed wall time and
    the median and slowest job (each job's start-up included), from its Snakemake benchmark files."""
    jobs = snakemake_benchmarks(folder)
    if jobs.empty:
        raise ConfigError(
            f"{folder}: no Snakemake benchmark files (results/<dataset>/<method>/seed<s>/benchmarks/*.tsv) "
            "under it; give the folder a DAG ran in (the one holding results/)"
        )
    rows = []
    for stage, cost in stage_costs(jobs).iterrows():
        how = f"{int(cost['jobs'])} jobs (Snakemake benchmark files; jobs ran side by side, one per core)"
        rows += [
            row(
                "dag",
                f"stage {stage}",
                float(cost["wall_s"]),
                "s",
                notes=f"{how}: summed wall time, {cost['share']:.0%} of all jobs'",
            ),
            row("dag", f"stage {stage} median job", float(cost["median_s"]), "s", notes=how),
            row("dag", f"stage {stage} slowest job", float(cost["max_s"]), "s", notes=how),
        ]
    return rows


def bench_dag(bench: Bench) -> list[dict]:
    """The default DAG run from a clean folder, then a no-op rerun; with ``bench.dag_results``, only
    the stage rows of a run already made there (a timed run of benchmarks/RESULTS.md, say)."""
    if bench.dag_results is not None:
        return stage_rows(Path(bench.dag_results))
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
        *stage_rows(directory),
    ]
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
