"""The report's figures: matplotlib on its Agg canvas (no display), one PNG per figure under
``figures/``. They only draw: cluster sizes and t-SNE maps come from what the clustering protocol
wrote beside its result (eval/clustering.npz), E-step clusters from the checkpoint's method state.
"""

from __future__ import annotations

import functools
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sslbench import atomic
from sslbench.evaluate import side_file
from sslbench.report.stats import HEADLINE, PAIR, TOP1, headline_stats, pair_id, pair_name
from sslbench.report.tables import Run, Tables, first_seed_runs

MAX_ESTEP_PANELS = 6


@dataclass
class Figure:
    kind: str
    caption: str
    png: bytes | None  # None: no data for it


def draw_figures(pair: tuple[str, str], tables: Tables, runs: list[Run], figures_dir: Path) -> list[Figure]:
    """Every figure of one (pretraining, evaluation) dataset pair, written to
    ``figures_dir/<pair id>_<kind>.png``; the training figures (curves, E-step) with the pretraining
    set's own pair only."""
    pretrain, target = pair
    rows = tables.table[
        (tables.table["pretrain_dataset"] == pretrain) & (tables.table["eval_dataset"] == target)
    ]
    colours = method_colours(sorted(rows["method"].unique()))
    name = pair_name(*pair)
    firsts = [r for r in first_seed_runs(runs, pretrain) if r.method in colours]
    sides = {r.method: read_clustering_side_file(r, target) for r in firsts}
    sides = {method: side for method, side in sides.items() if side is not None}
    own = pretrain == target  # training happened on this pair's dataset: its curves and E-steps
    estep = [panel for r in firsts for panel in estep_assignments(r)][:MAX_ESTEP_PANELS] if own else []
    drawn = [
        (
            "bars",
            bar_chart(tables.summary, pair, colours),
            "Headline metrics per protocol with 95% confidence intervals",
        ),
        (
            "lowshot",
            lowshot_curves(rows, name, colours),
            "Low-shot SVM: mAP against labelled examples per class",
        ),
        *(
            [
                (
                    "training",
                    training_curves(runs, pretrain, colours),
                    "Training curves: loss and images/s per epoch",
                ),
                (
                    "monitors",
                    monitor_curves(runs, pretrain, colours),
                    "While training: the kNN top-1 of held-out train images, RankMe and the features' std "
                    "per epoch (the monitors; mean over seeds, band from the lowest seed to the highest)",
                ),
            ]
            if own
            else []
        ),
        (
            "tsne",
            tsne_maps(sides, name),
            "t-SNE of test features, coloured by class (computed by the clustering protocol)",
        ),
        (
            "kmeans",
            size_panels(kmeans_sizes(sides), kmeans_title(sides, name)),
            "Cluster sizes of the clustering protocol's k-means (k = classes) on each method's test features",
        ),
        *(
            [
                (
                    "estep",
                    size_panels(
                        estep, f"{name}: cluster sizes of the E-step assignments stored in the checkpoint"
                    ),
                    "Cluster sizes of PCL's E-step (method state buffers named *assign*)",
                )
            ]
            if own
            else []
        ),
    ]
    return [
        Figure(kind, caption, save_figure(fig, figures_dir, f"{pair_id(*pair)}_{kind}"))
        for kind, fig, caption in drawn
    ]


def draw_ablations(ablations: pd.DataFrame, figures_dir: Path) -> list[Figure]:
    """One figure per swept setting (``figures_dir/ablation_<setting>.png``), from ablations.csv's rows."""
    return [
        Figure(
            f"ablation-{setting}",
            f"Ablation over {setting}: kNN and linear top-1 against the value each run trained with, mean "
            "over seeds, error bars 95% CI (none with one seed); one line per method sweeping it",
            save_figure(
                ablation_figure(setting, rows), figures_dir, "ablation_" + re.sub(r"[^\w.=-]", "_", setting)
            ),
        )
        for setting, rows in ablations.groupby("setting", sort=True)
    ]


def ablation_figure(setting: str, rows: pd.DataFrame):
    """One panel per (dataset pair, metric); numbers on a numeric axis (log where they span a decade),
    other values (a policy's name) as grouped points, side by side per method."""
    metrics = [(p, m) for _, p, m in TOP1]
    panels = sorted(
        rows.groupby([*PAIR, "protocol", "metric"]),
        key=lambda panel: (panel[0][0], panel[0][0] != panel[0][1], panel[0][1], metrics.index(panel[0][2:])),
    )  # each pretraining set's own target first, kNN before linear
    numbers = pd.to_numeric(rows["value"], errors="coerce")
    categorical = numbers.isna().any()
    values = sorted(set(rows["value"].astype(str))) if categorical else sorted(set(numbers))
    bases = sorted(rows["method_base"].unique())
    colours = method_colours(bases)
    fig, axes = new_figure(len(panels), width=4.4, height=3.4, columns=4)
    for ax, ((pretrain, target, protocol, metric), data) in zip(axes, panels):
        for i, (base, line) in enumerate(data.groupby("method_base", sort=True)):
            if categorical:
                x = [values.index(str(v)) + (i - (len(bases) - 1) / 2) * 0.15 for v in line["value"]]
            else:
                x = pd.to_numeric(line["value"]).to_numpy()
            errors = (100 * line["ci95"]).fillna(0.0).to_numpy()
            marker = method_marker(colours, base)
            style = {"color": colours[base], "label": base, "marker": marker, "capsize": 3}
            ax.errorbar(x, 100 * line["mean"], yerr=errors, linestyle="none" if categorical else "-", **style)
        if categorical:
            ax.set_xticks(range(len(values)), values, rotation=20, ha="right")
        else:
            if min(values) > 0 and max(values) >= 10 * min(values):
                ax.set_xscale("log")
            ax.set_xticks(values, [f"{v:g}" for v in values], rotation=30, ha="right")
            ax.minorticks_off()  # the swept values are the ticks
        label = next(label for label, p, m in TOP1 if (p, m) == (protocol, metric))
        ax.set_title(f"{pair_name(pretrain, target)}: {label}", fontsize=9)
        ax.set_xlabel(setting)
        ax.set_ylabel("%")
        ax.legend(fontsize=7)
    fixed_layout(fig, axes, f"{setting}: mean over seeds, error bars 95% CI")
    return fig


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")  # beside the colour: a line's method, also in grey print


def method_colours(methods: list[str]) -> dict[str, tuple]:
    """A colour per method (in sorted order), distinct for up to 40 methods: tab10, then tab20's light
    tones of those ten, then tab20b's twenty; past 40 they repeat, and ``method_marker`` tells them apart."""
    from matplotlib import colormaps

    palette = [*colormaps["tab10"].colors, *colormaps["tab20"].colors[1::2], *colormaps["tab20b"].colors]
    return {m: palette[i % len(palette)] for i, m in enumerate(sorted(methods))}


def method_marker(colours: dict[str, tuple], method: str) -> str:
    """The marker of ``method`` among the methods of ``colours`` (its index i in their order): marker
    (i + i // 40) mod 8, so methods 40k apart, which share a colour, differ in marker unless k is a
    multiple of 8: no two of the first 320 methods share both."""
    i = list(colours).index(method)
    return MARKERS[(i + i // 40) % len(MARKERS)]


def new_figure(panels: int, width: float = 4.2, height: float = 3.4, columns: int = 3):
    """A figure of ``panels`` panels, ``columns`` to a row; ``fixed_layout`` places them once drawn on.
    No layout engine: constrained layout measures every artist of every panel in a draw of its own
    before the one that paints, most of the report's time on grids of many panels."""
    from matplotlib.figure import Figure  # the Agg canvas: no display, no global pyplot state

    columns = max(1, min(columns, panels))
    rows = math.ceil(panels / columns)
    fig = Figure(figsize=(width * columns, height * rows))
    grid = fig.add_gridspec(rows, columns)
    return fig, [fig.add_subplot(grid[i // columns, i % columns]) for i in range(panels)]  # none hidden


POINT = 1 / 72  # inch
PAD = 4 * POINT  # between what surrounds a panel and its neighbour's, and at the figure's edges
MIN_PANEL = 0.3  # of its cell: the least a panel keeps where labels would take more


def fixed_layout(fig, axes, suptitle: str | None = None, fontsize: float = 10) -> None:
    """Place the panels of ``new_figure`` (and the figure's title, if any) with room for what surrounds
    each: its title, tick labels, axis labels, measured from their text as the draw will lay them out.
    Every panel gets the largest room any needs, as constrained layout would give it, without a draw.
    Like constrained layout, the width of a title or an x label and the height of a y label take no
    room."""
    rows, columns = axes[0].get_subplotspec().get_gridspec().get_geometry()
    width, height = fig.get_size_inches()
    top = PAD
    if suptitle is not None:
        title = fig.suptitle(suptitle, fontsize=fontsize, y=1 - PAD / height, verticalalignment="top")
        top += extent(title)[1] + PAD
    around = np.zeros(4)  # left, right, above, below: what sticks out of every panel's frame
    # measured twice: tick labels depend on the panel's size, x labels' overhang on its width
    for measure in (True, True, False):
        left, right, above, below = around
        w = fitted(width, columns, PAD + left, PAD + right, left + right + 2 * PAD)
        h = fitted(height, rows, top + above, PAD + below, above + below + 2 * PAD)
        fig.subplots_adjust(
            left=w.start / width,
            right=1 - w.end / width,
            bottom=h.end / height,
            top=1 - h.start / height,
            wspace=w.gap / w.panel,
            hspace=h.gap / h.panel,
        )
        if measure:
            around = np.max([surroundings(ax, w.panel) for ax in axes], axis=0)
    for ax in axes:
        if (
            ax.get_title()
            and not ax.yaxis.major.formatter.get_offset()
            and ax.xaxis.get_ticks_position() == "bottom"
        ):
            # at the frame's top, where each draw would put it after measuring the y axis again
            ax.set_title(ax.get_title(), fontsize=ax.title.get_fontsize(), y=1.0)


@dataclass
class Span:
    """One direction of a grid, in inches: margins at its start and end, the gap between panels and
    each panel's size."""

    start: float
    end: float
    gap: float
    panel: float


def fitted(size: float, count: int, start: float, end: float, gap: float) -> Span:
    """``count`` panels between margins ``start`` and ``end`` with ``gap`` between them; where they
    would leave a panel less than MIN_PANEL of its cell, margins and gaps shrink in proportion."""
    room = start + end + (count - 1) * gap
    least = MIN_PANEL * size / count
    scale = min(1.0, (size - count * least) / room) if room > 0 else 1.0
    start, end, gap = start * scale, end * scale, gap * scale
    return Span(start, end, gap, (size - start - end - (count - 1) * gap) / count)


def surroundings(ax, width: float) -> tuple[float, float, float, float]:
    """What sticks out of one panel's frame, in inches: left, right, above, below, for a panel
    ``width`` inches wide. Tick labels as the axes' locators and formatters give them, with the first
    tick's font, rotation and alignment (every tick copies it)."""
    import matplotlib as mpl

    left = right = above = below = 0.0
    if ax.title.get_text():
        above = extent(ax.title)[1] + mpl.rcParams["axes.titlepad"] * POINT
    ticks, offset = tick_labels(ax.yaxis)
    if ticks:
        tick = ax.yaxis.majorTicks[0]
        labels = max(extent(tick.label1, text)[0] for _, text in ticks)
        left = max(left, labels + (tick.get_tick_padding() + tick.get_pad()) * POINT)
    if offset:  # above the panel's top left; the title moves up over it
        above += extent(ax.yaxis.offsetText, offset)[1]
    if ax.yaxis.label.get_visible() and ax.yaxis.label.get_text():
        left += extent(ax.yaxis.label)[0] + ax.yaxis.labelpad * POINT
    ticks, offset = tick_labels(ax.xaxis)
    if ticks:
        tick = ax.xaxis.majorTicks[0]
        boxes = [(at, *extent(tick.label1, text)) for at, text in ticks]  # place, width, height
        below = max(high for _, _, high in boxes) + (tick.get_tick_padding() + tick.get_pad()) * POINT
        # the share of a label's width left and right of its tick
        share = {"left": (0.0, 1.0), "center": (0.5, 0.5), "right": (1.0, 0.0)}[tick.label1.get_ha()]
        left = max(left, *(share[0] * wide - at * width for at, wide, _ in boxes))
        right = max(right, *(share[1] * wide - (1 - at) * width for at, wide, _ in boxes))
    if offset:
        below += extent(ax.xaxis.offsetText, offset)[1]
    if ax.xaxis.label.get_visible() and ax.xaxis.label.get_text():
        below += extent(ax.xaxis.label)[1] + ax.xaxis.labelpad * POINT
    return left, right, above, below


def tick_labels(axis) -> tuple[list[tuple[float, str]], str]:
    """The major tick labels ``axis`` will draw, each with its place along the panel (0 to 1), and the
    axis' offset text: what the draw computes, from the same locator and formatter."""
    locs = axis.get_majorticklocs()
    if not len(locs) or not axis.majorTicks[0].label1.get_visible():
        return [], ""
    texts = axis.major.formatter.format_ticks(locs)
    low, high = axis.get_transform().transform(sorted(axis.get_view_interval()))
    slack = (high - low) * 1e-10  # matplotlib's own tolerance for a tick at an edge
    places = axis.get_transform().transform(np.asarray(locs, float))
    ticks = [
        ((at - low) / (high - low) if high > low else 0.5, text)
        for at, text in zip(places, texts)
        if low - slack <= at <= high + slack and text
    ]
    return ticks, axis.major.formatter.get_offset()


def extent(text, string: str | None = None) -> tuple[float, float]:
    """Width and height in inches of a matplotlib Text's box (rotated as it is), or of ``string`` in
    its font and rotation, as the Agg renderer lays it out."""
    string = text.get_text() if string is None else string
    return text_box(string, text.get_fontproperties().copy(), text.get_rotation())


@functools.cache  # the same tick labels, method names and titles recur across panels and figures
def text_box(string: str, font, rotation: float) -> tuple[float, float]:
    from matplotlib.text import Text

    figure, renderer = measuring()
    text = Text(text=string, fontproperties=font, rotation=rotation)
    text.set_figure(figure)
    box = text.get_window_extent(renderer, dpi=72)  # at 72 dpi a pixel is a point
    return box.width * POINT, box.height * POINT


@functools.cache
def measuring():
    """A figure and an Agg renderer at 72 dpi, to lay out texts on no figure of their own."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure

    return Figure(dpi=72), RendererAgg(1, 1, 72)


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    return buffer.getvalue()


def bar_chart(summary: pd.DataFrame, pair: tuple[str, str], colours: dict):
    parts = headline_stats(summary, pair)
    present = [c for c in parts["mean"].columns if parts["mean"][c].notna().any()]
    if not present:
        return None
    fig, axes = new_figure(len(present), width=4.0, height=3.2, columns=4)
    of_pair = summary[(summary["pretrain_dataset"] == pair[0]) & (summary["eval_dataset"] == pair[1])]
    ci = of_pair.set_index(["method", "protocol", "metric"])["ci95"]
    for ax, column in zip(axes, present):
        protocol, metric = next((p, m) for label, p, m in HEADLINE if label == column)
        means = parts["mean"][column].dropna()
        errors = [ci.get((m, protocol, metric), math.nan) for m in means.index]
        errors = [100 * e if math.isfinite(e) else 0.0 for e in errors]
        ax.bar(
            range(len(means)),
            100 * means.to_numpy(),
            yerr=errors,
            capsize=4,
            color=[colours[m] for m in means.index],
        )
        ax.set_xticks(range(len(means)), means.index, rotation=30, ha="right")
        ax.set_title(column, fontsize=10)
        ax.set_ylabel("%")
    fixed_layout(
        fig, axes, f"{pair_name(*pair)}: mean over seeds, error bars 95% CI (Student t; none with one seed)"
    )
    return fig


def lowshot_curves(table: pd.DataFrame, dataset: str, colours: dict):
    """``table``: the rows of one dataset pair (``dataset`` names it)."""
    rows = table[table["protocol"] == "lowshot_svm"]
    found = rows["metric"].str.extract(r"^map_k(\d+)_(mean|min|max)$")
    rows = rows.assign(k=pd.to_numeric(found[0]), stat=found[1]).dropna(subset=["k"])
    if rows.empty:
        return None
    fig, (ax,) = new_figure(1, width=6.0, height=4.0)
    for method, data in rows.groupby("method", sort=True):
        mean = data[data["stat"] == "mean"].groupby("k")["value"].mean()
        low = data[data["stat"] == "min"].groupby("k")["value"].min().reindex(mean.index)
        high = data[data["stat"] == "max"].groupby("k")["value"].max().reindex(mean.index)
        ax.plot(
            mean.index, 100 * mean, marker=method_marker(colours, method), color=colours[method], label=method
        )
        if low.notna().all() and high.notna().all():
            ax.fill_between(mean.index, 100 * low, 100 * high, color=colours[method], alpha=0.15)
    ks = sorted(rows["k"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [f"{k:g}" for k in ks])
    ax.set_xlabel("labelled examples per class (k)")
    ax.set_ylabel("mAP (%)")
    ax.set_title(
        f"{dataset}: low-shot SVM; line: mean over seeds, band: min–max over samples and seeds", fontsize=9
    )
    ax.legend(fontsize=8)
    fixed_layout(fig, [ax])
    return fig


def training_curves(runs: list[Run], dataset: str, colours: dict):
    from matplotlib.ticker import MaxNLocator

    logs = [r.log.assign(method=r.method, seed=r.seed) for r in runs if r.dataset == dataset and len(r.log)]
    if not logs:
        return None
    logs = pd.concat(logs, ignore_index=True)
    fig, axes = new_figure(2, width=5.5, height=3.6, columns=2)
    for method, data in logs.groupby("method", sort=True):
        mean = data.groupby("epoch")[["loss", "images_per_s"]].mean()
        marker = method_marker(colours, method)  # with 1 epoch: a dot
        style = {"color": colours[method], "label": method, "marker": marker, "markersize": 3}
        axes[0].plot(mean.index, mean["loss"], **style)
        axes[1].plot(mean.index, mean["images_per_s"], **style)
    for ax, label in zip(axes, ("training loss", "images/s")):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_title(f"{dataset}: {label} (mean over seeds)", fontsize=10)
        ax.legend(fontsize=8)
    fixed_layout(fig, axes)
    return fig


# The monitors' columns of train_log.csv (sslbench.pretrain.monitors) and what each panel calls them.
MONITOR_PANELS = {
    "knn_top1": "kNN top-1 of held-out train images",
    "rankme": "RankMe (1: collapsed)",
    "feature_std": "std of the features (0: collapsed)",
}


def monitor_curves(runs: list[Run], dataset: str, colours: dict):
    """The monitors against epoch, one panel each: per method the mean over its seeds on the epochs
    they were measured, with a band from the lowest seed to the highest. None where no run has them."""
    from matplotlib.ticker import MaxNLocator

    logs = [
        r.log.assign(method=r.method, seed=r.seed)
        for r in runs
        if r.dataset == dataset and set(MONITOR_PANELS) <= set(r.log.columns)
    ]
    logs = pd.concat(logs, ignore_index=True).dropna(subset=["rankme"]) if logs else pd.DataFrame()
    if logs.empty:
        return None
    fig, axes = new_figure(len(MONITOR_PANELS), width=4.6, height=3.6, columns=3)
    for method, data in logs.groupby("method", sort=True):
        by_epoch = data.groupby("epoch")[list(MONITOR_PANELS)]
        mean, low, high = by_epoch.mean(), by_epoch.min(), by_epoch.max()
        style = {
            "color": colours[method],
            "label": method,
            "marker": method_marker(colours, method),
            "markersize": 3,
        }
        for ax, column in zip(axes, MONITOR_PANELS):
            ax.plot(mean.index, mean[column], **style)
            ax.fill_between(
                mean.index, low[column], high[column], color=colours[method], alpha=0.15, linewidth=0
            )
    for ax, label in zip(axes, MONITOR_PANELS.values()):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_title(f"{dataset}: {label}", fontsize=10)
    axes[0].legend(fontsize=8)
    fixed_layout(fig, axes)
    return fig


def read_clustering_side_file(run: Run, target: str) -> dict | None:
    """What the clustering protocol wrote beside its result on ``target`` (None where it did not run)."""
    from sslbench.extract.featurefile import load_features

    path = side_file(run.folder / "eval" / target / "clustering.json")
    return load_features(path) if path.is_file() else None


def tsne_maps(sides: dict[str, dict], dataset: str):
    sides = {method: side for method, side in sides.items() if "tsne" in side}  # seeds without maps: skipped
    methods = sorted(sides)
    if not methods:
        return None
    fig, axes = new_figure(len(methods), width=3.6, height=3.6, columns=4)
    for ax, method in zip(axes, methods):
        xy, y, num_classes = sides[method]["tsne"], sides[method]["tsne_labels"], sides[method]["num_classes"]
        ax.scatter(
            xy[:, 0],
            xy[:, 1],
            c=y,
            s=6,
            cmap="tab10" if num_classes <= 10 else "turbo",
            vmin=0,
            vmax=max(num_classes - 1, 1),
        )
        ax.set_title(f"{method} ({len(xy)} test images)", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fixed_layout(
        fig, axes, f"{dataset}: t-SNE of test features (seed {seeds_note(sides)}), coloured by class"
    )
    return fig


def seeds_note(sides: dict[str, dict]) -> str:
    return ", ".join(map(str, sorted({int(side["meta"]["kmeans"]["seed"]) for side in sides.values()})))


def sorted_sizes(assignments: np.ndarray, k: int | None = None) -> np.ndarray:
    """Cluster sizes, largest first (empty clusters count when k is given)."""
    assignments = assignments[assignments >= 0]
    return np.sort(np.bincount(assignments, minlength=k or 0))[::-1]


def size_panels(panels: list[tuple[str, np.ndarray]], title: str):
    if not panels:
        return None
    fig, axes = new_figure(len(panels), width=3.8, height=3.0, columns=4)
    for ax, (name, sizes) in zip(axes, panels):
        ax.bar(np.arange(len(sizes)), sizes, width=1.0, color="#4c72b0")
        ax.axhline(sizes.sum() / len(sizes), color="black", linestyle="--", linewidth=1, label="equal sizes")
        ax.set_title(f"{name}: {len(sizes)} clusters", fontsize=9)
        ax.set_xlabel("cluster (largest first)")
        ax.set_ylabel("images")
        ax.legend(fontsize=7)
    fixed_layout(fig, axes, title)
    return fig


def kmeans_sizes(sides: dict[str, dict]) -> list[tuple[str, np.ndarray]]:
    """Cluster sizes of the clustering protocol's first restart at k = classes, per method."""
    return [
        (method, sorted_sizes(sides[method]["assignments"][0], sides[method]["meta"]["kmeans"]["k"]))
        for method in sorted(sides)
    ]


def kmeans_title(sides: dict[str, dict], dataset: str) -> str:
    """What the k-means shown is: the clustering protocol's own run, as it recorded it."""
    runs = {
        (s["k"], s["niter"], s["nredo"], s["spherical"], s["restarts"])
        for s in (side["meta"]["kmeans"] for side in sides.values())
    }
    how = "; ".join(
        f"k = {k}, {niter} iterations, best of {nredo}{', spherical' if spherical else ''}, "
        f"every test point, restart 1 of {restarts}"
        for k, niter, nredo, spherical, restarts in sorted(runs)
    )
    return f"{dataset}: cluster sizes of the clustering protocol's faiss k-means on test features ({how})"


def estep_assignments(run: Run) -> list[tuple[str, np.ndarray]]:
    """Buffers named *assign* in the checkpoint's method state (PCL's E-step), one panel per clustering."""
    path = run.folder / "checkpoint.pt"
    if not path.is_file():
        return []
    try:
        state = atomic.load_torch(path, mmap=True).get("method_state", {})
    except Exception as err:  # optional picture: a broken checkpoint is reported, not fatal here
        print(f"[sslbench] report: skipping E-step clusters of {path}: {type(err).__name__}: {err}")
        return []
    panels = []
    for name, value in sorted(state.items()):
        if "assign" not in name or not hasattr(value, "dtype") or value.dtype.is_floating_point:
            continue
        rows = value.reshape(-1, value.shape[-1]) if value.dim() > 1 else value.reshape(1, -1)
        for i, row in enumerate(rows.numpy().astype(np.int64)):
            if (row >= 0).any():
                label = name if len(rows) == 1 else f"{name}[{i}]"
                panels.append((f"{run.method} {label}", sorted_sizes(row)))
    return panels


def save_figure(fig, figures_dir: Path, name: str) -> bytes | None:
    if fig is None:
        return None
    png = png_bytes(fig)
    atomic.write_bytes(figures_dir / f"{name}.png", png)
    return png
