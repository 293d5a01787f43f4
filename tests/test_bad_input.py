"""Bad input gets one clear message naming the file, the key and the fix, before any training."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, tiny_suite_config

from sslbench.config import ConfigError, load_config, plan_runs, preflight

CONFIG_DIR = REPO / "config"


def check(tmp_path, preset: dict) -> str:
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG_DIR, [path])
    message = str(err.value)
    assert str(path) in message, message  # names the file that set the key
    return message


@pytest.mark.parametrize(
    "preset, expected",
    [
        ({"train": {"epochs": 0}}, "`train.epochs`"),
        ({"train": {"batch_size": -4}}, "`train.batch_size`"),
        ({"train": {"batch_size": "big"}}, "not of type 'integer'"),
        ({"train": {"epocs": 3}}, "unknown key `train.epocs`"),
        ({"datasets": {"digits": {"name": "mnist"}}}, "'mnist' is not one of ['digits', 'fashion_mnist'"),
        ({"dataset": {"name": "digits"}}, "datasets are now registered by label under `datasets:`"),
        ({"pretrain": []}, "`pretrain`"),
        ({"datasets": {"my digits": {"name": "digits"}}}, "`datasets`"),
        ({"protocols": ["knn", "svm"]}, "'svm' is not one of ['knn'"),
        ({"sedes": [0]}, "unknown key `sedes`"),
    ],
)
def test_config_errors_name_file_key_and_expectation(tmp_path, preset, expected):
    assert expected in check(tmp_path, preset)


def test_a_bad_value_from_the_command_line_is_named_as_such_not_as_the_default_file(tmp_path):
    """snakemake's --config parses `seeds=[0]` as ["0"] (its YAML loader keeps the items as strings):
    the error must name --config, which set the value, and say how to give it instead."""
    preset = tmp_path / "mine.yaml"
    preset.write_text("seeds: [0, 1]\n")
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG_DIR, [preset], {"seeds": ["0"]})
    message = str(err.value)
    assert "config key `seeds.0` (set in snakemake's --config)" in message and "--configfile" in message
    assert "default.yaml" not in message and "mine.yaml" not in message
    preset.write_text("seeds: [x]\n")  # a bad value from a file: named by its file, no --config hint
    with pytest.raises(ConfigError, match=r"`seeds\.0` \(set in \S*mine\.yaml\): 'x'") as err:
        load_config(CONFIG_DIR, [preset], {"train": {"epochs": 5}})
    assert "--configfile" not in str(err.value)


def test_default_and_every_preset_validate():
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        if path.name == "schema.yaml":
            continue
        load_config(CONFIG_DIR, [path])


def checked_plan(cfg):
    plan = plan_runs(cfg, REPO / "methods", ["random"])
    preflight(cfg, plan)


def test_unknown_backbone_is_caught_before_training():
    cfg = tiny_suite_config()
    cfg["backbone"]["name"] = "resnet_18"
    with pytest.raises(ConfigError, match=r"`backbone.name`: 'resnet_18' is not a timm model"):
        checked_plan(cfg)


def test_missing_dataset_files_name_the_path_and_how_to_get_them(tmp_path):
    cfg = tiny_suite_config()
    cfg["datasets"]["digits"].update(name="cifar10", root=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError) as err:
        checked_plan(cfg)
    assert "`datasets.digits`" in str(err.value)
    assert "nowhere" in str(err.value) and "download" in str(err.value)


def test_missing_target_files_name_the_target_and_how_to_get_them(tmp_path):
    cfg = tiny_suite_config()
    cfg["datasets"]["places"] = {"name": "imagefolder", "root": str(tmp_path / "places205")}
    cfg["evaluation"]["linear"] = {**cfg["evaluation"]["linear"], "targets": ["pretrain", "places"]}
    with pytest.raises(ConfigError) as err:
        checked_plan(cfg)
    message = str(err.value)
    assert "`datasets.places`" in message and str(tmp_path / "places205") in message, message
    assert "train/<class>/<image>" in message and "Places205" in message, message


def test_snakemake_stops_at_a_bad_config_before_any_job(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"train": {"epochs": 0}}))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "--cores",
            "1",
            "--configfile",
            "bad.yaml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert re.search(
        r"`train\.epochs` \(set in \S*bad\.yaml\): 0 is less than the minimum of 1", out.stdout + out.stderr
    ), out.stderr
    assert (
        'File "' not in out.stdout + out.stderr
    )  # the message alone, no frames (SSLBENCH_DEBUG=1 shows them)
    assert not (tmp_path / "results").exists()


PRESETS = sorted(p for p in (REPO / "config").glob("*.yaml") if p.name not in ("schema.yaml", "default.yaml"))


def preset_files(stem: str) -> list[Path]:
    """The files a preset is run with: an ImageNet ablation over config/imagenet.yaml, as its header says."""
    over = ["imagenet"] if stem.startswith("ablation_") and stem.endswith("_imagenet") else []
    return [REPO / "config" / f"{name}.yaml" for name in (*over, stem)]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_resolves_for_every_method(preset):
    from sslbench.config import resolve_runs, selected_methods

    config = load_config(CONFIG_DIR, preset_files(preset.stem))
    runs = resolve_runs(config, REPO / "methods", selected_methods(config, REPO / "methods"))
    assert runs
    for resolved in runs.values():
        assert resolved["train"]["epochs"] >= 1


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    """One working directory for every plan: the method folders checked by the first are remembered
    (.snakemake/sslbench/sound_methods.json), so the others plan without importing torch."""
    return tmp_path_factory.mktemp("plans")


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_snakemake_plans_every_preset(plan_dir, preset):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-n",
            "--cores",
            "1",
            "--configfile",
            *map(str, preset_files(preset)),
        ],
        cwd=plan_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^pretrain\s+\d+", out.stdout + out.stderr, re.M)
