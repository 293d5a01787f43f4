"""The plan's check of a method folder's paper.yaml (the numbers the report sets beside ours) and
README.md: each mistake named with the file, the entry, the key and the fix."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sslbench.errors import ConfigError
from sslbench.plan.paper import (
    METRIC_PATTERNS,
    README_SECTIONS,
    check_method_folders,
    metric_known,
    paper_problems,
    readme_problems,
)
from sslbench.plan.protocols import protocol_defaults, protocol_names
from sslbench.plan.workflow import list_method_folders

REPO = Path(__file__).resolve().parents[2]  # not support's: it imports torch, which none of this needs
METHODS_DIR = REPO / "methods"
TEMPLATE = METHODS_DIR / "_template"

ENTRY = {
    "pretrain_dataset": "imagenet",
    "eval_dataset": "imagenet",
    "backbone": "resnet50",
    "epochs": 200,
    "protocol": "linear",
    "metric": "top1",
    "value": 0.8906,
    "source": "Table 3 of the paper",
}


def method_folder(tmp_path: Path, readme: str | None = None, **entry) -> Path:
    """A method folder with one paper.yaml entry (ENTRY with ``entry``'s keys) and the template's
    README.md (or ``readme``); the methods folder is its parent."""
    folder = tmp_path / "methods" / "my_method"
    folder.mkdir(parents=True)
    (folder / "paper.yaml").write_text(yaml.safe_dump({"results": [{**ENTRY, **entry}]}))
    (folder / "README.md").write_text((TEMPLATE / "README.md").read_text() if readme is None else readme)
    return folder


def refused(folder: Path) -> str:
    """The plan check's message for the folder, which names the file."""
    with pytest.raises(ConfigError) as err:
        check_method_folders(folder.parent, [folder.name])
    return str(err.value)


def test_every_method_folder_passes():
    names = list_method_folders(METHODS_DIR)
    assert "_template" not in names and all((METHODS_DIR / n / "method.py").is_file() for n in names)
    check_method_folders(METHODS_DIR, names)
    papers = [METHODS_DIR / n / "paper.yaml" for n in names if (METHODS_DIR / n / "paper.yaml").exists()]
    assert len(papers) >= 15  # the check read them (a baseline has no paper)
    assert all(paper_problems(p) == [] for p in papers)


def test_a_sound_entry_passes_with_any_dataset_and_backbone(tmp_path):
    """Datasets and backbone are recorded as given: a paper's own are not ours to restrict."""
    folder = method_folder(
        tmp_path, pretrain_dataset="my_lab_set", eval_dataset="places205", backbone="resnet50w5"
    )
    check_method_folders(folder.parent, [folder.name])


def test_a_misspelt_protocol_is_named_with_the_known_ones(tmp_path):
    folder = method_folder(tmp_path, protocol="linaer")
    message = refused(folder)
    assert f"{folder / 'paper.yaml'}: results[0].protocol: unknown protocol 'linaer'" in message, message
    assert "'linear'" in message and "Fix the spelling" in message, message


@pytest.mark.parametrize(
    "protocol, metric", [("linear", "top_1"), ("knn", "top1"), ("lowshot_svm", "map_k8"), ("semisup", "top1")]
)
def test_a_metric_the_protocol_does_not_write_is_named(tmp_path, protocol, metric):
    folder = method_folder(tmp_path, protocol=protocol, metric=metric)
    message = refused(folder)
    assert f"{folder / 'paper.yaml'}: results[0].metric: {protocol} writes no metric '{metric}'" in message
    assert "Fix the spelling" in message, message


def test_every_protocol_has_its_metric_names_and_those_it_writes_are_known():
    """METRIC_PATTERNS is the one list of metric names: one entry per evaluation/ protocol, and the
    names each writes with its DEFAULTS (as its evaluate() forms them) match it."""
    assert sorted(METRIC_PATTERNS) == protocol_names()
    from evaluation.knn import variant_name  # no torch
    from evaluation.lowshot_logreg import subset_name

    semisup = ast.parse((REPO / "evaluation" / "semisup.py").read_text())
    fractions = next(
        ast.literal_eval(n.value)
        for n in semisup.body
        if isinstance(n, ast.Assign) and n.targets[0].id == "FRACTIONS"
    )
    written = {
        "knn": [
            f"top{n}_{variant_name(v['k'], v['temperature'])}"
            for v in protocol_defaults("knn")["DEFAULTS"]["variants"]
            for n in (1, 5)
        ]
        + [  # few-shot, with n_per_class 5: each variant votes with k = min(k, 5)
            f"top{n}_{variant_name(min(v['k'], 5), v['temperature'])}_n5_{stat}"
            for v in protocol_defaults("knn")["DEFAULTS"]["variants"]
            for n in (1, 5)
            for stat in ("mean", "std")
        ],
        "lowshot_logreg": [
            f"top1_{subset_name(size)}_{stat}"
            for key in ("shots", "fractions")
            for size in protocol_defaults("lowshot_logreg")["DEFAULTS"][key]
            for stat in ("mean", "std", "draw0")
        ],
        "lowshot_svm": [
            f"map_k{k}_{s}"
            for k in protocol_defaults("lowshot_svm")["DEFAULTS"]["ks"]
            for s in ("mean", "std", "min", "max")
        ]
        + [f"top1_k{k}_mean" for k in protocol_defaults("lowshot_svm")["DEFAULTS"]["ks"]],
        "clustering": ["ami", "nmi", "ari"]
        + [f"ami_k{m:g}x" for m in protocol_defaults("clustering")["DEFAULTS"]["overcluster"]],
        "semisup": [f"top{n}_{name}" for name in fractions for n in (1, 5)],
        "linear": ["top1", "top5"],
        "finetune": ["top1", "top5"],
    }
    assert sorted(written) == protocol_names()
    unknown = [(p, m) for p, names in written.items() for m in names if not metric_known(p, m)]
    assert not unknown


@pytest.mark.parametrize(
    "value, expected",
    [
        (89.06, "results[0].value: looks like a percent: write 0.8906 for 89.06"),
        (75, "results[0].value: looks like a percent: write 0.75 for 75"),
        (150.0, "results[0].value: 150.0 is outside [0, 1]"),
        (-0.1, "results[0].value: -0.1 is outside [0, 1]"),
        ("89.06%", "results[0].value: '89.06%' is not a number"),
        (True, "results[0].value: True is not a number"),
    ],
)
def test_a_value_that_is_no_fraction_is_refused(tmp_path, value, expected):
    folder = method_folder(tmp_path, value=value)
    message = refused(folder)
    assert f"{folder / 'paper.yaml'}: {expected}" in message, message


@pytest.mark.parametrize("value", [1, 1.0, 0.001, 0.8906])
def test_fractions_pass(tmp_path, value):
    folder = method_folder(tmp_path, value=value)
    check_method_folders(folder.parent, [folder.name])


def test_the_template_placeholders_are_refused(tmp_path):
    """The template's paper.yaml copied untouched: its value and source are placeholders; its datasets,
    backbone, epochs, protocol and metric are real values, so they pass."""
    folder = method_folder(tmp_path)
    shutil.copy(TEMPLATE / "paper.yaml", folder / "paper.yaml")
    path = folder / "paper.yaml"
    problems = paper_problems(path)
    assert [p.split(":")[1].strip() for p in problems] == ["results[0].value", "results[0].source"], problems
    assert "0.0 is the placeholder of methods/_template/paper.yaml" in problems[0]
    assert "'Table N of the paper' is the placeholder" in problems[1]
    assert "say where the number is printed" in problems[1]
    message = refused(folder)
    assert all(p in message for p in problems)


@pytest.mark.parametrize(
    "key, value", [("value", 0.0), ("value", 0), ("source", "Table N of the SimCLR paper")]
)
def test_each_placeholder_alone_is_refused(tmp_path, key, value):
    folder = method_folder(tmp_path, **{key: value})
    message = refused(folder)
    assert f"{folder / 'paper.yaml'}: results[0].{key}: {value!r} is the placeholder" in message, message


@pytest.mark.parametrize("section", README_SECTIONS)
def test_a_readme_without_a_template_section_is_named(tmp_path, section):
    template = (TEMPLATE / "README.md").read_text()
    readme = re.sub(rf"^## {section}$", "## Notes", template, flags=re.M)
    assert readme != template
    folder = method_folder(tmp_path, readme=readme)
    message = refused(folder)
    assert f"{folder / 'README.md'}: no `## {section}` heading" in message, message
    assert "methods/_template/README.md" in message


def test_a_missing_readme_is_named(tmp_path):
    folder = method_folder(tmp_path)
    (folder / "README.md").unlink()
    message = refused(folder)
    assert f"{folder / 'README.md'}: missing" in message, message


def test_the_required_sections_are_the_templates():
    headings = re.findall(r"^## (.+)$", (TEMPLATE / "README.md").read_text(), re.M)
    assert list(README_SECTIONS) == headings
    assert readme_problems(TEMPLATE / "README.md") == []


def test_the_plan_stops_at_a_bad_paper_yaml_without_a_traceback(tmp_path):
    """The Snakefile calls the check: `snakemake -n` exits 1 with the message alone, before any job."""
    for folder in ("rules", "config"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "Snakefile", tmp_path)
    shutil.copytree(
        METHODS_DIR / "byol", tmp_path / "methods" / "byol", ignore=shutil.ignore_patterns("__pycache__")
    )
    paper = tmp_path / "methods" / "byol" / "paper.yaml"
    entries = yaml.safe_load(paper.read_text())
    entries["results"][0]["value"] = 74.4
    paper.write_text(yaml.safe_dump(entries))
    command = [sys.executable, "-m", "snakemake", "-s", "Snakefile", "--cores", "1", "-n"]
    out = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "methods/byol/paper.yaml: results[0].value: looks like a percent: write 0.744 for 74.4" in text, (
        text
    )
    assert 'File "' not in text and "Traceback" not in text, text
