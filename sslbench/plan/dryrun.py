"""What the plan would run, as Snakemake itself judges it: the jobs of ``snakemake --summary`` whose
outputs it would write, each with the reason Snakemake gives. ``sslbench status`` prints them beside
what the results' own code records say, so that it never claims more or less than the plan does."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from sslbench.errors import SslbenchError

# Snakemake's summary status of an output -> why its job runs, in words a reader acts on
REASONS = {
    "missing": "missing",
    "updated input files": "an input file is newer than it (file dates: copy results/ with `rsync -a`)",
    "params changed": "its settings or its method folder's code changed",
    "set of input files changed": "the set of its input files changed",
    "rule implementation changed": "the rule that writes it changed",
    "ok": "an input is rewritten first",
}


RESULT_RULES = {"prepare", "pretrain", "import_released", "extract", "evaluate"}  # the rest make tables


class PlannedJob(NamedTuple):
    rule: str
    output: str  # the job's first output file in the summary
    why: str


def planned_jobs(config_files: list[str], cwd: str | Path = ".") -> list[PlannedJob]:
    """The jobs ``snakemake [--configfile ...]`` (its default target) would run from ``cwd``, one per
    job (its outputs share a log file), in the order of the summary."""
    command = [sys.executable, "-m", "snakemake", "--summary"]
    if config_files:
        command += ["--configfile", *config_files]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise SslbenchError(f"`{' '.join(command[1:])}` could not plan (exit {done.returncode}):\n{tail}")
    return summary_jobs(done.stdout)


def summary_jobs(summary: str) -> list[PlannedJob]:
    """The pending jobs of a ``snakemake --summary`` table (output_file, date, rule, log-file(s),
    status, plan): a job's outputs share its rule and log file, so each job is counted once."""
    jobs, seen = [], set()
    for line in summary.splitlines():
        fields = line.split("\t")
        if len(fields) != 6 or fields[0] == "output_file" or fields[5] != "update pending":
            continue
        output, _, rule, log, status, _ = fields
        key = (rule, log)  # every rule has a log per job but collect, which has one job
        if key not in seen:
            seen.add(key)
            jobs.append(PlannedJob(rule, output, REASONS.get(status, status)))
    return jobs


def planned_lines(jobs: list[PlannedJob], command: str, listed: int = 10) -> list[str]:
    """The jobs the plan runs, grouped by rule and reason: each job with a reason of its own (up to
    ``listed`` per rule and reason), a count of those that run because an input is rewritten first."""
    if not jobs:
        return [f"The plan runs nothing (`{command}`)."]
    lines = [f"The plan runs {len(jobs)} jobs (`{command}`):"]
    groups = defaultdict(list)
    for job in jobs:
        groups[job.rule, job.why].append(job.output)
    for (rule, why), outputs in groups.items():
        if why == REASONS["ok"]:
            lines.append(f"  - {rule}: {len(outputs)} jobs, as {why}")
            continue
        lines += [f"  - {rule} {output}: {why}" for output in outputs[:listed]]
        if len(outputs) > listed:
            lines.append(f"  - {rule}: {len(outputs) - listed} more, as {why}")
    return lines
