"""Prepared dataset files: one .npz per in-memory dataset section, decoded, subset and resized once
(`sslbench prepare`), which the jobs read instead of the dataset's own files.

The file holds each split's images (uint8 [N, C, H, W], as ImageSet holds them) and labels as arrays,
everything else of the Dataset and a meta record in `meta_json`.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import torch

from sslbench import atomic
from sslbench.data.containers import Dataset, ImageSet
from sslbench.data.files import DatasetError
from sslbench.data.registry import DATASETS, LAZY_DATASETS, load_arguments, load_data
from sslbench.errors import rebuild_command, unreadable

PREPARED_FORMAT = 1  # the layout below; a file of another layout is refused, not misread
SPLITS = ("train", "test")
SPLIT_ARRAYS = ("images", "labels")  # ImageSet's tensors; its other fields (but paths) go in the meta


def prepare_dataset(section: dict, out_path: str | Path) -> Path:
    """Load a dataset section as ``load_data`` does and write it, atomically, to one file that
    ``load_prepared`` reads back bit for bit. Only for datasets held in memory: a folder dataset
    decodes its images per batch, and a copy of them is what it avoids."""
    from sslbench.provenance import code_record, provenance

    if section["name"] in LAZY_DATASETS:
        raise DatasetError(
            f"dataset {section['name']!r} decodes its images from their files as they are used; there "
            f"is nothing to prepare (only {sorted(set(DATASETS) - set(LAZY_DATASETS))} are held in memory)"
        )
    data = load_data({"dataset": section})
    arrays, splits = {}, {}
    for split in SPLITS:
        images = getattr(data, split)
        arrays |= {f"{split}_{field}": getattr(images, field).numpy() for field in SPLIT_ARRAYS}
        splits[split] = {
            f.name: getattr(images, f.name)
            for f in dataclasses.fields(ImageSet)
            if f.name not in (*SPLIT_ARRAYS, "paths")
        }
    meta = {
        "format": PREPARED_FORMAT,
        "section": section,
        "dataset": {
            f.name: getattr(data, f.name) for f in dataclasses.fields(Dataset) if f.name not in SPLITS
        },
        "splits": splits,
        "prepared_with": provenance("cpu"),
        "code": code_record("prepare"),  # what `rerun_on_code_change` and `sslbench status` compare
    }
    buffer = io.BytesIO()
    np.savez(buffer, meta_json=np.array(json.dumps(meta)), **arrays)
    return atomic.write_bytes(out_path, buffer.getvalue())


def load_prepared(path: str | Path, section: dict) -> Dataset:
    """The Dataset of ``section`` from its file written by ``prepare_dataset``: the tensors, labels
    and attributes ``load_data`` gives for it, bit for bit. A file of another section is refused."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta_json"]))
            if meta.get("format") != PREPARED_FORMAT:
                raise DatasetError(
                    f"{path}: not a prepared dataset file of this code (its format: "
                    f"{meta.get('format')!r}, expected {PREPARED_FORMAT}). Prepare it again: "
                    f"{rebuild_command(path)}"
                )
            _check_prepared_section(path, meta["section"], section)
            arrays = {name: npz[name] for name in npz.files if name != "meta_json"}
            splits = {
                split: ImageSet(
                    **{field: torch.from_numpy(arrays[f"{split}_{field}"]) for field in SPLIT_ARRAYS},
                    **meta["splits"][split],
                )
                for split in SPLITS
            }
            return Dataset(**meta["dataset"], **splits)
    except DatasetError:
        raise
    except Exception as err:  # a truncated zip, a missing array, a damaged record: each its own error
        raise unreadable(path, "prepared dataset file", err) from err


def _check_prepared_section(path, prepared: dict, section: dict) -> None:
    if load_arguments(prepared) != load_arguments(section):
        raise DatasetError(
            f"{path}: prepared from the dataset section {json.dumps(prepared, sort_keys=True)}, not "
            f"from this job's {json.dumps(section, sort_keys=True)}. Prepare it again: "
            f"{rebuild_command(path)}, or run the job without --prepared to read the dataset's own files"
        )
