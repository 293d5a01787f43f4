"""Run under torchrun (2 processes): one short epoch of each method, then its state must agree on both ranks.

argv: out_dir method [method ...]   (one process start for all methods: torchrun and imports are slow)
"""

import json
import sys
from pathlib import Path

import torch

from sslbench import distributed as dist
from sslbench.config import load_config, resolve_runs
from sslbench.engine import Trainer

REPO = Path(__file__).resolve().parents[2]
out_root, methods = Path(sys.argv[1]), sys.argv[2:]
torch.set_num_threads(1)

tiny = {
    "dataset": {"image_size": 8},
    "train": {"epochs": 1, "batch_size": 64},
    "method_overrides": {"pcl": {"warmup_epochs": 0}},  # so that the E-step runs in this one epoch
}
runs = resolve_runs(load_config(REPO / "config", overrides=tiny), REPO / "methods", methods)
for (_, method), cfg in runs.items():
    trainer = Trainer(REPO / "methods" / method, cfg, 0, out_root / method, device="cpu", progress=False)
    trainer.fit()
    dist.barrier()
    # Every parameter and method buffer (queues, pseudo-labels, prototypes, concentrations) is identical
    # on both ranks: compare each against rank 0's copy. Batch-norm running statistics are the exception,
    # as in any DDP training: DDP broadcasts rank 0's at each forward, then each rank updates them from
    # its own shard; rank 0's are the ones checkpointed.
    state = {
        name: value
        for name, value in trainer.method.state_dict().items()
        if "running_" not in name and "num_batches_tracked" not in name
    }
    mismatched = [
        name for name, value in state.items() if not torch.equal(dist.broadcast(value.clone(), src=0), value)
    ]
    with open(out_root / f"report_rank{dist.rank()}.jsonl", "a") as f:  # a file per rank: no interleaving
        f.write(
            json.dumps(
                {"rank": dist.rank(), "method": method, "tensors": len(state), "mismatched": mismatched}
            )
            + "\n"
        )
dist.shutdown()
