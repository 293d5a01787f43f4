"""How a pretrain job starts its processes (sslbench.launch): the prefix of the rule's command, the
srun line of a multi-node job, each node's torchrun agent and its rendezvous, and the clear error outside
SLURM. The real multi-node run under SLURM is tests/workflow/test_slurm.py's."""

import subprocess
import sys

import pytest

from sslbench.errors import ConfigError
from sslbench.launch import PORTS, command, first_host, prefix, rendezvous_port

ARGS = ["pretrain", "--method-dir", "methods/simclr", "--seed", "0"]


def test_prefix_is_one_process_torchrun_on_this_machine_or_one_agent_per_node():
    assert prefix(nodes=1, agents=1, gpus=0) == prefix(1, 1, 1) == "sslbench"
    assert prefix(1, 1, 4) == "sslbench launch --gpus 4 --"
    assert prefix(2, 2, 8) == "sslbench launch --nodes 2 --agents 2 --gpus 8 --"
    assert prefix(2, 2, 0) == "sslbench launch --nodes 2 --agents 2 --gpus 0 --"  # CPU nodes: one process


def test_one_node_runs_a_standalone_torchrun_over_its_gpus():
    assert command(1, 1, 4, ARGS, env={}) == [
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "4",
        "-m",
        "sslbench.cli",
        *ARGS,
    ]


def test_the_jobs_shell_starts_one_task_per_node_each_relaunching_itself_as_the_nodes_agent():
    argv = command(2, 2, 8, ARGS, env={"SLURM_JOB_ID": "4242"})
    assert argv[:6] == ["srun", "--nodes", "2", "--ntasks", "2", "--kill-on-bad-exit=1"]
    assert argv[6:] == [sys.executable, "-m", "sslbench.cli", "launch"] + [
        "--nodes",
        "2",
        "--agents",
        "2",
        "--gpus",
        "8",
        "--in-step",
        "--",
        *ARGS,
    ]


def test_each_agent_meets_the_others_at_the_first_node_on_its_jobs_port():
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[017-018]"}
    argv = command(2, 2, 8, ARGS, env=env, in_step=True)
    assert argv == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"gpu017:{PORTS[0] + 4242}",
        "--rdzv-id",
        "sslbench-4242",
        "-m",
        "sslbench.cli",
        *ARGS,
    ]
    # CPU nodes (gpus 0) run one process each
    assert command(2, 2, 0, ARGS, env=env, in_step=True)[4] == "1"


def test_rendezvous_ports_differ_between_jobs_and_stay_in_range():
    ports = [rendezvous_port(str(job)) for job in range(1000, 1500)]
    assert len(set(ports)) == len(ports)
    assert all(PORTS[0] <= p < PORTS[1] for p in ports)
    assert rendezvous_port("4242_7") == rendezvous_port("4242")  # an array task: its array's job id
    assert rendezvous_port(str(PORTS[1] - PORTS[0] - 1)) == PORTS[1] - 1


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("node03", "node03"),
        ("node[03-04,07],gpu1", "node03"),
        ("gpu1,node[03-04]", "gpu1"),
        ("rack[2-3]-n[009-012]", "rack2-n009"),
        ("n[7,9]", "n7"),
    ],
)
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert first_host(nodelist) == first


def test_several_nodes_outside_slurm_is_a_clear_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"resources\.pretrain\.nodes` = 2.*SLURM.*Several machines"):
        command(2, 2, 8, ARGS, env={})
    out = subprocess.run(
        [sys.executable, "-m", "sslbench.cli", "launch", "--nodes", "2", "--agents", "2", "--", *ARGS],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("sslbench launch: error: config key `resources.pretrain.nodes` = 2"), (
        out.stderr
    )
