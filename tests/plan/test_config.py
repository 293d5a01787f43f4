import json
import math
import re
import subprocess
import sys

import pytest
from support import METHODS_DIR, REPO, preset_config, tiny_suite_config

from sslbench.errors import ConfigError
from sslbench.plan.checks import deep_merge, load_yaml
from sslbench.plan.protocols import protocol_settings
from sslbench.plan.runs import discover_methods, method_slug, plan_runs, resolve_runs, selected_methods
from sslbench.plan.settings import load_config, resolve_method_config
from sslbench.plan.workflow import preflight


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


def test_a_training_key_default_yaml_leaves_absent_may_be_set_for_one_method_but_a_typo_may_not():
    """train.step_factor is in the schema, absent from default.yaml (so absent from other runs)."""
    cfg = tiny_suite_config()
    assert "step_factor" not in cfg["train"]
    cfg["method_overrides"] = {"simclr": {"train": {"step_factor": 0.2}}}
    assert resolve_method_config(cfg, METHODS_DIR, "simclr")["train"]["step_factor"] == 0.2
    cfg["method_overrides"] = {"simclr": {"train": {"step_factr": 0.2}}}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['step_factr'\] under `train`"):
        resolve_method_config(cfg, METHODS_DIR, "simclr")


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


def test_methods_all_leaves_out_the_excluded_folders(tmp_path):
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "method.py").write_text("")
    every = ["alpha", "beta", "gamma"]
    assert selected_methods({"methods": "all", "methods_excluded": ["beta"]}, tmp_path) == ["alpha", "gamma"]
    assert selected_methods({"methods": ["beta"], "methods_excluded": ["beta"]}, tmp_path) == ["beta"]
    # a name without a folder leaves nothing out (a copy of the suite may keep only some folders)
    assert selected_methods({"methods": "all", "methods_excluded": ["delta"]}, tmp_path) == every
    default = selected_methods(load_config(REPO / "config", [], {}), METHODS_DIR)
    assert not {"simmim", "msn", "ibot", "ijepa", "dinov3", "franca", "capi"} & set(default) and {
        "mae",
        "dinov2",
    } <= set(default)


def write_presets(folder):
    (folder / "a.yaml").write_text("methods: [random]\nseeds: [0]\ntrain: {epochs: 3, lr: 0.5}\n")
    (folder / "b.yaml").write_text("train: {epochs: 4}\n")
    return [folder / "a.yaml", folder / "b.yaml"]


def test_load_config_merges_default_then_presets_in_order_then_overrides(tmp_path):
    presets = write_presets(tmp_path)
    config = load_config(REPO / "config", presets, {"datasets": {"digits": {"image_size": 12}}})
    assert config["train"]["epochs"] == 4 and config["train"]["lr"] == 0.5  # b over a, a over default
    assert config["train"]["batch_size"] == 128 and config["seeds"] == [0]  # default.yaml, a.yaml
    assert config["datasets"]["digits"] == {"name": "digits", "image_size": 12}  # --config over default
    assert config["datasets"]["fashion_mnist"] == load_config(REPO / "config")["datasets"]["fashion_mnist"]
    with pytest.raises(ConfigError, match=r"`train.epochs` \(set in \S*b\.yaml\)"):
        (tmp_path / "b.yaml").write_text("train: {epochs: 0}\n")
        load_config(REPO / "config", presets)


def test_the_snakefile_resolves_runs_with_the_same_loader(tmp_path):
    """Three --configfile presets and a --config override: every pretrain job's --config-json is the
    loader's resolved settings of its (pretraining dataset, method)."""
    presets = write_presets(tmp_path)
    # the floor on the config's one seed: one pretrain job to compare
    preset = "datasets: {mydigits: {name: digits, image_size: 8}}\nfloor: {seeds: 0}\n"
    (tmp_path / "c.yaml").write_text(preset)
    presets.append(tmp_path / "c.yaml")
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "results/table.csv", "-n", "-p"]
        + ["--cores", "1", "--configfile", *map(str, presets), "--config", "pretrain=[mydigits]"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    planned = re.findall(r"--config-json '(\{.*?\})' --seed", out.stdout + out.stderr)
    expected = resolve_runs(
        load_config(REPO / "config", presets, {"pretrain": ["mydigits"]}), METHODS_DIR, ["random"]
    )
    assert [json.loads(p) for p in planned] == [expected["mydigits", "random"]]
    assert "results/mydigits/random/seed0/checkpoint.pt" in out.stdout


# --------------------------------------------------------------------------- datasets, targets, variants


def grid_config(**keys) -> dict:
    """The tiny suite with two pretraining datasets (digits at two sizes) and ``keys`` on top."""
    cfg = tiny_suite_config()
    cfg["datasets"]["digits12"] = {"name": "digits", "image_size": 12}
    cfg["pretrain"] = ["digits", "digits12"]
    cfg.update(keys)
    return cfg


def test_runs_are_keyed_by_pretraining_dataset_and_method_label():
    cfg = grid_config(
        variants={"simclr": [{"name": "t01", "temperature": 0.1}]},
        sweeps={"simclr": {"temperature": [0.5, 0.2], "train.lr": [0.3]}},
    )
    plan = plan_runs(cfg, METHODS_DIR, ["simclr", "random"])
    labels = {"simclr", "simclr[t01]", "simclr[temperature=0.2]", "simclr[train.lr=0.3]", "random"}
    # temperature 0.5 is methods/simclr/config.yaml's own value: the base run, not a second one
    assert set(plan.runs) == {(p, m) for p in ("digits", "digits12") for m in labels}
    run = plan.runs["digits12", "simclr[temperature=0.2]"]
    assert run["params"]["temperature"] == 0.2 and run["dataset"]["image_size"] == 12
    assert run["method"] == "simclr[temperature=0.2]" and run["method_base"] == "simclr"
    assert run["variant"] == {"temperature": 0.2}
    lr_run = plan.runs["digits", "simclr[train.lr=0.3]"]
    assert lr_run["train"]["lr"] == 0.3 and lr_run["params"] == plan.runs["digits", "simclr"]["params"]
    assert plan.runs["digits", "simclr[t01]"]["params"]["temperature"] == 0.1
    assert plan.runs["digits", "simclr"]["variant"] == {}


def test_a_variant_folder_name_is_found_by_glob_and_by_snakemake_as_itself(tmp_path):
    """Path.glob reads `[` as a character class and snakemake `{` as a wildcard: the folder name of
    a label has neither, nor spaces, and each label has its own folder."""
    labels = ["moco", "moco[queue_size=256]", "moco[crop_scale=[0.2, 1.0],name=a b]", "moco[m09]"]
    slugs = [method_slug(label) for label in labels]
    assert slugs[:2] == ["moco", "moco@queue_size=256"] and len(set(slugs)) == len(labels)
    for slug in slugs:
        assert not set(slug) & set("[]*?{} /\\"), slug
        (tmp_path / slug).mkdir()
    for slug in slugs:
        assert list(tmp_path.glob(slug)) == [tmp_path / slug]


@pytest.mark.parametrize(
    "keys, key, words",
    [
        (
            {"sweeps": {"simclr": {"temprature": [0.1]}}},
            "sweeps.simclr.temprature",
            ["no setting 'temprature'"],
        ),
        (
            {"sweeps": {"simclr": {"train.lrr": [0.1]}}},
            "sweeps.simclr.train.lrr",
            ["unknown training setting 'lrr'"],
        ),
        ({"sweeps": {"simclr": {"temperature": []}}}, "sweeps.simclr.temperature", ["empty list"]),
        ({"sweeps": {"mocoo": {"temperature": [0.1]}}}, "sweeps", ["mocoo", "simclr"]),
        (
            {"variants": {"simclr": [{"temperature": 0.2}, {"name": "again", "temperature": 0.2}]}},
            "variants.simclr[1]",
            ["simclr[again]", "simclr[temperature=0.2]", "same settings"],
        ),
        ({"variants": {"simclr": [{"temperature": 0.5}]}}, "variants.simclr[0]", ["same settings as simclr"]),
        ({"variants": {"simclr": [{"name": "x"}]}}, "variants.simclr[0]", ["at least one setting"]),
        ({"pretrain": ["digitz"]}, "pretrain", ["digitz", "digits12"]),
        ({"evaluation": {"targets": ["pretrain", "mnist"]}}, "evaluation.targets", ["'mnist'", "digits12"]),
        (
            {"evaluation": {"knn": {"targets": ["voc"]}}},
            "evaluation.knn.targets",
            ["voc (voc07) is multi-label", "['lowshot_svm']", "Remove voc"],
        ),
    ],
)
def test_bad_grid_keys_are_named_with_the_method_or_dataset_and_the_fix(keys, key, words):
    cfg = grid_config(**keys)
    cfg["datasets"]["voc"] = {"name": "voc07", "root": "/nowhere"}
    with pytest.raises(ConfigError) as err:
        plan_runs(cfg, METHODS_DIR, ["simclr", "random"], check_files=False)
    message = str(err.value)
    assert f"`{key}`" in message, message
    for word in words:
        assert word in message, message


def test_targets_per_protocol_and_the_pretraining_set_itself():
    cfg = grid_config()
    cfg["evaluation"] = {
        **cfg["evaluation"],
        "targets": ["pretrain", "digits12"],
        "knn": {**cfg["evaluation"]["knn"], "targets": ["digits"]},
    }
    cfg["datasets"]["voc"] = {"name": "voc07", "root": "/nowhere"}
    cfg["evaluation"]["lowshot_svm"] = {**cfg["evaluation"]["lowshot_svm"], "targets": ["pretrain", "voc"]}
    plan = plan_runs(cfg, METHODS_DIR, ["random"], check_files=False)
    assert plan.targets["digits", "linear"] == ["digits", "digits12"]
    assert plan.targets["digits12", "linear"] == ["digits12"]  # `pretrain` is digits12 itself: once
    assert plan.targets["digits", "knn"] == plan.targets["digits12", "knn"] == ["digits"]
    assert plan.targets["digits", "lowshot_svm"] == ["digits", "voc"]  # multi-label: lowshot_svm only
    assert "results/digits12/random/seed0/eval/digits/knn.json" in plan.result_files([0])
    assert protocol_settings(cfg, "knn") == {"variants": cfg["evaluation"]["knn"]["variants"]}


def test_an_absent_optional_target_is_skipped_saying_how_to_install_it(tmp_path, monkeypatch):
    from sslbench.data.datasets import fashion_mnist

    monkeypatch.setattr(fashion_mnist, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "absent")
    cfg = tiny_suite_config()
    cfg["evaluation"]["targets"] = ["pretrain", "fashion_mnist"]
    plan = plan_runs(cfg, METHODS_DIR, ["random"])
    assert "apt-get install dataset-fashion-mnist" in plan.skipped["fashion_mnist"]
    assert all(targets == ["digits"] for targets in plan.targets.values())  # the rest is planned
    cfg["datasets"]["fashion_mnist"]["optional"] = False  # required: a clear error before any job
    plan = plan_runs(cfg, METHODS_DIR, ["random"])
    with pytest.raises(
        ConfigError, match=r"`datasets.fashion_mnist`: fashion_mnist: dataset files not found"
    ):
        preflight(cfg, plan)


# The official base lr of each new method's recipe, scaled by batch / 256 (SwAV's is absolute); the CIFAR
# presets run BYOL's Imagenette setting and SimSiam's CIFAR-10 appendix setting.
LR_BASE = {"byol": 0.2, "simsiam": 0.05, "mocov3": 0.6, "barlowtwins": 0.2, "vicreg": 0.2, "dino": 0.03}
CIFAR_LR_BASE = {"byol": 2.0, "simsiam": 0.03}
CLASSES = {
    "cifar10": 10,
    "cifar100": 100,
    "stl10": 10,
    "fashion_mnist": 10,
    "imagenet100": 100,
    "imagenet": 1000,
}


@pytest.mark.parametrize("preset", sorted(CLASSES))
def test_gpu_presets_undo_the_defaults_cpu_deviations_of_the_new_methods(preset):
    """Every GPU preset runs the official widths, optimisers, temperatures and crops, not the default's."""
    config = preset_config(preset)

    def run(method):
        return resolve_method_config(config, METHODS_DIR, method)

    for method, base in LR_BASE.items():
        train = run(method)["train"]
        base = CIFAR_LR_BASE.get(method, base) if preset.startswith("cifar") else base
        assert train["lr"] == pytest.approx(base * train["batch_size"] / 256), method
    for method in ("byol", "mocov3", "barlowtwins", "vicreg", "swav"):
        train = run(method)["train"]
        assert (train["optimizer"], train["lars_trust_coefficient"]) == ("lars", 1.0e-3), method
        rule = "larc" if method == "swav" else "update_norm"  # apex LARC (main_swav.py); the others' own LARS
        assert train["lars_trust_ratio"] == rule, method
    assert (
        run("byol")["params"].items()
        >= {"proj_hidden_dim": 4096, "pred_hidden_dim": 4096, "target_init": "own"}.items()
    )
    assert run("simsiam")["params"]["dim"] == 2048 and run("simsiam")["params"]["pred_dim"] == 512
    assert run("mocov3")["params"]["mlp_dim"] == 4096
    assert run("barlowtwins")["params"]["projector"] == [8192] * 3
    assert run("vicreg")["params"]["expander"] == [8192] * 3
    swav = run("swav")
    assert swav["params"].items() >= {"num_prototypes": 3000, "epsilon": 0.05, "hidden_dim": 2048}.items()
    assert (swav["train"]["lr"], swav["train"]["batch_size"], swav["train"]["weight_decay"]) == (
        0.6,
        256,
        1e-6,
    )
    assert [(c["count"], c["size"], c["crop_scale"]) for c in swav["augment"]["crops"]] == [
        (2, 1.0, [0.14, 1.0]),
        (6, 0.43, [0.05, 0.14]),
    ]
    dino = run("dino")
    assert dino["params"].items() >= {"out_dim": 65536, "hidden_dim": 2048, "bottleneck_dim": 256}.items()
    assert dino["params"]["use_bn_in_head"] is False
    # main_dino.py's help text: 0.9995 at batch 256; the command's 0.996 at 512 (and on STL-10's few steps)
    teacher = 0.996 if preset in ("cifar10", "cifar100", "stl10") else 0.9995
    assert dino["params"]["momentum"] == teacher and (teacher == 0.996 or dino["train"]["batch_size"] == 256)
    assert [(c["count"], c["crop_scale"]) for c in dino["augment"]["crops"]] == [
        (1, [0.14, 1.0]),
        (1, [0.14, 1.0]),
        (8, [0.05, 0.14]),
    ]
    deepcluster = run("deepcluster")["params"]
    assert (deepcluster["pca_dim"], deepcluster["num_clusters"]) == (256, 10 * CLASSES[preset])
    instdisc = run("instdisc")
    epochs = instdisc["train"]["epochs"]
    assert instdisc["train"]["milestones"] == [round(0.6 * epochs), round(0.8 * epochs)]
    if preset.startswith("imagenet"):  # main.py: NCE with 4096 noise rows
        assert (instdisc["params"]["num_negatives"], instdisc["params"]["temperature"]) == (4096, 0.07)
    if preset.startswith("cifar"):  # cifar.py: the softmax over every row, T 0.1, wd 5e-4, batch 128
        assert (instdisc["params"]["num_negatives"], instdisc["params"]["temperature"]) == (0, 0.1)
        assert (instdisc["train"]["weight_decay"], instdisc["train"]["batch_size"]) == (5e-4, 128)


# The runs each ablation preset's header promises (a sweep value equal to the base's is the base run).
ABLATION_RUNS = {
    "ablation_moco": 7,
    "ablation_pcl_phi": 2,
    "ablation_sela": 4,
    "ablation_supcon_ce": 13,
    "ablation_moco_imagenet": 9,
    "ablation_pcl_phi_imagenet": 2,
    "ablation_sela_imagenet": 6,
    "ablation_supcon_ce_imagenet": 13,  # SupCon's lr 0.03 is the imagenet preset's: its base run
    "ablation_lejepa": 9,  # 6 lambdas, 2 view counts beside the base's 6 local views, and the floor
}
# What each header layers it over (the seed papers' CPU ablations: the 30-epoch default)
ABLATION_BASES = {"ablation_lejepa": []}


@pytest.mark.parametrize("name", sorted(ABLATION_RUNS))
def test_every_ablation_preset_plans_the_runs_its_header_says(name):
    base = ["imagenet"] if name.endswith("_imagenet") else ABLATION_BASES.get(name, ["digits_30ep"])
    presets = [REPO / "config" / f"{b}.yaml" for b in base]
    cfg = load_config(REPO / "config", [*presets, REPO / "config" / f"{name}.yaml"])
    runs = resolve_runs(cfg, METHODS_DIR, cfg["methods"])
    assert len(runs) == ABLATION_RUNS[name]
    settings = {
        json.dumps({k: v for k, v in r.items() if k != "method"}, sort_keys=True) for r in runs.values()
    }
    assert len(settings) == len(runs)  # every run trains something different


def test_every_ablation_preset_is_listed():
    assert {p.stem for p in (REPO / "config").glob("ablation_*.yaml")} == set(ABLATION_RUNS)


# Presets with a recipe of their own: none may inherit a setting the default shortens for its 10 epochs.
RECIPE_PRESETS = ["digits_30ep", "fashion_mnist", "cifar10", "cifar100", "stl10", "imagenet100", "imagenet"]
BUDGETS = {"lowshot_svm": ("ks", "num_draws"), "semisup": ("epochs",)}


def dotted_keys(section: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in section.items():
        keys += dotted_keys(value, f"{prefix}{name}.") if isinstance(value, dict) else [f"{prefix}{name}"]
    return keys


def short_run_settings() -> list[tuple[str, str]]:
    """(method, dotted key) of each method setting the default scales to its 10 epochs: the ones
    digits_30ep puts back to their 30-epoch values."""
    overrides = load_yaml(REPO / "config" / "digits_30ep.yaml")["method_overrides"]
    return [(method, key) for method, section in overrides.items() for key in dotted_keys(section)]


def test_the_default_is_short_and_digits_30ep_puts_back_the_30_epoch_values():
    short, long = load_config(REPO / "config"), preset_config("digits_30ep")
    assert (short["train"]["epochs"], long["train"]["epochs"]) == (10, 30)
    for method, key in short_run_settings():
        resolved = [resolve_method_config(cfg, METHODS_DIR, method) for cfg in (short, long)]
        values = [r["train"] if key.startswith("train.") else r["params"] for r in resolved]
        name = key.removeprefix("train.")
        assert values[0][name] != values[1][name], f"{method}.{key}: the default does not shorten it"


@pytest.mark.parametrize("preset", RECIPE_PRESETS)
def test_presets_with_a_recipe_inherit_none_of_the_short_defaults_settings(preset):
    """Each sets its own epochs, the protocols' own budgets and every setting the default scales to 10
    epochs (for the methods it runs), so that none of the default's short-run values leaks into it."""
    from evaluation import lowshot_svm, semisup

    own = load_yaml(REPO / "config" / f"{preset}.yaml")
    config = preset_config(preset)
    assert "epochs" in own["train"]
    for protocol, module in (("lowshot_svm", lowshot_svm), ("semisup", semisup)):
        for key in BUDGETS[protocol]:
            assert protocol_settings(config, protocol)[key] == module.DEFAULTS[key], f"{protocol}.{key}"
    methods = selected_methods(config, METHODS_DIR)
    overrides = own.get("method_overrides") or {}
    missing = [
        f"{method}.{key}"
        for method, key in short_run_settings()
        if method in methods and key not in dotted_keys(overrides.get(method) or {})
    ]
    assert not missing, f"config/{preset}.yaml inherits the default's short-run value of {missing}"


# The ViT-S/16 variants beside the ResNet recipes: each official ViT command, read back from the plan.
VIT_EPOCHS = {"imagenet": 300, "imagenet100": 200}  # the commands' 300; ImageNet-100's preset length


def planned_vit_run(preset: str, method: str) -> dict:
    config = preset_config(preset)
    plan = plan_runs(config, METHODS_DIR, [method], check_files=False)
    return plan.runs[preset, f"{method}[vit_s16]"]


@pytest.mark.parametrize("preset", sorted(VIT_EPOCHS))
def test_dino_s_vit_s16_variant_is_main_dino_s_boosted_command(preset):
    run = planned_vit_run(preset, "dino")
    train, params, backbone = run["train"], run["params"], run["backbone"]
    assert backbone["name"] == "vit_small_patch16_224"
    assert backbone["args"] == {"patch_size": 16, "drop_path_rate": 0.1}  # --drop_path_rate (the student's)
    assert (train["optimizer"], train["epochs"]) == ("adamw", VIT_EPOCHS[preset])
    assert train["lr"] == pytest.approx(0.0005 * train["batch_size"] / 256)  # --lr 0.0005 x B / 256
    assert (train["weight_decay"], train["weight_decay_end"]) == (0.04, 0.4)  # the cosine wd schedule
    assert (train["warmup_epochs"], train["warmup_ramp"], train["schedule"]) == (10, "linspace", "cosine")
    teacher = (params["warmup_teacher_temp"], params["teacher_temp"], params["warmup_teacher_temp_epochs"])
    assert teacher == (0.04, 0.07, 30)  # the README's --teacher_temp 0.07 --warmup_teacher_temp_epochs 30
    official = {
        "out_dim": 65536,
        "hidden_dim": 2048,
        "bottleneck_dim": 256,
        "num_layers": 3,
        "use_bn_in_head": False,
        "norm_last_layer": False,  # --norm_last_layer false
        "clip_grad": 3.0,
        "freeze_last_layer": 1,
        "student_temp": 0.1,
        "center_momentum": 0.9,
        "momentum_schedule": "cosine",
    }
    assert {k: params[k] for k in official} == official
    assert params["momentum"] == 0.9995 and train["batch_size"] == 256  # the help text's value at batch 256
    crops = [(c["count"], c["size"], c["crop_scale"]) for c in run["augment"]["crops"]]
    # 2 x 224 px and 8 x 96 px
    assert crops == [(1, 1.0, [0.4, 1.0]), (1, 1.0, [0.4, 1.0]), (8, 0.43, [0.05, 0.4])]
    base = plan_runs(preset_config(preset), METHODS_DIR, ["dino"], check_files=False).runs[preset, "dino"]
    assert (base["backbone"]["name"], base["train"]["optimizer"]) == ("resnet50", "sgd")  # the ResNet run


@pytest.mark.parametrize("preset", sorted(VIT_EPOCHS))
def test_mocov3_s_vit_s16_variant_is_config_md_s_vit_small_command(preset):
    run = planned_vit_run(preset, "mocov3")
    train, params, backbone = run["train"], run["params"], run["backbone"]
    assert backbone["name"] == "vit_small_patch16_224"
    assert backbone["args"]["num_heads"] == 12  # vits.py vit_small: 12 heads (timm's ViT-S: 6)
    assert (train["optimizer"], train["epochs"]) == ("adamw", VIT_EPOCHS[preset])
    assert train["lr"] == pytest.approx(1.5e-4 * train["batch_size"] / 256)  # --lr=1.5e-4 x B / 256
    assert (train["weight_decay"], train["weight_decay_end"]) == (0.1, None)  # constant --weight-decay=.1
    assert (train["warmup_epochs"], train["warmup_ramp"], train["schedule"]) == (40, "linear", "cosine")
    assert params == {
        "dim": 256,
        "mlp_dim": 4096,
        "proj_layers": 3,
        "pred_last_bn": True,
        "exclude_bias_and_norm": False,  # AdamW(model.parameters()): every parameter decayed
        "stop_grad_conv1": True,
        "temperature": 0.2,
        "momentum": 0.99,
        "momentum_schedule": "cosine",  # --moco-m-cos
    }
    assert [v["crop_scale"] for v in run["augment"]] == [[0.08, 1.0], [0.08, 1.0]]  # --crop-min 0.08
    assert [v["preset"] for v in run["augment"]] == ["byol_view1", "byol_view2"]


@pytest.mark.parametrize("preset", ["imagenet", "imagenet100"])
def test_dinov2_in_the_imagenet_presets_is_ssl_default_config_on_vit_l16_with_the_square_root_lr_rule(preset):
    config = preset_config(preset)
    run = resolve_method_config(config, METHODS_DIR, "dinov2")
    train, params, backbone = run["train"], run["params"], run["backbone"]
    assert backbone["name"] == "vit_large_patch16_224"
    assert backbone["args"]["drop_path_rate"] == 0.3 and backbone["args"]["init_values"] == 1.0e-5
    assert train["lr"] == pytest.approx(0.004 * math.sqrt(train["batch_size"] / 1024))  # sqrt_wrt_1024
    assert (train["epochs"], train["warmup_epochs"], params["warmup_teacher_temp_epochs"]) == (100, 10, 30)
    assert (params["out_dim"], params["hidden_dim"], params["bottleneck_dim"]) == (65536, 2048, 256)
    assert (params["centering"], params["separate_head"], params["layer_decay"]) == ("centering", False, 0.9)
    assert [(c["count"], c["crop_scale"]) for c in run["augment"]["crops"]] == [
        (1, [0.32, 1.0]),
        (1, [0.32, 1.0]),
        (8, [0.05, 0.32]),
    ]


def test_the_imagenet_vit_variants_match_a_paper_yaml_row_by_backbone_and_epochs():
    from sslbench.plan.paper import paper_entries

    for method, protocols in (("dino", {"linear", "knn"}), ("mocov3", {"linear"})):
        run = planned_vit_run("imagenet", method)
        rows = [
            e
            for e in paper_entries(METHODS_DIR / method / "paper.yaml")
            if (e["backbone"], e["epochs"]) == (run["backbone"]["name"], run["train"]["epochs"])
        ]
        assert {e["protocol"] for e in rows} == protocols, method


# `evaluation.<protocol>.methods`: the runs a protocol evaluates (every run when absent).
def planned_results(**evaluation) -> dict[str, set[str]]:
    config = tiny_suite_config()
    config.update(methods=["simclr", "mae", "random"], protocols=["knn", "finetune"])
    config["variants"] = {"simclr": [{"name": "hot", "temperature": 1.0}]}
    config["evaluation"] |= evaluation
    plan = plan_runs(config, METHODS_DIR, config["methods"], check_files=False)
    folders = {slug: label for label, slug in plan.slugs.items()}
    found = {"knn": set(), "finetune": set()}
    for path in plan.result_files([0]):
        parts = path.split("/")
        found[parts[-1].removesuffix(".json")].add(folders[parts[2]])
    return found


def test_a_protocols_methods_choose_the_runs_it_evaluates_by_folder_or_label():
    runs = {"simclr", "simclr[hot]", "mae", "random", "random[vit_tiny_patch16_224]"}  # and MAE's ViT floor
    assert planned_results() == {"knn": runs, "finetune": runs}
    by_folder = planned_results(finetune={"methods": ["simclr"]})
    assert by_folder == {"knn": runs, "finetune": {"simclr", "simclr[hot]"}}  # a folder: its variants too
    by_label = planned_results(finetune={"methods": ["mae", "simclr[hot]"]})
    assert by_label == {"knn": runs, "finetune": {"mae", "simclr[hot]"}}


def test_a_protocols_methods_naming_no_method_folder_is_an_error():
    with pytest.raises(
        ConfigError, match=r"evaluation.finetune.methods.*\['maee', 'dno\[x\]'\] names no method folder"
    ):
        planned_results(finetune={"methods": ["mae", "maee", "dno[x]"]})
    assert planned_results(finetune={"methods": ["mae", "dino"]})["finetune"] == {"mae"}  # dino: not planned
