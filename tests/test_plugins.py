import pytest
from conftest import METHODS_DIR

from sslbench.method import Method
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
    from sslbench.config import method_problems

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
    from sslbench.config import method_problems

    assert method_problems(METHODS_DIR) == {}
