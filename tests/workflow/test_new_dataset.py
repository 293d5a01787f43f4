"""A newcomer adds a dataset as README.md's "Add a dataset" says: one module in sslbench/data/datasets/ of a
copy of the workflow and the package, a preset naming it; the plan accepts it, the DAG trains and
evaluates on it, and the table holds its rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support import copy_workflow, tiny_suite_config

pytestmark = pytest.mark.slow
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--cores", "1"]

# The newcomer's module: tiny coloured squares in .npy files, written by the test below.
SQUARES = '''"""Coloured squares: <root>/{train,test}_{images,labels}.npy (uint8 [N, 3, 8, 8], labels)."""

from pathlib import Path

from sslbench.data.files import FileSpec
from sslbench.data.spec import DatasetSpec

FILES = ["train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy"]


def squares_files(root=None, download=False, **options):
    folder = Path(root or "data/squares")
    return FileSpec("squares", [folder], FILES, f"write the four .npy files into {folder}")


def load_squares(root=None, download=False, image_size=None):
    import numpy as np

    from sslbench.data.containers import Dataset, in_memory

    folder = Path(root or "data/squares")
    train, test = (
        in_memory(np.load(folder / f"{split}_images.npy"), np.load(folder / f"{split}_labels.npy"))
        for split in ("train", "test")
    )
    names = [f"square{c}" for c in range(10)]
    return Dataset("squares", train, test, num_classes=10, channels=3, image_size=8, class_names=names)


def split_sizes(section):
    import numpy as np

    folder = Path(section.get("root") or "data/squares")
    if not all((folder / name).is_file() for name in FILES):
        return None
    return {split: len(np.load(folder / f"{split}_labels.npy")) for split in ("train", "test")}


SQUARES = DatasetSpec(
    name="squares",
    loader=load_squares,
    source="written by tests/workflow/test_new_dataset.py",
    files=squares_files,
    split_sizes=split_sizes,
    channels=3,
)
'''


def write_squares(folder: Path, per_class: dict[str, int]) -> None:
    """10 classes of 8x8 colour images, each class its own colour plus noise."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    colours = rng.integers(0, 256, (10, 3, 1, 1))
    for split, n in per_class.items():
        labels = np.repeat(np.arange(10), n)
        noise = rng.integers(-30, 31, (len(labels), 3, 8, 8))
        np.save(folder / f"{split}_images.npy", np.clip(colours[labels] + noise, 0, 255).astype(np.uint8))
        np.save(folder / f"{split}_labels.npy", labels)


def snakemake(root: Path, *args: str) -> subprocess.CompletedProcess:
    """snakemake in the copy, whose sslbench (on PYTHONPATH) shadows the installed one, also in the jobs."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root),
    }
    return subprocess.run(
        [*SNAKEMAKE, *args, "--configfile", str(root / "tiny.yaml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_dataset_added_as_one_module_is_planned_trained_and_evaluated(tmp_path):
    root = copy_workflow(tmp_path / "workflow", "sslbench", "evaluation")
    (root / "sslbench" / "data" / "datasets" / "squares.py").write_text(SQUARES)
    files = tmp_path / "squares"
    write_squares(files, {"train": 8, "test": 3})
    cfg = tiny_suite_config(epochs=1, batch_size=16)
    cfg["datasets"]["squares"] = {"name": "squares", "root": str(files), "image_size": 8}
    cfg.update(pretrain=["squares"], methods=["simclr"], protocols=["knn"])  # one run that trains
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))

    plan = snakemake(root, "-n", "results/table.csv")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "results/prepared/squares.npz" in plan.stdout
    run = snakemake(root, "results/table.csv")
    assert run.returncode == 0, run.stdout + run.stderr

    table = pd.read_csv(root / "results" / "table.csv")
    rows = table[table["pretrain_dataset"] == "squares"]
    assert set(rows["method"]) == {"simclr"} and set(rows["protocol"]) == {"knn"}
    assert set(rows["eval_dataset"]) == {"squares"} and rows["value"].notna().all()
    record = json.loads((root / "results" / "squares" / "simclr" / "seed0" / "run.json").read_text())
    assert "sslbench/data/datasets/squares.py" in record["meta"]["code"]  # the copy ran, and says so
