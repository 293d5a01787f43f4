"""The step, split_bn and views sections: each method's training step (the engine's own:
Trainer.make_views, train_step, start_epoch) against a bare forward/backward/step loop on the same
backbone, batch and views; MoCo's step with split batch norm against the same step with plain batch
norm; the view pipeline against the model, for each method's views and for multi-crop (SwAV's 2 global
+ 6 local crops, scaled to the image: ``MULTI_CROP``)."""

from __future__ import annotations

import json

import torch

from sslbench.augment.views import describe_views
from sslbench.bench.core import METHODS_DIR, Bench, interleaved, median, row, sync, timed
from sslbench.plan.settings import resolve_method_config

STEP_TARGET = ("<=", 1.10)  # method step / bare step
VIEWS_TARGET = (">=", 3.0)  # view images/s / model images/s
# SwAV's multi-crop (main_swav.py: 2 x 224 px at scale (0.14, 1) + 6 x 96 px at (0.05, 0.14)), its
# colour recipe = the simclr preset; sizes relative to the image (96 / 224 = 0.43).
MULTI_CROP = {
    "preset": "simclr",
    "crops": [
        {"count": 2, "size": 1.0, "crop_scale": [0.14, 1.0]},
        {"count": 6, "size": 0.43, "crop_scale": [0.05, 0.14]},
    ],
}
SPLIT_BN_TARGET = ("<=", 1.03)  # MoCo step with split BN / with plain BN
SPLIT_BN_SPLITS = 8  # MoCo's CIFAR demo (--bn-splits 8); the config's own value is timed too


class BareLoop:
    """The floor of a training step: the method's backbone architecture, batch, views (concatenated
    into one forward) and optimiser, with the mean of the backbone's outputs as the loss."""

    def __init__(self, trainer):
        from sslbench.optim import make_optimizer
        from sslbench.pretrain.trainer import build_backbone

        # The method's initial backbone weights, device and fast paths: like against like.
        self.backbone = build_backbone(trainer.cfg, trainer.data, trainer.seed).to(trainer.device)
        trainer.apply_fast_paths(self.backbone, self.backbone)
        self.backbone.train()
        self.optimizer = make_optimizer(list(self.backbone.parameters()), trainer.train_cfg, trainer.device)
        self.trainer = trainer

    def forward_backward(self, views: list[torch.Tensor]) -> torch.Tensor:
        from sslbench.kit.method import embed_crops

        with self.trainer.autocast():  # the views of one size in one forward: the fastest way through
            loss = torch.cat(embed_crops(self.backbone, views)).float().mean()
        loss.backward()
        return loss

    def step(self, views: list[torch.Tensor]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(views)
        float(loss.detach())  # the engine reads the loss every step (its finiteness check)
        self.optimizer.step()


def build_trainer(name: str, bench: Bench, **params):
    """The engine's Trainer of a method as the bench's config sets it up (``params`` override the
    method's own settings)."""
    from sslbench.pretrain.trainer import Trainer

    cfg = resolve_method_config(bench.config, METHODS_DIR, name)
    cfg["params"].update(params)
    return Trainer(
        METHODS_DIR / name,
        cfg,
        bench.seed,
        bench.workdir / "runs" / name,
        device=bench.device,
        progress=False,
    )


def batch(trainer, round_index: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images, indices on the device) of a random batch, the same for both sides of a round.
    Fetched as the engine fetches them (its batch source), outside the timings."""
    generator = torch.Generator().manual_seed(seed * 7_919 + round_index + 1_000)
    idx = torch.randperm(len(trainer.labels), generator=generator)[: trainer.batch_size]
    images = next(iter(trainer.images.iterate([idx])))
    return images, idx.to(trainer.device)


def make_views(
    trainer, images: torch.Tensor, round_index: int, seed: int
) -> tuple[float, list[torch.Tensor]]:
    """(seconds, views): Trainer.make_views with a generator seeded per round (identical for A and B)."""
    generator = torch.Generator().manual_seed(seed * 104_729 + round_index + 2_000)

    def draw():
        views = trainer.make_views(images, generator)
        sync(trainer.device)
        return views

    return timed(draw)


def method_step(trainer, ctx, views: list[torch.Tensor], idx: torch.Tensor) -> None:
    """The engine's own step (Trainer.train_step), views excluded."""
    trainer.train_step(views, idx, ctx)
    sync(trainer.device)


def walk_hooks(trainer, budget_s: float) -> list[float]:
    """Seconds of each on_epoch_start call, epoch 0, 1, ... as training calls them, until the run's
    last epoch or until the calls took ``budget_s``. Leaves the method as that epoch finds it
    (PCL with prototypes, SeLa with relabelled targets), so the steps timed next are typical."""
    from sslbench.kit.method import Method
    from sslbench.pretrain.trainer import TrainState

    if type(trainer.method).on_epoch_start is Method.on_epoch_start:
        return []
    seconds: list[float] = []
    for epoch in range(int(trainer.train_cfg["epochs"])):
        trainer.state = TrainState(epoch=epoch, step=epoch * trainer.steps_per_epoch)
        *_, hook_seconds = trainer.start_epoch()  # as train_epoch starts an epoch
        seconds.append(hook_seconds)
        if sum(seconds) >= budget_s:
            break
    return seconds


def bench_step(bench: Bench) -> list[dict]:
    return [r for name in bench.methods for r in method_step_rows(name, bench)]


def method_step_rows(name: str, bench: Bench) -> list[dict]:
    trainer = build_trainer(name, bench)
    if trainer.optimizer is None:
        return [row("step", name, None, "s/step", notes="no trainable parameters: never trained")]
    hooks = walk_hooks(trainer, bench.repeats.hook_budget_s)
    ctx = trainer.epoch_context()
    bare = BareLoop(trainer)

    def round_of(step):
        """(view seconds, step seconds) of round i: the same batch and views for both loops."""

        def run(i):
            images, idx = batch(trainer, i, bench.seed)
            view_s, views = make_views(trainer, images, i, bench.seed)
            return view_s, timed(lambda: step(views, idx))[0]

        return run

    run_method = round_of(lambda views, idx: method_step(trainer, ctx, views, idx))
    run_bare = round_of(lambda views, idx: (bare.step(views), sync(trainer.device)))
    pairs = interleaved(run_method, run_bare, bench.repeats.warmup, bench.repeats.steps)
    return step_rows(name, trainer, pairs, hooks)


def step_rows(name: str, trainer, pairs, hooks: list[float]) -> list[dict]:
    method_model = [m[1] for m, _ in pairs]
    bare_model = [b[1] for _, b in pairs]
    with_views = [(m[0] + m[1]) / (b[0] + b[1]) for m, b in pairs]
    images = trainer.batch_size * trainer.augment.num_views
    shape = (
        f"batch {trainer.batch_size} x views {describe_views(trainer.view_groups)}, "
        f"{trainer.cfg['backbone']['name']} at {trainer.data.image_size}px, "
        f"{trainer.train_cfg['optimizer']}; "
        f"images/s: method {images / median(method_model):.0f}, bare {images / median(bare_model):.0f}"
    )
    rows = [
        row(
            "step",
            name,
            median(method_model),
            "s/step",
            reference=median(bare_model),
            ratio=median(m / b for m, b in zip(method_model, bare_model)),
            ratio_is="method step / bare step",
            target=STEP_TARGET,
            notes=(
                f"views excluded; ratio: median over {len(pairs)} interleaved rounds of "
                f"each round's ratio (value, reference: plain medians); {shape}"
            ),
        ),
        row(
            "step",
            f"{name} (with views)",
            median(m[0] + m[1] for m, _ in pairs),
            "s/step",
            reference=median(b[0] + b[1] for _, b in pairs),
            ratio=median(with_views),
            ratio_is="(views + method step) / (views + bare step)",
            notes="the engine's whole step",
        ),
    ]
    if hooks:
        step_s = median(method_model)
        epochs = len(hooks)
        share = sum(hooks) / (sum(hooks) + epochs * trainer.steps_per_epoch * step_s)
        rows.append(
            row(
                "step",
                f"{name} on_epoch_start",
                max(hooks),
                "s/call",
                reference=step_s,
                ratio=max(hooks) / step_s,
                ratio_is="slowest hook call / method step",
                notes=(
                    f"{epochs} calls (epochs 0-{epochs - 1}), median {median(hooks):.3g} s; hooks are "
                    f"{share:.1%} of those epochs' time ({trainer.steps_per_epoch} steps/epoch)"
                ),
            )
        )
    return rows


def bench_split_bn(bench: Bench) -> list[dict]:
    """MoCo's step with split batch norm against the same step with bn_splits 1, and the backbone's
    batch-norm layers alone, split against plain; at the demo's 8 splits and the config's own."""
    cfg = resolve_method_config(bench.config, METHODS_DIR, "moco")
    batch_size = int(cfg["train"]["batch_size"])
    splits = sorted(
        s for s in {SPLIT_BN_SPLITS, int(cfg["params"]["bn_splits"])} - {1} if batch_size % s == 0
    )
    return [r for s in splits for r in (split_bn_step_row(bench, s), split_bn_layers_row(bench, s))]


def split_bn_row(name: str, pairs: list[tuple[float, float]], ratio_is: str, **keys) -> dict:
    """A split_bn row from interleaved (split, plain) seconds: the medians and the median ratio."""
    return row(
        "split_bn",
        name,
        median(a for a, _ in pairs),
        "s/step",
        reference=median(b for _, b in pairs),
        ratio=median(a / b for a, b in pairs),
        ratio_is=ratio_is,
        **keys,
    )


def split_bn_step_row(bench: Bench, splits: int) -> dict:
    split, plain = (build_trainer("moco", bench, bn_splits=s) for s in (splits, 1))
    for trainer in (split, plain):
        trainer.method.train()

    def run(trainer):
        ctx = trainer.epoch_context()

        def round_seconds(i):
            images, idx = batch(trainer, i, bench.seed)
            _, views = make_views(trainer, images, i, bench.seed)
            return timed(lambda: method_step(trainer, ctx, views, idx))[0]

        return round_seconds

    pairs = interleaved(run(split), run(plain), bench.repeats.warmup, bench.repeats.steps)
    return split_bn_row(
        f"moco step, bn_splits {splits}",
        pairs,
        "step with split BN / step with bn_splits 1",
        target=SPLIT_BN_TARGET,
        notes=(
            f"views excluded; ratio: median over {len(pairs)} interleaved rounds of each round's ratio; "
            f"batch {split.batch_size}, {split.cfg['backbone']['name']} at {split.data.image_size}px"
        ),
    )


def split_bn_layers_row(bench: Bench, splits: int) -> dict:
    """Every BatchNorm2d of MoCo's backbone on inputs of the shapes the step gives it, each output
    activated in place as timm's blocks do: forward and backward (the query encoder), then a
    forward without gradient (the key encoder)."""
    from torch import nn

    from sslbench.kit.moco import SplitBatchNorm2d

    trainer = build_trainer("moco", bench, bn_splits=1)
    backbone = trainer.method.backbone
    shapes: list[torch.Size] = []
    hooks = [
        m.register_forward_hook(lambda m, args, out: shapes.append(args[0].shape))
        for m in backbone.modules()
        if isinstance(m, nn.BatchNorm2d)
    ]
    images, _ = batch(trainer, 0, bench.seed)
    with torch.no_grad():
        backbone(make_views(trainer, images, 0, bench.seed)[1][0])
    for hook in hooks:
        hook.remove()
    generator = torch.Generator().manual_seed(bench.seed)
    inputs = [
        (torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)) for shape in shapes
    ]
    inputs = [(x.to(trainer.device).requires_grad_(), g.to(trainer.device)) for x, g in inputs]

    def layers(split: bool) -> list[nn.Module]:
        return [
            (SplitBatchNorm2d(shape[1], splits) if split else nn.BatchNorm2d(shape[1])).to(trainer.device)
            for shape in shapes
        ]

    def run(bn: list[nn.Module]):
        def round_seconds(i):
            def apply():
                for layer, (x, grad) in zip(bn, inputs):
                    layer(x).relu_().backward(grad)
                    with torch.no_grad():
                        layer(x).relu_()
                sync(trainer.device)

            return timed(apply)[0]

        return round_seconds

    pairs = interleaved(run(layers(True)), run(layers(False)), bench.repeats.warmup, bench.repeats.steps)
    return split_bn_row(
        f"BatchNorm2d layers, {splits} splits",
        pairs,
        "SplitBatchNorm2d / BatchNorm2d",
        notes=(
            f"the backbone's {len(shapes)} BatchNorm2d layers at the step's shapes (batch "
            f"{trainer.batch_size}), in-place ReLU on each output: forward + backward, then a forward "
            "without gradient, per layer"
        ),
    )


def bench_views(bench: Bench) -> list[dict]:
    rows = [r for name in bench.methods for r in method_views_rows(name, bench)]
    return rows + (multi_crop_views_rows(rows[0]["name"], bench) if rows else [])


def multi_crop_views_rows(name: str, bench: Bench) -> list[dict]:
    """MULTI_CROP's views against the model, on the data, backbone and device of method ``name``
    (its trainer, with the views swapped: the engine's own view pipeline and view-making)."""
    from sslbench.augment.pipeline import MultiViewAugment
    from sslbench.augment.views import view_groups

    trainer = build_trainer(name, bench)
    trainer.view_groups = view_groups(MULTI_CROP, trainer.data.image_size, 2)
    trainer.augment = MultiViewAugment(trainer.view_groups, trainer.data.channels, trainer.mean, trainer.std)
    trainer.augment.to(trainer.device)
    return views_rows("multi-crop", trainer, bench, f"SwAV's crops, simclr colours, on {name}'s backbone")


def method_views_rows(name: str, bench: Bench) -> list[dict]:
    trainer = build_trainer(name, bench)
    if trainer.optimizer is None:
        return []  # never trained: no views
    return views_rows(name, trainer, bench, f"augment {json.dumps(trainer.cfg['augment'], sort_keys=True)}")


def views_rows(name: str, trainer, bench: Bench, setting: str) -> list[dict]:
    bare = BareLoop(trainer)
    latest: dict = {}

    def run_views(i):
        images, _ = batch(trainer, i, bench.seed)
        seconds, latest["views"] = make_views(trainer, images, i, bench.seed)
        return seconds

    def run_model(i):
        bare.backbone.zero_grad(set_to_none=True)
        return timed(lambda: (bare.forward_backward(latest["views"]), sync(trainer.device)))[0]

    pairs = interleaved(run_views, run_model, bench.repeats.warmup, bench.repeats.steps)
    images = trainer.batch_size * trainer.augment.num_views
    views_rate = images / median(v for v, _ in pairs)
    model_rate = images / median(m for _, m in pairs)
    return [
        row(
            "views",
            name,
            views_rate,
            "images/s",
            reference=model_rate,
            ratio=median(m / v for v, m in pairs),
            ratio_is="view images/s / model images/s",
            target=VIEWS_TARGET,
            notes=(
                f"views {describe_views(trainer.view_groups)} x batch {trainer.batch_size}, {setting}, "
                f"image {trainer.data.image_size}px; model = backbone forward+backward (a forward per size)"
            ),
        )
    ]
