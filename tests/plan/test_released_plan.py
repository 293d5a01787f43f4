"""Released weights in the plan: a run of their method, labelled by the entry, its file's digest in its
settings; an absent file is skipped (or stops the plan when required); a wrong checksum or format stops it."""

import hashlib

import pytest
import timm
from support import METHODS_DIR, tiny_suite_config

from sslbench.errors import ConfigError
from sslbench.plan.runs import plan_runs
from sslbench.pretrain.official_files import write_official


def with_released(tmp_path, **entry) -> dict:
    config = tiny_suite_config()
    config["released"] = {"mine": {"method": "moco", "format": "torchvision", "dataset": "digits", **entry}}
    return config


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "weights.pth"
    write_official(timm.create_model("test_resnet", num_classes=0).state_dict(), "torchvision", path)
    return path


def test_a_released_file_is_a_run_of_its_method_with_its_digest(tmp_path, weights, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_runs(with_released(tmp_path, path=str(weights), epochs=800), METHODS_DIR, ["random"])
    run = plan.runs["digits", "moco (released: mine)"]
    assert plan.slugs["moco (released: mine)"] == "moco@released=mine"
    assert (run["method_base"], run["train"], run["params"]) == ("moco", {"epochs": 800}, {})
    assert run["released"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert run["released"]["file"] == "weights.pth" and ("digits", "random") in plan.runs
    assert any(f.split("/")[2] == "moco@released=mine" for f in plan.result_files([0]))


def test_an_absent_file_skips_its_run_and_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = with_released(tmp_path, path="weights/none.pth", url="https://example.org/none.pth")
    plan = plan_runs(config, METHODS_DIR, ["random"])
    assert ("digits", "moco (released: mine)") not in plan.runs
    why = plan.skipped_runs["moco (released: mine)"]
    assert "weights/none.pth" in why and "https://example.org/none.pth" in why
    config["released"]["mine"]["required"] = True
    with pytest.raises(ConfigError, match=r"released\.mine\.path.*weights/none\.pth"):
        plan_runs(config, METHODS_DIR, ["random"])


def test_a_file_unlike_the_published_checksum_stops_the_plan(tmp_path, weights, monkeypatch):
    monkeypatch.chdir(tmp_path)
    md5 = hashlib.md5(weights.read_bytes()).hexdigest()
    plan_runs(with_released(tmp_path, path=str(weights), md5=md5[:8]), METHODS_DIR, ["random"])
    wrong = "0" * 8 if not md5.startswith("0" * 8) else "f" * 8
    with pytest.raises(ConfigError, match=r"released\.mine\.md5.*not the published"):
        plan_runs(with_released(tmp_path, path=str(weights), md5=wrong), METHODS_DIR, ["random"])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"format": "mocov9"}, r"released\.mine\.format`: unknown format 'mocov9'; known: moco, pcl"),
        ({"method": "nosuch"}, r"released\.mine\.method`: no method folder methods/nosuch"),
        ({"dataset": "imagenet"}, r"released\.mine\.dataset`: 'imagenet' is not registered"),
    ],
)
def test_a_wrong_entry_names_its_key(tmp_path, weights, monkeypatch, entry, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        plan_runs(with_released(tmp_path, path=str(weights), **entry), METHODS_DIR, ["random"])
