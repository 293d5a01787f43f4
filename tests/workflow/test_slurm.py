"""The workstation and SLURM profiles: planned with -n, and run for real through a local one-node SLURM.

The real run needs Debian's slurmctld/slurmd/munge (.ci/install-slurm.sh) and root; without them it skips
with the reason (it fails where SSLBENCH_REQUIRE names slurm, as in CI). The dry runs need only snakemake
and snakemake-executor-plugin-slurm.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml
from slurm_cluster import PARTITION, LocalSlurm, SlurmBusy, why_unavailable
from support import REPO, copy_workflow, require, tiny_suite_config

pytestmark = pytest.mark.slow
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SLURM_PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
# Distinct per rule, so each SLURM job's limits show which rule's config they came from.
RESOURCES = {
    "pretrain": {"threads": 1, "gpus": 0, "mem_mb": 1000, "runtime": 7},
    "extract": {"threads": 1, "gpus": 0, "mem_mb": 1100, "runtime": 6},
    "evaluate": {"threads": 2, "gpus": 0, "mem_mb": 1200, "runtime": 5},
}
# Through SLURM, pretraining runs on "two nodes": two torchrun agents of one process each, which the one
# node of the local cluster holds side by side (the test profile sets the job's nodes to 1); locally on
# one torchrun of 2 processes, which must train the same bits.
SLURM_RESOURCES = {**RESOURCES, "pretrain": {**RESOURCES["pretrain"], "nodes": 2}}
LOCAL_RESOURCES = {**RESOURCES, "pretrain": {**RESOURCES["pretrain"], "gpus": 2}}
TABLE_KEYS = ["pretrain_dataset", "eval_dataset", "method", "seed", "protocol", "metric"]
PREEMPTED_EPOCHS = 12


def workflow_copy(root: Path, resources: dict = RESOURCES) -> Path:
    """Snakefile, rules, config, methods and profiles in `root`, with the tiny config as tiny.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    copy_workflow(root, "profiles")
    cfg = tiny_suite_config()
    # two protocols: a run's extract job frees two evaluate jobs at once, which SLURM gets as one array
    cfg.update(methods=["simclr", "random"], seeds=[0], protocols=["knn", "clustering"], resources=resources)
    # long enough for the SLURM run to signal its pretrain job mid-run (preempt_when_training)
    cfg["method_overrides"] = {"simclr": {"train": {"epochs": PREEMPTED_EPOCHS}}}
    # evaluated on another target than the pretraining set, so that extract jobs go through the queue
    cfg["datasets"]["digits6"] = {"name": "digits", "image_size": 6}
    cfg["evaluation"]["targets"] = ["digits6"]
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    return root


def snakemake_command(root: Path, *args: str, path: str | None = None, env: dict | None = None) -> dict:
    """Popen arguments for snakemake in `root`; the rules' `sslbench` and torchrun come from our bin."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**(env or os.environ), "PATH": path or f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    # targets and flags go before --configfile, which would swallow any positional argument after it
    return {"args": [*SNAKEMAKE, *args, "--configfile", "tiny.yaml"], "cwd": root, "env": env}


def snakemake(root: Path, *args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(
        **snakemake_command(root, *args, **kwargs), capture_output=True, text=True, timeout=timeout
    )
    out.text = out.stdout + out.stderr
    return out


def planned_jobs(text: str) -> list[dict]:
    """Each job of a dry run's listing: its rule, resources and shell command."""
    jobs = []
    for block in re.split(r"^(?:local)?rule ", text, flags=re.M)[1:]:
        resources = re.search(r"^\s+resources: (.*)$", block, re.M)
        command = re.search(r"^Shell command: (.*)$", block, re.M)
        jobs.append(
            {
                "rule": block.split(":", 1)[0],
                "resources": dict(kv.split("=", 1) for kv in resources.group(1).split(", ")),
                "command": command.group(1) if command else "",
            }
        )
    return jobs


def path_without_slurm(tmp_path: Path) -> str:
    """A PATH with this interpreter's bin and `which` only: no sinfo, sbatch or squeue on it."""
    bare = tmp_path / "bare_bin"
    bare.mkdir()
    (bare / "which").symlink_to(shutil.which("which"))
    return f"{Path(sys.executable).parent}{os.pathsep}{bare}"


# -- dry runs: no cluster needed --------------------------------------------------------------------------


def plan_on_slurm_profile(root: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """`snakemake -n` of the table with profiles/slurm, no SLURM command on PATH."""
    return snakemake(
        root,
        "-n",
        "results/table.csv",
        "--workflow-profile",
        "profiles/slurm",
        path=path_without_slurm(tmp_path),
    )


def test_slurm_profile_plans_the_dag_without_slurm_on_path(tmp_path):
    resources = {**RESOURCES, "pretrain": {**RESOURCES["pretrain"], "gpus": 4}}
    root = workflow_copy(tmp_path / "wf", resources)
    out = plan_on_slurm_profile(root, tmp_path)
    assert out.returncode == 0, out.text
    assert "Using workflow specific profile profiles/slurm" in out.text
    jobs = planned_jobs(out.text)
    assert sorted(j["rule"] for j in jobs) == [
        "collect",
        *["evaluate"] * 4,  # knn and clustering for each run
        "extract",
        "extract",
        "prepare",  # the pretraining set and the transfer target, decoded once each
        "prepare",
        "pretrain",
        "pretrain",
    ]
    defaults, per_rule = SLURM_PROFILE["default-resources"], SLURM_PROFILE["set-resources"]
    for job in jobs:
        res, rule = job["resources"], job["rule"]
        expected_partition = per_rule.get(rule, {}).get("slurm_partition", defaults["slurm_partition"])
        assert res["slurm_partition"] == expected_partition, job
        assert res["slurm_account"] == defaults["slurm_account"], job
        if rule in resources:  # the workflow's own request wins over the profile's defaults
            assert (int(res["mem_mb"]), int(res["runtime"]), int(res["gpu"])) == (
                resources[rule]["mem_mb"],
                resources[rule]["runtime"],
                resources[rule]["gpus"],
            ), job
        else:
            assert int(res["runtime"]) == defaults["runtime"], job
    # no cap on a cluster: a 4-GPU pretrain job is one torchrun over 4 processes
    for job in (j for j in jobs if j["rule"] == "pretrain"):
        assert job["command"].startswith("sslbench launch --gpus 4 -- pretrain"), job


def test_a_pretrain_job_on_two_nodes_asks_slurm_for_one_task_per_node(tmp_path):
    """nodes 2, gpus 8: the plugin's sbatch line asks for 2 nodes, 2 tasks and 8 GPUs on each node
    (not 8 in all), and the job's command starts one torchrun agent per node through srun."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    pretrain = {"threads": 16, "gpus": 8, "nodes": 2, "mem_mb": 64000, "runtime": 600}
    root = workflow_copy(tmp_path / "wf", {**RESOURCES, "pretrain": pretrain})
    out = plan_on_slurm_profile(root, tmp_path)
    assert out.returncode == 0, out.text
    jobs = [j for j in planned_jobs(out.text) if j["rule"] == "pretrain"]
    assert len(jobs) == 2
    for job in jobs:
        assert job["command"].startswith("sslbench launch --nodes 2 --agents 2 --gpus 8 -- pretrain"), job
        res = job["resources"]
        assert (res["nodes"], res["tasks"], res["mpi"], res["gres"], res["gpu"]) == (
            "2",
            "2",
            "srun",
            "gpu:8",
            "0",
        )
        # what the plugin submits with these resources (its own functions, on the resources as planned)
        resources = ResourcesView({k: int(v) if v.isdigit() else v for k, v in res.items()})
        job_view = SimpleNamespace(resources=resources, threads=16)
        params = {
            "run_uuid": "u",
            "slurm_logfile": "log",
            "comment_str": "c",
            "account": "",
            "partition": "",
            "workdir": "",
        }
        sbatch = get_submit_command(job_view, params) + set_gres_string(job_view)
        assert {"--nodes=2", "--ntasks=2", "--gres=gpu:8", "--cpus-per-task=16"} <= set(sbatch.split()), (
            sbatch
        )
        assert "--gpus" not in sbatch and "--ntasks-per-gpu" not in sbatch, sbatch


class ResourcesView(dict):
    """A job's resources as the plugin reads them: `resources.get(name)` and `resources.name`."""

    __getattr__ = dict.__getitem__


def test_default_profile_is_picked_up_and_caps_gpus(tmp_path):
    cap = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())["resources"]["gpu"]
    root = workflow_copy(
        tmp_path / "wf", {**RESOURCES, "pretrain": {**RESOURCES["pretrain"], "gpus": cap + 3}}
    )

    out = snakemake(root, "-n", "results/table.csv")  # no --workflow-profile: profiles/default applies
    assert out.returncode == 0, out.text
    assert "Using workflow specific profile profiles/default" in out.text
    pretrain = [j for j in planned_jobs(out.text) if j["rule"] == "pretrain"]
    assert len(pretrain) == 2 and all(int(j["resources"]["gpu"]) == cap for j in pretrain), pretrain
    launcher = f"sslbench launch --gpus {cap} -- pretrain" if cap > 1 else "sslbench pretrain"
    assert all(j["command"].startswith(launcher) for j in pretrain), pretrain

    # the command line wins over the profile: a 2-GPU machine runs 2-process DDP
    out = snakemake(root, "-n", "results/table.csv", "--resources", "gpu=2")
    assert out.returncode == 0, out.text
    pretrain = [j for j in planned_jobs(out.text) if j["rule"] == "pretrain"]
    assert len(pretrain) == 2 and all(
        j["command"].startswith("sslbench launch --gpus 2 -- pretrain") for j in pretrain
    ), pretrain


# -- a real run through a local SLURM ---------------------------------------------------------------------


def local_test_profile(root: Path) -> Path:
    """profiles/slurm adjusted to the local cluster: its partition, no account, squeue for job states."""
    profile = yaml.safe_load((root / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["slurm_partition"] = PARTITION
    del profile["default-resources"]["slurm_account"]
    for settings in profile.get("set-resources", {}).values():
        if "slurm_partition" in settings:
            settings["slurm_partition"] = PARTITION
    profile["set-resources"]["pretrain"]["nodes"] = 1  # the one node holds the job's two agents
    profile.update(
        {
            "slurm-status-command": "squeue",  # no accounting database: sacct knows no job
            "slurm-init-seconds-before-status-checks": 6,  # first poll (default 40 s); +10 s per empty poll
            "latency-wait": 5,
            "retries": 1,  # the profile's: a preempted job's retry goes on from where it stopped
            "keep-going": False,
            "slurm-keep-successful-logs": True,
        }
    )
    folder = root / "profiles" / "slurm_local"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


@pytest.fixture(scope="module")
def slurm_and_local_runs(tmp_path_factory):
    """The tiny config run locally and through SLURM; yields both folders, the cluster and timings."""
    require("slurm", why_unavailable())
    base = tmp_path_factory.mktemp("slurm")
    cluster = LocalSlurm(base / "cluster")
    try:
        try:
            cluster.start()
        except SlurmBusy as busy:
            require("slurm", str(busy))
        local = workflow_copy(base / "local", LOCAL_RESOURCES)
        on_slurm = workflow_copy(base / "on_slurm", SLURM_RESOURCES)
        local_test_profile(on_slurm)
        start, started = time.monotonic(), time.time()
        # The local run (profiles/default) goes alongside, niced: it uses the CPU the SLURM run leaves
        # idle while the executor plugin waits between its status polls.
        with open(base / "local.log", "w") as log:
            local_run = subprocess.Popen(
                **snakemake_command(local, "results/table.csv", "--resources", "gpu=2"),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: os.nice(19),
            )
            try:
                with open(base / "slurm.log", "w") as slurm_log:
                    slurm_run = subprocess.Popen(
                        **snakemake_command(
                            on_slurm,
                            "results/table.csv",
                            "--workflow-profile",
                            "profiles/slurm_local",
                            env=cluster.env,
                        ),
                        stdout=slurm_log,
                        stderr=subprocess.STDOUT,
                    )
                    try:
                        stopped = preempt_when_training(
                            cluster, on_slurm / "results/digits/simclr/seed0", slurm_run
                        )
                        slurm_run.wait(timeout=400)
                    finally:
                        if slurm_run.poll() is None:
                            slurm_run.kill()
                timings = {"slurm": time.monotonic() - start}
                local_run.wait(timeout=240)
                timings["local"] = (base / "local.log").stat().st_mtime - started  # its last line
            finally:
                if local_run.poll() is None:
                    local_run.kill()
        text = (base / "slurm.log").read_text()
        assert slurm_run.returncode == 0, text + "\n" + cluster.log_tail()
        assert local_run.returncode == 0, (base / "local.log").read_text()
        yield {
            "local": local,
            "slurm": on_slurm,
            "jobs": cluster.jobs(),
            "stopped": stopped,
            "timings": timings,
            "log": text,
        }
    finally:
        cluster.stop()


def preempt_when_training(cluster: LocalSlurm, run_dir: Path, dag: subprocess.Popen) -> str:
    """Once the run's pretrain job has logged an epoch, SLURM signals it as before a preemption
    (`scancel --signal=USR1`, what `--signal=USR1@<s>` sends before the time limit); its job id."""
    log, deadline = run_dir / "train_log.csv", time.monotonic() + 300
    while not (log.is_file() and 2 <= len(log.read_text().splitlines()) <= PREEMPTED_EPOCHS - 2):
        assert dag.poll() is None and time.monotonic() < deadline, "the pretrain job never logged an epoch"
        time.sleep(0.2)
    (job,) = [
        j
        for j in cluster.jobs()
        if j["JobState"] == "RUNNING"
        and j.get("Comment", "").startswith("rule_pretrain_wildcards_digits_simclr")
    ]
    cluster.run("scancel", "--signal=USR1", job["JobId"])
    return job["JobId"]


def test_slurm_run_gives_the_same_table_as_a_local_run(slurm_and_local_runs):
    local = pd.read_csv(slurm_and_local_runs["local"] / "results" / "table.csv")
    slurm = pd.read_csv(slurm_and_local_runs["slurm"] / "results" / "table.csv")
    columns = [*TABLE_KEYS, "value"]
    local, slurm = (t[columns].sort_values(TABLE_KEYS).reset_index(drop=True) for t in (local, slurm))
    assert set(local["method"]) == {"simclr", "random"} and len(local) >= 4
    pd.testing.assert_frame_equal(slurm, local, check_exact=True)
    print("timings (s):", {k: round(v, 1) for k, v in slurm_and_local_runs["timings"].items()})


def test_a_pretrain_job_signalled_by_slurm_goes_on_from_its_step_in_its_retry(slurm_and_local_runs):
    """The job SLURM signalled wrote its state within an epoch and failed; Snakemake's retry went on from
    there and trained the same bits as the local run, which nothing stopped."""
    run = slurm_and_local_runs["slurm"] / "results" / "digits" / "simclr" / "seed0"
    (stop,) = json.loads((run / "run.json").read_text())["meta"]["interruptions"]
    assert stop["signal"] == "SIGUSR1" and 2 <= stop["epoch"] <= PREEMPTED_EPOCHS, stop
    assert "going on from step" in (run / "logs" / "pretrain.log").read_text()
    local = slurm_and_local_runs["local"] / "results" / "digits" / "simclr" / "seed0" / "checkpoint.pt"
    a, b = (torch.load(path, weights_only=False) for path in (local, run / "checkpoint.pt"))
    for part in ("encoder", "method_state"):
        assert all(torch.equal(a[part][key], b[part][key]) for key in a[part]), part


def test_every_job_ran_under_slurm_with_its_rules_resources(slurm_and_local_runs):
    assert "Using workflow specific profile profiles/slurm_local" in slurm_and_local_runs["log"]
    stopped = slurm_and_local_runs[
        "stopped"
    ]  # told to stop: it wrote its state and failed, then its retry ran
    (preempted,) = [job for job in slurm_and_local_runs["jobs"] if job["JobId"] == stopped]
    assert preempted["JobState"] == "FAILED", preempted
    jobs = [job for job in slurm_and_local_runs["jobs"] if job["JobId"] != stopped]
    rules = [re.match(r"rule_([a-z]+)", job.get("Comment", "")).group(1) for job in jobs]
    # collect and report are local rules: they run on the submitting node, not through the queue
    assert sorted(rules) == ["evaluate"] * 4 + ["extract", "extract", "pretrain", "pretrain"]
    # the profile's slurm-array-jobs: each run's two evaluate jobs, ready together, went as one array
    arrays = Counter(j.get("ArrayJobId") for j, rule in zip(jobs, rules) if rule == "evaluate")
    assert sorted(arrays.values()) == [2, 2] and None not in arrays, jobs
    for rule, job in zip(rules, jobs):
        assert job["JobState"] == "COMPLETED" and job["Partition"] == PARTITION, job
        if rule in RESOURCES:  # threads -> --cpus-per-task, mem_mb -> --mem, runtime -> -t
            want = RESOURCES[rule]
            tasks = 2 if rule == "pretrain" else 1  # one task per node, the two "nodes" on one
            assert job["TimeLimit"] == f"00:{want['runtime']:02d}:00", job
            # an array job asks for a few MB more, for the commands of its tasks that it carries
            fudge = int(job["MinMemoryNode"].rstrip("M")) - want["mem_mb"]
            assert fudge == 0 or ("ArrayJobId" in job and 0 < fudge <= 16), job
            assert (int(job["NumTasks"]), int(job["NumCPUs"])) == (tasks, want["threads"] * tasks), job


def test_each_node_of_a_pretrain_job_starts_its_agent_at_the_jobs_rendezvous(slurm_and_local_runs):
    """The job's srun started one task per node; each ran torchrun for 2 nodes, meeting at the first
    node, on the port of its job id."""
    from sslbench.launch import rendezvous_port

    (job,) = [
        j
        for j in slurm_and_local_runs["jobs"]
        if j["JobState"] == "COMPLETED"
        and j.get("Comment", "").startswith("rule_pretrain_wildcards_digits_simclr")
    ]
    log = (slurm_and_local_runs["slurm"] / "results/digits/simclr/seed0/logs/pretrain.log").read_text()
    launched = re.findall(r"^\[sslbench\] launching: (.*)$", log, re.M)
    assert launched[0].startswith("srun --nodes 1 --ntasks 2 "), launched
    endpoint = f"{job['BatchHost']}:{rendezvous_port(job['JobId'])}"
    agent = (
        f"torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {endpoint} "
        f"--rdzv-id sslbench-{job['JobId']} -m sslbench.cli pretrain "
    )
    assert len(launched) == 3 and all(line.startswith(agent) for line in launched[1:]), launched
    run = json.loads((slurm_and_local_runs["slurm"] / "results/digits/simclr/seed0/run.json").read_text())
    assert run["meta"]["world_size"] == 2
