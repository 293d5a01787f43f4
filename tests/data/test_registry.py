"""The registry: every DatasetSpec of sslbench/data/datasets/ found (a module there is a dataset), one
name each, and what the planner reads of them without torch."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from support import REPO

from sslbench.data.files import DatasetError
from sslbench.data.registry import DATASETS, discover, load_dataset, missing_files, split_sizes
from sslbench.data.spec import DatasetSpec


def test_unknown_dataset_lists_known_names():
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist-but-wrong")
    for name in DATASETS:
        assert name in str(info.value)


def test_unknown_option_is_an_error():
    with pytest.raises(DatasetError, match="classes_file"):
        load_dataset("digits", classes_file="x.txt")


def test_one_list_of_datasets_for_the_loaders_the_file_checks_and_the_schema():
    """The schema's dataset names are the registry's (planning imports no torch), each a spec whose
    loader takes the common arguments; a dataset without files to look for (shipped with a package)
    is never missing, one that cannot tell its split sizes gives none."""
    from sslbench.plan.settings import with_datasets

    schema = with_datasets({"$defs": {"dataset": {"properties": {"name": {"type": "string"}}}}})
    assert schema["$defs"]["dataset"]["properties"]["name"] == {"enum": list(DATASETS)}
    assert list(DATASETS) == sorted(DATASETS)
    for name, spec in DATASETS.items():
        assert isinstance(spec, DatasetSpec) and spec.name == name and spec.source
        assert {"root", "download", "image_size"} <= set(inspect.signature(spec.loader).parameters)
        if spec.files is None:
            assert missing_files({"name": name}) is None
        if spec.split_sizes is None:
            assert split_sizes({"name": name, "root": "anywhere"}) is None
    unknown = {"name": "no_such_dataset"}
    assert missing_files(unknown) is None and split_sizes(unknown) is None


def test_the_registry_and_every_dataset_module_import_without_torch():
    """The Snakefile plans at every invocation and reads the specs: neither the registry nor a dataset
    module may import torch at its top level (sslbench/data/spec.py)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import sslbench.data.registry\n"
        "from sslbench.data import datasets\n"
        "names = [m.name for m in pkgutil.iter_modules(datasets.__path__, 'sslbench.data.datasets.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    count, torch_loaded = out.stdout.split()
    assert int(count) >= 6 and torch_loaded == "False"


SPEC_MODULE = """
from sslbench.data.spec import DatasetSpec

def load(root=None, download=False, image_size=None):
    raise NotImplementedError

{name} = DatasetSpec(name="{dataset}", loader=load, source="nowhere")
"""


def test_a_module_is_a_dataset_and_a_name_defined_twice_is_an_error_naming_both_modules(
    tmp_path, monkeypatch
):
    package = tmp_path / "more_datasets"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text(SPEC_MODULE.format(name="FIRST", dataset="twice"))
    (package / "other.py").write_text(SPEC_MODULE.format(name="OTHER", dataset="once"))
    (package / "reuses.py").write_text("from more_datasets.first import FIRST  # the same spec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import more_datasets

        assert {name: spec.source for name, spec in discover(more_datasets).items()} == {
            "once": "nowhere",
            "twice": "nowhere",
        }
        (package / "second.py").write_text(SPEC_MODULE.format(name="SECOND", dataset="twice"))
        with pytest.raises(DatasetError) as info:
            discover(more_datasets)
        message = str(info.value)
        assert "'twice' is defined twice" in message
        assert "more_datasets.first" in message and "more_datasets.second" in message
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "more_datasets"]:
            del sys.modules[name]
