"""The floor of every run is the untrained network of its own backbone (`random`, or the variant the plan
adds for another backbone), measured on the floor's many seeds for the floor's protocols and targets."""

from support import REPO, tiny_suite_config

from sslbench.plan.runs import FLOOR_METHOD, floor_key, plan_runs

METHODS = REPO / "methods"
VIT = {"name": "vit_tiny_patch16_224", "args": {"patch_size": 4, "depth": 2, "num_heads": 2, "embed_dim": 32}}


def plan_of(methods, **changes):
    cfg = tiny_suite_config()
    cfg["floor"] = {"seeds": 5, "protocols": ["knn"], "targets": ["pretrain"]}
    cfg["evaluation"]["targets"] = ["pretrain", "digits16"]
    cfg["datasets"]["digits16"] = {"name": "digits", "image_size": 16}
    for key, value in changes.items():
        cfg[key] = value
    return plan_runs(cfg, METHODS, methods)


def test_each_run_is_measured_against_the_untrained_network_of_its_own_backbone():
    plan = plan_of(
        ["simclr", "mae", "deepcluster", "pixels", "random"],
        method_overrides={"simclr": {"backbone": VIT}},
    )
    floors = {label: floor for (_, label), floor in plan.floors.items()}
    # two ViTs of one name and other args (MAE's own, the first planned, and simclr's): two floors
    assert floors["mae"] == "random[vit_tiny_patch16_224]"
    assert floors["simclr"].startswith("random[vit_tiny_patch16_224-")
    assert floors["deepcluster"] == "random"  # the Sobel filter is DeepCluster's, in front of the ResNet
    assert floors["random"] == "random" and "pixels" not in floors
    for (p, label), floor in plan.floors.items():
        assert floor_key(plan.runs[p, label]["backbone"]) == floor_key(plan.runs[p, floor]["backbone"])
        assert plan.runs[p, floor]["method_base"] == FLOOR_METHOD
        assert plan.floors[p, floor] == floor  # a floor is its own


def test_the_floor_of_a_network_named_like_another_s_says_which_settings_differ():
    plan = plan_of(["simclr", "densecl", "random"])  # DenseCL: the suite's test_resnet with the small stem
    floors = {label: floor for (_, label), floor in plan.floors.items()}
    assert floors["simclr"] == "random"
    assert floors["densecl"] == "random[test_resnet,small_stem=True]"
    assert plan.runs["digits", floors["densecl"]]["backbone"]["small_stem"] is True


def test_a_floor_is_measured_on_its_extra_seeds_for_the_floor_protocols_and_targets_only():
    plan = plan_of(["simclr", "random"], seeds=[0, 7])
    assert plan.floor_seeds == [0, 1, 2, 3, 4]
    seeds = {(m, s) for _, m, s in plan.run_seeds([0, 7])}
    assert seeds == {("simclr", 0), ("simclr", 7)} | {("random", s) for s in (0, 7, 1, 2, 3, 4)}
    files = plan.result_files([0, 7])
    extra = [f for f in files if "/random/seed1/" in f]
    assert extra == ["results/digits/random/seed1/eval/digits/knn.json"]  # knn, on the pretraining set
    both = {f for f in files if "/random/seed7/" in f}
    assert both == {f.replace("/simclr/", "/random/") for f in files if "/simclr/seed7/" in f}


def test_no_floor_without_random_and_none_of_extra_seeds_at_zero():
    assert plan_of(["simclr", "mae"]).floors == {}
    plan = plan_of(["simclr", "random"], floor={"seeds": 0, "protocols": ["knn"], "targets": ["pretrain"]})
    assert plan.floors and plan.floor_seeds == []
    assert {s for _, _, s in plan.run_seeds([0])} == {0}
