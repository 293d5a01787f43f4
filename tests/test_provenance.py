"""The provenance a run records: `git_dirty` says whether the code a job read is the commit's, with
an untracked method folder (or sslbench source) counted as a difference, in a real git repository."""

import json
import shutil
import subprocess

import pytest
from support import METHODS_DIR

from sslbench import provenance
from sslbench.pretrain.trainer import pretrain
from sslbench.provenance import code_files, git_state, method_files, untracked

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """A committed checkout with one tracked source file and one tracked method folder."""
    root = tmp_path.resolve() / "checkout"
    (root / "sslbench").mkdir(parents=True)
    (root / "sslbench" / "core.py").write_text("x = 1\n")
    (root / "methods" / "old").mkdir(parents=True)
    (root / "methods" / "old" / "method.py").write_text("y = 2\n")
    (root / ".gitignore").write_text("ignored/\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return root


def new_method(root, name="rotnet"):
    folder = root / "methods" / name
    folder.mkdir(parents=True)
    (folder / "method.py").write_text("z = 3\n")
    (folder / "config.yaml").write_text("a: 1\n")
    return folder


def state(root, *files):
    git_state.cache_clear()  # each call sees the tree as it is now
    return git_state(tuple(files), repo=root)


def test_an_untracked_method_folder_makes_the_run_dirty_and_a_clean_tree_stays_clean(repo):
    core, old = repo / "sslbench" / "core.py", repo / "methods" / "old" / "method.py"
    clean = state(repo, core, old)
    assert clean["git_dirty"] is False and len(clean["git_commit"]) == 40
    folder = new_method(repo)
    read = (core, *method_files(folder))
    assert state(repo, *read)["git_dirty"] is True  # tracked files untouched: only the new folder
    assert untracked(read, repo) == ["methods/rotnet/config.yaml", "methods/rotnet/method.py"]
    assert state(repo, core, old)["git_dirty"] is False  # a job that did not read the new folder
    git(repo, "add", "methods/rotnet")  # added, not committed: still not the commit's code
    assert state(repo, *read)["git_dirty"] is True
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "rotnet")
    assert state(repo, *read)["git_dirty"] is False


def test_a_modified_method_an_untracked_source_an_ignored_or_outside_file_make_it_dirty(repo, tmp_path):
    core, old = repo / "sslbench" / "core.py", repo / "methods" / "old" / "method.py"
    old.write_text("y = 3\n")  # a tracked method file edited
    assert state(repo, core)["git_dirty"] is True
    git(repo, "checkout", "--", ".")
    assert state(repo, core, old)["git_dirty"] is False
    helper = repo / "sslbench" / "helper.py"  # a new sslbench module the job imported
    helper.write_text("w = 0\n")
    assert state(repo, core, helper)["git_dirty"] is True
    helper.unlink()
    (repo / "ignored").mkdir()
    hidden = repo / "ignored" / "method.py"  # a method folder git ignores is no more the commit's
    hidden.write_text("v = 1\n")
    assert state(repo, core, hidden)["git_dirty"] is True
    outside = tmp_path / "elsewhere.py"
    outside.write_text("u = 1\n")
    assert untracked((core, outside), repo) == [str(outside)]
    assert state(repo, core, outside)["git_dirty"] is True


def test_no_checkout_is_unknown(tmp_path):
    (tmp_path / "a.py").write_text("")
    assert state(tmp_path.resolve(), tmp_path / "a.py") == {"git_commit": "unknown", "git_dirty": None}


def test_the_trainers_provenance_checks_the_files_of_its_method_folder(monkeypatch):
    """provenance(device, "pretrain", method_dir) asks git about the stage's sources and the method
    folder's files: the list its code record digests."""
    asked = []
    monkeypatch.setattr(provenance, "git_state", lambda files=(): asked.append(files) or {})
    provenance.provenance("cpu", "pretrain", METHODS_DIR / "simclr")
    files = set(asked[-1])
    assert set(method_files((METHODS_DIR / "simclr").resolve())) <= files
    assert set(code_files("pretrain", METHODS_DIR / "simclr")) == files
    assert provenance.REPO / "sslbench" / "pretrain" / "trainer.py" in files
    provenance.provenance("cpu")
    assert asked[-1] == ()


def test_the_stages_that_load_data_record_every_file_of_the_dataset_modules_folder(tmp_path):
    """The registry imports the modules of sslbench/data/datasets/ by listing the folder, which no import
    names: every stage that loads data records each of its files (digits' split too), and the prepare
    job records what the planner computes for it."""
    from sslbench.data.prepared import prepare_dataset
    from sslbench.extract.featurefile import load_meta

    folder = provenance.REPO / "sslbench" / "data" / "datasets"
    files = {p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert {folder / "digits.py", folder / "digits_split.txt", folder / "voc07.py"} <= files
    for stage, protocol in [(s, None) for s in ("prepare", "pretrain", "import", "extract")] + [
        ("evaluate", "semisup"),
        ("evaluate", "finetune"),
    ]:
        assert files <= set(code_files(stage, protocol=protocol)), (stage, protocol)
    path = prepare_dataset({"name": "digits", "image_size": 8}, tmp_path / "digits.npz")
    assert load_meta(path)["code"] == provenance.code_record("prepare")


def test_a_pretrain_runs_record_is_dirty_when_its_method_folder_is_untracked(
    tmp_path, monkeypatch, method_config
):
    """The trainer's call site: run.json (whose git_dirty every result row of the run copies) gets the
    git state of the files the run read, its method folder's among them."""
    asked = []

    def fake_state(files=()):
        asked.append(files)
        return {"git_commit": "c0ffee", "git_dirty": any("methods/random/" in p.as_posix() for p in files)}

    monkeypatch.setattr(provenance, "git_state", fake_state)
    pretrain(METHODS_DIR / "random", method_config("random"), 0, tmp_path, progress=False)
    meta = json.loads((tmp_path / "run.json").read_text())["meta"]
    assert (meta["git_commit"], meta["git_dirty"]) == ("c0ffee", True)
    assert set(method_files((METHODS_DIR / "random").resolve())) <= set(asked[-1])
