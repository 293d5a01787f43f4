"""Bad input gets one clear message naming the file, the key and the fix, before any training."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from support import REPO, tiny_suite_config

from sslbench.errors import ConfigError
from sslbench.plan.backbones import check_backbones
from sslbench.plan.protocols import PLANNING_LITERALS, protocol_defaults, protocol_literals
from sslbench.plan.runs import plan_runs, selected_methods
from sslbench.plan.settings import config_sources, load_config
from sslbench.plan.workflow import preflight

CONFIG_DIR = REPO / "config"


def check(tmp_path, preset: dict) -> str:
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG_DIR, [path])
    message = str(err.value)
    assert str(path) in message, message  # names the file that set the key
    return message


def snakemake(cwd, *args: str) -> subprocess.CompletedProcess:
    """The Snakefile run by snakemake on one core in ``cwd``, in a fresh process."""
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "preset, expected",
    [
        ({"train": {"epochs": 0}}, "`train.epochs`"),
        ({"train": {"batch_size": -4}}, "`train.batch_size`"),
        ({"train": {"batch_size": "big"}}, "not of type 'integer'"),
        ({"train": {"epocs": 3}}, "unknown key `train.epocs`"),
        (
            {"datasets": {"digits": {"name": "mnist"}}},
            "'mnist' is not one of ['cifar10', 'cifar100', 'digits', 'fashion_mnist'",
        ),
        ({"dataset": {"name": "digits"}}, "datasets are now registered by label under `datasets:`"),
        ({"pretrain": []}, "`pretrain`"),
        ({"datasets": {"my digits": {"name": "digits"}}}, "`datasets`"),
        ({"protocols": ["knn", "svm"]}, "'svm' is not one of ['clustering', 'finetune', 'knn', 'linear'"),
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
    check_backbones(plan, cfg, REPO / "methods", facts_file=None)
    preflight(cfg, plan)


def test_unknown_backbone_is_caught_before_training():
    cfg = tiny_suite_config()
    cfg["backbone"]["name"] = "resnet_18"
    with pytest.raises(ConfigError, match=r"unknown backbone 'resnet_18' \(config key `backbone.name`\)"):
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
    out = snakemake(tmp_path, "--configfile", "bad.yaml")
    assert out.returncode != 0
    assert re.search(
        r"`train\.epochs` \(set in \S*bad\.yaml\): 0 is less than the minimum of 1", out.stdout + out.stderr
    ), out.stderr
    assert (
        'File "' not in out.stdout + out.stderr
    )  # the message alone, no frames (SSLBENCH_DEBUG=1 shows them)
    assert not (tmp_path / "results").exists()


# --------------------------------------------------------------------------- checked by the planner
# Each bad setting stops the plan, as the Snakefile plans it, before any job: one message naming the key,
# the file that set it, the bad value and the fix.


def planned(tmp_path, preset: dict, methods_dir=REPO / "methods"):
    """The plan of the default with ``preset`` over it, as the Snakefile makes it."""
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    config = load_config(CONFIG_DIR, [path])
    methods = selected_methods(config, methods_dir)
    return plan_runs(config, methods_dir, methods, sources=config_sources(CONFIG_DIR, [path]))


def plan_error(tmp_path, preset: dict, methods_dir=REPO / "methods") -> str:
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, preset, methods_dir)
    message = str(err.value)
    assert f"(set in {tmp_path / 'preset.yaml'})" in message, message
    return message


def fashion_mnist_headers(folder: Path, train: int, test: int) -> Path:
    """The four IDX files of Fashion-MNIST, headers only: what the planner reads of them."""
    folder.mkdir()
    for name, count in (("train", train), ("t10k", test)):
        (folder / f"{name}-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + count.to_bytes(4, "big"))
        (folder / f"{name}-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03")
    return folder


def test_a_subset_larger_than_its_split_names_the_split_size(tmp_path):
    methods = {"methods": ["random"]}
    message = plan_error(tmp_path, {**methods, "datasets": {"digits": {"subset": {"train": 5000}}}})
    assert "`datasets.digits.subset.train`" in message and "5000 is more than the 1347 images" in message
    assert "give at most 1347" in message
    root = fashion_mnist_headers(tmp_path / "fmnist", train=600, test=100)  # read from the IDX headers
    fashion = {"root": str(root), "subset": {"train": 500, "test": 200}}
    message = plan_error(tmp_path, {**methods, "datasets": {"fashion_mnist": fashion}})
    assert "`datasets.fashion_mnist.subset.test`" in message and "the 100 images" in message, message
    fashion["subset"]["test"] = 100
    assert planned(tmp_path, {**methods, "datasets": {"fashion_mnist": fashion}}).runs


def test_a_subset_whose_split_size_is_only_known_when_loaded_is_checked_then():
    from sslbench.data.files import DatasetError
    from sslbench.data.registry import load_dataset

    with pytest.raises(DatasetError, match=r"`subset\.test`: 451 is more than the 450 images"):
        load_dataset("digits", subset={"test": 451})


def test_every_pretraining_dataset_optional_and_absent_is_an_error(tmp_path, monkeypatch):
    from sslbench.data.datasets import fashion_mnist

    monkeypatch.setattr(fashion_mnist, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "absent")
    preset = {"methods": ["random"], "pretrain": ["fashion_mnist"], "evaluation": {"targets": ["pretrain"]}}
    message = plan_error(tmp_path, preset)
    assert "`pretrain`" in message and "nothing can run" in message
    assert "train-images-idx3-ubyte" in message and "apt-get install dataset-fashion-mnist" in message


def test_method_overrides_of_an_unknown_method_are_an_error_of_an_unselected_one_a_warning(tmp_path):
    message = plan_error(tmp_path, {"method_overrides": {"mocoo": {"dim": 64}}})
    assert "`method_overrides`" in message and "['mocoo']" in message and "'moco'" in message
    plan = planned(tmp_path, {"methods": ["simclr"], "method_overrides": {"moco": {"dim": 64}}})
    assert len(plan.warnings) == 1 and "`method_overrides.moco`" in plan.warnings[0], plan.warnings
    assert "not among the methods this run plans (['simclr'])" in plan.warnings[0]


@pytest.mark.parametrize(
    "preset, key",
    [
        ({"method_overrides": {"simclr": {"train": {"epochs": -1}}}}, "method_overrides.simclr.train.epochs"),
        ({"variants": {"simclr": [{"train": {"epochs": -1}}]}}, "variants.simclr[0].train.epochs"),
        ({"sweeps": {"simclr": {"train.epochs": [-1]}}}, "sweeps.simclr.train.epochs"),
    ],
)
def test_a_training_setting_is_checked_wherever_it_is_given(tmp_path, preset, key):
    message = plan_error(tmp_path, {"methods": ["simclr"], **preset})
    assert f"`{key}`" in message and "-1 is less than the minimum of 1" in message, message


def test_a_methods_own_training_settings_are_checked_too(tmp_path):
    import shutil

    shutil.copytree(REPO / "methods" / "random", tmp_path / "methods" / "random")
    (tmp_path / "methods" / "random" / "config.yaml").write_text("train: {lr: -0.1}\n")
    with pytest.raises(
        ConfigError, match=r"random/config\.yaml: key `train\.lr`: -0\.1 is less than or equal"
    ):
        planned(tmp_path, {"methods": ["random"]}, tmp_path / "methods")


@pytest.mark.parametrize(
    "preset, key, words",
    [
        (
            {"sweeps": {"simclr": {"temperature": ["hot"]}}},
            "sweeps.simclr.temperature",
            ["'hot' is not of type 'number'", "simclr/config.yaml (0.5)"],
        ),
        (
            {"sweeps": {"simclr": {"train.lr": [0.1, -0.1]}}},
            "sweeps.simclr.train.lr",
            ["-0.1 is less than or equal to the minimum of 0"],
        ),
        (
            {"variants": {"simclr": [{"temperature": -0.5}]}},
            "variants.simclr[0].temperature",
            ["-0.5 is less than or equal to the minimum of 0", "simclr/schema.yaml"],
        ),
        (
            {"method_overrides": {"simclr": {"proj_dim": True}}},
            "method_overrides.simclr.proj_dim",
            ["True is not of type 'integer'"],
        ),
        (
            {"method_overrides": {"simclr": {"proj_dim": 1.5}}},
            "method_overrides.simclr.proj_dim",
            ["1.5 is not of type 'integer'"],
        ),
        (
            {"variants": {"moco": [{"version": 3}]}},
            "variants.moco[0].version",
            ["3 is not one of [1, 2, 'cifar_demo']"],
        ),
    ],
)
def test_a_method_setting_of_the_wrong_type_or_out_of_its_range_is_named(tmp_path, preset, key, words):
    message = plan_error(tmp_path, {"methods": ["simclr", "moco"], **preset})
    assert f"`{key}`" in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "section, words",
    [
        (
            {"knn": {"kk": 5}},
            [
                "unknown key `evaluation.knn.kk`",
                "['methods', 'n_per_class', 'n_tries', 'targets', 'variants']",
            ],
        ),
        ({"knn": {"variants": [{"k": "x", "temperature": 0.1}]}}, ["`evaluation.knn.variants.0.k`", "'x'"]),
        ({"linear": {"val_fraction": "x"}}, ["`evaluation.linear.val_fraction`", "not of type 'number'"]),
        ({"linear": {"lr": 3.0}}, ["unknown key `evaluation.linear.lr`"]),  # mode paper's, not cached's
        (
            {"linear": {"mode": "papr"}},
            ["`evaluation.linear.mode`", "'papr' is not one of ['cached', 'mae', 'paper']"],
        ),
    ],
)
def test_an_unknown_or_mistyped_protocol_setting_is_named(tmp_path, section, words):
    message = check(tmp_path, {"evaluation": section})
    for word in words:
        assert word in message, message


# (protocol, a value out of its range, the same setting at the rule's edge, the key named, the rule's words)
OUT_OF_RANGE = [
    ("finetune", {"layer_decay": 1.5}, {"layer_decay": 1.0}, "layer_decay", "greater than the maximum of 1"),
    ("finetune", {"epochs": -1}, {"epochs": 1}, "epochs", "-1 is less than the minimum of 1"),
    ("finetune", {"batch_size": 63}, {"batch_size": 2}, "batch_size", "63 is not a multiple of 2"),
    (
        "knn",
        {"variants": [{"k": 0, "temperature": 0.1}]},
        {"variants": [{"k": 1, "temperature": 0.1}]},
        "variants.0.k",
        "0 is less than the minimum of 1",
    ),
    ("semisup", {"val_fraction": 1.0}, {"val_fraction": 0.99}, "val_fraction", "greater than or equal to"),
    ("semisup", {"lr_grid": [0.01, 0.0]}, {"lr_grid": [1e-9]}, "lr_grid.1", "less than or equal to"),
    ("linear", {"mode": "paper", "lr": 0.0}, {"mode": "paper", "lr": 1e-9}, "lr", "less than or equal to"),
    ("linear", {"val_fraction": 0.0}, {"val_fraction": 0.01}, "val_fraction", "less than or equal to"),
    ("lowshot_svm", {"cv_folds": 1}, {"cv_folds": 2}, "cv_folds", "1 is less than the minimum of 2"),
    ("clustering", {"niter": 0}, {"niter": 1}, "niter", "0 is less than the minimum of 1"),
]


def job_error(protocol: str, settings: dict, tmp_path) -> Exception:
    """What the protocol's job raises first with these settings and inputs that are not there (no
    features, no checkpoint): its settings are judged before anything is read."""
    import importlib

    module = importlib.import_module(f"evaluation.{protocol}")
    extra = {"checkpoint_path": tmp_path / "absent.pt"} if getattr(module, "NEEDS_CHECKPOINT", False) else {}
    with pytest.raises(Exception) as err:
        module.evaluate(None, settings, 0, **extra)
    return err.value


@pytest.mark.parametrize("protocol, bad, edge, key, rule", OUT_OF_RANGE, ids=lambda v: str(v)[:40])
def test_a_protocol_setting_out_of_its_range_stops_the_plan_and_the_job_alike(
    tmp_path, protocol, bad, edge, key, rule
):
    """The plan names the key, the file that set it, the rule (its RULES) and the fix; the job raises
    the same words (one judge), less the file; a value at the rule's edge passes both."""
    from evaluation.common import ProtocolError

    message = plan_error(tmp_path, {"evaluation": {protocol: bad}})
    set_in = f" (set in {tmp_path / 'preset.yaml'})"
    line = next(line for line in message.splitlines() if f"`evaluation.{protocol}.{key}`" in line)
    assert f"`evaluation.{protocol}.{key}`{set_in}: " in line and rule in line, message
    assert f"evaluation/{protocol}.py's rule for" in line and "RULES'" in line and "Give a value" in line
    refused = job_error(protocol, bad, tmp_path)
    assert isinstance(refused, ProtocolError) and str(refused) == line.strip().replace(set_in, "")

    edge_path = tmp_path / "edge.yaml"
    edge_path.write_text(yaml.safe_dump({"evaluation": {protocol: edge}}))
    load_config(CONFIG_DIR, [edge_path])
    stopped = job_error(protocol, edge, tmp_path)  # by the absent input, past the settings
    assert not isinstance(stopped, ProtocolError), stopped


def test_every_protocols_rules_hold_for_its_own_defaults():
    from sslbench.plan.protocols import protocol_names, setting_problems

    for protocol in protocol_names():
        for name, defaults in protocol_defaults(protocol).items():
            assert setting_problems(protocol, defaults) == [], (protocol, name)


@pytest.mark.parametrize(
    "rules, words",
    [
        ({"neighbours": {"minimum": 1}}, "RULES' `neighbours` must be one of its settings"),
        ({"variants": {"minItems": -1}}, "RULES' `variants`: not a JSON schema"),
    ],
)
def test_a_protocols_unsound_rule_is_named(rules, words):
    from sslbench.plan.protocols import cached_setting_rules
    from sslbench.provenance import module_file

    path = module_file("evaluation.knn")
    text = f"{path.read_text()}\nRULES = {rules!r}\n"  # the last assignment is the one read
    with pytest.raises(ConfigError, match=f"evaluation/knn.py: {re.escape(words)}"):
        cached_setting_rules("knn", str(path), text, None)


def test_a_modes_own_protocol_settings_are_known_in_that_mode(tmp_path):
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump({"evaluation": {"linear": {"mode": "paper", "lr": 3.0, "epochs": 10}}}))
    load_config(CONFIG_DIR, [path])


@pytest.mark.parametrize(
    "protocol", ["knn", "linear", "lowshot_svm", "lowshot_logreg", "semisup", "finetune", "clustering"]
)
def test_the_planner_reads_each_protocols_own_defaults(protocol):
    import importlib

    module = importlib.import_module(f"evaluation.{protocol}")
    read = protocol_defaults(protocol)
    assert read["DEFAULTS"] == module.DEFAULTS
    assert {name: getattr(module, name) for name in read} == read
    literals = protocol_literals(protocol)  # and what it declares for planning: RULES, the flags
    assert {name: getattr(module, name) for name in literals} == literals
    assert set(literals) - set(read) == {n for n in (*PLANNING_LITERALS, "RULES") if hasattr(module, n)}


PRESETS = sorted(p for p in (REPO / "config").glob("*.yaml") if p.name not in ("schema.yaml", "default.yaml"))


def preset_files(stem: str) -> list[Path]:
    """The files a preset is run with: an ImageNet ablation or the released weights over
    config/imagenet.yaml, as their headers say."""
    over_imagenet = stem.startswith("ablation_") and stem.endswith("_imagenet") or stem == "released_imagenet"
    over = ["imagenet"] if over_imagenet else []
    return [REPO / "config" / f"{name}.yaml" for name in (*over, stem)]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_resolves_for_every_method(preset):
    from sslbench.plan.runs import resolve_runs, selected_methods

    config = load_config(CONFIG_DIR, preset_files(preset.stem))
    runs = resolve_runs(config, REPO / "methods", selected_methods(config, REPO / "methods"))
    assert runs
    for resolved in runs.values():  # a release states its epochs where its repository does
        assert "released" in resolved or resolved["train"]["epochs"] >= 1


@pytest.fixture(scope="module")
def preset_plans(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every preset's dry run, in one working directory: the method folders checked by the first plan are
    remembered (.snakemake/sslbench/sound_methods.json), so the others plan without importing torch. Each
    is one single-threaded snakemake process: after the first, two run at a time."""
    plan_dir = tmp_path_factory.mktemp("plans")

    def plan(stem: str) -> subprocess.CompletedProcess:
        return snakemake(plan_dir, "-n", "--configfile", *map(str, preset_files(stem)))

    first, *rest = [p.stem for p in PRESETS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return {first: plan(first)} | dict(zip(rest, pool.map(plan, rest), strict=True))


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_snakemake_plans_every_preset(preset_plans, preset):
    out = preset_plans[preset]
    if preset == "released_imagenet":  # nothing trains, and no released file is here: each named
        assert out.returncode == 1 and "no released weights can run" in out.stderr
        assert "put the moco release there (published at https://dl.fbaipublicfiles.com/moco" in out.stderr
        return
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^pretrain\s+\d+", out.stdout + out.stderr, re.M)
