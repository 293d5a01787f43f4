"""Prepared dataset files: what `sslbench prepare` writes reads back as the loader gives it, bit for bit;
only the datasets held in memory are prepared."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dataset_files import (
    cifar_batch,
    make_cifar10,
    make_idx_tree,
    make_imagefolder,
    make_stl10,
    make_voc,
    write_pickle,
)
from support import assert_same_dataset, write_fashion_format

from sslbench.data.files import DatasetError
from sslbench.data.prepared import load_prepared, prepare_dataset
from sslbench.data.registry import DATASETS, load_data, load_dataset
from sslbench.errors import UnreadableFileError


def sections(tmp_path) -> dict[str, dict]:
    fashion = str(write_fashion_format(tmp_path / "fashion"))
    return {
        "digits": {"name": "digits", "image_size": 16, "label": "digits"},
        # the default's target: a stratified subset of each split, resized from 28 px
        "fashion_mnist": {
            "name": "fashion_mnist",
            "root": fashion,
            "image_size": 16,
            "subset": {"train": 20, "test": 10},
            "label": "fashion_mnist",
        },
    }


@pytest.mark.parametrize("name", ["digits", "fashion_mnist"])
def test_a_prepared_file_reads_back_as_load_data_gives_it_bit_for_bit(name, tmp_path):
    section = sections(tmp_path)[name]
    path = prepare_dataset(section, tmp_path / "prepared" / f"{name}.npz")
    loaded = load_data({"dataset": section})
    assert_same_dataset(load_data({"dataset": section}, prepared=path), loaded)
    assert loaded.image_size == 16 and loaded.train.images.shape[-2:] == (16, 16)
    with np.load(path) as npz:
        meta = json.loads(str(npz["meta_json"]))
    assert meta["section"] == section and meta["code"]["sslbench/data/prepared.py"]
    assert meta["code"][f"sslbench/data/datasets/{name}.py"]  # found by the registry, not imported by name
    assert {"git_commit", "versions", "cpu_kernels"} <= set(meta["prepared_with"])


def test_a_prepared_file_of_another_section_or_damaged_is_refused_by_name(tmp_path):
    section = sections(tmp_path)["fashion_mnist"]
    path = prepare_dataset(section, tmp_path / "fashion_mnist.npz")
    assert load_prepared(path, {**section, "label": "another_label"}).train.images.shape[0] == 20
    for other in ({**section, "image_size": 8}, {**section, "subset": {"train": 30, "test": 10}}):
        with pytest.raises(DatasetError) as info:
            load_prepared(path, other)
        message = str(info.value)
        assert (
            message.startswith(f"{path}: prepared from the dataset section") and '"image_size": 16' in message
        )
        assert f"--forcerun {path}" in message and "without --prepared" in message
    features = tmp_path / "features.npz"  # an .npz with a meta record, but no prepared file
    np.savez(features, meta_json=np.array(json.dumps({"dataset": "digits"})), train=np.zeros(3))
    with pytest.raises(DatasetError, match=f"{features}: not a prepared dataset file"):
        load_prepared(features, section)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(UnreadableFileError, match=f"{path}: unreadable prepared dataset file.*Rebuild it"):
        load_prepared(path, section)


def write_cifar100(root):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for split, n in (("train", 4), ("test", 2)):
        write_pickle(folder / split, cifar_batch(n, b"fine_labels", 100))


# Tiny files of each dataset with files, in its real format: a dataset added without one fails below.
WRITERS = {
    "fashion_mnist": make_idx_tree,
    "cifar10": make_cifar10,
    "cifar100": write_cifar100,
    "stl10": make_stl10,
    "imagefolder": make_imagefolder,
    "voc07": make_voc,
}


def test_only_the_datasets_held_in_memory_are_prepared(tmp_path):
    """Each spec's `lazy`, `multilabel` and `channels` (what the planner reads, without torch) are what
    its loader does."""
    for name, spec in DATASETS.items():
        root = None
        if spec.files is not None:
            assert name in WRITERS, f"{name}: add a writer of tiny files in its format to WRITERS"
            root = str(tmp_path / name)
            WRITERS[name](tmp_path / name)
        loaded = load_dataset(name, root=root, image_size=8)
        lazy = loaded.train.images is None
        assert (lazy, loaded.multilabel) == (spec.lazy, spec.multilabel), name
        assert spec.channels in (None, loaded.channels), name
        if lazy:
            with pytest.raises(DatasetError, match="nothing to prepare"):
                prepare_dataset({"name": name, "root": root}, tmp_path / f"{name}.npz")
            assert not (tmp_path / f"{name}.npz").exists()


def test_a_refresh_rebuilds_a_prepared_file_made_by_code_that_has_changed(tmp_path):
    """`sslbench status` forceruns such a file: the jobs it reruns would otherwise read old images."""
    from support import METHODS_DIR

    from sslbench.collect import prepared_states, refresh_command

    path = prepare_dataset(sections(tmp_path)["digits"], tmp_path / "digits.npz")
    missing, broken = tmp_path / "missing.npz", tmp_path / "broken.npz"
    broken.write_bytes(path.read_bytes()[:100])
    assert [(s.path, s.state) for s in prepared_states([path, missing, broken], METHODS_DIR)] == [
        (str(broken), "unreadable")
    ]
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays.pop("meta_json")))
    changed = "sslbench/data/datasets/digits.py"
    meta["code"][changed] = "0" * 64  # what an edit of the digits loader since would look like
    np.savez(path, meta_json=np.array(json.dumps(meta)), **arrays)
    (state,) = prepared_states([path], METHODS_DIR)
    assert (state.state, state.changed) == ("stale", {"prepare": [changed]})
    assert refresh_command([state], []).endswith(f"--forcerun {path}")
