"""The DDP contract: every method, run by 2 processes (real torch.distributed, gloo on the CPU, launched
by torchrun), computes what one process computes on the whole batch: 2 processes of one torchrun
(one node), and 2 torchrun agents of one process each meeting at a c10d rendezvous on 127.0.0.1 (two
nodes, as two machines meet; gloo over TCP).

Every folder under methods/ is checked (discovery, not a list), and tests/methods/exerciser (parameter
groups under LARS, a cosine momentum pair, multi-crop views, a gradient hook), through the engine's own
path: the epoch's start (``Trainer.start_epoch``: the global RNG seeded per rank, as in training, then
the method's ``on_epoch_start`` hook with a real ``EpochContext``), then one ``Trainer.train_step``
(DDP-wrapped under torchrun) on a fixed global batch, each rank taking its shard. The one process is
rank 0, so a rank that draws random numbers of its own (a k-means seed, a fresh layer, noise indices)
instead of rank 0's differs from it.
One torchrun start runs every method (start-up is slow); this module is also that run's script.
Compared with one process on the same global batch and views:

(a) the method's whole state right after ``on_epoch_start``, before any forward (DDP re-broadcasts
    rank 0's buffers at every forward, which would hide a rank that computed something else);
(b) the loss: the mean of the per-rank losses equals the one-process loss. That is exact for both kinds
    of reduction the methods have: a loss averaged over the rank's own samples (cross-entropy, InfoNCE
    against the queue) has equal shards, so the mean of the shard means is the batch mean; a loss over the
    gathered batch (SimCLR, SupCon) is the whole batch's loss on every rank;
(c) the gradients after DDP's averaging, and the state after the step (optimiser update, queue, momentum
    encoder);
(d) rank 0's epoch-start state on every rank even where a rank's own arithmetic differs (here: rank 1's
    parameters perturbed), as PCL's main_pcl.py broadcasts its clustering: no rank may go on from a
    relabelling or an E-step of its own (non-deterministic GPU kernels would make them differ).

Batch norm is in eval mode for the step: per-process batch statistics make even a faithful method differ
from one process (that is the engine-wide per-process BN, declared in the method READMEs), and it would
hide what the contract is about, what the method itself does with the rest of the batch. Eval mode makes
every network a per-sample function wherever its batch norm sits (backbone, heads, split BN of the key
encoder), without swapping the method's modules. A method whose loss uses only its own images passes as
it is; one whose loss uses the rest of the batch must gather it (``sslbench.distributed``).

The hook runs as at the start of epoch ``HOOK_EPOCH`` of the default 30, where the epoch hooks do work
(past PCL's warm-up, one of SeLa's relabelling epochs).
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import (
    METHODS_DIR,
    REPO,
    TINY_IJEPA,
    TINY_VIT,
    VIT_OVERRIDES,
    contract_folders,
    pretrain_args,
    tiny_suite_config,
)

from sslbench import distributed as dist
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer

pytestmark = pytest.mark.slow

FOLDERS = contract_folders()  # every method folder and the test method that uses the whole contract
# Every folder with its own settings, plus the settings of paths a default does not take:
# {case: (method, method_overrides)}.
# MAE's, SimMIM's, MSN's and iBOT's attention key biases have no gradient (softmax ignores a constant per
# query): only round-off, ~1e-10, which differs between 1 and 2 processes. Adam's and AdamW's first step is
# about g / (|g| + eps) x lr, so that round-off moves them by up to 1 % of the lr in either direction, and
# any entry whose gradient is near 0 by up to the lr (W-MSE's and MMCR's Adam, VISReg's AdamW). The gradients
# are compared (they agree); the step is SGD's, which moves them by lr x round-off.
SGD_STEP = {"train": {"optimizer": "sgd", "lr": 0.01}}
# W-MSE whitens 64-d embeddings in sub-batches of 128, over this test's global batch of 32: 8-d ones in two
# sub-batches of 16 here, so that which rows share a sub-batch (rank 0's draw) matters.
OWN_SETTINGS = {
    "mae": SGD_STEP,
    "simmim": SGD_STEP,
    "msn": SGD_STEP,
    "ibot": SGD_STEP,
    "dinov2": SGD_STEP,
    "dinov3": {"gram_start": 0.0, **SGD_STEP},  # the Gram phase from the first step
    "franca": SGD_STEP,
    "ijepa": {**TINY_IJEPA, **SGD_STEP},
    "capi": SGD_STEP,
    "mmcr": SGD_STEP,
    "visreg": SGD_STEP,
    "wmse": {"proj_dim": 8, "w_size": 16, **SGD_STEP},
}
CASES = {method: (method, OWN_SETTINGS.get(method, {})) for method in FOLDERS} | {
    "instdisc-nce": ("instdisc", {"num_negatives": 64}),  # NCE (the ImageNet presets'); the default: softmax
    # the released models' recipe: Sinkhorn-Knopp over every rank's crops and masked patches (their counts
    # differ between the ranks), a head of its own for the patches
    "dinov2-sinkhorn": ("dinov2", {"centering": "sinkhorn_knopp", "separate_head": True, **SGD_STEP}),
}
# Every method on a tiny ViT too (pixels has no backbone to swap; I-JEPA's and CAPI's own cases are their
# ViT, without a class token, with 2-px patches)
CASES |= {
    f"{method}-vit": (method, {**VIT_OVERRIDES.get(method, {}), "backbone": TINY_VIT, **CASES[method][1]})
    for method in FOLDERS
    if method not in ("pixels", "ijepa", "capi")
}
GLOBAL_BATCH = 32  # 16 per rank: several images per class on each rank (SupCon's positives)
HOOK_EPOCH = 4


def torchrun(*args: str, timeout=300, nodes: int = 1) -> subprocess.CompletedProcess:
    """2 processes: one agent with --standalone (nodes 1), or two agents of one process each with
    --nnodes 2 and a c10d rendezvous on a free port of 127.0.0.1 (nodes 2)."""
    # the script imports the tests' helpers (support.py) as pytest does: tests/ on the path
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    run = [sys.executable, "-m", "torch.distributed.run"]
    if nodes == 1:
        cmd = [*run, "--standalone", "--nproc-per-node", "2", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    meet = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    meet += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"two-nodes-{port}"]
    agents = [
        subprocess.Popen(
            [*run, *meet, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(nodes)
    ]
    outs = [agent.communicate(timeout=timeout) for agent in agents]
    return subprocess.CompletedProcess(
        agents[0].args,
        max(agent.returncode for agent in agents),
        "".join(out for out, _ in outs),
        "".join(err for _, err in outs),
    )


def contract_config(case: str) -> dict:
    method, overrides = CASES[case]
    suite = tiny_suite_config(epochs=30, batch_size=GLOBAL_BATCH) | {"method_overrides": {method: overrides}}
    return resolve_method_config(suite, FOLDERS[method].parent, method)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def contract_record(case: str, out_dir: Path) -> dict:
    """What this process computes for `case`: (a) to (d) of the module docstring, on its shard."""
    trainer = Trainer(
        FOLDERS[CASES[case][0]], contract_config(case), 0, out_dir, device="cpu", progress=False
    )
    trainer.state.epoch, trainer.state.step = HOOK_EPOCH, HOOK_EPOCH * trainer.steps_per_epoch
    _, _, ctx, _ = trainer.start_epoch()
    record = {"epoch_start": snapshot(trainer.method)}
    if trainer.method.trains:
        g = torch.Generator().manual_seed(1)
        idx = torch.randperm(len(trainer.labels), generator=g)[:GLOBAL_BATCH]
        views = trainer.make_views(trainer.data.train.images[idx], g)  # the global batch, on every rank
        mine = dist.shard(GLOBAL_BATCH)
        trainer.method.eval()
        record["loss"] = trainer.train_step([v[mine] for v in views], idx[mine], ctx)
        record["grads"] = {
            name: p.grad.clone() for name, p in trainer.method.named_parameters() if p.grad is not None
        }
        record["after_step"] = snapshot(trainer.method)
    if dist.world_size() > 1:  # (d): rank r > 0 moves its parameters away from rank 0's, then reruns the hook
        with torch.no_grad():
            for p in trainer.method.parameters():
                p.add_(0.01 * dist.rank() * torch.randn_like(p))
        trainer.start_epoch()
        record["epoch_start_perturbed"] = {name: b.clone() for name, b in trainer.method.named_buffers()}
    return record


def ddp_main(out_dir: str, cases: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_from_env("cpu")
    out = Path(out_dir)
    launch = {key: int(os.environ[key]) for key in ("GROUP_RANK", "LOCAL_WORLD_SIZE")}  # torchrun's node
    torch.save(launch, out / f"launch.rank{dist.rank()}.pt")
    for case in cases:
        record = contract_record(case, out / case)
        torch.save(record, out / f"{case}.rank{dist.rank()}.pt")
    dist.shutdown()


@pytest.fixture(scope="module", params=[1, 2], ids=["one_node", "two_nodes"])
def ddp_records(request, tmp_path_factory):
    """Both ranks' records of every case this session runs (`-k my_method` runs its cases alone), on
    one node or two."""
    out = tmp_path_factory.mktemp("ddp")
    selected = {
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec") and "case" in item.callspec.params
    }
    run = torchrun(__file__, str(out), *sorted(selected), timeout=600, nodes=request.param)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    launches = [torch.load(out / f"launch.rank{r}.pt") for r in (0, 1)]
    nodes = sorted(launch["GROUP_RANK"] for launch in launches)  # each node's agent: its group rank
    assert nodes == ([0, 0] if request.param == 1 else [0, 1]), launches
    assert all(launch["LOCAL_WORLD_SIZE"] == 3 - request.param for launch in launches), launches
    return lambda case: [torch.load(out / f"{case}.rank{r}.pt", weights_only=False) for r in (0, 1)]


def assert_same_state(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys(), what
    for name in expected:
        if expected[name].is_floating_point():
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=f"{what}: {name}")
        else:  # labels, assignments, queue pointers: exactly
            assert torch.equal(got[name], expected[name]), f"{what}: {name}"


@pytest.mark.parametrize("case", CASES)
def test_two_processes_compute_what_one_process_computes_on_the_whole_batch(case, ddp_records, tmp_path):
    import faiss

    # One thread, as each torchrun process (OMP_NUM_THREADS=1): faiss's k-means (PCL, DeepCluster) sums
    # in another order on other threads, and its prototypes then move by more than the tolerance.
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    one = contract_record(case, tmp_path)
    ranks = ddp_records(case)
    for r, record in enumerate(ranks):
        assert_same_state(record["epoch_start"], one["epoch_start"], f"rank {r}, after on_epoch_start")
    if "loss" in one:
        loss = sum(record["loss"] for record in ranks) / len(ranks)
        assert loss == pytest.approx(one["loss"], rel=1e-5), [record["loss"] for record in ranks]
        # Round-off travels through every layer the loss shares, at the size of the model's largest gradients:
        # a tensor whose per-image terms cancel carries it at that size, not its own (NNCLR's predictor output
        # bias, L2-normalised after it: 3.6e-4 summed from terms near 1e-2, 6e-8 apart between 1 and 2
        # processes on an Intel Xeon with AVX-512).
        scale = max(grad.abs().max().item() for grad in one["grads"].values())
        for r, record in enumerate(ranks):
            assert record["grads"].keys() == one["grads"].keys()
            for name, grad in one["grads"].items():
                torch.testing.assert_close(
                    record["grads"][name], grad, rtol=1e-4, atol=1e-5 * scale, msg=f"rank {r}: grad of {name}"
                )
            assert_same_state(record["after_step"], one["after_step"], f"rank {r}, after the step")
    assert_same_state(ranks[1]["epoch_start_perturbed"], ranks[0]["epoch_start_perturbed"], "rank 1 vs 0")


def test_torchrun_training_writes_one_checkpoint(tmp_path):
    cfg = resolve_method_config(tiny_suite_config(epochs=1), METHODS_DIR, "simclr")
    out = tmp_path / "run"
    run = torchrun("-m", "sslbench.cli", *pretrain_args(cfg, out))
    assert run.returncode == 0, run.stdout + run.stderr
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["meta"]["world_size"] == 2 and ckpt["meta"]["batch_per_process"] == 32
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "epoch_0001.pt",
        "epoch_0001.pt.sha256",
    ]


if __name__ == "__main__":  # under torchrun: the 2-process side of the contract
    ddp_main(sys.argv[1], sys.argv[2:])
