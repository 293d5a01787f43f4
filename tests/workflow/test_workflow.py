"""End to end: real snakemake on a copy of the workflow with a tiny config."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import copy_workflow, tiny_suite_config

from sslbench.plan.runs import plan_runs, selected_methods

pytestmark = pytest.mark.slow
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """A copy of the workflow (Snakefile, rules, config, methods) with a tiny config, run once."""
    root = tmp_path_factory.mktemp("wf")
    copy_workflow(root)
    cfg = tiny_suite_config()
    cfg["seeds"] = [0, 1]
    cfg["methods"] = ["simclr", "random"]
    # every protocol runs, at the smallest settings that still run each code path (their own tests pin
    # the settings; here the DAG is what is checked)
    cfg["evaluation"]["semisup"] |= {"epochs": {"1pct": 4, "10pct": 2}, "lr_grid": [0.01, 0.03]}
    cfg["evaluation"]["lowshot_svm"] |= {"ks": [1, 4], "num_draws": 2, "cost_grid": [0.1, 1.0, 10.0]}
    cfg["protocols"].append("finetune")  # not in the default: MAE's fine-tuning on every label
    cfg["evaluation"]["finetune"] = {"epochs": 1, "batch_size": 64, "warmup_epochs": 0.5}
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    run = snakemake(root, "--cores", "2")  # the default target: the report, via the table
    assert run.returncode == 0, run.stdout + run.stderr
    return root


UMASK = 0o002  # not the usual 022: outputs must follow the umask, not a fixed mode


def snakemake(root: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # The rules call the `sslbench` console script: put this interpreter's bin folder first on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [*SNAKEMAKE, "--configfile", str(root / "tiny.yaml"), *args],
        cwd=cwd or root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        umask=UMASK,
    )


def planned_jobs(root: Path, *extra: str) -> dict[str, int]:
    out = snakemake(root, "-n", "--cores", "2", *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", text, re.M)
        if m.group(1) not in ("total", "count")
    }


def test_table_has_every_method_seed_and_its_settings(workflow):
    table = pd.read_csv(workflow / "results" / "table.csv")
    runs = set(zip(table["method"], table["seed"]))
    assert runs == {("simclr", 0), ("simclr", 1), ("random", 0), ("random", 1)}
    knn = table[table["metric"] == "top1_k200_t0.1"]
    assert len(knn) == 4 and knn["value"].between(0, 1).all()
    for column in (
        "backbone",
        "epochs",
        "batch_size",
        "image_size",
        "protocol_settings",
        "git_commit",
        "device",
        "version_torch",
        "eval_wall_time_s",
        "small_stem",
        "run_settings",
    ):
        assert column in table.columns and table[column].notna().all(), column
    # one name for every setting a run trained with: the same across a method's seeds, another method's
    # settings another name (the record on many seeds is matched by it)
    settings = table.groupby("method")["run_settings"].nunique()
    assert dict(settings) == {"random": 1, "simclr": 1}
    assert table.groupby("method")["run_settings"].first().nunique() == 2


def test_dag_shows_pretrain_extract_evaluate_collect(workflow):
    # with a transfer target for kNN: the pretrain job writes its own set's features, extract the others'
    cfg = yaml.safe_load((workflow / "tiny.yaml").read_text())
    cfg["datasets"]["digits6"] = {"name": "digits", "image_size": 6}
    cfg["evaluation"]["knn"]["targets"] = ["pretrain", "digits6"]
    (workflow / "target.yaml").write_text(yaml.safe_dump(cfg))
    # the last --configfile wins: target.yaml is the whole tiny config and its target
    out = snakemake(
        workflow, "-n", "--forceall", "--cores", "2", "--configfile", str(workflow / "target.yaml")
    )
    text = out.stdout + out.stderr
    for rule in ("pretrain", "extract", "evaluate", "collect", "report"):
        assert re.search(rf"^{rule}\s+\d+", text, re.M), text


def test_rerun_with_nothing_changed_does_no_work(workflow):
    out = snakemake(workflow, "-n", "--cores", "2")
    assert "Nothing to be done" in out.stdout + out.stderr


def test_a_moved_or_copied_checkout_plans_no_work(workflow, tmp_path):
    """Every path the DAG sees is relative to the working directory: renaming the whole folder, or
    copying it (results/ and .snakemake/ with it) elsewhere, retrains nothing."""
    moved = workflow.with_name(workflow.name + "_moved")
    workflow.rename(moved)
    try:
        out = snakemake(moved, "-n", "--cores", "2")
    finally:
        moved.rename(workflow)
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout + out.stderr

    copy = tmp_path / "another" / "mount"
    shutil.copytree(workflow, copy, symlinks=True)  # keeps modification times, as cp -a or rsync -a do
    out = snakemake(
        copy, "-s", str(copy / "Snakefile"), "--directory", str(copy), "-n", "--cores", "2", cwd=tmp_path
    )
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout + out.stderr


def test_every_output_has_the_mode_the_umask_gives(workflow):
    """Files written atomically (tables, report, figures, checkpoints, features) are readable by
    whoever the umask allows, like every file snakemake itself writes."""
    modes = {
        str(p.relative_to(workflow / "results")): p.stat().st_mode & 0o777
        for p in (workflow / "results").rglob("*")
        if p.is_file()
    }
    for name in ("report.html", "table.csv", "figures/digits_bars.png", "digits/simclr/seed0/checkpoint.pt"):
        assert name in modes, sorted(modes)
    assert {name for name, mode in modes.items() if mode != 0o666 & ~UMASK} == set(), modes


def test_report_and_tables_are_written(workflow):
    results = workflow / "results"
    for name in ("report.html", "table.md", "summary.csv", "comparisons.csv"):
        assert (results / name).stat().st_size > 0, name
    summary = pd.read_csv(results / "summary.csv")
    assert set(summary["method"]) == {"simclr", "random"}
    assert "simclr" in (results / "table.md").read_text()


def test_new_method_folder_runs_only_its_jobs_and_collect(workflow):
    shutil.copytree(workflow / "methods" / "simclr", workflow / "methods" / "simclr_copy")
    cfg = yaml.safe_load((workflow / "tiny.yaml").read_text())
    cfg["methods"] = "all"
    cfg["method_overrides"] = {}
    (workflow / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    try:
        methods = selected_methods(cfg, workflow / "methods")
        jobs = planned_jobs(workflow, "results/table.csv")
        # every run not yet trained (the copy's, any other repository method's but those the default leaves
        # out, and the floors the plan adds for other backbones: MAE's ViT, DenseCL's small stem) once a seed
        runs = {label for _, label in plan_runs(cfg, workflow / "methods", methods).runs}
        assert jobs["pretrain"] == 2 * len(runs - {"simclr", "random"}) and jobs["collect"] == 1, jobs
        assert "simclr_copy" in methods and "random[vit_tiny_patch16_224]" in runs
    finally:
        shutil.rmtree(workflow / "methods" / "simclr_copy")


def test_broken_method_folder_stops_before_training_or_is_left_out_by_the_setting(workflow):
    broken = workflow / "methods" / "broken"
    broken.mkdir()
    (broken / "method.py").write_text("from sslbench import Method\nclass Broken(Method)\n    pass\n")
    cfg = yaml.safe_load((workflow / "tiny.yaml").read_text())
    cfg["methods"] = ["simclr", "random", "broken"]
    (workflow / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    before = (workflow / "results" / "table.csv").read_bytes()
    try:
        out = snakemake(workflow, "--cores", "2")
        text = out.stdout + out.stderr
        assert out.returncode != 0
        assert "methods/broken" in text and "syntax error" in text, text
        assert "broken_methods=leave_out" in text, text
        assert not (workflow / "results" / "digits" / "broken").exists()
        assert (workflow / "results" / "table.csv").read_bytes() == before  # nothing computed is touched

        out = snakemake(workflow, "--cores", "2", "--config", "broken_methods=leave_out")
        assert out.returncode == 0, out.stdout + out.stderr
        failures = pd.read_csv(workflow / "results" / "failures.csv")
        assert list(failures["method"]) == ["broken"] and "syntax error" in failures["problem"][0]
        table = pd.read_csv(workflow / "results" / "table.csv")
        assert set(table["method"]) == {"simclr", "random"}
        # the report names the broken folder
        out = snakemake(workflow, "--cores", "2", "--config", "broken_methods=leave_out")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "Failed (not run): broken:" in (workflow / "results" / "table.md").read_text()
        assert 'id="table-failures"' in (workflow / "results" / "report.html").read_text()
    finally:
        shutil.rmtree(broken)
        cfg["methods"] = ["simclr", "random"]
        (workflow / "tiny.yaml").write_text(yaml.safe_dump(cfg))


def test_same_config_and_seed_give_a_bit_identical_table(workflow):
    """Retrain one run from scratch (checkpoints deleted): every value in the table is the same."""

    def values():
        table = pd.read_csv(workflow / "results" / "table.csv", dtype={"value": str})  # compare as text
        return table.set_index(["method", "seed", "protocol", "metric"])["value"].sort_index()

    before = values()
    shutil.rmtree(workflow / "results" / "digits" / "simclr" / "seed0" / "checkpoints")
    out = snakemake(
        workflow,
        "--cores",
        "2",
        "--forcerun",
        "results/digits/simclr/seed0/checkpoint.pt",
        "results/table.csv",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "localrule pretrain" in out.stdout + out.stderr or "rule pretrain" in out.stdout + out.stderr
    after = values()
    assert before.equals(after)


def planned_inputs(root: Path, cfg: dict) -> dict[tuple, list[str]]:
    """{(rule, wildcard values...): the job's inputs} of a dry run of ``cfg``."""
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    out = snakemake(root, "-n", "--forceall", "--cores", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    jobs, rule, inputs = {}, None, []
    for line in (out.stdout + out.stderr).splitlines():
        if found := re.match(r"^(?:local)?rule (\w+):$", line):
            rule, inputs = found[1], []
        elif found := re.match(r"^\s+input: (.+)$", line):
            inputs = found[1].split(", ")
        elif (found := re.match(r"^\s+wildcards: (.+)$", line)) and rule:
            values = dict(pair.split("=", 1) for pair in found[1].split(", "))
            keys = ("dataset",) if rule == "prepare" else ("pretrain", "target", "protocol")
            key = (rule, *(values[k] for k in keys if k in values))
            jobs[key] = inputs
    return jobs


def test_a_prepared_file_or_checkpoint_is_an_input_of_exactly_the_jobs_that_read_it(tmp_path):
    """One prepare job per dataset held in memory that the plan loads; its file is an input of the
    pretrain job (the pretraining set), each extraction (its target) and the protocols that load
    images (semisup, finetune, linear in mode paper), never of those on the cached features alone (a
    new prepared file must not rerun them). A folder dataset decodes lazily: it has none. The run's
    checkpoint is an input of each extraction and of the protocols whose module sets NEEDS_CHECKPOINT
    (semisup, finetune, linear), never of kNN, which a new checkpoint reaches through its features."""
    root = tmp_path / "wf"
    root.mkdir()
    copy_workflow(root)
    for split in ("train", "val"):
        (tmp_path / "places" / split / "bakery").mkdir(parents=True)  # planning only looks for them
    cfg = tiny_suite_config()
    cfg["datasets"] |= {
        "digits6": {"name": "digits", "image_size": 6},
        "places": {"name": "imagefolder", "root": str(tmp_path / "places"), "image_size": 8},
    }
    targets = ["pretrain", "digits6", "places"]
    protocols = ["knn", "linear", "semisup", "finetune"]
    cfg.update(methods=["random"], protocols=protocols)
    cfg["evaluation"]["targets"] = targets
    cfg["evaluation"]["semisup"]["targets"] = targets
    prepared = {label: [f"results/prepared/{label}.npz"] for label in ("digits", "digits6")}
    checkpoint = ["results/digits/random/seed0/checkpoint.pt"]
    for mode, image_protocols in (
        ("cached", {"semisup", "finetune"}),
        ("paper", {"semisup", "finetune", "linear"}),
    ):
        cfg["evaluation"]["linear"] = {"mode": mode}
        planned = planned_inputs(root, cfg)
        for key, inputs in planned.items():
            reads = (
                key[0] == "extract" or key[0] == "evaluate" and key[-1] in ("linear", "semisup", "finetune")
            )
            assert [i for i in inputs if i.endswith("/checkpoint.pt")] == (checkpoint if reads else []), key
        jobs = {k: [i for i in v if i.startswith("results/prepared/")] for k, v in planned.items()}
        expected = {("prepare", label): [] for label in prepared}
        expected["pretrain", "digits"] = prepared["digits"]
        expected |= {("extract", "digits", t): prepared.get(t, []) for t in ("digits6", "places")}
        for target in ("digits", "digits6", "places"):
            for protocol in protocols:
                reads = protocol in image_protocols
                expected["evaluate", "digits", target, protocol] = prepared.get(target, []) if reads else []
        assert {k: v for k, v in jobs.items() if k[0] != "collect"} == expected, mode
