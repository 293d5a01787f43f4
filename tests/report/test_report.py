"""The report, built once from a synthetic results/ folder written here (real files, real faiss,
real sklearn t-SNE), then read back: every table and figure is there, and every number it shows
equals the CSV it came from."""

import base64
import io as bytes_io
import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from matplotlib import colormaps
from matplotlib import image as mpimg
from scipy import stats as scipy_stats
from support import REPO, require

from evaluation import clustering
from sslbench.evaluate import side_file
from sslbench.extract.features import save_features
from sslbench.report import ReportInputError, build_report
from sslbench.report.figures import (
    ablation_figure,
    kmeans_sizes,
    kmeans_title,
    method_colours,
    method_marker,
    read_clustering_side_file,
    sorted_sizes,
)
from sslbench.report.page import comparison_matrix_html
from sslbench.report.stats import (
    HEADLINE,
    KEY,
    SAME_MARK,
    SAME_NOTE,
    headline_table,
    leaderboards,
    margins,
    paired_comparison,
    run_floors,
    summarise,
)
from sslbench.report.tables import (
    HEADLINE_HEADING,
    first_seed_runs,
    headline_notes,
    leaderboard_display,
    leaderboard_text,
    read_runs,
    read_table,
    run_folder,
    sweep_points,
)

DATASET = "digits"
TARGET = "fashion_mnist"  # a transfer target of the digits runs: knn and linear of alpha and beta only
PAIR_ID = f"{DATASET}_to_{TARGET}"
TRANSFER = {"alpha": -0.2, "beta": -0.1}  # offsets on the target: beta transfers better
CLASSES = 4
# method -> (seeds, offset of its metrics); pcl has one seed (n=1) and no semisup results
METHODS = {"alpha": ([0, 1, 2], 0.10), "beta": ([0, 1, 2], 0.0), "pcl": ([0], 0.05)}
PROTOCOL_METRICS = {
    "knn": ["top1_k200_t0.1", "top5_k200_t0.1", "top1_k20_t0.07", "top5_k20_t0.07"],
    "linear": ["top1", "top5"],
    "lowshot_svm": [
        f"{s}_k{k}_{a}"
        for k in (1, 2, 4, 8)
        for s, a in [("map", "mean"), ("map", "std"), ("map", "min"), ("map", "max"), ("top1", "mean")]
    ],
    "clustering": ["ami", "nmi", "ari", "ami_k2x", "ami_k5x"],
    "semisup": ["top1_1pct", "top5_1pct", "top1_10pct", "top5_10pct"],
    "finetune": ["top1", "top5"],
}
EPOCHS = 3


def metric_value(rng, offset: float, protocol: str, metric: str, k_shift: float) -> float:
    base = 0.5 + offset + rng.normal(0, 0.01)
    if protocol == "lowshot_svm":
        k = int(re.search(r"_k(\d+)_", metric).group(1))
        mean = 0.3 + offset + 0.05 * math.log2(k) + k_shift
        return {"mean": mean, "std": 0.02, "min": mean - 0.04, "max": mean + 0.04}[metric.rsplit("_", 1)[1]]
    return float(np.clip(base, 0, 1))


def write_results(root: Path) -> Path:
    """results/table.csv and the run folders, in the formats the rest of the code writes."""
    results = root / "results"
    rng = np.random.default_rng(0)
    rows = []
    for method, (seeds, offset) in METHODS.items():
        for seed in seeds:
            folder = results / DATASET / method / f"seed{seed}"
            folder.mkdir(parents=True)
            write_run(folder, method, seed, offset, rng)
            k_shift = rng.normal(0, 0.01)
            evaluations = [(DATASET, protocol, offset) for protocol in PROTOCOL_METRICS]
            if method in TRANSFER:
                evaluations += [(TARGET, protocol, TRANSFER[method]) for protocol in ("knn", "linear")]
            for target, protocol, shift in evaluations:
                if protocol == "semisup" and method == "pcl":
                    continue
                for metric in PROTOCOL_METRICS[protocol]:
                    rows.append(
                        {
                            "pretrain_dataset": DATASET,
                            "eval_dataset": target,
                            "method": method,
                            "seed": seed,
                            "protocol": protocol,
                            "metric": metric,
                            "value": metric_value(rng, shift, protocol, metric, k_shift),
                            "augment": "{}",
                            "backbone": "test_resnet",
                            "batch_size": 64,
                            "device": "cpu (x86_64)",
                            "epochs": EPOCHS,
                            "epochs_trained": EPOCHS,
                            "eval_wall_time_s": 1.5 + seed,
                            "git_commit": "abc123",
                            "git_dirty": False,
                            "image_size": 8,
                            "images_per_s": 100.0,
                            "lr": 0.06,
                            "method_params": "{}",
                            "protocol_settings": "{}",
                            "small_stem": False,
                            "train_wall_time_s": 10.0,
                            "version_torch": "2.0",
                        }
                    )
    pd.DataFrame(rows).to_csv(results / "table.csv", index=False)
    return results


def write_run(folder: Path, method: str, seed: int, offset: float, rng) -> None:
    epochs = np.arange(1, EPOCHS + 1)
    pd.DataFrame(
        {
            "epoch": epochs,
            "loss": 5.0 - epochs - offset,
            "lr": 0.06,
            "images_per_s": 100.0 + seed,
            "seconds": 3.0 + seed,
            "hook_seconds": 0.1,
            # the monitors, measured on even epochs and the last (sslbench.pretrain.monitors)
            **{
                column: np.where(
                    (epochs % 2 == 0) | (epochs == EPOCHS), value + 0.01 * epochs + offset, np.nan
                )
                for column, value in (("knn_top1", 0.5), ("rankme", 5.0), ("feature_std", 0.1))
            },
        }
    ).to_csv(folder / "train_log.csv", index=False)
    cfg = {
        "method": method,
        "dataset": {"name": DATASET, "image_size": 8},
        "backbone": {"name": "test_resnet"},
        "train": {"epochs": EPOCHS, "batch_size": 64, "lr": 0.06},
        "augment": {},
        "params": {},
    }
    meta = {
        "method": method,
        "dataset": DATASET,
        "seed": seed,
        "train_wall_time_s": 9.0 + seed,
        "images_per_s": 100.0 + seed,
        "peak_gpu_memory_bytes": (3 + seed) * 2**20 if method == "beta" else None,
        "device": "NVIDIA H200" if method == "beta" else "cpu (x86_64)",
        # pcl was trained from a copy that is no git checkout (sslbench.provenance.git_state)
        "git_commit": "unknown" if method == "pcl" else "abc123",
        "git_dirty": None if method == "pcl" else seed == 1,
        "versions": {"torch": "2.0", "numpy": "2.4"},
    }
    (folder / "run.json").write_text(json.dumps({"cfg": cfg, "meta": meta}))
    centres = rng.normal(0, 1, (CLASSES, 16))
    features = {}
    for split, size in (("train", 40), ("test", 80)):
        labels = np.arange(size) % CLASSES
        features[split] = (centres[labels] + rng.normal(0, 0.3, (size, 16))).astype(np.float32)
        features[f"{split}_labels"] = labels
    features = {**features, "num_classes": CLASSES, "meta": {"seed": seed}}
    save_features(folder / "features" / f"{DATASET}.npz", features)
    # the clustering protocol itself writes what the report's t-SNE and k-means figures draw
    clustering.evaluate(
        features, {}, seed, side_file=side_file(folder / "eval" / DATASET / "clustering.json")
    )
    if method == "pcl":  # E-step assignments of two clusterings, as PCL keeps them in its method state
        assign = torch.stack([torch.arange(80) % 4, torch.arange(80) % 8])
        torch.save(
            {"method_state": {"encoder_q.weight": torch.zeros(2), "cluster_assign": assign}},
            folder / "checkpoint.pt",
        )


def write_methods_and_presets(root: Path) -> tuple[Path, Path]:
    methods, config = root / "methods", root / "config"
    (methods / "alpha").mkdir(parents=True)
    (methods / "alpha" / "config.yaml").write_text("{}\n")  # a method without settings
    (methods / "_template").mkdir()
    paper = {
        "results": [
            {
                "pretrain_dataset": DATASET,
                "eval_dataset": DATASET,
                "backbone": "test_resnet",
                "epochs": EPOCHS,
                "protocol": "knn",
                "metric": "top1_k200_t0.1",
                "value": 0.55,
                "source": "Table 1",
            },
            {
                "pretrain_dataset": "cifar10",
                "eval_dataset": "cifar10",
                "backbone": "resnet18",
                "epochs": 800,
                "protocol": "linear",
                "metric": "top1",
                "value": 0.9,
                "source": "Table 2",
            },
            {
                "pretrain_dataset": "imagenet",
                "eval_dataset": "voc07",
                "backbone": "resnet50",
                "epochs": 200,
                "protocol": "lowshot_svm",
                "metric": "map_k1_mean",
                "value": 0.7,
                "source": "Table 3",
            },
        ]
    }
    (methods / "alpha" / "paper.yaml").write_text(yaml.safe_dump(paper))
    (methods / "_template" / "paper.yaml").write_text(
        yaml.safe_dump({"results": [dict(paper["results"][0])]})
    )
    config.mkdir()
    shutil.copy(REPO / "config" / "default.yaml", config / "default.yaml")
    (config / "cifar10.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": {"cifar10": {"name": "cifar10"}},
                "pretrain": ["cifar10"],
                "evaluation": {"targets": ["pretrain"]},
                "backbone": {"name": "resnet18"},
                "train": {"epochs": 800},
            }
        )
    )
    return methods, config


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    results = write_results(root)
    methods, config = write_methods_and_presets(root)
    out = root / "out"
    path = build_report(results, methods, config, out)
    return {"root": root, "results": results, "out": out, "html": path.read_text(), "path": path}


# --------------------------------------------------------------------------- the full method list
# Every method folder of methods/, sweeps of two methods over one shared setting (SupCon and supervised
# CE over train.lr), a numeric sweep (MoCo's queue) and a categorical one (SupCon's augmentation policy);
# kNN and linear on digits and one transfer target; simclr's results stale; trained outside a git checkout.
WIDE_BASES = sorted(
    p.name for p in (REPO / "methods").iterdir() if (p / "method.py").is_file() and p.name[0] not in "_."
)
WIDE_BASE_SETTINGS = {
    "moco": {"params": {"queue_size": 4096}},
    "supcon": {"augment": {"policy": "simclr"}},
    "supervised": {"train": {"lr": 0.1}},
}
WIDE_SWEEPS = {
    "moco[queue_size=256]": ("moco", {"queue_size": 256}),
    "moco[queue_size=1024]": ("moco", {"queue_size": 1024}),
    "supcon[train.lr=0.01]": ("supcon", {"train": {"lr": 0.01}}),
    "supcon[train.lr=0.3]": ("supcon", {"train": {"lr": 0.3}}),
    "supervised[train.lr=0.3]": ("supervised", {"train": {"lr": 0.3}}),
    "supcon[augment.policy=randaugment]": ("supcon", {"augment": {"policy": "randaugment"}}),
    "supcon[augment.policy=autoaugment]": ("supcon", {"augment": {"policy": "autoaugment"}}),
}
WIDE_METRICS = {"knn": "top1_k200_t0.1", "linear": "top1"}
STALE = "simclr"


def write_wide_results(root: Path) -> Path:
    results = root / "results"
    rng = np.random.default_rng(3)
    labels = {m: (m, {}) for m in WIDE_BASES} | WIDE_SWEEPS
    rows = []
    for i, (label, (base, variant)) in enumerate(sorted(labels.items())):
        for seed in (0, 1, 2):
            cfg = {
                "method": label,
                "method_base": base,
                "variant": variant,
                "dataset": {"name": DATASET, "image_size": 8},
                "backbone": {"name": "test_resnet"},
                "train": {"epochs": EPOCHS, "batch_size": 64, "lr": 0.06},
                "augment": {},
                "params": {},
            }
            for section, settings in WIDE_BASE_SETTINGS.get(base, {}).items():
                cfg[section].update(settings)
            for section, settings in variant.items():  # a sweep of a method's own setting lies in params
                cfg[section if section in cfg else "params"].update(
                    settings if isinstance(settings, dict) else {section: settings}
                )
            meta = {"seed": seed, "train_wall_time_s": 5.0 + i, "images_per_s": 50.0 + i, "device": "cpu"}
            meta |= {"git_commit": "unknown", "git_dirty": None, "versions": {"torch": "2.0"}}
            folder = run_folder(results, DATASET, label, seed)
            folder.mkdir(parents=True)
            (folder / "run.json").write_text(json.dumps({"cfg": cfg, "meta": meta}))
            log = {"epoch": [1, 2], "loss": [2.0, 1.0], "images_per_s": [50.0 + i] * 2}
            if base == "moco":  # the queue it trained with: the base's 4096 shrunk to fit the data
                log["queue_size"] = [cfg["params"]["queue_size"] if variant else 2048] * 2
            pd.DataFrame(log).to_csv(folder / "train_log.csv", index=False)
            for target in (DATASET, TARGET):
                for protocol, metric in WIDE_METRICS.items():
                    value = 0.4 + 0.004 * i + rng.normal(0, 0.01) - 0.1 * (target == TARGET)
                    rows.append(
                        {
                            "pretrain_dataset": DATASET,
                            "eval_dataset": target,
                            "method": label,
                            "method_base": base,
                            "variant": json.dumps(variant),
                            "seed": seed,
                            "protocol": protocol,
                            "metric": metric,
                            "value": value,
                            "stale": base == STALE,
                        }
                    )
    pd.DataFrame(rows).to_csv(results / "table.csv", index=False)
    return results


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    root = tmp_path_factory.mktemp("wide")
    results = write_wide_results(root)
    methods, config = write_methods_and_presets(root)
    path = build_report(results, methods, config, root / "out")
    parser = PageParser()
    parser.feed(path.read_text())
    return {"results": results, "out": root / "out", "html": path.read_text(), "path": path, "page": parser}


# --------------------------------------------------------------------------- reading the page back
class PageParser(HTMLParser):
    """Tables (by id: rows of (text, bold) cells), figure ids, images, and every URL-like attribute."""

    def __init__(self):
        super().__init__()
        self.tables, self.figures, self.images, self.urls, self.tags = {}, [], [], [], set()
        self._table = self._row = self._cell = None
        self._bold = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        self.urls += [v for k, v in attrs.items() if k in ("src", "href") and v]
        if tag == "table":
            self._table = self.tables.setdefault(attrs["id"], [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell, self._bold = "", False
        elif tag == "strong":
            self._bold = True
        elif tag == "figure":
            self.figures.append(attrs["id"])
        elif tag == "img":
            self.images.append(attrs["src"])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append((self._cell, self._bold))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None


@pytest.fixture(scope="module")
def page(report):
    parser = PageParser()
    parser.feed(report["html"])
    return parser


def records(page, table_id):
    """A parsed table as a list of {header: (text, bold)}."""
    header, *rows = page.tables[table_id]
    names = [h for h, _ in header]
    return [dict(zip(names, row)) for row in rows]


def close(shown: str, value: float, scale: float, decimals: int) -> bool:
    """A displayed number equals the CSV's value to the precision shown."""
    return abs(float(shown.replace("−", "-")) - scale * value) <= 0.5 * 10**-decimals + 1e-9


def csv(report, name):
    return pd.read_csv(report["out"] / f"{name}.csv")


# --------------------------------------------------------------------------- tests
FIGURES = ["bars", "lowshot", "training", "monitors", "tsne", "kmeans", "estep"]
TABLES = [
    f"table-leaderboard-{DATASET}",
    f"table-leaderboard-{PAIR_ID}",
    f"table-headline-{DATASET}",
    f"table-headline-{PAIR_ID}",
    f"table-targets-{DATASET}-knn",
    f"table-targets-{DATASET}-linear",
    "table-reproduced",
    "table-comparisons",
    "table-cost",
    "table-versions",
    "table-runs",
    "table-summary",
]


def test_every_table_and_figure_is_on_the_page_and_in_figures(report, page):
    assert set(TABLES) <= set(page.tables)
    # the transfer pair has bar charts only: no low-shot, no clustering, no training of its own
    drawn = [(DATASET, kind) for kind in FIGURES] + [(PAIR_ID, "bars")]
    assert page.figures == [f"fig-{kind}-{pair}" for pair, kind in drawn]
    for kind in ("lowshot", "tsne", "kmeans"):
        assert f'id="fig-{kind}-{PAIR_ID}-absent"' in report["html"]
    for (pair, kind), src in zip(drawn, page.images, strict=True):
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png == (report["out"] / "figures" / f"{pair}_{kind}.png").read_bytes()
        pixels = mpimg.imread(bytes_io.BytesIO(png))
        assert pixels.shape[0] > 150 and pixels.shape[1] > 250 and pixels.std() > 0.05, kind
    for name in ("summary", "comparisons", "margins", "reproduced", "cost", "environment", "ablations"):
        assert (report["out"] / f"{name}.csv").is_file()


def test_the_monitor_figure_draws_each_methods_mean_over_seeds_and_needs_the_columns():
    """The monitors' panels plot, per method, the mean over seeds on the epochs measured (NaN rows, the
    epochs not measured, left out); runs without the monitors' columns give no figure."""
    from sslbench.report.figures import method_colours, monitor_curves
    from sslbench.report.tables import Run

    def log(seed):
        return pd.DataFrame(
            {
                "epoch": [1, 2],
                "loss": [1.0, 0.5],
                "knn_top1": [np.nan, 0.5 + seed],
                "rankme": [np.nan, 4.0 + seed],
                "feature_std": [np.nan, 0.1],
            }
        )

    colours = method_colours(["m"])
    fig = monitor_curves([Run("d", "m", s, Path("."), {}, {}, log(s)) for s in (0, 1)], "d", colours)
    knn, rank = fig.axes[0].lines[0], fig.axes[1].lines[0]
    assert list(knn.get_xdata()) == [2] and list(knn.get_ydata()) == [1.0]  # (0.5 + 1.5) / 2
    assert list(rank.get_ydata()) == [4.5]
    unmonitored = [Run("d", "m", 0, Path("."), {}, {}, log(0).drop(columns=["knn_top1", "rankme"]))]
    assert monitor_curves(unmonitored, "d", colours) is None


def test_page_is_self_contained(page):
    assert all(url.startswith("data:image/png;base64,") for url in page.urls)
    assert not {"script", "link", "iframe", "object"} & page.tags


def test_no_table_cell_shows_nan(page):
    cells = [text for rows in page.tables.values() for row in rows for text, _ in row]
    assert not [c for c in cells if re.search(r"\bnan\b|\binf\b", c, re.I)]


@pytest.mark.parametrize("target", [DATASET, TARGET])
def test_headline_cells_equal_summary_csv_and_best_is_bold(report, page, target):
    """One headline table per (pretraining, evaluation) dataset pair, each from its own rows."""
    summary = csv(report, "summary")
    summary = summary[summary["eval_dataset"] == target].set_index(["method", "protocol", "metric"])
    rows = records(page, f"table-headline-{DATASET if target == DATASET else PAIR_ID}")
    assert [r["method"][0] for r in rows] == sorted(METHODS if target == DATASET else TRANSFER)
    for label, protocol, metric in HEADLINE:
        present = [m for m in METHODS if (m, protocol, metric) in summary.index]
        # a column no method of the pair has is left out (the transfer pair: kNN and linear only)
        assert (label in rows[0]) == bool(present), label
        best = max(present, key=lambda m: summary.loc[(m, protocol, metric), "mean"]) if present else None
        for row in rows if present else []:
            method, (text, bold) = row["method"][0], row[label]
            if method not in present:
                assert text == "—" and not bold
                continue
            stats = summary.loc[(method, protocol, metric)]
            mean, _, std = text.partition(" ± ")
            if stats["n"] == 1:
                assert mean.endswith(" (n=1)") and not std and pd.isna(stats["std"])
                mean = mean.removesuffix(" (n=1)")
            else:
                assert close(std, stats["std"], 100, 2)
            assert close(mean, stats["mean"], 100, 2)
            assert bold == (method == best), (label, method)


def test_table_md_bolds_the_best_and_states_the_settings(report):
    leaders, text = (report["out"] / "table.md").read_text().split(HEADLINE_HEADING)
    assert leaders.startswith(f"## Leaderboard: {DATASET}, ")  # the leaderboards first
    assert text.startswith(f"### {DATASET}\n") and f"### {DATASET} → {TARGET}\n" in text
    text = text.split("\n### ")[0]  # the digits headline
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["method"] + [label for label, _, _ in HEADLINE]
    cells = {
        row[0]: dict(zip(header[1:], row[1:]))
        for row in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])
    }
    # alpha has the largest offset: it is best (bold) wherever it is evaluated; semisup lacks pcl
    assert cells["alpha"]["kNN top-1 (k200_t0.1)"].startswith("**")
    assert not cells["beta"]["kNN top-1 (k200_t0.1)"].startswith("**")
    assert cells["pcl"]["semi-sup 1% top-1"] == "—" and cells["pcl"]["linear top-1"].endswith("(n=1)")
    footnote = [line for line in text.splitlines() if line.startswith("Settings:")]
    assert footnote and all(
        s in footnote[0] for s in (DATASET, "test_resnet", f"epochs {EPOCHS}", "seeds 0, 1, 2")
    )


def test_headline_names_the_columns_it_has_no_data_for(report):
    """The transfer pair ran kNN and linear only: one line under its table names the other six
    headline columns; the digits pair has every column and no such line."""
    markdown = (report["out"] / "table.md").read_text()
    own, transfer = markdown.split(f"### {DATASET} → {TARGET}\n")
    transfer = transfer.split("\n### ")[0]
    html_own, html_transfer = (
        report["html"].split(f'id="table-headline-{pair}"')[1].split("<h2>")[0] for pair in (DATASET, PAIR_ID)
    )
    assert "No data in this table" not in own + html_own
    for text in (transfer, html_transfer):
        (line,) = [line for line in re.split(r"\n|<p", text) if "No data in this table for: " in line]
        assert [label for label, _, _ in HEADLINE if label in line] == [label for label, _, _ in HEADLINE[2:]]
        assert "lowshot_svm map_k8_mean" in line


def test_headline_notes_explain_the_same_mark_once():
    """pixels' kNN is the same on every seed: its cell carries the mark, and the notes explain it once."""
    rows = [
        {**dict(zip(KEY, ("d", "d", m, s, protocol, metric))), "value": v}
        for m, values in {"pixels": [0.4, 0.4, 0.4], "a": [0.5, 0.6, 0.7]}.items()
        for _, protocol, metric in HEADLINE[:2]
        for s, v in enumerate(values)
    ]
    summary = summarise(pd.DataFrame(rows))
    cells = headline_table(summary)
    assert list(cells.loc["pixels"]) == [f"40.00 {SAME_MARK}"] * 2
    notes = headline_notes(summary, ("d", "d"), "Settings.", cells)
    assert notes[0] == "Settings." and notes.count(SAME_NOTE) == 1
    assert SAME_NOTE not in headline_notes(summary, ("d", "d"), "", cells.drop(index="pixels"))


def test_summary_table_equals_summary_csv_and_table_csv(report, page):
    summary = csv(report, "summary")
    table = pd.read_csv(report["results"] / "table.csv")
    rows = records(page, "table-summary")
    keys = ["pretrain_dataset", "eval_dataset", "method", "protocol", "metric"]
    assert len(rows) == len(summary) == len(table.groupby(keys))
    for row, (_, expected) in zip(rows, summary.iterrows()):
        assert row["eval_dataset"][0] == expected["eval_dataset"]
        values = table[
            (table["eval_dataset"] == expected["eval_dataset"])
            & (table["method"] == expected["method"])
            & (table["metric"] == expected["metric"])
            & (table["protocol"] == expected["protocol"])
        ]["value"]
        assert row["method"][0] == expected["method"] and row["metric"][0] == expected["metric"]
        assert close(row["mean (%)"][0], values.mean(), 100, 2) and int(row["n"][0]) == len(values)
        if len(values) > 1 and values.nunique() == 1:  # the low-shot std over draws: 0.02 on every seed
            assert row["std (%)"][0] == row["ci95 (%)"][0] == f"0 {SAME_MARK}" and expected["std"] == 0
        elif len(values) > 1:
            assert close(row["std (%)"][0], values.std(ddof=1), 100, 2)
        else:
            assert row["std (%)"][0] == row["ci95 (%)"][0] == "—"
    assert (
        sum(row["std (%)"][0] == f"0 {SAME_MARK}" for row in rows) == 4 * 2
    )  # k = 1, 2, 4, 8 of alpha, beta
    assert report["html"].split('id="table-summary"')[1].split("</details>")[0].count(SAME_NOTE) == 1


def test_comparisons_cover_headline_metrics_and_equal_their_csv(report, page):
    comparisons = csv(report, "comparisons")
    # every protocol is in the synthetic table: every headline metric is compared
    assert {(p, m) for p, m in zip(comparisons["protocol"], comparisons["metric"])} == {
        (p, m) for _, p, m in HEADLINE
    }
    rows = records(page, "table-comparisons")
    assert len(rows) == len(comparisons)
    for row, (_, expected) in zip(rows, comparisons.iterrows()):
        assert (row["method_a"][0], row["method_b"][0]) == (expected["method_a"], expected["method_b"])
        assert close(row["mean A − B (% points)"][0], expected["mean_diff"], 100, 2)
        assert int(row["n"][0]) == expected["n"] and row["verdict"][0] == expected["verdict"]
        assert int(row["tests in family"][0]) == expected["family_size"]
        if expected["n"] > 1:
            for shown, column in (("p (paired t)", "p_value"), ("p (Holm)", "p_adjusted")):
                assert math.isclose(float(row[shown][0]), expected[column], rel_tol=5e-3, abs_tol=1e-300)
            low, high = row["95% CI of A − B (% points)"][0].split(" to ")
            assert close(low, expected["ci_low"], 100, 2) and close(high, expected["ci_high"], 100, 2)
        else:
            assert row["p (paired t)"][0] == row["p (Holm)"][0] == "—"
            assert row["95% CI of A − B (% points)"][0] == "—" and expected["verdict"] == "untested (n < 2)"
    knn = comparisons[
        (comparisons["metric"] == "top1_k200_t0.1")
        & (comparisons["eval_dataset"] == DATASET)
        & (comparisons["method_a"] == "alpha")
        & (comparisons["method_b"] == "beta")
    ].iloc[0]
    assert knn["verdict"] == "alpha > beta"  # 0.10 apart, seed noise 0.01
    assert knn["family_size"] == 1 and knn["p_adjusted"] == knn["p_value"]  # pcl's pairs are untested
    transfer = comparisons[(comparisons["eval_dataset"] == TARGET) & (comparisons["metric"] == "top1")]
    assert list(transfer["verdict"]) == ["beta > alpha"]  # compared within the pair only


def test_reproduced_vs_reported_table(report, page):
    reproduced = csv(report, "reproduced")
    table = pd.read_csv(report["results"] / "table.csv")
    assert list(reproduced["method"]) == ["alpha"] * 3  # the _template folder is skipped
    ours = table[
        (table["method"] == "alpha")
        & (table["metric"] == "top1_k200_t0.1")
        & (table["eval_dataset"] == DATASET)
    ]["value"]
    same = reproduced.iloc[0]
    assert math.isclose(same["ours"], ours.mean()) and same["n"] == 3
    assert math.isclose(same["gap"], ours.mean() - 0.55)
    assert "config/cifar10.yaml" in reproduced.iloc[1]["reproduce"] and pd.isna(reproduced.iloc[1]["ours"])
    assert reproduced.iloc[2]["reproduce"].startswith("no preset")
    # the table shows only what this run can speak to; the rest is one list, by what would reproduce it
    rows = records(page, "table-reproduced")
    assert len(rows) == 1 and rows[0]["method"][0] == "alpha" and rows[0]["eval_dataset"][0] == DATASET
    items = re.findall(r"<li>(.*?)</li>", report["html"].split('id="list-to-reproduce"')[1].split("</ul>")[0])
    hints = sorted(reproduced["reproduce"].dropna())  # "no preset: …" (Table 3), "run with … cifar10.yaml …"
    assert len(items) == 2 and all(item.startswith(f"{hint}: ") for item, hint in zip(items, hints))
    assert items[0].endswith(": alpha lowshot_svm/map_k1_mean")
    assert items[1].endswith(": alpha linear/top1") and "config/cifar10.yaml" in items[1]
    for row, (_, expected) in zip(rows, reproduced.iterrows()):
        assert close(row["reported (%)"][0], expected["reported"], 100, 2)
        for shown, column in (("ours (%)", "ours"), ("gap (% points)", "gap")):
            if pd.isna(expected[column]):
                assert row[shown][0] == "—"
            else:
                assert close(row[shown][0], expected[column], 100, 2)


def test_cost_table_equals_cost_csv_and_run_json(report, page):
    cost = csv(report, "cost").set_index("method")
    # run.json: wall time 9 + seed, images/s 100 + seed, beta's peak (3 + seed) MiB on the GPU
    assert math.isclose(cost.loc["alpha", "train_wall_time_s"], 10.0)
    assert math.isclose(cost.loc["beta", "peak_gpu_memory_mib"], 5.0) and pd.isna(
        cost.loc["alpha", "peak_gpu_memory_mib"]
    )
    # six protocols on digits and two on the transfer target, 1.5 + seed each
    assert math.isclose(cost.loc["alpha", "eval_wall_time_s"], 8 * 2.5)
    assert math.isclose(cost.loc["pcl", "eval_wall_time_s"], 5 * 1.5)  # no semisup
    for row in records(page, "table-cost"):
        expected = cost.loc[row["method"][0]]
        assert close(row["training wall time (s)"][0], expected["train_wall_time_s"], 1, 1)
        assert close(row["images/s"][0], expected["images_per_s"], 1, 0)
        if pd.isna(expected["peak_gpu_memory_mib"]):
            assert row["peak GPU memory (MiB)"][0] == "—"
        else:
            assert close(row["peak GPU memory (MiB)"][0], expected["peak_gpu_memory_mib"], 1, 0)
        assert row["device"][0] == expected["device"]


def test_environment_shows_versions_commit_dirty_flag_and_config(report, page):
    versions = {r["package"][0]: r["version(s)"][0] for r in records(page, "table-versions")}
    assert versions["torch"] == "2.0" and versions["git_commit"] == "abc123, unknown"
    assert versions["git_dirty"] == "False, True, unknown" and "NVIDIA H200" in versions["device"]
    runs = records(page, "table-runs")
    assert len(runs) == 7
    assert [(r["git_commit"][0], r["git_dirty"][0]) for r in runs if r["method"][0] == "pcl"] == [
        ("unknown",) * 2
    ]
    assert "&quot;epochs&quot;: 3" in report["html"]  # the resolved config, folded in <details>


def test_cluster_sizes_sorted_and_complete():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 7, size=200)
    sizes = sorted_sizes(np.concatenate([labels, [-1, -1]]), k=9)  # -1: unassigned, not counted
    assert sizes.sum() == 200 and len(sizes) == 9 and (np.diff(sizes) <= 0).all()
    assert list(sizes) == sorted(np.bincount(labels, minlength=9), reverse=True)


def test_kmeans_figure_shows_the_clustering_protocols_own_run_and_says_which(report):
    runs = read_runs(report["results"], pd.read_csv(report["results"] / "table.csv"))
    sides = {r.method: read_clustering_side_file(r, DATASET) for r in first_seed_runs(runs, DATASET)}
    assert set(sides) == set(METHODS)
    for method, sizes in kmeans_sizes(sides):
        first_restart = sides[method]["assignments"][0]  # what the protocol scored in its first restart
        assert list(sizes) == sorted(np.bincount(first_restart, minlength=CLASSES), reverse=True)
    assert kmeans_title(sides, DATASET) == (
        f"{DATASET}: cluster sizes of the clustering protocol's faiss k-means on test features "
        "(k = 4, 50 iterations, best of 1, every test point, restart 1 of 5)"
    )


def test_methods_by_targets_matrix_equals_summary_csv(report, page):
    """kNN top-1 of every method on every target of the digits runs: the pretraining set's own column
    first, "—" where a method was not evaluated on a target, the best of each column in bold."""
    summary = csv(report, "summary")
    knn = summary[summary["metric"] == "top1_k200_t0.1"].set_index(["method", "eval_dataset"])
    rows = records(page, f"table-targets-{DATASET}-knn")
    assert list(rows[0]) == ["method", DATASET, TARGET]
    assert [r["method"][0] for r in rows] == sorted(METHODS)
    for target in (DATASET, TARGET):
        present = [m for m in METHODS if (m, target) in knn.index]
        best = max(present, key=lambda m: knn.loc[(m, target), "mean"])
        for row in rows:
            method, (text, bold) = row["method"][0], row[target]
            if method not in present:
                assert text == "—" and not bold and target == TARGET and method == "pcl"
                continue
            assert close(
                text.partition(" ± ")[0].removesuffix(" (n=1)"), knn.loc[(method, target), "mean"], 100, 2
            )
            assert bold == (method == best), (target, method)
    assert "beta" == max(TRANSFER, key=TRANSFER.get)  # on the target beta is best, on digits alpha
    markdown = (report["out"] / "table.md").read_text()
    assert f"### kNN top-1 (k200_t0.1), pretrained on {DATASET}, on every target" in markdown
    assert f"| method | {DATASET} | {TARGET} |" in markdown


def test_missing_inputs_name_the_file(tmp_path, report):
    with pytest.raises(ReportInputError, match="table.csv"):
        build_report(tmp_path, tmp_path, tmp_path, tmp_path / "out")
    results = tmp_path / "results"
    shutil.copytree(report["results"], results)
    (results / DATASET / "beta" / "seed1" / "run.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"beta/seed1/run\.json"):
        build_report(results, tmp_path, tmp_path, tmp_path / "out")


def test_ablations_csv_holds_every_sweep_point_and_the_base_runs(wide):
    """One axis per swept setting; the base run sits on each axis at its own value (from run.json, or
    the one its training log says it used: the base MoCo's queue);
    SupCon and supervised CE share train.lr; mean, std, n equal the summary of the label's rows."""
    ablations, summary = csv(wide, "ablations"), csv(wide, "summary")
    expected = {
        "queue_size": {
            ("moco", "moco"): "2048",
            ("moco", "moco[queue_size=256]"): "256",
            ("moco", "moco[queue_size=1024]"): "1024",
        },
        "train.lr": {
            ("supcon", "supcon"): "0.06",
            ("supcon", "supcon[train.lr=0.01]"): "0.01",
            ("supcon", "supcon[train.lr=0.3]"): "0.3",
            ("supervised", "supervised"): "0.1",
            ("supervised", "supervised[train.lr=0.3]"): "0.3",
        },
        "augment.policy": {
            ("supcon", "supcon"): "simclr",
            ("supcon", "supcon[augment.policy=randaugment]"): "randaugment",
            ("supcon", "supcon[augment.policy=autoaugment]"): "autoaugment",
        },
    }
    assert set(ablations["setting"]) == set(expected)
    for setting, points in expected.items():
        rows = ablations[ablations["setting"] == setting]
        # every point on both dataset pairs and both metrics
        assert len(rows) == 4 * len(points) and set(rows["eval_dataset"]) == {DATASET, TARGET}
        shown = {
            (b, m): str(v) for b, m, v in rows[["method_base", "method", "value"]].itertuples(index=False)
        }
        assert shown == points
    # along a numeric axis in numeric order, per (pair, method, metric)
    queue = ablations[(ablations["setting"] == "queue_size") & (ablations["metric"] == "top1")]
    assert list(queue["value"].astype(str))[:3] == ["256", "1024", "2048"]
    keyed = summary.set_index(["eval_dataset", "method", "protocol", "metric"])
    for row in ablations.itertuples():
        stats = keyed.loc[(row.eval_dataset, row.method, row.protocol, row.metric)]
        assert math.isclose(row.mean, stats["mean"]) and math.isclose(row.std, stats["std"]) and row.n == 3


def test_sweep_values_keep_their_type_without_a_text_setting(wide):
    """Only numeric sweeps (no policy name among them): a queue size stays 256, never 256.0."""
    runs = read_runs(wide["results"], pd.read_csv(wide["results"] / "table.csv"))
    points = sweep_points([r for r in runs if r.cfg["method_base"] in ("moco", "supervised")])
    assert dict(zip(points["method"], points["value"])) == {
        "moco": "2048",
        "moco[queue_size=256]": "256",
        "moco[queue_size=1024]": "1024",
        "supervised": "0.1",
        "supervised[train.lr=0.3]": "0.3",
    }


def test_ablation_figures_numeric_axes_and_grouped_policies(wide):
    ablations = csv(wide, "ablations")
    ids = [f"fig-ablation-{s}-sweeps" for s in ("augment.policy", "queue_size", "train.lr")]
    assert [f for f in wide["page"].figures if f.startswith("fig-ablation")] == ids
    for setting in ("augment.policy", "queue_size", "train.lr"):
        assert (wide["out"] / "figures" / f"ablation_{setting}.png").stat().st_size > 5000
    lr = ablation_figure("train.lr", ablations[ablations["setting"] == "train.lr"])
    axes = [ax for ax in lr.axes if ax.get_visible()]
    assert len(axes) == 4 and all(ax.get_xscale() == "log" for ax in axes)  # 0.01 … 0.3: over a decade
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["supcon", "supervised"]
    policy = ablation_figure("augment.policy", ablations[ablations["setting"] == "augment.policy"])
    ticks = [t.get_text() for t in policy.axes[0].get_xticklabels()]
    assert ticks == ["autoaugment", "randaugment", "simclr"] and policy.axes[0].get_xscale() == "linear"


MATRIX = re.compile(r'<table class="matrix" id="([^"]+)">(.*?)</table><p class="note">([^<]*)</p>')
MATRIX_CELL = re.compile(r'<td class="([^"]+)"(?: title="([^"]*)")?>([^<]*)</td>')
TESTED_TITLE = re.compile(r"95% CI (\S+) to (\S+), p = (\S+), Holm p = (\S+), n = (\d+)$")


def check_matrices(report) -> set[str]:
    """Every methods × methods matrix of the page against comparisons.csv: row − column in % points
    (0 for a tie), the mirror of each compared pair negated with its interval, coloured by sign,
    strong only where the Holm-adjusted p < 0.05, italic where exact; under each, what its family of
    tests can resolve. Returns the cells' classes."""
    comparisons = csv(report, "comparisons")
    protocols = "|".join(sorted({p for _, p, _ in HEADLINE}))
    kinds = set()
    for table_id, body, resolution in MATRIX.findall(report["html"]):
        pair_part, protocol, metric = re.fullmatch(rf"matrix-(.+?)-({protocols})-(.+)", table_id).groups()
        target = TARGET if pair_part == PAIR_ID else DATASET
        of = comparisons[
            (comparisons["eval_dataset"] == target)
            & (comparisons["protocol"] == protocol)
            & (comparisons["metric"] == metric)
        ]
        methods = sorted(set(of["method_a"]) | set(of["method_b"]))
        rows = re.findall(r'<tr><th class="text">([^<]+)</th>(.*?)</tr>', body)
        assert [r for r, _ in rows] == methods
        cells = {r: MATRIX_CELL.findall(c) for r, c in rows}
        assert all(cells[m][i] == ("self", "", "") for i, m in enumerate(methods))
        for pair in of.itertuples(index=False):
            expected = (
                "untested"
                if pair.n < 2
                else "exact"
                if pd.isna(pair.p_value)
                else "resolved"
                if pair.p_adjusted < 0.05
                else "noise"
            )
            for row, column, sign in ((pair.method_a, pair.method_b, 1), (pair.method_b, pair.method_a, -1)):
                kind, title, text = cells[row][methods.index(column)]
                side = "better" if sign * pair.mean_diff > 0 else "worse" if pair.mean_diff else "tie"
                assert kind.split() == [side, expected], (row, column)
                assert text == "0" if side == "tie" else close(text, sign * pair.mean_diff, 100, 1)
                if expected in ("resolved", "noise"):
                    low, high, p, p_adjusted, n = TESTED_TITLE.search(title).groups()
                    low, high = (low, high) if sign > 0 else (high, low)
                    assert close(low, sign * pair.ci_low, 100, 2) and close(high, sign * pair.ci_high, 100, 2)
                    assert math.isclose(float(p), pair.p_value, rel_tol=5e-3)
                    assert math.isclose(float(p_adjusted), pair.p_adjusted, rel_tol=5e-3)
                    assert int(n) == pair.n
                kinds.add(kind)
        tested = of[of["p_value"].notna()]
        tests = "paired test" if len(tested) == 1 else "paired tests"
        assert f"With {tested['n'].max()} seeds and {len(tested)} {tests} in this matrix" in resolution
        assert set(of["family_size"]) == {len(tested)}
    return kinds


def test_comparison_matrices_equal_comparisons_csv_at_full_size(wide):
    """Every method on 3 seeds: k(k − 1)/2 tests a matrix, and Holm's correction calls far fewer
    differences than the raw p-values would."""
    assert len(MATRIX.findall(wide["html"])) == 4  # 2 pairs x (kNN, linear)
    assert {"better noise", "worse noise"} <= check_matrices(wide)
    comparisons = csv(wide, "comparisons")
    k = len(WIDE_BASES) + len(WIDE_SWEEPS)
    assert (
        set(comparisons["family_size"]) == {k * (k - 1) // 2}
        and f"{k * (k - 1) // 2} paired tests" in wide["html"]
    )
    assert (comparisons["p_adjusted"] < 0.05).sum() < (comparisons["p_value"] < 0.05).sum() / 4


def test_comparison_matrices_equal_comparisons_csv(report):
    """alpha beats beta by 10 points at 1 point of noise: resolved in every matrix; pcl has one seed."""
    assert len(MATRIX.findall(report["html"])) == len(HEADLINE) + 2  # and kNN, linear on the target
    assert {"better resolved", "worse resolved", "better untested", "worse untested"} <= check_matrices(
        report
    )


def test_ties_and_exact_differences_in_a_matrix():
    """A mean difference of round-off is a tie: "0", white, never "+0.0"; a difference the same on
    every seed is exact: italic, its title says there is no test."""
    b = np.array([0.1 + 0.2, 0.6, 0.6])
    table = pd.DataFrame(
        [
            {**dict(zip(KEY, ("d", "d", m, s, "knn", "top1"))), "value": v}
            for m, values in {"a": [0.3, 0.5, 0.7], "b": b, "c": b + 0.1}.items()
            for s, v in enumerate(values)
        ]
    )
    comparisons = paired_comparison(table, "knn", "top1")
    assert list(comparisons["verdict"]) == ["within noise", "within noise", "c > b (exact)"]
    cells = {
        (row, i): cell
        for row, body in re.findall(
            r'<th class="text">([^<]+)</th>(.*?)</tr>',
            comparison_matrix_html(comparisons, ("d", "d"), "knn", "top1"),
        )
        for i, cell in enumerate(MATRIX_CELL.findall(body))
    }
    kind, _, text = cells[("a", 1)]  # a − b: −5.6e-17, 0.1, −0.1
    assert (kind, text) == ("tie noise", "0")
    kind, title, text = cells[("c", 1)]
    assert (kind, text) == ("better exact", "+10.0") and "no test" in title
    assert cells[("b", 2)][0] == "worse exact"


# --------------------------------------------------------------------------- leaderboard
RESNET, VIT = "resnet18", "vit_tiny_patch16_224"
FLOOR = [0.50, 0.55, 0.45, 0.52, 0.48]
LEADER_RUNS = {  # label: (method_base, backbone, kNN top-1 per seed)
    "random": ("random", RESNET, FLOOR),
    f"random[{VIT}]": ("random", VIT, [0.30, 0.31, 0.29, 0.30]),
    "simclr": ("simclr", RESNET, [0.60, 0.62, 0.64]),
    "byol": ("byol", RESNET, [0.50, 0.55, 0.49]),
    "moco": ("moco", RESNET, [0.45, 0.42, 0.47]),
    "one": ("one", RESNET, [0.70]),
    "mae": ("mae", VIT, [0.35, 0.36, 0.34]),
    "dino[vit_s16]": ("dino", "vit_small_patch16_224", [0.40, 0.41, 0.42]),
    "supervised": ("supervised", RESNET, [0.90, 0.91, 0.92]),
    "pixels": ("pixels", "pixels", [0.40, 0.40, 0.40]),
}


def leader_table() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                **dict(zip(KEY, (DATASET, DATASET, label, s, "knn", "top1_k200_t0.1"))),
                "value": v,
                "method_base": base,
                "backbone": backbone,
                "small_stem": backbone == RESNET,
                "backbone_args": "{}",
                "features": "pooled",
                "stale": label == "byol",
            }
            for label, (base, backbone, values) in LEADER_RUNS.items()
            for s, v in enumerate(values)
        ]
    )


def test_leaderboard_cells_marks_and_legend_from_known_inputs():
    """Ranked by mean; each margin against its own backbone's floor with its Welch interval (simclr's by
    hand in test_stats: +12.00 [+6.96, +17.04]); ✓ above, · not resolved, ✗ below, "n < 2" for one
    seed, "no floor" where the backbone has none; the references last, unranked; stale byol marked."""
    table = leader_table()
    (board,) = leaderboards(table, summarise(table), margins(table), run_floors(table))
    cells = leaderboard_display(board, {"byol"}).set_index("method")
    assert list(cells.index) == [
        "one",
        "simclr",
        "byol †",
        "moco",
        "dino[vit_s16]",
        "mae",
        "random",
        f"random[{VIT}]",
        "supervised",
        "pixels",
    ]
    assert list(cells["#"]) == ["1", "2", "3", "4", "5", "6"] + ["reference"] * 4
    assert dict(cells["above its floor"]) == {
        "one": "n < 2",
        "simclr": "✓",
        "byol †": "·",
        "moco": "✗",
        "dino[vit_s16]": "no floor",
        "mae": "✓",
        "random": "—",
        f"random[{VIT}]": "—",
        "supervised": "✓",
        "pixels": "—",
    }
    simclr = cells.loc["simclr"]
    assert simclr["margin [95% CI] (% points)"] == "+12.00 [+6.96, +17.04]"
    assert (simclr["mean ± std (n)"], simclr["floor"]) == ("62.00 ± 2.00 (n=3)", "random")
    assert simclr["floor mean ± std (n)"] == "50.00 ± 3.81 (n=5)"
    assert cells.loc["mae", "floor"] == f"random[{VIT}]" and cells.loc["mae", "floor mean ± std (n)"] == (
        "30.00 ± 0.82 (n=4)"
    )
    assert cells.loc["one", "margin [95% CI] (% points)"] == "+20.00"  # no interval with one seed
    assert cells.loc["moco", "margin [95% CI] (% points)"].startswith("−5.33 [")
    assert cells.loc["dino[vit_s16]", "floor"] == "none: no random run on its backbone vit_small_patch16_224"
    assert cells.loc["dino[vit_s16]", "margin [95% CI] (% points)"] == "—"
    assert cells.loc["random", "floor"] == "the floor of resnet18 (small stem)"
    assert cells.loc["pixels", "mean ± std (n)"] == f"40.00 {SAME_MARK} (n=3)"

    text = leaderboard_text(table)
    assert text.startswith(f"## Leaderboard: {DATASET}, {HEADLINE[0][0]}\n\n| # | method |")
    assert "| 3 | byol † |" in text and "| reference | pixels |" in text
    for words in (
        "Welch–Satterthwaite",
        "Holm's correction within the 4 learned methods tested here",  # not one (n < 2) nor dino
        "Seeds: learned methods n = 1, 3; floors n = 4, 5.",
        "here random is the floor of resnet18 (small stem); random[vit_tiny_patch16_224] is the floor of "
        "vit_tiny_patch16_224.",
        "not claimed to learn anything at this budget",
        "none: no random run on the method's backbone",
    ):
        assert words in text, words


def test_leaderboard_opens_table_md_and_the_page_and_equals_margins_csv(wide):
    """The full method list, one backbone: every learned method against random, ranked by mean; the
    leaderboards open table.md (the text ``leaderboard_text`` gives from table.csv alone) and the
    page; each margin, interval and p equal Welch's from table.csv (scipy)."""
    table = pd.read_csv(wide["results"] / "table.csv")
    markdown = (wide["out"] / "table.md").read_text()
    leaders = markdown.split(HEADLINE_HEADING)[0]
    assert leaders == leaderboard_text(read_table(wide["results"]))
    assert re.findall(r"^## (.*)$", leaders, re.M) == [
        f"Leaderboard: {DATASET}, {HEADLINE[0][0]}",
        f"Leaderboard: {DATASET} → {TARGET}, {HEADLINE[0][0]}",
    ]
    assert wide["html"].split("<h2>")[1].startswith(f"Leaderboard: {DATASET}, ")
    assert wide["html"].index(f'id="table-leaderboard-{DATASET}"') < wide["html"].index("table-headline")
    margin_rows = csv(wide, "margins")
    assert {
        "floor",
        "n",
        "floor_n",
        "margin",
        "ci_low",
        "ci_high",
        "p_value",
        "p_adjusted",
        "verdict",
    } <= set(margin_rows.columns)
    assert set(margin_rows["method"]) == set(table["method"]) - {"random", "pixels"}
    assert set(margin_rows["floor"]) == {"random"}
    for row in margin_rows.itertuples():
        rows = table[(table["eval_dataset"] == row.eval_dataset) & (table["metric"] == row.metric)]
        a, b = (rows.loc[rows["method"] == m, "value"] for m in (row.method, "random"))
        welch = scipy_stats.ttest_ind(a, b, equal_var=False, alternative="greater")
        assert math.isclose(row.p_value, welch.pvalue, rel_tol=1e-9) and math.isclose(row.df, welch.df)
        half = scipy_stats.t.ppf(0.975, welch.df) * math.sqrt(a.var() / len(a) + b.var() / len(b))
        assert math.isclose(row.margin, a.mean() - b.mean(), abs_tol=1e-12)
        assert math.isclose(row.ci_low, row.margin - half) and math.isclose(row.ci_high, row.margin + half)
    for target, pair in ((DATASET, DATASET), (TARGET, PAIR_ID)):
        shown = records(wide["page"], f"table-leaderboard-{pair}")
        knn = margin_rows[(margin_rows["eval_dataset"] == target) & (margin_rows["protocol"] == "knn")]
        learned = knn[knn["role"] == "learned"].sort_values("mean", ascending=False)
        ranked = [r for r in shown if r["#"][0] != "reference"]
        assert [r["method"][0].removesuffix(" †") for r in ranked] == list(learned["method"])
        assert [r["#"][0] for r in ranked] == [str(i) for i in range(1, len(ranked) + 1)]
        references = ["random", "supervised", "supervised[train.lr=0.3]", "pixels"]
        assert [r["method"][0] for r in shown[len(ranked) :]] == references
        for cells, expected in zip(ranked, learned.itertuples()):
            margin = cells["margin [95% CI] (% points)"][0]
            assert close(margin.split(" [")[0], expected.margin, 100, 2)
            mark = {"above its floor": "✓", "not resolved": "·", "below its floor mean": "✗"}
            assert cells["above its floor"][0] == mark[expected.verdict]


def test_stale_methods_are_marked_with_how_to_refresh(wide):
    for table_id in (
        f"table-headline-{DATASET}",
        f"table-headline-{PAIR_ID}",
        f"table-targets-{DATASET}-knn",
    ):
        names = [r["method"][0] for r in records(wide["page"], table_id)]
        assert [n for n in names if "†" in n] == [f"{STALE} †"], table_id
    assert "sslbench status" in wide["html"].split('id="stale-note"')[1].split("</p>")[0]
    markdown = (wide["out"] / "table.md").read_text()
    assert f"| {STALE} † |" in markdown and "sslbench status" in markdown
    assert "†" not in (Path(wide["out"]) / "summary.csv").read_text()  # the CSVs keep the plain labels


def test_runs_outside_a_git_checkout_show_unknown(wide):
    """git_dirty is None in every run.json (no git checkout): the report says unknown, never nan/None."""
    runs = records(wide["page"], "table-runs")
    assert len(runs) == 3 * (len(WIDE_BASES) + len(WIDE_SWEEPS))
    assert {(r["git_commit"][0], r["git_dirty"][0]) for r in runs} == {("unknown", "unknown")}
    versions = {r["package"][0]: r["version(s)"][0] for r in records(wide["page"], "table-versions")}
    assert versions["git_dirty"] == versions["git_commit"] == "unknown"


CHROMIUM = "/usr/bin/chromium"
WINDOW = (1400, 2200)


def run_chromium(page: Path, tmp_path: Path, *action: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a file; console messages go to stderr (--enable-logging)."""
    require(
        "chromium",
        None
        if os.path.exists(CHROMIUM)
        else f"{CHROMIUM} is absent (apt-get install chromium; CI installs it)",
    )
    run = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--hide-scrollbars",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            *action,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.parametrize("which", ["report", "wide"])
def test_report_renders_in_headless_chromium(request, which, tmp_path):
    """A screenshot with content and no console error, for the three-method page with every figure and
    for the page of the full method list. The page has no script, so the console can only report
    resources that failed."""
    path = request.getfixturevalue(which)["path"]
    shot = tmp_path / "report.png"
    run = run_chromium(path, tmp_path, f"--screenshot={shot}")
    assert not re.search(r"Uncaught|ERROR:CONSOLE|Failed to load resource|net::ERR_", run.stderr), run.stderr[
        -3000:
    ]
    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == WINDOW[::-1]
    assert shot.stat().st_size > 50_000 and pixels[..., :3].std() > 0.1
    if os.environ.get("SSLBENCH_KEEP_SCREENSHOT"):  # to look at it: SSLBENCH_KEEP_SCREENSHOT=/tmp/shot.png
        shutil.copy(shot, os.environ["SSLBENCH_KEEP_SCREENSHOT"].replace(".png", f"-{which}.png"))


# Measures the laid-out page in the browser (in a copy: the report itself runs no script) and writes
# what it found into the DOM, which --dump-dom prints.
MEASURE = """<script>
const chosen = "table.matrix, table[id^=table-headline], table[id^=table-targets]";
const fonts = t => [...t.querySelectorAll("td")].map(c => parseFloat(getComputedStyle(c).fontSize));
const out = [...document.querySelectorAll(chosen)]
  .map(t => ({id: t.id, right: t.getBoundingClientRect().right, font: Math.min(...fonts(t))}));
document.body.setAttribute("data-measured", JSON.stringify({width: window.innerWidth, tables: out}));
</script></body>"""


def test_matrices_fit_the_window_at_full_size(wide, tmp_path):
    """With every method folder and 7 sweeps (36 labels), every methods × methods matrix, headline and
    methods × targets table fits a 1400-pixel window without scrolling, in type no smaller than 10 px
    (vertical column heads)."""
    copy = tmp_path / "measured.html"
    copy.write_text(wide["html"].replace("</body>", MEASURE))
    dom = run_chromium(copy, tmp_path, "--dump-dom").stdout
    measured = json.loads(re.search(r'data-measured="([^"]+)"', dom).group(1).replace("&quot;", '"'))
    ids = [t["id"] for t in measured["tables"]]
    assert sum(i.startswith("matrix-") for i in ids) == 4 and f"table-headline-{DATASET}" in ids
    for table in measured["tables"]:
        assert table["right"] <= measured["width"], table
        assert table["font"] >= 10, table


def test_reproduced_table_sets_the_released_weights_between_the_paper_and_ours(tmp_path):
    """Three columns in the browser: the paper's number, our protocol on the authors' weights (a
    released run of the method) and our training, each from its own rows of the table."""
    results = write_results(tmp_path)
    methods, config = write_methods_and_presets(tmp_path)
    table = pd.read_csv(results / "table.csv")
    label, rng = "alpha (released: r)", np.random.default_rng(1)
    mine = table[(table["method"] == "alpha") & (table["seed"] < 2)].copy()
    for seed in (0, 1):
        write_run(mkdir(run_folder(results, DATASET, label, seed)), label, seed, 0.0, rng)
    mine = mine.assign(method=label, method_base="alpha", released_name="r", released_file="r.pth")
    mine["value"] = 0.52 + 0.01 * mine["seed"]
    pd.concat([table.assign(method_base=table["method"]), mine]).to_csv(results / "table.csv", index=False)
    path = build_report(results, methods, config, tmp_path / "out")
    row = pd.read_csv(tmp_path / "out" / "reproduced.csv").iloc[0]  # alpha's kNN on digits (paper 0.55)
    ours = table[(table["method"] == "alpha") & (table["metric"] == row["metric"])]
    ours = ours[ours["eval_dataset"] == DATASET]["value"]
    assert (row["released"], row["released_n"]) == (pytest.approx(0.525), 2)
    assert row["released_gap"] == pytest.approx(0.525 - 0.55) and row["ours"] == pytest.approx(ours.mean())

    dom = run_chromium(path, tmp_path, "--dump-dom").stdout
    parser = PageParser()
    parser.feed(dom)
    shown = records(parser, "table-reproduced")[0]
    assert close(shown["reported (%)"][0], 0.55, 100, 2)
    assert close(shown["released weights, our protocol (%)"][0], 0.525, 100, 2)
    assert close(shown["released gap (% points)"][0], 0.525 - 0.55, 100, 2)
    assert close(shown["ours (%)"][0], ours.mean(), 100, 2)


def mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder


def test_a_finished_run_prints_the_leaderboard_where_the_report_is_as_new_as_the_table(report, tmp_path):
    """The Snakefile's onsuccess: the first command shows the result, or says how to get it."""
    from sslbench.report.tables import finished_message

    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(report["results"] / "table.csv", results / "table.csv")
    assert "`snakemake --cores all` writes the report" in finished_message(results)  # no report yet
    for name in ("report.html", "table.md"):
        shutil.copy(report["out"] / name, results / name)
    shown = finished_message(results)
    assert shown.startswith("## Leaderboard: ") and shown.endswith(
        f"The whole report: {results / 'report.html'} (its tables: {results / 'table.md'})"
    )
    assert shown.split("\n\nThe whole report")[0] in (results / "table.md").read_text()
    os.utime(results / "table.csv", (1e10, 1e10))  # a table newer than its report
    assert "writes the report" in finished_message(results)
    assert finished_message(tmp_path / "nothing") == ""


def test_forty_methods_get_forty_colours_and_no_two_of_320_share_colour_and_marker():
    names = [f"m{i:03d}" for i in range(320)]
    colours = method_colours(names[:40])
    assert len(set(colours.values())) == 40
    colours = method_colours(names)
    styles = {(colours[m], method_marker(colours, m)) for m in names}
    assert len(styles) == 320
    first = method_colours(names[:10])  # a table of ten methods keeps tab10's colours
    assert [first[m] for m in names[:10]] == list(colormaps["tab10"].colors)


def test_the_report_writes_exactly_the_files_its_rule_declares(tmp_path):
    """rules/report.smk declares results/<name>.csv for each name of REPORT_TABLES, table.md, report.html
    and figures/: Snakemake then rebuilds and cleans every file the report writes, and no other."""
    import re

    from sslbench.plan.paths import REPORT_TABLES

    results = write_results(tmp_path)
    methods, config = write_methods_and_presets(tmp_path)
    out = tmp_path / "out"
    build_report(results, methods, config, out)
    written = {p.name for p in out.iterdir()}
    assert written == {f"{name}.csv" for name in REPORT_TABLES} | {"table.md", "report.html", "figures"}
    rule = (REPO / "rules" / "report.smk").read_text()
    assert "for name in REPORT_TABLES" in rule and re.search(r'report\(f"results/\{name\}\.csv"', rule)
    for caption in [*REPORT_TABLES, "report", "table_md", "figures"]:
        assert (REPO / "rules" / "captions" / f"{caption}.rst").read_text().strip(), caption
