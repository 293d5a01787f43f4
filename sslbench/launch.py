"""How a pretrain job starts its training processes: one process, torchrun's one per GPU on this machine,
or one torchrun agent per node of a SLURM allocation, the agents meeting at a c10d rendezvous.

The rule's shell line starts with ``prefix(...)``; a multi-node job runs ``sslbench launch`` twice: in
the job's batch shell it starts ``srun`` (one task per node), and in each task it starts that node's
torchrun agent, whose rendezvous address it derives from the allocation.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys

from sslbench.errors import ConfigError

ENTRY = ["-m", "sslbench.cli"]
PORTS = (20000, 60000)  # rendezvous ports: above the usual services, below Linux's ephemeral range


def prefix(nodes: int, agents: int, gpus: int) -> str:
    """What a pretrain job's command starts with: ``sslbench`` (one process), or ``sslbench launch ... --``
    (torchrun over `gpus` processes per node, on `agents` torchrun agents spread over `nodes`)."""
    if agents > 1:
        return " ".join(["sslbench launch", *node_flags(nodes, agents, gpus), "--"])
    if gpus > 1:
        return f"sslbench launch --gpus {gpus} --"
    return "sslbench"


def node_flags(nodes: int, agents: int, gpus: int) -> list[str]:
    """`sslbench launch`'s options of a job on several nodes."""
    return ["--nodes", str(nodes), "--agents", str(agents), "--gpus", str(gpus)]


def rendezvous_port(job_id: str) -> int:
    """A port for one SLURM job's rendezvous: from its job id, so that two jobs whose first node is the
    same machine meet on different ports (unless their ids differ by a multiple of 40,000)."""
    low, high = PORTS
    return low + int(job_id.split("_")[0]) % (high - low)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: ``node[03-04,07],gpu1`` -> ``node03``, ``rack[2-3]-n[1-4]`` ->
    ``rack2-n1`` (the first entry, each bracket replaced by its first value, padding kept)."""
    first, depth = "", 0
    for char in nodelist:
        if char == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(char, 0)
        first += char
    return re.sub(r"\[([^],-]+)[^]]*\]", r"\1", first)


def command(nodes: int, agents: int, gpus: int, args: list[str], env, in_step: bool = False) -> list[str]:
    """The command that runs the pretrain `args` (``pretrain --method-dir ...``) here: in the job's shell,
    or (`in_step`) in one task of the job's step, one per node."""
    per_node = str(max(1, gpus))
    if agents <= 1:
        return ["torchrun", "--standalone", "--nproc-per-node", per_node, *ENTRY, *args]
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise ConfigError(
            f"config key `resources.pretrain.nodes` = {nodes}: a multi-node pretrain job runs inside a SLURM "
            "allocation (run Snakemake with --workflow-profile profiles/slurm); on machines without SLURM "
            "set nodes to 1 and start the torchrun command of README.md's 'Several machines' on each"
        )
    if not in_step:  # the job's batch shell: one task per node, each an agent
        step = ["srun", "--nodes", str(nodes), "--ntasks", str(agents), "--kill-on-bad-exit=1"]
        flags = [*node_flags(nodes, agents, gpus), "--in-step"]
        return [*step, sys.executable, *ENTRY, "launch", *flags, "--", *args]
    endpoint = f"{first_host(env['SLURM_STEP_NODELIST'])}:{rendezvous_port(job)}"
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", f"sslbench-{job}"]
    return ["torchrun", "--nnodes", str(agents), "--nproc-per-node", per_node, *rendezvous, *ENTRY, *args]


def run(nodes: int, agents: int, gpus: int, args: list[str], in_step: bool = False) -> None:
    """Replace this process by the launcher. SIGUSR1 (the scheduler's warning before a time limit or a
    preemption) is ignored from here down to torchrun's agent, which it would otherwise kill: it reaches
    every training process too, each of which catches it, writes its state after the step and ends."""
    argv = command(nodes, agents, gpus, args, os.environ, in_step)
    if shutil.which(argv[0]) is None:
        raise ConfigError(f"`{argv[0]}` is not on PATH: the pretrain job cannot start its processes")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print("[sslbench] launching:", " ".join(argv), flush=True)  # in the job's log: what each node ran
    os.execvp(argv[0], argv)
