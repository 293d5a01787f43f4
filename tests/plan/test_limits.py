"""What a run's settings must fit, judged by the plan with the functions the jobs call (plan/limits), and
each run's backbone judged on the meta device (plan/backbones)."""

import json
import subprocess
import sys

import pytest
from support import REPO, tiny_suite_config, tiny_vit

from sslbench.errors import ConfigError
from sslbench.plan.backbones import check_backbones
from sslbench.plan.limits import pretrain_batch_problem, protocol_batch_problem, split_batch_norm_problem
from sslbench.plan.runs import plan_runs

METHODS = REPO / "methods"


def test_a_pretraining_batch_fits_the_train_split_and_divides_over_the_processes():
    assert pretrain_batch_problem(1347, 1347, 1, "digits") is None  # the whole split is one batch
    assert "at most 1347" in pretrain_batch_problem(1348, 1347, 1, "digits")
    assert pretrain_batch_problem(128, 1347, 4, "digits") is None
    assert "divisible by the 3 processes" in pretrain_batch_problem(128, 1347, 3, "digits")


def test_split_batch_norm_needs_a_divisor_of_the_process_batch_and_batchnorm_layers():
    assert split_batch_norm_problem(1, 64, has_batchnorm2d=False) is None  # no split: any backbone
    assert split_batch_norm_problem(8, 64, has_batchnorm2d=True) is None
    for bad in (0, 3, 2.0, True):
        assert "positive integer dividing the batch size 64" in split_batch_norm_problem(bad, 64, True)
    assert "Set `bn_splits: 1`" in split_batch_norm_problem(8, 64, has_batchnorm2d=False)


def test_a_protocol_that_drops_the_last_batch_needs_a_batch_within_its_train_split():
    assert protocol_batch_problem("finetune", 1347, 1347) is None
    assert "1347 train images" in protocol_batch_problem("finetune", 1348, 1347)


def planned(**changes):
    cfg = tiny_suite_config()  # 8-px digits, batch 64
    for key, value in changes.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    methods = cfg["methods"] if cfg["methods"] != "all" else ["simclr"]
    return cfg, plan_runs(cfg, METHODS, methods)


def test_the_plan_refuses_a_batch_larger_than_the_train_split_naming_where_it_was_set():
    cfg = tiny_suite_config(batch_size=5000)
    with pytest.raises(
        ConfigError, match=r"simclr on digits: config key `train.batch_size` = 5000 exceeds the 1347"
    ):
        plan_runs(cfg, METHODS, ["simclr"])


def test_the_job_and_the_plan_give_the_same_split_batch_norm_message(tmp_path):
    """The key encoder's builder (the job) and the plan judge `bn_splits` with one function."""
    from sslbench.kit.moco import query_head_and_key_encoder

    with pytest.raises(ConfigError) as job:
        query_head_and_key_encoder(tiny_vit(), 2, 16, bn_splits=4, batch_size=64)
    cfg, plan = planned(
        methods=["moco"],
        method_overrides={
            "moco": {"bn_splits": 4, "backbone": {"name": "vit_tiny_patch16_224", "args": VIT}}
        },
    )
    with pytest.raises(ConfigError) as planned_error:
        check_backbones(plan, cfg, METHODS, facts_file=tmp_path / "facts.json")
    assert str(job.value) in str(planned_error.value)
    assert "moco on digits" in str(planned_error.value) and "method_overrides" in str(planned_error.value)


VIT = {"patch_size": 4, "depth": 2, "num_heads": 2, "embed_dim": 32}


@pytest.mark.parametrize(
    "backbone, words",
    [
        (
            {"name": "vit_tiny_patch16_224", "args": {**VIT, "patch_size": 3}},
            ["8-px", "divisible by patch size (3)"],
        ),
        ({"name": "test_resnet", "features": "cls_avgpool"}, ["`backbone.features`", "is none"]),
        ({"name": "vit_tiny_patch16_224", "args": VIT, "features": "last4_cls"}, ["this ViT has 2"]),
        ({"name": "vit_tiny_patch16_224", "args": {**VIT, "no_such_arg": 1}}, ["`backbone.args`", "refuses"]),
    ],
)
def test_a_backbone_that_cannot_take_its_run_stops_the_plan(tmp_path, backbone, words):
    cfg, plan = planned(methods=["simclr"], backbone=backbone)
    with pytest.raises(ConfigError) as err:
        check_backbones(plan, cfg, METHODS, facts_file=tmp_path / "facts.json")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_every_crop_size_of_a_run_goes_through_its_backbone(tmp_path):
    """DINO's local crops are smaller than the image: a patch size that divides the image but not the
    crops is refused, naming the crop size."""
    cfg, plan = planned(
        methods=["dino"],
        datasets={"digits": {"name": "digits", "image_size": 24}},  # local crops of 12 px
        backbone={"name": "vit_tiny_patch16_224", "args": {**VIT, "patch_size": 8}},
    )
    run = plan.runs["digits", "dino"]
    with pytest.raises(ConfigError, match=r"refuses the (\d+)-px crops") as err:
        check_backbones(plan, cfg, METHODS, facts_file=tmp_path / "facts.json")
    size = int(err.value.args[0].split("refuses the ")[1].split("-px")[0])
    assert size == 12, run["augment"]


def test_remembered_facts_plan_without_torch(tmp_path):
    """A second plan of the same backbones reads the facts the first remembered and imports no torch."""
    facts = tmp_path / "facts.json"
    cfg, plan = planned(methods=["simclr", "mae"])
    check_backbones(plan, cfg, METHODS, facts_file=facts)
    assert len(json.loads(facts.read_text())) == 2  # the ResNet and MAE's ViT
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    code = (
        "import json, sys\n"
        "from sslbench.plan.runs import plan_runs\n"
        "from sslbench.plan.backbones import check_backbones\n"
        f"cfg = json.loads(open({str(tmp_path / 'cfg.json')!r}).read())\n"
        f"plan = plan_runs(cfg, {str(METHODS)!r}, ['simclr', 'mae'])\n"
        f"check_backbones(plan, cfg, {str(METHODS)!r}, facts_file={str(facts)!r})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_features_of_every_evaluation_target_are_read_at_its_size(tmp_path):
    """A ViT trained on 8-px digits is evaluated on a 10-px target: its 4-px patches do not divide it."""
    cfg, plan = planned(
        methods=["simclr"],
        datasets={"digits10": {"name": "digits", "image_size": 10}},
        evaluation={"targets": ["pretrain", "digits10"]},
        backbone={"name": "vit_tiny_patch16_224", "args": VIT},
    )
    refused = r"cannot be read from 10-px images .*divisible by patch size \(4\)"
    with pytest.raises(ConfigError, match=refused):
        check_backbones(plan, cfg, METHODS, facts_file=tmp_path / "facts.json")
