"""A bad setting never costs a finished result: every setting that can be judged without training stops
the plan before any job, naming the key, the file that set it and the fix, with results/ untouched; a job
that fails after planning passed leaves the run's previous files in place, and setting the value back
reuses them without training."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import copy_workflow, tiny_suite_config

pytestmark = pytest.mark.slow
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--cores", "1"]

# A method whose training refuses its first batch when `fail` is set: a setting no plan can judge.
FLAKY = """
import torch

from sslbench.kit.method import Method


class Flaky(Method):
    num_views = 1

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        self.head = torch.nn.Linear(self.feature_dim, 8)
        self.fail = cfg["params"]["fail"]

    def training_loss(self, views, labels, indices):
        if self.fail:
            raise RuntimeError("this backbone refuses the first batch")
        return self.head(self.backbone(views[0])).pow(2).mean()
"""


def snakemake(root: Path, *args: str, presets=(), env: dict | None = None) -> subprocess.CompletedProcess:
    """snakemake ``args`` in ``root`` with its tiny config, then ``presets``, as --configfile."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **(env or {}),
    }
    return subprocess.run(
        [*SNAKEMAKE, *args, "--configfile", str(root / "tiny.yaml"), *presets],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def results_state(root: Path) -> dict[str, str]:
    """{path: sha256} of every file under results/."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "results").rglob("*"))
        if p.is_file()
    }


def status(root: Path, *presets: str) -> subprocess.CompletedProcess:
    """`sslbench status` in ``root`` with its tiny config, then ``presets``, as --configfile."""
    return subprocess.run(
        [sys.executable, "-m", "sslbench.cli", "status", "--configfile", str(root / "tiny.yaml"), *presets],
        cwd=root,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A copy of the workflow holding a finished run of simclr (ResNet), mae (its tiny ViT) and flaky."""
    root = copy_workflow(tmp_path_factory.mktemp("kept"))
    (root / "methods" / "flaky").mkdir()
    (root / "methods" / "flaky" / "method.py").write_text(FLAKY)
    (root / "methods" / "flaky" / "config.yaml").write_text("fail: false\naugment: {preset: mocov2}\n")
    (root / "methods" / "flaky" / "README.md").write_text("# Flaky\n\n## Implemented\n\n## Deviations\n")
    cfg = tiny_suite_config(epochs=1)
    cfg.update(methods=["simclr", "mae", "flaky"], protocols=["knn"])
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    run = snakemake(root, "results/table.csv")
    assert run.returncode == 0, run.stdout + run.stderr
    return root


def preset(root: Path, name: str, settings: dict) -> str:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(settings))
    return str(path)


VIT_2_BLOCKS = {
    "name": "vit_tiny_patch16_224",
    "args": {"patch_size": 4, "depth": 2, "num_heads": 3, "embed_dim": 96},
}


@pytest.mark.parametrize(
    "name, settings, words",
    [
        (
            "patch5",
            {
                "method_overrides": {
                    "mae": {"backbone": {"args": {"patch_size": 5, "depth": 4, "num_heads": 3}}}
                }
            },
            ["mae on digits", "`backbone.args`", "divisible by patch size (5)", "8 px"],
        ),
        ("huge_batch", {"train": {"batch_size": 1_000_000_000}}, ["`train.batch_size`", "at most 1347"]),
        (
            "features_resnet",
            {"backbone": {"features": "last4_cls"}},
            ["`backbone.features`", "Use `features: pooled`"],
        ),
        (
            "features_2_blocks",
            {"method_overrides": {"mae": {"backbone": {**VIT_2_BLOCKS, "features": "last4_cls"}}}},
            ["mae on digits", "`backbone.features`", "this ViT has 2", "deeper ViT"],
        ),
        (
            "split_bn_vit",
            {
                "methods": ["simclr", "mae", "flaky", "moco"],
                "method_overrides": {"moco": {"bn_splits": 4, "backbone": VIT_2_BLOCKS}},
            },
            ["moco on digits", "`bn_splits` = 4", "BatchNorm2d", "Set `bn_splits: 1`"],
        ),
        (
            "finetune_layer_decay",
            {"protocols": ["knn", "finetune"], "evaluation": {"finetune": {"layer_decay": 1.5}}},
            ["evaluation.finetune.layer_decay"],
        ),
        (
            "finetune_epochs",
            {"protocols": ["knn", "finetune"], "evaluation": {"finetune": {"epochs": -1}}},
            ["evaluation.finetune.epochs"],
        ),
        (
            "finetune_batch",
            {"protocols": ["knn", "finetune"], "evaluation": {"finetune": {"batch_size": 2000}}},
            ["evaluation.finetune.batch_size", "1347 train images", "lower it"],
        ),
    ],
)
def test_a_bad_setting_stops_the_plan_and_changes_nothing_under_results(finished, name, settings, words):
    before = results_state(finished)
    run = snakemake(finished, "results/table.csv", presets=[preset(finished, name, settings)])
    assert run.returncode == 1, run.stdout + run.stderr
    message = run.stderr
    assert "sslbench: error:" in message and f"{name}.yaml" in message, message
    for word in words:
        assert word in message, (word, message)
    assert "Traceback" not in message and "Job stats" not in run.stdout + message
    assert results_state(finished) == before


def test_with_the_bad_settings_gone_nothing_reruns(finished):
    run = snakemake(finished, "-n", "results/table.csv")
    assert run.returncode == 0 and "Nothing to be done" in run.stdout + run.stderr, run.stdout + run.stderr


def test_debug_shows_the_traceback_of_a_plan_error(finished):
    bad = preset(finished, "debug", {"backbone": {"features": "last4_cls"}})
    run = snakemake(finished, "-n", presets=[bad], env={"SSLBENCH_DEBUG": "1"})
    assert run.returncode == 1
    assert "Traceback (most recent call last)" in run.stderr and "check_backbones" in run.stderr, run.stderr


def test_a_job_that_fails_after_the_plan_leaves_the_run_in_place_and_the_fix_reuses_it(finished):
    run_dir = finished / "results" / "digits" / "flaky" / "seed0"
    kept = {p: (run_dir / p).read_bytes() for p in ("checkpoint.pt", "run.json", "features/digits.npz")}
    failing = preset(finished, "flaky_fails", {"method_overrides": {"flaky": {"fail": True}}})
    run = snakemake(finished, "results/table.csv", presets=[failing])
    assert run.returncode == 1, run.stdout + run.stderr
    assert "refuses the first batch" in (run_dir / "logs" / "pretrain.log").read_text()
    assert {p: (run_dir / p).read_bytes() for p in kept} == kept  # put back by Snakemake's update()

    run = snakemake(finished, "results/table.csv")  # the setting set back: the finished run is kept
    assert run.returncode == 0, run.stdout + run.stderr
    assert "not trained again" in (run_dir / "logs" / "pretrain.log").read_text()
    assert {p: (run_dir / p).read_bytes() for p in kept} == kept


@pytest.mark.parametrize("text", ["just a string\n", "- a\n- list\n"])
def test_a_configfile_that_is_no_mapping_changes_nothing_and_status_names_it(finished, text):
    """Snakemake reads --configfile itself and does not name the file (README, "When something goes
    wrong"); `sslbench status` with the same files does."""
    before = results_state(finished)
    bad = finished / "not_a_mapping.yaml"
    bad.write_text(text)
    run = snakemake(finished, "results/table.csv", presets=[str(bad)])
    assert run.returncode == 1 and "Config file must be given as JSON or YAML" in run.stderr, run.stderr
    assert results_state(finished) == before
    said = status(finished, str(bad))
    assert said.returncode == 1
    assert f"{bad}: expected a mapping of keys to values at the top level" in said.stderr, said.stderr
    assert "Traceback" not in said.stderr


def test_results_copied_into_a_fresh_clone_plan_nothing(finished, tmp_path):
    """A clone has fresh file dates and no .snakemake/; results/ copied with its dates (`cp -a`): the same
    code and settings rerun nothing, and status agrees with the plan."""
    import shutil

    clone = tmp_path / "clone"
    shutil.copytree(finished, clone, ignore=shutil.ignore_patterns(".snakemake", "results"))
    later = (finished / "results" / "table.csv").stat().st_mtime + 3600
    for path in clone.rglob("*"):
        os.utime(path, (later, later))  # every workflow file newer than every result, as in a clone
    shutil.copytree(finished / "results", clone / "results")  # copy2 keeps the dates, like cp -a

    run = snakemake(clone, "-n", "results/table.csv")
    assert run.returncode == 0 and "Nothing to be done" in run.stdout + run.stderr, run.stdout + run.stderr
    said = status(clone)
    assert said.returncode == 0, said.stderr
    # the fixture stopped at table.csv: the report alone is to make
    assert said.stdout.splitlines()[1:] == [
        "  - report results/report.html: missing",
        "All 3 results are up to date with the code.",
    ], said.stdout

    # a method folder added: its jobs and the collect step alone (Snakemake has no record here of the
    # results collect last read: results/collected.txt, whose date moves when that list changes)
    shutil.copytree(clone / "methods" / "flaky", clone / "methods" / "flaky2")
    cfg = yaml.safe_load((clone / "tiny.yaml").read_text())
    (clone / "added.yaml").write_text(yaml.safe_dump({"methods": [*cfg["methods"], "flaky2"]}))
    run = snakemake(clone, "-n", "results/table.csv", "-q", "rules", presets=[str(clone / "added.yaml")])
    counts = dict(re.findall(r"^(\w+) +(\d+)$", run.stdout, re.M))
    assert counts == {"pretrain": "1", "evaluate": "1", "collect": "1", "total": "3"}, run.stdout + run.stderr

    # an edit after the copy: no record of the last run's settings here, so the plan keeps the result
    # and status names it, with the command that reruns it
    with open(clone / "methods" / "flaky" / "method.py", "a") as f:
        f.write("# an edit after the copy\n")
    said = status(clone).stdout
    assert "results/digits/flaky/seed0/eval/digits/knn.json  (pretrain: methods/flaky/method.py" in said, said
    assert "--forcerun results/digits/flaky/seed0/checkpoint.pt" in said, said


def test_an_edit_to_a_method_reruns_its_jobs_and_status_says_why(finished):
    method = finished / "methods" / "flaky" / "method.py"
    source = method.read_text()
    try:
        method.write_text(source + "# an edit to the method\n")
        run = snakemake(finished, "-n", "results/table.csv")
        plan = run.stdout + run.stderr
        assert run.returncode == 0 and "Params have changed" in plan, plan
        assert set(re.findall(r"^pretrain +(\d+)$", plan, re.M)) == {"1"}, plan  # job stats, printed twice
        said = status(finished).stdout
        assert "  - pretrain results/digits/flaky/seed0/" in said, said
        assert "its settings or its method folder's code changed" in said, said
        assert "  - evaluate: 1 jobs, as an input is rewritten first" in said, said
    finally:
        method.write_text(source)
