import pytest
from support import METHODS_DIR, REPO

from sslbench.kit.method import Method
from sslbench.plugins import PluginError, load_method_class


def write_method(tmp_path, name, code):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "method.py").write_text(code)
    return folder


def test_loads_the_repository_methods():
    for name in ("simclr", "random"):
        cls = load_method_class(METHODS_DIR / name)
        assert issubclass(cls, Method)


def test_missing_method_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PluginError, match="no method.py"):
        load_method_class(tmp_path / "empty")


def test_syntax_error_names_file_and_line(tmp_path):
    folder = write_method(tmp_path, "broken", "import torch\ndef oops(:\n")
    with pytest.raises(PluginError, match=r"method\.py:2: syntax error"):
        load_method_class(folder)


def test_no_method_subclass(tmp_path):
    folder = write_method(tmp_path, "nosub", "class Foo:\n    pass\n")
    with pytest.raises(PluginError, match="exactly one subclass"):
        load_method_class(folder)


def test_missing_required_hook(tmp_path):
    folder = write_method(tmp_path, "nohook", "from sslbench import Method\nclass M(Method):\n    pass\n")
    with pytest.raises(PluginError, match="training_loss"):
        load_method_class(folder)


def test_paper_yaml_with_missing_fields_is_named_before_training(tmp_path):
    from sslbench.plan.workflow import method_problems

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "method.py").write_text(
        "from sslbench import Method\nclass M(Method):\n    def training_loss(self, v, l, i):\n   "
        "     return 0\n"
    )
    (folder / "paper.yaml").write_text(
        "results:\n  - {pretrain_dataset: imagenet, eval_dataset: voc07, backbone: resnet50, value: 0.6}\n"
    )
    problems = method_problems(tmp_path)
    assert list(problems) == ["m"]
    assert "paper.yaml: results[0] lacks ['epochs', 'protocol', 'metric', 'source']" in problems["m"]


def test_every_repository_method_folder_is_sound():
    from sslbench.plan.workflow import method_problems

    assert method_problems(METHODS_DIR) == {}


CHECK_TWICE = """
import json, sys
from sslbench.plan.runs import plan_runs
from sslbench.plan.settings import config_sources, load_config
from sslbench.plan.workflow import method_problems
problems = method_problems(sys.argv[1], checked=sys.argv[2])
if not problems:  # the rest of the plan, every setting's check included
    plan_runs(load_config("config"), sys.argv[1], ["moco"], sources=config_sources("config"))
print(json.dumps({"problems": problems, "torch": "torch" in sys.modules}))
"""


def test_a_sound_folder_is_imported_once_until_its_code_or_paper_changes(tmp_path):
    """Planning an unchanged DAG imports no method (and so no torch), nor do the checks of its
    settings; an edit brings the check of the folder back."""
    import json
    import shutil
    import subprocess
    import sys

    methods = tmp_path / "methods"
    shutil.copytree(METHODS_DIR / "moco", methods / "moco", ignore=shutil.ignore_patterns("__pycache__"))
    checked = tmp_path / ".snakemake" / "sound.json"

    def check() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", CHECK_TWICE, str(methods), str(checked)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        return json.loads(out.stdout)

    assert check() == {"problems": {}, "torch": True}  # checked: the method imported
    assert check() == {"problems": {}, "torch": False}  # remembered: nothing imported
    (methods / "moco" / "paper.yaml").write_text("results:\n  - {value: 0.6}\n")
    again = check()
    assert again["torch"] and "paper.yaml: results[0] lacks" in again["problems"]["moco"]
    assert json.loads(checked.read_text()) == {}  # a broken folder is never remembered
    shutil.copy(METHODS_DIR / "moco" / "paper.yaml", methods / "moco" / "paper.yaml")
    with open(methods / "moco" / "method.py", "a") as f:
        f.write("raise RuntimeError('an edit that breaks the import')\n")
    broken = check()
    assert broken["torch"] and "an edit that breaks the import" in broken["problems"]["moco"]
    checked.write_text("{not json")
    (methods / "moco" / "method.py").write_text((METHODS_DIR / "moco" / "method.py").read_text())
    assert check() == {"problems": {}, "torch": True}  # a damaged file: everything checked again
