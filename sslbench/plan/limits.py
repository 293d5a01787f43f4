"""What a run's settings must fit, judged from numbers alone (no torch): the sizes of the data's splits,
the number of processes, what the backbone has. The plan checks every run with these functions before
any job, and the code that uses each value calls the same function, so the two cannot disagree. Each
returns the problem (naming the key, the value and the fix), or None."""

from __future__ import annotations


def pretrain_processes(config: dict) -> int:
    """The processes a pretrain job runs on: one, or torchrun's one per GPU (`resources.pretrain.gpus`)
    on each of its `nodes`."""
    job = config["resources"]["pretrain"]
    return max(1, int(job.get("gpus", 0) or 0)) * int(job.get("nodes", 1) or 1)


def pretrain_batch_problem(batch_size: int, train_images: int, processes: int, dataset: str) -> str | None:
    """`train.batch_size`, the global batch of fixed-size batches (drop_last: MoCo's queue), against the
    pretraining set's train split and the processes it is split over."""
    if batch_size > train_images:
        return (
            f"config key `train.batch_size` = {batch_size} exceeds the {train_images} training images of "
            f"{dataset}; use a batch size of at most {train_images}"
        )
    if batch_size % processes:
        return (
            f"config key `train.batch_size` = {batch_size} (the global batch) must be divisible by the "
            f"{processes} processes"
        )
    return None


def split_batch_norm_problem(splits, per_process_batch: int, has_batchnorm2d: bool) -> str | None:
    """MoCo's split batch norm (`bn_splits`, shuffle-BN on one process): a positive number of splits
    dividing each process's batch, over a backbone that has BatchNorm2d layers to split."""
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1 or per_process_batch % splits:
        return (
            f"config key `bn_splits` = {splits!r} must be a positive integer dividing the batch size "
            f"{per_process_batch} of each process (`train.batch_size` / number of processes)"
        )
    if splits > 1 and not has_batchnorm2d:
        return (
            f"config key `bn_splits` = {splits}: split batch norm (shuffle-BN on one process) needs the "
            "backbone's BatchNorm2d layers, and this backbone has none (a Vision Transformer). Set "
            "`bn_splits: 1` in method_overrides (or the variant) for this backbone."
        )
    return None


def protocol_batch_problem(protocol: str, batch_size: int, train_images: int) -> str | None:
    """A protocol that drops the last short batch of each epoch (its DROPS_LAST_BATCH) trains on
    nothing when its `batch_size` exceeds the images it trains on."""
    if batch_size > train_images:
        return (
            f"setting `batch_size` = {batch_size} is larger than the {train_images} train images of the "
            f"target, and {protocol} drops the last short batch of each epoch; lower it"
        )
    return None
