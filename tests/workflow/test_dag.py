"""The DAG's dimensions with real snakemake on a copy of the project (Snakefile, rules, config, methods and
the sslbench / evaluation sources, so that a source can be edited): two pretraining datasets, an
evaluation target added later, a second preset with a sweep, and code fingerprints. One sequence of
runs, module-scoped; each test reads what one step planned or wrote."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import copy_workflow, tiny_suite_config

pytestmark = pytest.mark.slow
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PROTOCOLS = ["knn", "lowshot_svm"]  # two that import no torch: a job costs little more than its start
LOWSHOT = {"ks": [1, 2], "num_draws": 1, "cost_grid": [1.0]}


def env_for(root: Path) -> dict:
    """The copy's sslbench and evaluation first on the path (also for the `sslbench` console script
    the rules run), so that a fingerprint is taken of the copy's files."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root),
    }


def run(root: Path, *args: str) -> str:
    out = subprocess.run(args, cwd=root, env=env_for(root), capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    return text


def snakemake(root: Path, preset: str, *args: str) -> dict:
    """Run (or with -n, plan) results/table.csv: {rule: job count}, the (dataset, method folder) of
    each pretrain job, and the output. A run prints its plan before it starts, as a dry run does."""
    # targets and flags go before --configfile, which would take any argument after it as a file
    text = run(root, *SNAKEMAKE, "--cores", "2", "-p", "results/table.csv", *args, "--configfile", preset)
    counts = {
        m[1]: int(m[2])
        for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", text, re.M)
        if m[1] not in ("total", "count")
    }
    trained = re.findall(
        r"^(?:local)?rule pretrain:\n(?:.*\n)*?\s+wildcards: pretrain=(\S+), method=(\S+), seed", text, re.M
    )
    return {"counts": counts, "trained": sorted(trained), "text": text}


def write_preset(root: Path, name: str, targets: list[str], **keys) -> str:
    cfg = tiny_suite_config()
    cfg["datasets"]["digits6"] = {"name": "digits", "image_size": 6}  # a second (pretraining) dataset
    cfg.update(seeds=[0], protocols=PROTOCOLS, **keys)
    cfg["evaluation"]["targets"] = targets
    # on every target (the default runs the low-shot SVM on the pretraining set only)
    cfg["evaluation"]["lowshot_svm"] = {**cfg["evaluation"]["lowshot_svm"], **LOWSHOT, "targets": targets}
    (root / name).write_text(yaml.safe_dump(cfg))
    return name


def table(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "results" / "table.csv")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    copy_workflow(root, "sslbench", "evaluation")
    seen = {}
    # Preset A: simclr pretrained on digits (8 px) and on digits6, each evaluated on its own dataset.
    runs = {"pretrain": ["digits", "digits6"], "methods": ["simclr"]}
    a = write_preset(root, "a.yaml", ["pretrain"], **runs)
    seen["a"] = snakemake(root, a)
    seen["a_table"] = table(root)
    # A gains a transfer target: digits6 for the digits run (the digits6 run already has it).
    a = write_preset(root, "a.yaml", ["pretrain", "digits6"], **runs)
    seen["target"] = snakemake(root, a)
    seen["target_table"] = table(root)
    # Preset B, another config in the same folder: a temperature sweep of simclr on digits alone.
    sweep = {"simclr": {"temperature": [0.5, 0.2]}}  # 0.5: methods/simclr/config.yaml's own value
    one = {"pretrain": ["digits"], "methods": ["simclr"]}
    seen["sweep"] = snakemake(root, write_preset(root, "b.yaml", ["pretrain"], **one, sweeps=sweep))
    seen["sweep_table"] = table(root)
    sweep["simclr"]["temperature"].append(0.1)
    seen["sweep_value_plan"] = snakemake(
        root, write_preset(root, "b2.yaml", ["pretrain"], **one, sweeps=sweep), "-n"
    )
    # A source edit: evaluation/knn.py changes after the results were computed.
    with open(root / "evaluation" / "knn.py", "a") as f:
        f.write("# an edit after the results were computed\n")
    switch = write_preset(root, "switch.yaml", ["pretrain", "digits6"], **runs, rerun_on_code_change=True)
    seen["switch_plan"] = snakemake(root, switch, "-n")
    seen["edit"] = snakemake(root, a)  # the switch is off: the collect step alone, for the stale marks
    seen["stale_table"] = table(root)
    # The report rule on that table (preset B's runs): its ablation over the sweep, its stale marks.
    run(root, *SNAKEMAKE, "--cores", "2", "results/report.html", "--configfile", "b.yaml")
    seen["report_page"] = (root / "results" / "report.html").read_text()  # the refresh below rebuilds it
    seen["ablations"] = pd.read_csv(root / "results" / "ablations.csv")
    seen["summary"] = pd.read_csv(root / "results" / "summary.csv")
    seen["status"] = run(root, "sslbench", "status", "--configfile", a)
    command = re.search(r"^To refresh them: (.+)$", seen["status"], re.M)[1]
    seen["refresh"] = run(root, *shlex.split(command))
    seen["status_after"] = run(root, "sslbench", "status", "--configfile", a)
    seen["root"] = root
    return seen


def test_each_pretraining_dataset_method_and_seed_trains_once(grid):
    plan = grid["a"]
    assert plan["trained"] == [("digits", "simclr"), ("digits6", "simclr")]
    # the pretrain job writes its own set's features: no extract job for a run's own dataset; each
    # pretraining set is prepared once, and the targets added below reuse those files
    assert plan["counts"] == {"prepare": 2, "pretrain": 2, "evaluate": 4, "collect": 1}, plan["text"]
    rows = grid["a_table"]
    assert set(zip(rows["pretrain_dataset"], rows["eval_dataset"])) == {
        ("digits", "digits"),
        ("digits6", "digits6"),
    }
    assert set(rows.loc[rows["pretrain_dataset"] == "digits6", "image_size"]) == {6}
    assert set(rows["method"]) == {"simclr"} and set(rows["variant"]) == {"{}"}


def test_an_added_target_reruns_only_its_extraction_and_evaluation(grid):
    plan = grid["target"]
    # one extraction per (checkpoint, target), however many protocols read it
    assert plan["counts"] == {"extract": 1, "evaluate": 2, "collect": 1}, plan["text"]
    rows = grid["target_table"]
    transfer = rows[(rows["pretrain_dataset"] == "digits") & (rows["eval_dataset"] == "digits6")]
    assert set(transfer["protocol"]) == set(PROTOCOLS)
    assert set(transfer["eval_image_size"]) == {6} and set(transfer["image_size"]) == {8}
    assert set(transfer["transfer_channels"]) == {"none"}
    assert transfer["eval_normalisation"].str.startswith("pretraining set's mean").all()
    key = ["pretrain_dataset", "eval_dataset", "method", "protocol", "metric"]
    before, after = grid["a_table"].set_index(key), rows.set_index(key)
    assert after.loc[before.index, "value"].equals(before["value"])  # nothing already computed changed


def test_a_sweep_trains_one_run_per_variant_and_a_second_preset_keeps_the_first_ones_rows(grid):
    plan = grid["sweep"]
    assert plan["trained"] == [("digits", "simclr@temperature=0.2")], plan["text"]
    assert plan["counts"] == {"pretrain": 1, "evaluate": 2, "collect": 1}
    rows = grid["sweep_table"]
    variant = rows[rows["method"] == "simclr[temperature=0.2]"]
    assert set(variant["method_base"]) == {"simclr"} and set(variant["variant"]) == {'{"temperature": 0.2}'}
    assert {json.loads(p)["temperature"] for p in variant["method_params"]} == {0.2}
    # preset A's results are still in the table: the digits6 run and the transfer pair
    key = ["pretrain_dataset", "eval_dataset", "method", "protocol", "metric"]
    kept, now = grid["target_table"].set_index(key), rows.set_index(key)
    assert set(kept.index) < set(now.index)
    assert (
        grid["root"] / "results" / "digits" / "simclr@temperature=0.2" / "seed0" / "checkpoint.pt"
    ).is_file()


def test_adding_a_sweep_value_trains_only_that_variant(grid):
    plan = grid["sweep_value_plan"]
    assert plan["trained"] == [("digits", "simclr@temperature=0.1")], plan["text"]
    assert plan["counts"] == {"pretrain": 1, "evaluate": 2, "collect": 1}


def test_a_source_edit_marks_the_rows_that_ran_it_stale_and_reruns_nothing_by_default(grid):
    assert grid["edit"]["counts"] == {"collect": 1}, grid["edit"]["text"]
    rows = grid["stale_table"]
    stale = rows[rows["stale"]]
    assert set(stale["protocol"]) == {"knn"} and set(stale["stale_files"]) == {"evaluation/knn.py"}
    assert rows.loc[rows["protocol"] == "knn", "stale"].all()
    assert not rows.loc[rows["protocol"] == "lowshot_svm", "stale"].any()
    assert rows["code_pretrain"].notna().all() and rows["code_extract"].notna().all()


def test_the_report_rule_draws_the_sweep_and_marks_the_stale_rows(grid):
    results = grid["root"] / "results"
    ablations = grid["ablations"]
    knn = ablations[(ablations["metric"] == "top1_k200_t0.1") & (ablations["eval_dataset"] == "digits")]
    # the base run at its own temperature (methods/simclr/config.yaml: 0.5), beside the variant
    assert list(zip(knn["method"], knn["value"])) == [("simclr[temperature=0.2]", 0.2), ("simclr", 0.5)]
    summary = grid["summary"].set_index(["eval_dataset", "method", "metric"])
    for method, mean in zip(knn["method"], knn["mean"]):
        assert mean == pytest.approx(summary.loc[("digits", method, "top1_k200_t0.1"), "mean"])
    assert (results / "figures" / "ablation_temperature.png").stat().st_size > 5000
    page = grid["report_page"]
    assert 'id="fig-ablation-temperature-sweeps"' in page
    # knn.py changed after both runs' knn results: both marked (the refresh later reruns the base's only)
    assert "simclr †" in page and "simclr[temperature=0.2] †" in page and 'id="stale-note"' in page


def test_status_lists_the_stale_results_and_the_command_that_refreshes_them(grid):
    status = grid["status"]
    # preset A's knn results: both runs on their own dataset, the digits run on digits6
    listed = re.findall(r"^  (results/\S+\.json)", status, re.M)
    assert sorted(listed) == [
        "results/digits/simclr/seed0/eval/digits/knn.json",
        "results/digits/simclr/seed0/eval/digits6/knn.json",
        "results/digits6/simclr/seed0/eval/digits6/knn.json",
    ], status
    assert "evaluate: evaluation/knn.py" in status and "missing" not in status
    command = shlex.split(re.search(r"^To refresh them: (.+)$", status, re.M)[1])
    assert command[:6] == ["snakemake", "--cores", "all", "--configfile", "a.yaml", "--config"]
    assert command[6:8] == ["rerun_on_code_change=True", "--forcerun"]
    assert sorted(command[8:]) == sorted(listed)
    # the refresh leaves a plan that runs nothing: its forced jobs stored the code param a plain plan
    # computes from what they recorded
    assert "The plan runs nothing" in grid["status_after"], grid["status_after"]
    assert "All 6 results are up to date with the code." in grid["status_after"], grid["status_after"]
    refreshed = table(grid["root"])
    assert not refreshed.loc[refreshed["pretrain_dataset"] == "digits6", "stale"].any()


def test_the_switch_reruns_the_jobs_whose_files_changed(grid):
    plan = grid["switch_plan"]
    assert plan["counts"] == {"evaluate": 3, "collect": 1}, plan["text"]
    assert re.findall(r"--protocol (\w+)", plan["text"]) == ["knn"] * 3
