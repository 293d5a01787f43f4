"""sslbench.bench at tiny sizes: the rows and columns, finite ratios, faiss against scikit-learn.

No timed assertions: only the structure of the CSV and what must hold whatever the machine's load
(equal kNN predictions, close k-means inertias, peak memory above an empty interpreter's).
"""

import math
import sys

import numpy as np
import pandas as pd
import pytest
from support import tiny_suite_config

from sslbench.bench import COLUMNS, SECTIONS, Repeats, Sizes, run_bench
from sslbench.bench.core import Bench, check_sections
from sslbench.bench.jobs import planned_jobs, run_measured, snakemake_benchmarks, stage_costs
from sslbench.bench.solvers import exp_vote_weights, inertia, sela_settings
from sslbench.errors import ConfigError

TINY = Sizes(
    knn_train=1500,
    knn_test=300,
    dim=32,
    classes=10,
    kmeans_points=1500,
    kmeans_k=15,
    kmeans_iters=10,
    sinkhorn_points=600,
    sinkhorn_clusters=30,
)
FAST = Repeats(warmup=1, steps=2, solvers=1, hook_budget_s=5.0)


def tiny_config(**overrides):
    cfg = tiny_suite_config()
    cfg["method_overrides"] = {"pcl": {"warmup_epochs": 0}}  # an E-step in the 2 epochs the hooks walk
    cfg.update(overrides)
    return cfg


def transfer_config(**overrides):
    """tiny_config evaluated on another dataset than the pretraining set (digits at 6 px): the plan
    then has an extract job (the pretrain job writes the pretraining set's own features)."""
    cfg = tiny_config(**overrides)
    cfg["datasets"]["digits6"] = {"name": "digits", "image_size": 6}
    cfg["evaluation"]["targets"] = ["digits6"]
    return cfg


def bench(tmp_path, sections, **kw):
    out = tmp_path / "bench.csv"
    frame = run_bench(
        out,
        sections=sections,
        quick=True,
        config=kw.pop("config", None) or tiny_config(),
        sizes=TINY,
        repeats=FAST,
        threads=1,
        verbose=False,
        **kw,
    )
    return out, frame


def rows_of(frame, section):
    return frame[frame["section"] == section].set_index("name")


def assert_ratios_positive_and_finite(frame):
    ratios = frame["ratio"].dropna()
    assert len(ratios) and all(math.isfinite(r) and r > 0 for r in ratios), frame[["name", "ratio"]]


def test_step_and_views_rows_for_each_method(tmp_path):
    out, frame = bench(tmp_path, ["views", "step"], methods=["pcl", "supervised", "random"])
    written = pd.read_csv(out)
    assert list(written.columns) == COLUMNS and len(written) == len(frame)
    assert list(frame["section"].unique()) == ["step", "views"]  # the fixed order, whatever was asked
    step = rows_of(frame, "step")
    assert {"pcl", "pcl (with views)", "pcl on_epoch_start", "supervised", "supervised (with views)"} <= set(
        step.index
    )
    assert "supervised on_epoch_start" not in step.index  # no hook to time
    assert math.isnan(step.loc["random", "value"])  # never trained: nothing timed, no ratio
    assert "never trained" in step.loc["random", "notes"]
    for name in ("pcl", "supervised"):
        assert step.loc[name, "value"] > 0 and step.loc[name, "reference"] > 0
        assert (
            step.loc[name, "ratio_is"] == "method step / bare step" and step.loc[name, "target"] == "<= 1.1"
        )
        assert step.loc[name, "meets_target"] == (step.loc[name, "ratio"] <= 1.1)
    # PCL's hook walked epochs 0 and 1 with warmup_epochs 0: two E-steps, each slower than nothing.
    assert (
        step.loc["pcl on_epoch_start", "value"] > 0 and "2 calls" in step.loc["pcl on_epoch_start", "notes"]
    )
    views = rows_of(frame, "views")
    assert set(views.index) == {"pcl", "supervised", "multi-crop"}  # the untrained floor draws no views
    # SwAV's 2 x 224 + 6 x 96 px on the tiny 8-px images: 96 / 224 of 8 px is 3.4 px, rounded to 3.
    assert "views 2 x 8px + 6 x 3px x batch 64" in views.loc["multi-crop", "notes"]
    assert "views 2 x 8px x batch 64" in views.loc["pcl", "notes"]
    assert (views["unit"] == "images/s").all()
    assert_ratios_positive_and_finite(frame)
    assert (frame["torch_threads"] == 1).all() and frame["git_commit"].str.len().gt(0).all()


def test_split_bn_rows_time_moco_with_and_without_split_bn(tmp_path):
    # batch 36: the config's bn_splits 4 divides it, the demo's 8 does not (no row for 8).
    config = tiny_config()
    config["train"]["batch_size"] = 36
    _, frame = bench(tmp_path, ["split_bn"], config=config)
    rows = rows_of(frame, "split_bn")
    assert list(rows.index) == ["moco step, bn_splits 4", "BatchNorm2d layers, 4 splits"]
    step, layers = rows.iloc[0], rows.iloc[1]
    assert step["ratio_is"] == "step with split BN / step with bn_splits 1" and step["target"] == "<= 1.03"
    assert step["meets_target"] == (step["ratio"] <= 1.03)
    assert "batch 36" in step["notes"] and "test_resnet at 8px" in step["notes"]
    assert layers["ratio_is"] == "SplitBatchNorm2d / BatchNorm2d" and "(batch 36)" in layers["notes"]
    assert (rows["value"] > 0).all() and (rows["reference"] > 0).all()
    assert_ratios_positive_and_finite(frame)


def test_knn_faiss_and_sklearn_predict_the_same(tmp_path):
    _, frame = bench(tmp_path, ["knn"])
    knn = rows_of(frame, "knn")
    # One speed-up and one agreement row per variant of the config's knn protocol.
    for variant in tiny_config()["evaluation"]["knn"]["variants"]:
        name = f"k{variant['k']} T{variant['temperature']:g}"
        assert knn.loc[f"{name} agreement", "value"] == 1.0  # every prediction equal
        assert knn.loc[f"{name} agreement", "meets_target"]
        assert knn.loc[f"{name} speed-up", "value"] > 0 and knn.loc[f"{name} speed-up", "reference"] > 0
    assert "similarity GEMM floor" in knn.index
    assert_ratios_positive_and_finite(frame)


def test_exp_vote_weights_invert_cosine_distance():
    distances = np.array([[0.0, 0.5, 1.0, 2.0]])
    assert np.allclose(exp_vote_weights(distances, 0.1), np.exp(np.array([[1.0, 0.5, 0.0, -1.0]]) / 0.1))


def test_kmeans_inertias_agree_and_inertia_is_exact(tmp_path):
    _, frame = bench(tmp_path, ["kmeans"])
    gap = rows_of(frame, "kmeans").loc[f"k{TINY.kmeans_k} inertia gap"]
    assert 0 < gap["value"] and 0 < gap["reference"]
    assert gap["ratio"] == pytest.approx(abs(gap["value"] - gap["reference"]) / gap["reference"])
    assert gap["ratio"] < 0.03  # faiss and sklearn's Lloyd land within a few % on random data
    assert_ratios_positive_and_finite(frame)
    # inertia(): the nearest centroid's squared distance, summed (hand-computed case).
    points = np.array([[0, 0], [1, 0], [10, 10]], dtype=np.float32)
    centroids = np.array([[0.5, 0], [10, 11]], dtype=np.float32)
    assert inertia(points, centroids) == pytest.approx(0.25 + 0.25 + 1.0)


def test_sinkhorn_uses_selas_settings_and_converges(tmp_path):
    _, frame = bench(tmp_path, ["sinkhorn"])
    rows = rows_of(frame, "sinkhorn")
    name = f"{TINY.sinkhorn_points}x{TINY.sinkhorn_clusters}"
    settings = sela_settings(tiny_config())
    assert 1 <= rows.loc[f"{name} iterations", "value"] < settings["max_iters"]
    assert rows.loc[f"{name} seconds", "value"] > 0
    assert f"tol {settings['tol']:g}" in rows.loc[f"{name} seconds", "notes"]
    assert rows.loc[f"{name} log-domain iteration", "unit"] == "s/iteration"
    assert_ratios_positive_and_finite(frame)


def test_run_measured_reports_the_commands_own_peak_rss(tmp_path):
    # This process holds torch (hundreds of MiB); ru_maxrss survives fork + exec, so a child forked
    # from it directly would report at least that. The wrapper must measure the command alone.
    _, empty = run_measured([sys.executable, "-c", "pass"], tmp_path / "empty.log")
    _, big = run_measured([sys.executable, "-c", "block = b'x' * (300 << 20)"], tmp_path / "big.log")
    assert empty < 100
    assert 300 <= big < empty + 330
    with pytest.raises(RuntimeError, match=r"(?s)exit 3.*boom"):
        run_measured([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "fail.log")


@pytest.mark.slow
def test_memory_rows_measure_real_jobs(tmp_path):
    config = transfer_config(protocols=["knn"])
    _, frame = bench(tmp_path, ["memory"], config=config, methods=["supervised"])
    memory = rows_of(frame, "memory")
    assert list(memory.index) == [
        "pretrain supervised",
        "extract supervised digits6",
        "evaluate supervised digits6 knn",
    ]
    baseline = float(memory["notes"].iloc[0].split("peaks at ")[1].split(" MiB")[0])
    assert baseline > 100  # an interpreter that imported torch
    # Training and extraction import what the baseline imports, and more: their peak is at least the
    # baseline's. A kNN job never imports torch (features are .npz; numpy + faiss), so it stays far below.
    assert (memory["value"][:2] >= 0.95 * baseline).all()
    assert 10 < memory["value"].iloc[2] < 0.5 * baseline
    assert (memory["reference"] == 4000).all()  # resources.<rule>.mem_mb of the config
    assert_ratios_positive_and_finite(frame)


def test_memory_section_runs_the_jobs_snakemake_plans(tmp_path):
    config = transfer_config(protocols=["knn", "clustering"])
    bench = Bench(config, None, ["supervised"], TINY, FAST, "cpu", 1, 3, tmp_path, True)
    preset = tmp_path / "one.yaml"
    preset.write_text("methods: [supervised]\nseeds: [3]\n")
    jobs = planned_jobs(bench, tmp_path / "plan", preset, target="results/table.csv")
    assert sorted((j.rule, j.wildcards.get("protocol") or j.wildcards.get("dataset")) for j in jobs) == [
        ("collect", None),
        ("evaluate", "clustering"),
        ("evaluate", "knn"),
        ("extract", None),
        ("prepare", "digits"),
        ("prepare", "digits6"),
        ("pretrain", None),
    ]
    run = "results/digits/supervised/seed3"
    for job in jobs:
        if job.rule == "evaluate":
            protocol = job.wildcards["protocol"]
            wildcards = {
                "pretrain": "digits",
                "method": "supervised",
                "seed": "3",
                "target": "digits6",
                "protocol": protocol,
            }
            assert job.wildcards == wildcards
            assert job.shell.startswith(f"sslbench evaluate --protocol {protocol} --features {run}/")
            assert set(job.files) == {
                f"{run}/eval/digits6/{protocol}.json",
                f"{run}/logs/digits6_{protocol}.log",
                f"{run}/benchmarks/digits6_{protocol}.tsv",
            }


def test_snakemake_benchmark_files_are_found_and_others_ignored(tmp_path):
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    job = tmp_path / "results" / "digits" / "moco" / "seed0" / "benchmarks" / "pretrain.tsv"
    job.parent.mkdir(parents=True)
    job.write_text(header + "12.5\t0:00:12\t812.3\t2000\t700\t720\t1\t2\t95\t11.9\n")
    (tmp_path / "results" / "table.tsv").write_text("method\tvalue\nmoco\t1\n")  # not a benchmark file
    found = snakemake_benchmarks(tmp_path)
    assert list(found["file"]) == ["results/digits/moco/seed0/benchmarks/pretrain.tsv"]
    assert found["max_rss"].tolist() == [812.3] and found["s"].tolist() == [12.5]
    assert snakemake_benchmarks(tmp_path / "results" / "digits" / "moco" / "nothing").empty


def test_bad_input_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark section.*'gpu'.*choose from"):
        check_sections(["step", "gpu"])
    assert check_sections("knn") == ["knn"] and check_sections(reversed(SECTIONS)) == list(SECTIONS)
    with pytest.raises(ConfigError, match="nosuchmethod.*known"):
        run_bench(
            tmp_path / "b.csv",
            sections=["step"],
            config=tiny_config(),
            methods=["nosuchmethod"],
            verbose=False,
        )
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        run_bench(tmp_path / "b.csv", sections=["knn"], config=tmp_path / "no_such.yaml", verbose=False)
    assert not (tmp_path / "b.csv").exists()


def test_the_cli_pins_glibcs_malloc_thresholds_and_says_so(tmp_path):
    import subprocess
    from pathlib import Path

    out = tmp_path / "bench.csv"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sslbench.cli",
            "bench",
            "--sections",
            "sinkhorn",
            "--quick",
            "--out",
            str(out),
            "--quiet",
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert set(pd.read_csv(out)["malloc"]) == {"glibc mmap and trim thresholds pinned at 1 GiB"}


def test_stage_costs_sum_each_stage_and_name_transfer_targets_apart(tmp_path):
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    seconds = {  # (method, job) -> wall s
        ("moco", "pretrain"): 30.0,
        ("pcl", "pretrain"): 50.0,
        ("moco", "extract_fashion_mnist"): 9.0,
        ("moco", "digits_linear"): 8.0,
        ("pcl", "digits_linear"): 6.0,
        ("moco", "fashion_mnist_linear"): 13.0,
    }
    for (method, name), wall in seconds.items():
        path = tmp_path / "results" / "digits" / method / "seed0" / "benchmarks" / f"{name}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + f"{wall}\t0:00:01\t1\t1\t1\t1\t0\t0\t90\t{wall}\n")
    stages = stage_costs(snakemake_benchmarks(tmp_path))
    assert list(stages.index) == ["pretrain", "linear", "fashion_mnist_linear", "extract_fashion_mnist"]
    assert stages.loc["pretrain"].tolist()[:2] == [2, 80.0] and stages.loc["linear", "per_job_s"] == 7.0
    assert stages["share"].sum() == pytest.approx(1.0) and stages.loc["pretrain", "share"] == pytest.approx(
        80 / 116
    )
    assert stages.loc["pretrain", ["median_s", "max_s"]].tolist() == [40.0, 50.0]
    assert stages.loc["linear", ["median_s", "max_s"]].tolist() == [7.0, 8.0]


def test_bench_dag_tabulates_a_finished_run_and_says_when_there_is_none(tmp_path):
    import subprocess
    from pathlib import Path

    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for seed, wall in enumerate([1.0, 2.0, 6.0]):
        path = tmp_path / "results" / "digits" / "knnonly" / f"seed{seed}" / "benchmarks" / "digits_knn.tsv"
        path.parent.mkdir(parents=True)
        path.write_text(header + f"{wall}\t0:00:01\t1\t1\t1\t1\t0\t0\t90\t{wall}\n")

    def bench(folder):
        command = [sys.executable, "-m", "sslbench.cli", "bench", "--sections", "dag", "--quiet"]
        command += ["--dag-results", str(folder), "--out", str(tmp_path / "bench.csv")]
        repo = Path(__file__).resolve().parent.parent
        return subprocess.run(command, cwd=repo, capture_output=True, text=True)

    done = bench(tmp_path)
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(tmp_path / "bench.csv").set_index("name")["value"]
    assert rows["stage knn"] == 9.0
    assert rows["stage knn median job"] == 2.0 and rows["stage knn slowest job"] == 6.0
    empty = tmp_path / "empty"
    empty.mkdir()
    done = bench(empty)
    assert done.returncode != 0 and "no Snakemake benchmark files" in done.stderr
    assert str(empty) in done.stderr and "Traceback" not in done.stderr


def test_stage_costs_count_the_prepare_jobs_as_one_stage(tmp_path):
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    files = {
        "results/prepared/benchmarks/digits.tsv": 1.0,
        "results/prepared/benchmarks/fashion_mnist.tsv": 3.0,
        "results/digits/moco/seed0/benchmarks/pretrain.tsv": 30.0,
    }
    for name, wall in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(header + f"{wall}\t0:00:01\t1\t1\t1\t1\t0\t0\t90\t{wall}\n")
    stages = stage_costs(snakemake_benchmarks(tmp_path))
    assert list(stages.index) == ["pretrain", "prepare"] and stages.loc["prepare"].tolist()[:2] == [2, 4.0]
