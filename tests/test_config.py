import json
import re
import subprocess
import sys

import pytest
from conftest import METHODS_DIR, REPO, tiny_suite_config

from sslbench.config import (
    ConfigError,
    dataset_label,
    deep_merge,
    discover_methods,
    load_config,
    resolve_method_config,
    resolve_runs,
    selected_methods,
)


def test_discovery_finds_method_folders_and_skips_template(tmp_path):
    (tmp_path / "alpha").mkdir()
    (tmp_path / "alpha" / "method.py").write_text("")
    (tmp_path / "_template").mkdir()
    (tmp_path / "_template" / "method.py").write_text("")
    (tmp_path / "no_code").mkdir()
    assert discover_methods(tmp_path) == ["alpha"]


def test_repository_methods_are_discovered():
    found = discover_methods(METHODS_DIR)
    assert {"simclr", "random"} <= set(found)
    assert "_template" not in found


def test_deep_merge_overrides_nested_and_leaves_inputs_alone():
    base = {"a": {"x": 1, "y": 2}, "b": [1, 2]}
    out = deep_merge(base, {"a": {"y": 3}, "b": [9]})
    assert out == {"a": {"x": 1, "y": 3}, "b": [9]}
    assert base == {"a": {"x": 1, "y": 2}, "b": [1, 2]}


def test_precedence_suite_then_method_then_override():
    cfg = tiny_suite_config()
    resolved = resolve_method_config(cfg, METHODS_DIR, "simclr")
    assert resolved["params"]["temperature"] == 0.5  # methods/simclr/config.yaml
    assert resolved["train"]["epochs"] == 2  # the suite
    cfg["method_overrides"] = {"simclr": {"temperature": 0.2, "train": {"epochs": 5}}}
    resolved = resolve_method_config(cfg, METHODS_DIR, "simclr")
    assert resolved["params"]["temperature"] == 0.2
    assert resolved["train"]["epochs"] == 5


def test_unknown_override_key_is_named():
    cfg = tiny_suite_config()
    cfg["method_overrides"] = {"simclr": {"temprature": 0.2}}
    with pytest.raises(ConfigError, match=r"method_overrides\.simclr\.temprature"):
        resolve_method_config(cfg, METHODS_DIR, "simclr")


def test_unknown_method_lists_known_ones():
    cfg = tiny_suite_config()
    cfg["methods"] = ["simclr", "mocoo"]
    with pytest.raises(ConfigError, match="mocoo") as err:
        selected_methods(cfg, METHODS_DIR)
    assert "simclr" in str(err.value) and "random" in str(err.value)


def write_presets(folder):
    (folder / "a.yaml").write_text("methods: [random]\nseeds: [0]\ntrain: {epochs: 3, lr: 0.5}\n")
    (folder / "b.yaml").write_text("train: {epochs: 4}\n")
    return [folder / "a.yaml", folder / "b.yaml"]


def test_load_config_merges_default_then_presets_in_order_then_overrides(tmp_path):
    presets = write_presets(tmp_path)
    config = load_config(REPO / "config", presets, {"dataset": {"label": "mydigits"}})
    assert config["train"]["epochs"] == 4 and config["train"]["lr"] == 0.5  # b over a, a over default
    assert config["train"]["batch_size"] == 128 and config["seeds"] == [0]  # default.yaml, a.yaml
    assert config["dataset"] == {**load_config(REPO / "config")["dataset"], "label": "mydigits"}
    assert dataset_label(config) == "mydigits" and dataset_label(load_config(REPO / "config")) == "digits"
    with pytest.raises(ConfigError, match=r"`train.epochs` \(set in \S*b\.yaml\)"):
        (tmp_path / "b.yaml").write_text("train: {epochs: 0}\n")
        load_config(REPO / "config", presets)


def test_the_snakefile_resolves_runs_with_the_same_loader(tmp_path):
    """Two --configfile presets and a --config override: every pretrain job's --config-json is the
    loader's resolved settings of its (dataset, method)."""
    presets = write_presets(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "results/table.csv", "-n", "-p"]
        + ["--cores", "1", "--configfile", *map(str, presets), "--config", "dataset={label: mydigits}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    planned = re.findall(r"--config-json '(\{.*?\})' --seed", out.stdout + out.stderr)
    expected = resolve_runs(
        load_config(REPO / "config", presets, {"dataset": {"label": "mydigits"}}), METHODS_DIR, ["random"]
    )
    assert [json.loads(p) for p in planned] == [expected["mydigits", "random"]]
    assert "results/mydigits/random/seed0/checkpoint.pt" in out.stdout
