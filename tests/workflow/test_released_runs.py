"""Released weights through the real DAG: a checkpoint the suite trained, written in MoCo's official
format and imported back, gives exactly the numbers of the run it came from; it plans no pretraining,
reruns nothing when its file is unchanged, and reruns its import and protocols when the file changes."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from support import copy_workflow, tiny_suite_config

pytestmark = pytest.mark.slow
RELEASED = "moco (released: roundtrip)"


def run(root: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def snakemake(root: Path, *args: str) -> str:
    return run(root, sys.executable, "-m", "snakemake", "--configfile", "tiny.yaml", "--cores", "2", *args)


def planned(root: Path) -> str:
    return snakemake(root, "-n", "results/table.csv")


def test_a_checkpoint_exported_in_mocos_format_and_imported_gives_the_same_numbers(tmp_path):
    root = copy_workflow(tmp_path / "wf")
    cfg = tiny_suite_config()
    cfg.update(methods=["moco"], seeds=[0], protocols=["knn", "clustering", "lowshot_logreg"])
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(root, "results/table.csv")
    weights = root / "weights" / "moco.pth.tar"
    run(
        root,
        "sslbench",
        "export",
        "--checkpoint",
        "results/digits/moco/seed0/checkpoint.pt",
        "--format",
        "moco",
        "--out",
        str(weights),
    )
    official = torch.load(weights, weights_only=False)
    assert set(official) == {"epoch", "arch", "state_dict"}  # what the run knows; no made-up optimizer
    assert (official["epoch"], official["arch"]) == (cfg["train"]["epochs"], cfg["backbone"]["name"])
    assert any(k.startswith("module.encoder_k.") for k in official["state_dict"])

    entry = {"method": "moco", "format": "moco", "path": "weights/moco.pth.tar", "dataset": "digits"}
    cfg["released"] = {"roundtrip": {**entry, "normalisation": "dataset"}}  # the suite's own statistics
    (root / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    plan = planned(root)
    assert "import_released" in plan and "rule pretrain" not in plan
    snakemake(root, "results/table.csv")

    table = pd.read_csv(root / "results" / "table.csv")
    values = table.set_index(["method", "protocol", "metric"])["value"]
    ours, imported = values.xs("moco"), values.xs(RELEASED)
    assert len(ours) > 3 and ours.sort_index().equals(imported.sort_index())
    assert set(imported.index.get_level_values("protocol")) == {"knn", "clustering", "lowshot_logreg"}
    row = table[table["method"] == RELEASED].iloc[0]
    assert row["method_base"] == "moco" and row["released_file"] == "moco.pth.tar"
    assert row["released_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert table.loc[table["method"] == "moco", "released_name"].isna().all()

    assert "Nothing to be done" in planned(root)
    official["state_dict"]["module.encoder_q.conv1.0.weight"] += 1e-3  # another file at the same path
    torch.save(official, weights)
    plan = planned(root)
    assert "import_released" in plan and "rule pretrain" not in plan and "rule evaluate" in plan
