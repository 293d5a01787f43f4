import pytest
from conftest import METHODS_DIR, tiny_suite_config

from sslbench.config import ConfigError, deep_merge, discover_methods, resolve_method_config, selected_methods


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
