"""The one pretraining loop every method shares.

The engine owns: data order and views, the optimiser over the method's parameter
groups and its schedule, the momentum (EMA) updates of the method's pairs, devices
(bf16 autocast and channels_last on CUDA), per-epoch atomic checkpoints and
resume, the epoch log, and divergence checks (the pieces it shares with the
protocols' loops are in ``sslbench.optim``).  A method computes its loss, declares
its groups, pairs and views, and hooks the start of an epoch, the gradients before
the step and the end of a step (see ``sslbench.kit.method``).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from sslbench import atomic
from sslbench import distributed as dist
from sslbench.augment.pipeline import EvalTransform, MultiViewAugment
from sslbench.augment.views import check_view_groups, view_groups
from sslbench.backbones import backbone_from_config, feature_reader
from sslbench.data.containers import Dataset
from sslbench.data.images import dataset_stats
from sslbench.data.registry import load_data
from sslbench.errors import ConfigError, SslbenchError
from sslbench.kit.headlayer import layer_record
from sslbench.kit.method import DataInfo, EpochContext, Method, checked_param_groups
from sslbench.kit.momentum import check_momentum, checked_momentum_pairs, ema_update, momentum_at
from sslbench.optim import (
    autocast,
    check_finite,
    learning_rate,
    make_optimizer,
    set_learning_rate,
    set_weight_decay,
)
from sslbench.plan.limits import pretrain_batch_problem
from sslbench.plan.settings import dataset_label
from sslbench.plugins import load_method_class
from sslbench.pretrain.batches import batch_source
from sslbench.pretrain.checkpoints import CHECKPOINT_DIR, EpochCheckpoints, prepared_digest, save_final
from sslbench.pretrain.monitors import COLUMNS as MONITOR_COLUMNS
from sslbench.pretrain.monitors import Monitor
from sslbench.pretrain.progress import epoch_line
from sslbench.pretrain.trackers import Trackers
from sslbench.provenance import code_record, provenance


def every_rank(state: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """A generator state (a byte tensor) of every rank, in rank order: one element in one process. Each
    its own tensor, not a row of the gathered one, which a checkpoint would keep as a view at a storage
    offset: a generator given that state crashes the process (seen on rank 1 of a resumed run)."""
    if not dist.is_initialized():
        return [state]
    return [row.clone() for row in dist.gather(state.to(device)[None]).cpu()]


def epoch_generators(seed: int, epoch: int, rank: int) -> tuple[torch.Generator, torch.Generator]:
    """(data order, views) generators of one epoch, and the global RNG (methods' own randomness).

    Everything random is re-seeded from (seed, epoch, rank) at each epoch start, so a resumed run
    draws exactly what an uninterrupted one draws, with no RNG state to checkpoint. The data order
    is the same on every rank (each takes its shard of each batch); views differ per rank.
    """
    order = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    views = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 1_009 + rank * 7_919 + 17)
    torch.manual_seed(seed * 1_000_003 + epoch * 1_013 + rank * 7_927 + 29)
    return order, views


class _TrainingLoss(torch.nn.Module):
    """Lets DistributedDataParallel wrap ``training_loss``, which is not ``forward``."""

    def __init__(self, method: Method):
        super().__init__()
        self.method = method

    def forward(self, views, labels, indices):
        return self.method.training_loss(views, labels, indices)


def build_backbone(cfg: dict, data: Dataset, seed: int) -> torch.nn.Module:
    """The run's backbone with its initial weights, seeded by ``seed``."""
    torch.manual_seed(seed)
    return backbone_from_config(cfg, data.channels, data.image_size)


def build_method(method_dir: str | Path, cfg: dict, data: Dataset, seed: int) -> Method:
    """Backbone from the config, handed to the method plugin; weights seeded by ``seed``."""
    cls = load_method_class(method_dir)
    backbone = build_backbone(cfg, data, seed)
    info = DataInfo(
        num_classes=data.num_classes,
        num_train=len(data.train),
        channels=data.channels,
        image_size=data.image_size,
        batch_size=int(cfg["train"]["batch_size"]),
        epochs=int(cfg["train"]["epochs"]),
    )
    return cls(backbone, info, cfg)


def normalisation(data: Dataset) -> tuple[list[float], list[float]]:
    return dataset_stats(data.channels, data.train.images)


@dataclass
class TrainState:
    epoch: int = 0  # completed epochs
    step: int = 0
    last_finite_loss: float | None = None
    interruptions: list = field(default_factory=list)  # {epoch, step, signal} of each stop it was told


# A job told to stop (a scheduler's warning before preemption: SLURM's --signal=USR1@<s>, or SIGTERM)
# writes a checkpoint after the step it is in and ends; its rerun continues from that step.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Preempted(SslbenchError):
    """The job was told to stop: its checkpoint within the epoch is written, and a rerun resumes it."""


class Trainer:
    """Trains one (method, seed) and writes ``out_dir/checkpoint.pt``."""

    def __init__(
        self,
        method_dir: str | Path,
        cfg: dict,
        seed: int,
        out_dir: str | Path,
        device: str = "auto",
        progress: bool = True,
        prepared: str | Path | None = None,
        monitor: dict | None = None,
        logging: dict | None = None,
    ):
        self.cfg, self.seed, self.out_dir = cfg, seed, Path(out_dir)
        self.monitor_settings = monitor or {}  # the config's `monitor` section: not a training setting
        self.monitor = Monitor(**self.monitor_settings)
        # the config's `logging`: trackers that also get the log, with the run's settings
        self.trackers = Trackers(logging if dist.is_main() else None, self.out_dir, {**cfg, "seed": seed})
        self.method_dir = Path(method_dir)
        self.train_cfg = cfg["train"]
        self.device = dist.init_from_env(device)
        self.world, self.rank = dist.world_size(), dist.rank()
        self.progress = progress and dist.is_main()  # the step bar; the per-epoch line is always logged
        self.prepared = prepared  # the dataset's file from `sslbench prepare`
        self.data = load_data(cfg, prepared)
        self.method = build_method(method_dir, cfg, self.data, seed).to(self.device)
        self.mean, self.std = mean, std = normalisation(self.data)  # stored in the checkpoint for extract
        size, channels = self.data.image_size, self.data.channels
        self.view_groups = self.method_views(cfg.get("augment", {}), size)
        self.augment = MultiViewAugment(self.view_groups, channels, mean, std).to(self.device)
        self.eval_transform = EvalTransform(size, channels, mean, std).to(self.device)
        self.on_cuda = self.device.type == "cuda"
        # The speed switches this run uses: decided once, from the config and the device.
        self.amp = self.on_cuda and bool(self.train_cfg.get("amp", True))
        self.channels_last = self.on_cuda and bool(self.train_cfg.get("channels_last", True))
        self.compile_backbone = bool(self.train_cfg.get("compile", False))
        # Only the trained backbone is compiled: momentum encoders and heads are small or gradient-free.
        self.apply_fast_paths(self.method, self.method.backbone)
        self.images = batch_source(self.data.train, self.device, self.train_cfg.get("workers", 4))
        self.labels = self.data.train.labels.to(self.device)
        self.batch_size = int(self.train_cfg["batch_size"])
        problem = pretrain_batch_problem(self.batch_size, len(self.labels), self.world, dataset_label(cfg))
        if problem:  # the plan checked it where the split's size is known before loading
            raise ConfigError(problem)
        self.local_batch = self.batch_size // self.world
        self.steps_per_epoch = len(self.labels) // self.batch_size  # drop_last: fixed-size batches (queues)
        # The pairs first: a target left trainable is named as such, not as a parameter left out of a group.
        self.momentum_pairs = checked_momentum_pairs(self.method.momentum_pairs())
        params = [p for p in self.method.parameters() if p.requires_grad]
        groups = checked_param_groups(self.method) if params else []
        self.optimizer = make_optimizer(groups, self.train_cfg, self.device) if params else None
        self.momentum = check_momentum(cfg["params"]) if self.momentum_pairs else None
        self.total_steps = self.train_cfg["epochs"] * self.steps_per_epoch
        self.loss_fn = _TrainingLoss(self.method)
        if self.world > 1 and params:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.on_cuda else None
            self.loss_fn = DistributedDataParallel(self.loss_fn, device_ids=ids)
        self.state = TrainState()
        self.log_rows: list[dict] = []
        self.checkpoints = EpochCheckpoints(self.out_dir)
        self.within: tuple[Path, dict] | None = None  # a checkpoint within the next epoch, to resume
        self.stop_signal: int | None = None  # set by the handler of STOP_SIGNALS (fit)

    # --- data -------------------------------------------------------------------------------
    def method_views(self, augment, image_size: int) -> list:
        """The view groups of the run's ``augment`` setting, checked against the method's views."""
        try:
            groups = view_groups(augment, image_size, self.method.num_views)
            check_view_groups(groups, self.method.num_views, self.method.multi_crop, image_size)
        except ConfigError as err:
            name = self.cfg["method"]
            raise ConfigError(
                f"{name}: {err} (set in {self.method_dir / 'config.yaml'} or method_overrides.{name}.augment)"
            ) from err
        return groups

    def make_views(self, images: torch.Tensor, generator: torch.Generator) -> list[torch.Tensor]:
        views = self.augment(images, generator)
        if self.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views

    @torch.no_grad()
    def forward_train_set(self, fn) -> torch.Tensor:
        """``fn`` on every training image (evaluation transform, dataset order), on every rank.

        Under DDP each rank computes a contiguous shard and the shards are gathered in order.
        """
        was_training = self.method.training
        self.method.eval()
        mine = torch.arange(len(self.images))[dist.shard(len(self.images))]
        outputs = []
        for images in self.images.iterate(list(mine.split(1024))):
            x = self.eval_transform(images)
            with self.autocast():
                outputs.append(fn(x).float())
        self.method.train(was_training)
        return dist.gather_uneven(torch.cat(outputs))

    def fast_paths(self) -> dict[str, bool]:
        """Which speed switches this run actually used (they depend on the device, not just the config)."""
        return {
            "bf16_autocast": self.amp,
            "channels_last": self.channels_last,
            "fused_optimizer": bool(self.optimizer is not None and self.optimizer.defaults.get("fused")),
            "compiled_backbone": self.compile_backbone,
        }

    def apply_fast_paths(self, model: torch.nn.Module, backbone: torch.nn.Module) -> None:
        """channels_last on ``model`` and torch.compile of ``backbone``, as this run uses them. In
        place (nn.Module.compile): parameter names, hence checkpoints, stay as they are."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        if self.compile_backbone:
            backbone.compile()

    def autocast(self):
        return autocast(self.device, self.amp)

    def epoch_context(self) -> EpochContext:
        return EpochContext(
            epoch=self.state.epoch,
            num_epochs=self.train_cfg["epochs"],
            step=self.state.step,
            steps_per_epoch=self.steps_per_epoch,
            device=self.device,
            forward_train_set=self.forward_train_set,
        )

    # --- checkpoints ------------------------------------------------------------------------
    def _checkpoint(self) -> dict:
        return {
            "epoch": self.state.epoch,
            "step": self.state.step,
            "last_finite_loss": self.state.last_finite_loss,
            "interruptions": self.state.interruptions,
            "method_state": self.method.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "log": self.log_rows,
            "cfg": self.cfg,
            "seed": self.seed,
        }

    def save_epoch_checkpoint(self) -> None:
        if dist.is_main():
            self.checkpoints.save(self.state.epoch, self._checkpoint())

    def resume(self) -> bool:
        """Restore the newest epoch checkpoint of these settings that loads (``EpochCheckpoints.newest``)."""
        found = self.checkpoints.newest(
            self.cfg, self.seed, self.method.state_dict(), self.device, self.method_dir / "method.py"
        )
        if found is not None:
            path, ckpt = found
            self.load_state(ckpt)
            self.log_rows = ckpt["log"]
            print(f"[sslbench] resumed from {path} (epoch {self.state.epoch})")
        # A stop within the next epoch: it resumes once that epoch has started as it did (train_epoch).
        self.within = self.checkpoints.within(self.state.epoch, self.cfg, self.seed, self.device)
        if self.within is not None:
            print(f"[sslbench] resuming from {self.within[0]} once its epoch has started again")
        return found is not None or self.within is not None

    def load_state(self, ckpt: dict) -> None:
        """The method, optimiser and counters of a checkpoint (an epoch's or one within an epoch)."""
        if self.optimizer is not None:  # validates the groups before it changes anything
            self.optimizer.load_state_dict(ckpt["optimizer"])
        self.method.load_state_dict(ckpt["method_state"])
        self.state = TrainState(
            ckpt["epoch"], ckpt["step"], ckpt["last_finite_loss"], list(ckpt.get("interruptions", []))
        )

    # --- the loop ---------------------------------------------------------------------------
    def _diverged(self, value: float, batch: int) -> str:
        return (
            f"{self.cfg['method']}: loss is {value} at epoch {self.state.epoch + 1}, step {batch + 1} "
            f"(global step {self.state.step}); last finite loss {self.state.last_finite_loss}. "
            f"The last good checkpoint is kept in {self.out_dir / CHECKPOINT_DIR}. "
            "Lower `train.lr` or check the method's loss."
        )

    def train_step(
        self, views: list[torch.Tensor], idx: torch.Tensor, ctx: EpochContext, batch: int = 0
    ) -> float:
        """One optimiser step of the method on a batch's views, at the schedule's lr (and weight
        decay) of step ``state.step`` (each group's), then the momentum updates; returns the loss."""
        set_learning_rate(self.optimizer, self.train_cfg, self.state.step, self.steps_per_epoch)
        set_weight_decay(self.optimizer, self.train_cfg, self.state.step, self.steps_per_epoch)
        labels = self.labels[idx] if self.method.needs_labels else None
        with self.autocast():
            loss = self.loss_fn(views, labels, idx)
        value = self.state.last_finite_loss = check_finite(loss, self._diverged, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.method.on_before_step(ctx)
        self.optimizer.step()
        if self.momentum_pairs:
            base, schedule, warmup, truncate = self.momentum
            tau = momentum_at(base, schedule, self.state.step, self.total_steps, warmup, truncate)
            for online, target in self.momentum_pairs:
                ema_update(online, target, tau)
            ctx.log["target_momentum"] = tau  # the epoch's last
        self.state.step += 1
        ctx.step = self.state.step
        self.method.on_step_end(ctx)
        return value

    def start_epoch(self) -> tuple[torch.Generator, torch.Generator, EpochContext, float]:
        """(data order generator, views generator, context, hook seconds) of the epoch ``state.epoch``:
        everything random re-seeded for it (epoch_generators), the method in train mode and its
        on_epoch_start hook run."""
        order_gen, view_gen = epoch_generators(self.seed, self.state.epoch, self.rank)
        self.method.train()
        ctx = self.epoch_context()
        t0 = time.perf_counter()
        self.method.on_epoch_start(ctx)
        if self.on_cuda:
            torch.cuda.synchronize()  # the hook's own time
        return order_gen, view_gen, ctx, time.perf_counter() - t0

    def epoch_batches(self, generator: torch.Generator) -> list[torch.Tensor]:
        """The epoch's global batches: the method's order (a random permutation unless it samples)
        cut into ``steps_per_epoch`` full batches (drop_last: fixed-size batches, for queues)."""
        order = self.method.epoch_order(len(self.labels), generator)
        if order.shape != (len(self.labels),):
            raise ValueError(
                f"{type(self.method).__name__}.epoch_order() must return {len(self.labels)} indices (one "
                f"per training image), got shape {tuple(order.shape)}"
            )
        return list(order.split(self.batch_size)[: self.steps_per_epoch])

    def train_epoch(self) -> dict:
        epoch = self.state.epoch
        order_gen, view_gen, ctx, hook_seconds = self.start_epoch()
        mine = slice(self.rank * self.local_batch, (self.rank + 1) * self.local_batch)
        index_batches = [batch[mine] for batch in self.epoch_batches(order_gen)]  # each rank its shard
        first, total, seen, earlier_seconds = 0, 0.0, 0, 0.0
        if self.within is not None:  # the epoch a stop cut short, started again: on from its last step
            first, total, seen, earlier_seconds = self.continue_within(view_gen, ctx)
        image_batches = self.images.iterate(index_batches[first:])
        t_steps = time.perf_counter()
        bar = tqdm(
            range(first, self.steps_per_epoch),
            desc=f"{self.cfg['method']} epoch {epoch + 1}",
            disable=not self.progress,
            leave=False,
        )
        for batch, images in zip(bar, image_batches):
            idx = index_batches[batch].to(self.device)
            lr = learning_rate(self.train_cfg, self.state.step, self.steps_per_epoch)  # the log's
            value = self.train_step(self.make_views(images, view_gen), idx, ctx, batch)
            total += value
            seen += len(idx) * self.world
            bar.set_postfix(loss=f"{value:.4f}")
            if self.told_to_stop():
                seconds = earlier_seconds + time.perf_counter() - t_steps
                self.stop_within(batch + 1, view_gen, ctx, total, seen, seconds)
        if self.on_cuda:
            torch.cuda.synchronize()
        step_seconds = earlier_seconds + time.perf_counter() - t_steps
        self.state.epoch += 1
        stops = sum(1 for stop in self.state.interruptions if stop["epoch"] == self.state.epoch)
        row = {
            "epoch": self.state.epoch,
            "loss": total / self.steps_per_epoch,
            "lr": lr,
            "images_per_s": seen / step_seconds,
            "seconds": step_seconds + hook_seconds,
            "hook_seconds": hook_seconds,
            "peak_memory_mb": self.peak_memory_mb(),
            **({"stops": stops} if stops else {}),  # the times a job was told to stop within it
            **ctx.log,
        }
        self.log_rows.append(row)
        return row

    # --- stopping within an epoch, and going on from there ------------------------------------
    def catch_stop_signals(self) -> dict:
        """Handlers of STOP_SIGNALS that note the signal (acted on after the step: ``told_to_stop``);
        the handlers they replace. Only the main thread can set them (elsewhere: none set)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def note(signum, frame):
            self.stop_signal = signum

        return {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}

    def told_to_stop(self) -> bool:
        """Whether a stop signal came (to any rank: all stop after the same step)."""
        told = self.stop_signal is not None
        if self.world > 1:
            told = bool(dist.all_reduce_sum(torch.tensor([float(told)], device=self.device)).item())
        return told

    def stop_within(self, batch: int, view_gen, ctx: EpochContext, total: float, seen: int, seconds: float):
        """Write the checkpoint after step ``batch`` of this epoch, with what going on from there
        needs beyond an epoch checkpoint (every rank's generators, the epoch's sums so far), and end."""
        told = self.stop_signal
        name = signal.Signals(told).name if told is not None else "another rank's signal"
        self.state.interruptions.append({"epoch": self.state.epoch + 1, "step": batch, "signal": name})
        cuda = torch.cuda.get_rng_state(self.device) if self.on_cuda else None
        within = {
            "batch": batch,
            "total": total,
            "seen": seen,
            "seconds": seconds,
            "log": dict(ctx.log),
            "view_rng": every_rank(view_gen.get_state(), self.device),
            "torch_rng": every_rank(torch.get_rng_state(), self.device),
            "cuda_rng": every_rank(cuda, self.device) if cuda is not None else None,
        }
        if dist.is_main():
            checkpoint = {**self._checkpoint(), "within_epoch": within}
            self.checkpoints.save_within(self.state.epoch, batch, checkpoint)
        dist.barrier()
        raise Preempted(
            f"{self.cfg['method']} seed {self.seed}: told to stop ({name}) in epoch {self.state.epoch + 1}; "
            f"its state after step {batch} is in {self.checkpoints.folder}. Run the job again (snakemake "
            "reruns it) to go on from there."
        )

    def continue_within(self, view_gen, ctx: EpochContext) -> tuple[int, float, int, float]:
        """The state a stop wrote within this epoch, loaded over the epoch's fresh start (whose hook has
        run again exactly as it first did, so the method's own attributes are those of the epoch):
        (first step to run, the epoch's loss sum and images so far, its step seconds so far)."""
        path, ckpt = self.within
        self.within = None
        within = ckpt["within_epoch"]
        self.load_state(ckpt)
        view_gen.set_state(within["view_rng"][self.rank])
        torch.set_rng_state(within["torch_rng"][self.rank])
        if self.on_cuda and within["cuda_rng"] is not None:
            torch.cuda.set_rng_state(within["cuda_rng"][self.rank], self.device)
        ctx.log.update(within["log"])
        ctx.step = self.state.step
        print(f"[sslbench] going on from step {within['batch']} of epoch {self.state.epoch + 1} ({path})")
        return within["batch"], within["total"], within["seen"], within["seconds"]

    def fit(self) -> Path:
        """Train (resuming if possible) and write the final checkpoint; return its path."""
        start = time.perf_counter()
        self.resume()
        self.trackers.replay(self.log_rows)  # the rows of a resumed run, once each
        epochs = self.train_cfg["epochs"] if self.method.trains else 0
        if dist.is_main():
            print(
                f"[sslbench] {self.cfg['method']} seed {self.seed}: {epochs} epochs × "
                f"{self.steps_per_epoch} steps on {self.device}",
                flush=True,
            )
        replaced = self.catch_stop_signals()
        try:
            while self.state.epoch < epochs:
                row = self.train_epoch()
                if self.monitor.due(row["epoch"], epochs):
                    row.update(self.monitor_row())
                self.save_epoch_checkpoint()
                self._write_log()
                self.trackers.log(row)
                if dist.is_main():  # in the job's log too (--quiet hides the step bar only)
                    print(epoch_line(self.log_rows, epochs), flush=True)
        finally:
            self.trackers.close()
            for sig, handler in replaced.items():
                signal.signal(sig, handler)
        self._write_log()
        return self.save_final(time.perf_counter() - start)

    def monitor_row(self) -> dict[str, float]:
        """The monitors (``sslbench.pretrain.monitors``) on the encoder's features of the train split,
        and what measuring them cost (not counted in the epoch's seconds)."""
        start = time.perf_counter()
        # the features the protocols read (backbone.features), on the train split
        reader = feature_reader(self.method.encoder(), self.cfg["backbone"])
        features = self.forward_train_set(reader).cpu().numpy()
        row = self.monitor.measure(features, self.labels.cpu().numpy(), self.data.num_classes)
        row.update(self.method.health(self.forward_train_set))  # its heads' own measures, if any
        return {**row, "monitor_seconds": time.perf_counter() - start}

    def monitor_summary(self) -> dict:
        """run.json's record of the monitors: their settings, and what they measured after the last
        epoch they ran (empty when they never ran)."""
        measured = [r for r in self.log_rows if MONITOR_COLUMNS[0] in r]
        last = {k: measured[-1][k] for k in ("epoch", *MONITOR_COLUMNS)} if measured else {}
        return {"settings": self.monitor_settings, "last": last}

    def peak_memory_mb(self) -> float:
        """The epoch's peak of allocated GPU memory (then reset), or on a CPU the process's peak
        resident memory so far (Linux's ru_maxrss, in KiB)."""
        if self.on_cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def _write_log(self) -> None:
        if not dist.is_main():
            return
        import pandas as pd

        columns = ["epoch", "loss", "lr", "images_per_s", "seconds", "hook_seconds", "peak_memory_mb"]
        frame = pd.DataFrame(self.log_rows, columns=None if self.log_rows else columns)
        atomic.write_text(self.out_dir / "train_log.csv", frame.to_csv(index=False))

    def save_final(self, wall_time: float) -> Path:
        peak = None
        if self.on_cuda:  # the epochs' peaks (each epoch resets the counter) and the end's
            epochs = [int(r["peak_memory_mb"] * 2**20) for r in self.log_rows if "peak_memory_mb" in r]
            peak = max([torch.cuda.max_memory_allocated(self.device), *epochs])
        meta = {
            "method": self.cfg["method"],
            "dataset": dataset_label(self.cfg),
            "seed": self.seed,
            "epochs_trained": self.state.epoch,
            "steps": self.state.step,
            "batch_size": self.batch_size,
            "world_size": self.world,
            "batch_per_process": self.local_batch,
            "lr_scaling": "none: train.lr is used as given for the global batch train.batch_size",
            "image_size": self.data.image_size,
            "channels": self.data.channels,
            "num_classes": self.data.num_classes,
            "backbone": self.cfg["backbone"]["name"],
            "small_stem": bool(self.cfg["backbone"].get("small_stem", False)),
            "train_wall_time_s": sum(r["seconds"] for r in self.log_rows) or wall_time,
            "images_per_s": (
                sum(r["images_per_s"] for r in self.log_rows) / len(self.log_rows) if self.log_rows else None
            ),
            "peak_gpu_memory_bytes": peak,
            "monitor": self.monitor_summary(),
            "interruptions": self.state.interruptions,  # each stop it was told, and where it went on
            "fast_paths": self.fast_paths(),
            **provenance(self.device, "pretrain", self.method_dir),  # git_dirty: also its untracked files
            "code": code_record("pretrain", self.method_dir),  # the files this job ran, with their sha256
            "prepared_sha256": prepared_digest(self.prepared),  # the dataset file it trained on
        }
        if not dist.is_main():
            return self.out_dir / "checkpoint.pt"
        checkpoint = {
            "encoder": self.method.encoder().state_dict(),
            "method_state": self.method.state_dict(),
            "projection_first_layer": layer_record(self.method.projection_head()),
            "cfg": self.cfg,
            "seed": self.seed,
            "meta": meta,
            "normalisation": {"mean": self.mean, "std": self.std},
        }
        return save_final(self.out_dir, checkpoint)


def pretrain(method_dir: str | Path, cfg: dict, seed: int, out_dir: str | Path, **options) -> Path:
    """Train one (method, seed) with the Trainer's ``options``; under torchrun every process calls this
    and rank 0 writes."""
    path = Trainer(method_dir, cfg, seed, out_dir, **options).fit()
    dist.barrier()
    return path
