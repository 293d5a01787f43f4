"""Every mistake in a new method folder stops the plan with status 1, naming the file, the key and the fix:
its views (`augment`, in its config.yaml or a preset's overrides), a setting method.py reads that
config.yaml lacks, a missing config.yaml, a method.py that does not load; `broken_methods: leave_out` plans on
without the broken folders and says so on the plan's last line."""

import re
import shutil

import pytest
import yaml
from support import REPO, copy_workflow, tiny_suite_config
from test_bad_input import planned, snakemake

from sslbench.errors import ConfigError

LOSS = "    def training_loss(self, views, labels, indices):\n        return views[0].sum()\n"
HEADER = "from sslbench import Method\n\n\nclass M(Method):\n"

# method folder: (its files, what the plan must say of it)
BROKEN = {
    "syntax": ({"method.py": HEADER + "    def training_loss(self\n"}, ["method.py:5: syntax error"]),
    "nosub": (
        {"method.py": "class M:\n    pass\n"},
        ["exactly one subclass of sslbench.Method", "Define one"],
    ),
    "noloss": (
        {"method.py": HEADER + LOSS.replace("training_loss", "training_los")},
        ["does not implement the required hook(s) ['training_loss']"],
    ),
    "typo": (  # a setting misspelt in config.yaml, in a folder without schema.yaml
        {
            "method.py": HEADER
            + "    def __init__(self, backbone, info, cfg):\n        super().__init__(backbone, info, cfg)\n"
            + '        self.t = cfg["params"]["temperature"]\n\n'
            + LOSS,
            "config.yaml": "temprature: 0.5\n",
        },
        [
            "typo/method.py:7 reads the setting 'temperature' (did you mean 'temprature'?)",
            "typo/config.yaml does not set (its settings: ['temprature'])",
            "fix the name in method.py",
        ],
    ),
    "noconf": ({}, ["noconf/config.yaml: missing", "copy methods/_template/config.yaml"]),
}


@pytest.fixture(scope="module")
def broken_workflow(tmp_path_factory):
    """A copy of the workflow (tiny config, simclr) with the BROKEN folders beside the sound ones."""
    root = copy_workflow(tmp_path_factory.mktemp("folders"))
    for name, (files, _) in BROKEN.items():
        if name == "noconf":  # the template, less its config.yaml
            shutil.copytree(REPO / "methods" / "_template", root / "methods" / name)
            (root / "methods" / name / "config.yaml").unlink()
            continue
        (root / "methods" / name).mkdir()
        for file, text in {"config.yaml": "{}\n", **files}.items():
            (root / "methods" / name / file).write_text(text)
    cfg = tiny_suite_config()
    cfg.update(methods=["simclr", *BROKEN], protocols=["knn"])
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    return root


def plan(root, *args):
    """A dry run of the copy's own Snakefile (the last -s wins) in ``root``."""
    return snakemake(root, "-s", str(root / "Snakefile"), "-n", "--configfile", "tiny.yaml", *args)


def test_broken_method_folders_stop_the_plan_each_named_with_the_fix(broken_workflow):
    out = plan(broken_workflow)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert (
        "sslbench: error: broken method folder(s):" in text and "--config broken_methods=leave_out" in text
    ), text
    lines = {
        name: [line for line in text.splitlines() if line.startswith(f"  methods/{name}: ")]
        for name in BROKEN
    }
    for name, (_, words) in BROKEN.items():
        assert len(lines[name]) == 1, (name, text)
        for word in words:
            assert word in lines[name][0], (name, lines[name][0])
    assert "schema.yaml" not in lines["noconf"][0]  # the missing file is named as itself
    assert 'File "' not in text and "rule pretrain" not in text, text  # no traceback, no job planned


def test_leave_out_plans_the_others_and_its_last_line_names_the_folders_left_out(broken_workflow):
    out = plan(broken_workflow, "--config", "broken_methods=leave_out")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rule pretrain" in out.stdout + out.stderr
    last = (out.stdout + out.stderr).strip().splitlines()[-1]
    assert last.startswith("sslbench: left out (broken_methods: leave_out), broken: "), last
    assert all(f"methods/{name}" in last for name in BROKEN), last


def test_a_missing_config_yaml_is_named_as_itself_by_the_plan(tmp_path):
    """Where the folder reaches the plan (sslbench status, a plan of its own), not a schema.yaml problem."""
    shutil.copytree(REPO / "methods" / "_template", tmp_path / "methods" / "mine")
    (tmp_path / "methods" / "mine" / "config.yaml").unlink()
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, {"methods": ["mine"]}, tmp_path / "methods")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'methods' / 'mine' / 'config.yaml'}: missing"), message
    assert "schema.yaml" not in message


def test_an_augment_typo_in_a_methods_config_is_named_by_that_file(tmp_path):
    """The layer that holds the typo is named, not the last layer that sets `augment` (the preset)."""
    shutil.copytree(REPO / "methods" / "simclr", tmp_path / "methods" / "simclr")
    config = tmp_path / "methods" / "simclr" / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    settings["augment"]["crop_scal"] = [0.2, 1.0]
    config.write_text(yaml.safe_dump(settings))
    preset = {"methods": ["simclr"], "method_overrides": {"simclr": {"augment": {"flip_p": 0.3}}}}
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, preset, tmp_path / "methods")
    message = str(err.value)
    assert message.startswith(f"{config}: key `augment`: "), message
    assert "unknown ViewConfig key(s) ['crop_scal']" in message and "'crop_scale'" in message, message
    assert "preset.yaml" not in message


@pytest.mark.parametrize(
    "preset, key, words",
    [
        (
            {
                "variants": {
                    "simclr": [{"augment": [{"preset": "simclr"}, {"preset": "simclr", "flip": 0.5}]}]
                }
            },
            "variants.simclr[0].augment",
            ["`augment[1]`: unknown ViewConfig key(s) ['flip']", "'flip_p'"],
        ),
        (
            {"sweeps": {"simclr": {"augment.hue": [0.1, 0.7]}}},
            "sweeps.simclr.augment.hue",
            ["ViewConfig.hue must be in [0, 0.5]", "got 0.7"],
        ),
    ],
)
def test_augment_keys_and_values_are_judged_wherever_they_are_given(tmp_path, preset, key, words):
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, {"methods": ["simclr"], **preset})
    message = str(err.value)
    assert f"config key `{key}` (set in {tmp_path / 'preset.yaml'}): " in message, message
    for word in words:
        assert word in message, message


def test_a_crop_too_small_for_the_images_names_the_run_and_the_file(tmp_path):
    """What no layer shows alone: the side a crop gets on the run's own images."""
    crops = {"crops": [{"count": 2, "size": 1.0}, {"count": 2, "size": 0.05}]}
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, {"methods": ["simclr"], "method_overrides": {"simclr": {"augment": crops}}})
    message = str(err.value)
    assert message.startswith("simclr on digits: `augment.crops[1].size` = 0.05 gives 1 px"), message
    assert f"(set in {tmp_path / 'preset.yaml'})" in message, message


def test_snakemake_stops_at_a_bad_augment_value_of_a_presets_overrides(tmp_path):
    views = [{"preset": "simclr", "crop_scale": [0.0, 1.0]}, {"preset": "simclr"}]
    (tmp_path / "bad.yaml").write_text(
        yaml.safe_dump({"methods": ["simclr"], "method_overrides": {"simclr": {"augment": views}}})
    )
    out = snakemake(tmp_path, "-n", "--configfile", "bad.yaml")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    where = r"config key `method_overrides\.simclr\.augment` \(set in \S*bad\.yaml\): `augment\[0\]`"
    assert re.search(f"sslbench: error: {where}", text), text
    assert "ViewConfig.crop_scale must satisfy 0 < low <= high <= 1, got (0.0, 1.0)" in text, text
    assert 'File "' not in text, text
