"""The report: the DAG's last stage turns ``results/table.csv`` and the run folders
into tables (CSV, Markdown) and one self-contained HTML page.

Every number a table shows is read from a CSV this module writes next to the page
(summary.csv, comparisons.csv, reproduced.csv, cost.csv, environment.csv), so the
page can be checked against them. Figures are PNGs (matplotlib's Agg canvas, no
display) written under ``figures/`` and embedded in the page as base64; the page
loads nothing from anywhere else and runs no script.

Displayed numbers: metrics are fractions shown in percent with two decimals.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import atomic
from .stats import (
    HEADLINE,
    MISSING,
    TableError,
    best_methods,
    check_table,
    headline_comparisons,
    headline_stats,
    headline_table,
    percent,
    reproduced_vs_reported,
    summarise,
)

TSNE_POINTS = 500
KMEANS_NITER = 20
MAX_ESTEP_PANELS = 6


class ReportInputError(FileNotFoundError):
    pass


# --------------------------------------------------------------------------- inputs
@dataclass
class Run:
    dataset: str
    method: str
    seed: int
    folder: Path
    cfg: dict
    meta: dict
    log: pd.DataFrame = field(repr=False)


def read_table(results_dir: Path) -> pd.DataFrame:
    path = results_dir / "table.csv"
    if not path.is_file():
        raise ReportInputError(f"{path}: not found; build it first with `snakemake results/table.csv`")
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise TableError(f"{path}: unreadable ({err}); delete it and rerun snakemake") from err
    if table.empty:
        raise TableError(f"{path}: holds no results; run at least one method and protocol first")
    return check_table(table, str(path))


def run_folder(results_dir: Path, dataset: str, method: str, seed: int) -> Path:
    return results_dir / dataset / method / f"seed{seed}"


def read_run(results_dir: Path, dataset: str, method: str, seed: int) -> Run:
    folder = run_folder(results_dir, dataset, method, seed)
    run_json, log_csv = folder / "run.json", folder / "train_log.csv"
    for path in (run_json, log_csv):
        if not path.is_file():
            raise ReportInputError(
                f"{path}: not found, but table.csv has results of this run; rerun snakemake to retrain it"
            )
    try:
        record = json.loads(run_json.read_text())
        cfg, meta = record["cfg"], record["meta"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise TableError(
            f"{run_json}: unreadable or without cfg/meta ({err}); delete the run folder and rerun snakemake"
        ) from err
    try:
        log = pd.read_csv(log_csv)
    except pd.errors.EmptyDataError:  # a method that does not train (the untrained floor) logs no epoch
        log = pd.DataFrame(columns=["epoch", "loss", "images_per_s"])
    return Run(dataset, method, seed, folder, cfg, meta, log)


def read_runs(results_dir: Path, table: pd.DataFrame) -> list[Run]:
    keys = table[["dataset", "method", "seed"]].drop_duplicates().sort_values(["dataset", "method", "seed"])
    return [read_run(results_dir, d, m, int(s)) for d, m, s in keys.itertuples(index=False)]


def first_seed_runs(runs: list[Run], dataset: str) -> list[Run]:
    """One run per method (its smallest seed, normally seed 0) for the per-method pictures."""
    chosen: dict[str, Run] = {}
    for run in runs:
        if run.dataset == dataset and (run.method not in chosen or run.seed < chosen[run.method].seed):
            chosen[run.method] = run
    return [chosen[m] for m in sorted(chosen)]


# --------------------------------------------------------------------------- tables
def settings_footnote(table: pd.DataFrame, dataset: str) -> str:
    rows = table[table["dataset"] == dataset]
    parts = [f"dataset {dataset}"]
    for column, label in (("backbone", "backbone"), ("epochs", "epochs")):
        if column not in rows:
            continue
        per_method = rows.groupby("method")[column].agg(lambda v: ", ".join(sorted(map(str, v.unique()))))
        if per_method.nunique() == 1:
            parts.append(f"{label} {per_method.iloc[0]}")
        else:
            parts.append(f"{label} " + ", ".join(f"{m}: {v}" for m, v in per_method.items()))
    seeds = sorted(int(s) for s in rows["seed"].unique())
    parts.append("seeds " + ", ".join(map(str, seeds)))
    return (
        "Settings: " + "; ".join(parts) + ". Cells: mean ± std over seeds, in %; best of each column "
        f"in bold; {MISSING}: not evaluated."
    )


def headline_markdown(summary: pd.DataFrame, dataset: str, footnote: str) -> str:
    cells = headline_table(summary, dataset)
    best = best_methods(headline_stats(summary, dataset)["mean"])
    header = "| method | " + " | ".join(cells.columns) + " |"
    rule = "|---|" + "---:|" * len(cells.columns)
    lines = [header, rule]
    for method, row in cells.iterrows():
        shown = [f"**{row[c]}**" if method in best[c] else row[c] for c in cells.columns]
        lines.append(f"| {method} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + f"\n\n{footnote}\n"


def fmt(value, spec: str) -> str:
    """A number for display; missing (None/NaN) as "—"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return format(value, spec)


def fmt_percent(value) -> str:
    return MISSING if value is None or not math.isfinite(value) else percent(value)


def summary_display(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary[["dataset", "method", "protocol", "metric"]].copy()
    for column in ("mean", "std", "ci95"):
        out[f"{column} (%)"] = summary[column].map(fmt_percent)
    out["n"] = summary["n"].astype(str)
    return out


def comparisons_display(comparisons: pd.DataFrame) -> pd.DataFrame:
    out = comparisons[["dataset", "protocol", "metric", "method_a", "method_b"]].copy()
    out["mean A − B (% points)"] = comparisons["mean_diff"].map(fmt_percent)
    out["p (paired t)"] = comparisons["p_value"].map(lambda p: fmt(p, ".3g"))
    out["n"] = comparisons["n"].astype(str)
    out["verdict"] = comparisons["verdict"]
    return out


def reproduced_display(reproduced: pd.DataFrame) -> pd.DataFrame:
    out = reproduced[["method", "dataset", "paper_backbone", "paper_epochs", "protocol", "metric"]].copy()
    out = out.rename(columns={"paper_backbone": "backbone", "paper_epochs": "epochs"})
    out["reported (%)"] = reproduced["reported"].map(fmt_percent)
    out["ours (%)"] = reproduced["ours"].map(fmt_percent)
    out["std (%)"] = reproduced["std"].map(fmt_percent)
    out["n"] = reproduced["n"].astype(str)
    out["gap (% points)"] = reproduced["gap"].map(fmt_percent)
    out["source"] = reproduced["source"]
    out["how to reproduce"] = reproduced["reproduce"].replace("", MISSING)
    return out


def cost_table(runs: list[Run], table: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, method): mean over seeds of training time and throughput, peak GPU memory, devices."""
    per_run = pd.DataFrame(
        [
            {
                "dataset": r.dataset,
                "method": r.method,
                "seed": r.seed,
                "train_wall_time_s": r.meta.get("train_wall_time_s"),
                "images_per_s": r.meta.get("images_per_s"),
                "peak_gpu_memory_mib": (
                    r.meta["peak_gpu_memory_bytes"] / 2**20
                    if r.meta.get("peak_gpu_memory_bytes") is not None
                    else None
                ),
                "device": r.meta.get("device", "unknown"),
            }
            for r in runs
        ]
    )
    numeric = ["train_wall_time_s", "images_per_s", "peak_gpu_memory_mib"]
    per_run[numeric] = per_run[numeric].apply(pd.to_numeric, errors="coerce")
    grouped = per_run.groupby(["dataset", "method"], sort=True)
    out = grouped.agg(
        seeds=("seed", "count"),
        train_wall_time_s=("train_wall_time_s", "mean"),
        images_per_s=("images_per_s", "mean"),
        peak_gpu_memory_mib=("peak_gpu_memory_mib", "max"),
        device=("device", lambda v: ", ".join(sorted(set(map(str, v))))),
    ).reset_index()
    if "eval_wall_time_s" in table:
        # table.csv repeats a protocol's wall time on each of its metric rows: one per (run, protocol)
        per_protocol = table.drop_duplicates(["dataset", "method", "seed", "protocol"])
        per_seed = per_protocol.groupby(["dataset", "method", "seed"])["eval_wall_time_s"].sum()
        eval_time = per_seed.groupby(["dataset", "method"]).mean().rename("eval_wall_time_s").reset_index()
        out = out.merge(eval_time, on=["dataset", "method"], how="left")
    return out


def cost_display(cost: pd.DataFrame) -> pd.DataFrame:
    out = cost[["dataset", "method"]].copy()
    out["seeds"] = cost["seeds"].astype(str)
    out["training wall time (s)"] = cost["train_wall_time_s"].map(lambda v: fmt(v, ".1f"))
    out["images/s"] = cost["images_per_s"].map(lambda v: fmt(v, ".0f"))
    out["peak GPU memory (MiB)"] = cost["peak_gpu_memory_mib"].map(lambda v: fmt(v, ".0f"))
    if "eval_wall_time_s" in cost:
        out["evaluation wall time (s)"] = cost["eval_wall_time_s"].map(lambda v: fmt(v, ".1f"))
    out["device"] = cost["device"]
    return out


def environment_table(runs: list[Run]) -> pd.DataFrame:
    """One row per run: where and with what code it was trained."""
    rows = []
    for r in runs:
        versions = r.meta.get("versions", {}) or {}
        rows.append(
            {
                "dataset": r.dataset,
                "method": r.method,
                "seed": r.seed,
                "device": r.meta.get("device", "unknown"),
                "git_commit": r.meta.get("git_commit", "unknown"),
                "git_dirty": r.meta.get("git_dirty"),
                **{f"version_{k}": v for k, v in sorted(versions.items())},
            }
        )
    return pd.DataFrame(rows)


def versions_display(environment: pd.DataFrame) -> pd.DataFrame:
    """Each package's version(s) over all runs; more than one means the runs are not comparable."""
    columns = [c for c in environment.columns if c.startswith("version_")]
    rows = [
        {
            "package": c.removeprefix("version_"),
            "version(s)": ", ".join(sorted(map(str, environment[c].dropna().unique()))),
        }
        for c in columns
    ]
    for key in ("git_commit", "git_dirty", "device"):
        rows.append({"package": key, "version(s)": ", ".join(sorted(map(str, environment[key].unique())))})
    return pd.DataFrame(rows, columns=["package", "version(s)"])


# --------------------------------------------------------------------------- figures
def method_colours(methods: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(sorted(methods))}


def new_figure(panels: int, width: float = 4.2, height: float = 3.4, columns: int = 3):
    from matplotlib.figure import Figure  # the Agg canvas: no display, no global pyplot state

    columns = max(1, min(columns, panels))
    rows = math.ceil(panels / columns)
    fig = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    return buffer.getvalue()


def bar_chart(summary: pd.DataFrame, dataset: str, colours: dict):
    parts = headline_stats(summary, dataset)
    present = [c for c in parts["mean"].columns if parts["mean"][c].notna().any()]
    if not present:
        return None
    fig, axes = new_figure(len(present), width=4.0, height=3.2, columns=4)
    ci = summary[summary["dataset"] == dataset].set_index(["method", "protocol", "metric"])["ci95"]
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
    fig.suptitle(
        f"{dataset}: mean over seeds, error bars 95% CI (Student t; none with one seed)", fontsize=10
    )
    return fig


def lowshot_curves(table: pd.DataFrame, dataset: str, colours: dict):
    rows = table[(table["dataset"] == dataset) & (table["protocol"] == "lowshot_svm")]
    found = rows["metric"].str.extract(r"^map_k(\d+)_(mean|min|max)$")
    rows = rows.assign(k=pd.to_numeric(found[0]), stat=found[1]).dropna(subset=["k"])
    if rows.empty:
        return None
    fig, (ax,) = new_figure(1, width=6.0, height=4.0)
    for method, data in rows.groupby("method", sort=True):
        mean = data[data["stat"] == "mean"].groupby("k")["value"].mean()
        low = data[data["stat"] == "min"].groupby("k")["value"].min().reindex(mean.index)
        high = data[data["stat"] == "max"].groupby("k")["value"].max().reindex(mean.index)
        ax.plot(mean.index, 100 * mean, marker="o", color=colours[method], label=method)
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
        style = {"color": colours[method], "label": method, "marker": "o", "markersize": 3}  # 1 epoch: a dot
        axes[0].plot(mean.index, mean["loss"], **style)
        axes[1].plot(mean.index, mean["images_per_s"], **style)
    for ax, label in zip(axes, ("training loss", "images/s")):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_title(f"{dataset}: {label} (mean over seeds)", fontsize=10)
        ax.legend(fontsize=8)
    return fig


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def load_run_features(run: Run) -> dict:
    from .featurefile import load_features

    path = run.folder / "features.npz"
    if not path.is_file():
        raise ReportInputError(f"{path}: not found; rerun snakemake to extract the features of this run")
    return load_features(path)


def tsne_maps(features: dict[str, dict], dataset: str, max_points: int):
    from sklearn.manifold import TSNE

    methods = sorted(features)
    if not methods:
        return None
    fig, axes = new_figure(len(methods), width=3.6, height=3.6, columns=4)
    for ax, method in zip(axes, methods):
        x, y = features[method]["test"], features[method]["test_labels"]
        # the same subsample for every method (same test set, fixed seed): the maps show the same images
        pick = np.sort(np.random.default_rng(0).choice(len(x), size=min(len(x), max_points), replace=False))
        x, y = l2_normalize(x[pick].astype(np.float64)), y[pick]
        perplexity = min(30.0, (len(x) - 1) / 3)
        # exact gradients are cheap at <= 500 points; 500 iterations settle the map (sklearn's minimum is 250)
        xy = TSNE(
            n_components=2, perplexity=perplexity, init="pca", method="exact", max_iter=500, random_state=0
        ).fit_transform(x)
        num_classes = int(features[method]["num_classes"])
        ax.scatter(
            xy[:, 0],
            xy[:, 1],
            c=y,
            s=6,
            cmap="tab10" if num_classes <= 10 else "turbo",
            vmin=0,
            vmax=max(num_classes - 1, 1),
        )
        ax.set_title(f"{method} ({len(x)} test images)", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        f"{dataset}: t-SNE of test features (seed {min_seed_note(features)}), coloured by class", fontsize=10
    )
    return fig


def min_seed_note(features: dict[str, dict]) -> str:
    seeds = sorted({int(f["meta"].get("seed", 0)) for f in features.values()})
    return ", ".join(map(str, seeds))


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
    fig.suptitle(title, fontsize=10)
    return fig


def kmeans_sizes(features: dict[str, dict]) -> list[tuple[str, np.ndarray]]:
    """faiss k-means (k = classes) on each method's L2-normalised test features, as the "
    "clustering protocol."""
    from .kmeans import kmeans

    panels = []
    for method in sorted(features):
        x = np.ascontiguousarray(l2_normalize(features[method]["test"].astype(np.float32)))
        k = min(int(features[method]["num_classes"]), len(x))
        assignment = kmeans(x, k, niter=KMEANS_NITER, seed=0, max_points_per_centroid=None).assignments
        panels.append((method, sorted_sizes(assignment.astype(np.int64), k)))
    return panels


def estep_assignments(run: Run) -> list[tuple[str, np.ndarray]]:
    """Buffers named *assign* in the checkpoint's method state (PCL's E-step), one panel per clustering."""
    path = run.folder / "checkpoint.pt"
    if not path.is_file():
        return []
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("method_state", {})
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


# --------------------------------------------------------------------------- HTML
CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;
color:#222;line-height:1.4}
h1{font-size:1.6em}h2{font-size:1.3em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.1em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td.text,th.text{text-align:left;white-space:normal}
tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}.note{font-size:.85em;color:#555}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.8em}
details{margin:.5em 0}summary{cursor:pointer}
"""

NUMERIC_CELL = re.compile(r"^[-+−]?[\d.]+(e[-+]?\d+)?( ± [\d.]+)?( \(n=1\))?$|^—$")


def html_table(
    frame: pd.DataFrame, table_id: str, bold: set[tuple[int, str]] = frozenset(), caption: str | None = None
) -> str:
    """A table of display strings; text columns left-aligned, numbers right-aligned."""
    text_columns = {
        c for c in frame.columns if not frame[c].astype(str).map(lambda v: bool(NUMERIC_CELL.match(v))).all()
    }
    head = "".join(
        f'<th class="{"text" if c in text_columns else "num"}">{html.escape(str(c))}</th>'
        for c in frame.columns
    )
    body = []
    for i, (_, row) in enumerate(frame.iterrows()):
        cells = []
        for c in frame.columns:
            value = html.escape(str(row[c]))
            if (i, c) in bold:
                value = f"<strong>{value}</strong>"
            cells.append(f'<td class="{"text" if c in text_columns else "num"}">{value}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table id="{table_id}">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def html_figure(png: bytes, figure_id: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="{figure_id}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def headline_html(summary: pd.DataFrame, dataset: str, footnote: str) -> str:
    cells = headline_table(summary, dataset)
    best = best_methods(headline_stats(summary, dataset)["mean"])
    frame = cells.reset_index()
    bold = {(i, c) for i, m in enumerate(cells.index) for c in cells.columns if m in best[c]}
    return (
        html_table(frame, f"table-headline-{dataset}", bold) + f'<p class="note">{html.escape(footnote)}</p>'
    )


@dataclass
class Page:
    sections: list[str] = field(default_factory=list)

    def add(self, title: str, body: str, level: int = 2) -> None:
        self.sections.append(f"<h{level}>{html.escape(title)}</h{level}>{body}")

    def render(self, title: str) -> str:
        return (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{''.join(self.sections)}</body></html>\n"
        )


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def save_figure(fig, figures_dir: Path, name: str) -> bytes | None:
    if fig is None:
        return None
    png = png_bytes(fig)
    atomic.write_bytes(figures_dir / f"{name}.png", png)
    return png


def configs_html(runs: list[Run]) -> str:
    """The resolved config of each method (its first seed's run.json), folded."""
    parts = []
    for dataset in sorted({r.dataset for r in runs}):
        for run in first_seed_runs(runs, dataset):
            text = html.escape(json.dumps(run.cfg, indent=2, sort_keys=True))
            title = html.escape(f"{dataset} / {run.method}: resolved config")
            parts.append(f"<details><summary>{title}</summary><pre>{text}</pre></details>")
    return "".join(parts)


# --------------------------------------------------------------------------- entry point
def read_failures(path: Path) -> pd.DataFrame:
    """results/failures.csv (method, problem), or an empty frame where there is none."""
    if path.exists() and path.stat().st_size:
        return pd.read_csv(path, dtype=str)
    return pd.DataFrame(columns=["method", "problem"])


def build_report(
    results_dir: str | Path,
    methods_dir: str | Path,
    config_dir: str | Path,
    out_dir: str | Path,
    tsne_points: int = TSNE_POINTS,
) -> Path:
    """Write summary.csv, comparisons.csv, reproduced.csv, cost.csv, environment.csv, table.md,
    figures/*.png and report.html into ``out_dir``; return the path of report.html."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    figures_dir = out_dir / "figures"
    table = read_table(results_dir)
    runs = read_runs(results_dir, table)

    summary = summarise(table)
    comparisons = headline_comparisons(table)
    reproduced = reproduced_vs_reported(table, methods_dir, config_dir)
    cost = cost_table(runs, table)
    environment = environment_table(runs)
    for name, frame in (
        ("summary", summary),
        ("comparisons", comparisons),
        ("reproduced", reproduced),
        ("cost", cost),
        ("environment", environment),
    ):
        atomic.write_text(out_dir / f"{name}.csv", frame.to_csv(index=False))

    datasets = sorted(table["dataset"].unique())
    footnotes = {d: settings_footnote(table, d) for d in datasets}
    markdown = "\n".join(
        (f"### {d}\n\n" if len(datasets) > 1 else "") + headline_markdown(summary, d, footnotes[d])
        for d in datasets
    )
    failures = read_failures(Path(results_dir) / "failures.csv")
    if len(failures):  # method folders skipped with --keep-going: never silently absent from the table
        markdown += "\n\nFailed (not run): " + "; ".join(f"{m}: {why}" for m, why in failures.values)
    atomic.write_text(out_dir / "table.md", markdown)

    page = Page()
    for d in datasets:
        page.add(f"Headline: {d}", headline_html(summary, d, footnotes[d]))
    if len(failures):
        page.add(
            "Failed method folders",
            html_table(failures, "table-failures")
            + note("Skipped with --keep-going: fix these folders and rerun (results/failures.csv)."),
        )
    page.add(
        "Reproduced vs reported",
        (
            html_table(reproduced_display(reproduced), "table-reproduced")
            if len(reproduced)
            else '<p id="table-reproduced" class="note">'
            "No methods/&lt;name&gt;/paper.yaml lists reported numbers.</p>"
        )
        + note(
            "Reported: the paper's number (methods/<name>/paper.yaml). Ours: our runs with the "
            "paper's dataset, "
            "backbone and epochs; gap = ours − reported. Otherwise: the preset that would produce it."
        ),
    )
    page.add(
        "Paired comparisons",
        html_table(comparisons_display(comparisons), "table-comparisons")
        + note(
            "Each headline metric, every pair of methods, paired by seed (scipy.stats.ttest_rel). "
            "Verdict at alpha 0.05 per pair, not corrected for the number of pairs."
        ),
    )

    for d in datasets:
        colours = method_colours(sorted(table.loc[table["dataset"] == d, "method"].unique()))
        firsts = first_seed_runs(runs, d)
        features = {r.method: load_run_features(r) for r in firsts}
        estep = [panel for r in firsts for panel in estep_assignments(r)][:MAX_ESTEP_PANELS]
        figures = [
            (
                "bars",
                bar_chart(summary, d, colours),
                "Headline metrics per protocol with 95% confidence intervals",
            ),
            (
                "lowshot",
                lowshot_curves(table, d, colours),
                "Low-shot SVM: mAP against labelled examples per class",
            ),
            ("training", training_curves(runs, d, colours), "Training curves: loss and images/s per epoch"),
            ("tsne", tsne_maps(features, d, tsne_points), "t-SNE of test features, coloured by class"),
            (
                "kmeans",
                size_panels(
                    kmeans_sizes(features), f"{d}: faiss k-means (k = classes) cluster sizes on test features"
                ),
                "Cluster sizes of k-means on each method's test features",
            ),
            (
                "estep",
                size_panels(estep, f"{d}: cluster sizes of the E-step assignments stored in the checkpoint"),
                "Cluster sizes of PCL's E-step (method state buffers named *assign*)",
            ),
        ]
        body = []
        for kind, fig, caption in figures:
            png = save_figure(fig, figures_dir, f"{d}_{kind}")
            if png is not None:
                body.append(html_figure(png, f"fig-{kind}-{d}", caption))
            else:
                body.append(
                    f'<p class="note" id="fig-{kind}-{d}-absent">{html.escape(caption)}: no data.</p>'
                )
        page.add(f"Figures: {d}", "".join(body))

    page.add(
        "Cost",
        html_table(cost_display(cost), "table-cost")
        + note("Means over seeds; peak GPU memory is the maximum over seeds (— on CPU)."),
    )
    page.add(
        "Environment",
        html_table(versions_display(environment), "table-versions")
        + html_table(
            environment[["dataset", "method", "seed", "device", "git_commit", "git_dirty"]].astype(str),
            "table-runs",
        )
        + configs_html(runs),
    )
    page.add(
        "All metrics",
        "<details><summary>every (dataset, method, protocol, metric)</summary>"
        + html_table(summary_display(summary), "table-summary")
        + "</details>",
    )
    return atomic.write_text(out_dir / "report.html", page.render("sslbench report"))
