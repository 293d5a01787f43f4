"""Released weights as runs: each entry of the config's ``released`` section is a run of its method
whose pretraining is an import of the file (``sslbench import``), then extraction and every protocol
exactly as for a trained run.

A released run is labelled ``<method> (released: <name>)`` (folder ``<method>@released=<name>``); its
``method_base`` is the method. Its resolved settings carry the file's name, format and sha256, so a
changed file reruns its import, extraction and protocols, and every result row names the file. An
absent file skips the run with a message saying where to put it, or stops the plan where the entry is
``required``. Digests are remembered by (path, size, mtime): planning hashes a file only when it
changes.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from sslbench import atomic
from sslbench.errors import ConfigError
from sslbench.plan.settings import without_plan_keys
from sslbench.weightfiles import FORMATS

NORMALISATIONS = ("imagenet", "dataset")  # the constants the releases were trained with, or ours
DIGESTS_FILE = ".snakemake/sslbench/released_sha256.json"  # remembered digests, relative to the cwd


def released_label(method: str, name: str) -> str:
    return f"{method} (released: {name})"


def released_slug(method: str, name: str) -> str:
    return f"{method}@released={name}"


def check_entry(name: str, entry: dict, config: dict, methods_dir: str | Path) -> None:
    key = lambda field: f"config key `released.{name}.{field}`"
    if not (Path(methods_dir) / entry["method"]).is_dir():
        raise ConfigError(
            f"{key('method')}: no method folder methods/{entry['method']}; name the method it is a run of"
        )
    if entry["dataset"] not in config["datasets"]:
        raise ConfigError(
            f"{key('dataset')}: {entry['dataset']!r} is not registered under `datasets` "
            f"({sorted(config['datasets'])}); register the dataset the weights were pretrained on"
        )
    if entry["format"] not in FORMATS:
        raise ConfigError(f"{key('format')}: unknown format {entry['format']!r}; known: {', '.join(FORMATS)}")


def file_digest(path: Path, remembered: dict, kind: str = "sha256") -> str:
    """The file's ``kind`` digest, from ``remembered`` while its size and mtime are unchanged: a plan
    reads a released file only when it changes."""
    import hashlib

    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}" + ("" if kind == "sha256" else f":{kind}")
    if key not in remembered:
        with open(path, "rb") as f:  # in blocks: a release can be hundreds of megabytes
            remembered[key] = hashlib.file_digest(f, kind).hexdigest()
    return remembered[key]


def check_published(name: str, entry: dict, path: Path, remembered: dict) -> None:
    """The file's digest starts with the published one (repositories publish prefixes: MoCo's md5,
    torchvision's sha256); md5 is computed only when an entry gives one."""
    for kind in ("sha256", "md5"):
        published = entry.get(kind)
        if not published:
            continue
        actual = file_digest(path, remembered, kind)
        if not actual.startswith(published.lower()):
            raise ConfigError(
                f"config key `released.{name}.{kind}`: {path} has {kind} {actual}, not the published "
                f"{published}; the file is another release or damaged: download it again"
            )


def released_runs(
    config: dict, methods_dir: str | Path, datasets: dict, check_files: bool
) -> tuple[dict[tuple[str, str], dict], dict[str, str], dict[str, str]]:
    """({(dataset, label): resolved settings}, {label: slug}, {label: why it is skipped}) of the
    config's ``released`` entries. Without ``check_files`` no file is read (the runs are planned as if
    every file were there, with no digest)."""
    entries = config.get("released") or {}
    runs, slugs, skipped = {}, {}, {}
    digests_path = Path(DIGESTS_FILE)
    try:
        remembered = json.loads(digests_path.read_text()) if check_files and digests_path.is_file() else {}
    except ValueError:  # a damaged file: hash again
        remembered = {}
    before = dict(remembered)
    for name, entry in entries.items():
        check_entry(name, entry, config, methods_dir)
        label, path = released_label(entry["method"], name), Path(entry["path"])
        digest = None
        if check_files:
            if not path.is_file():
                where = f" (published at {entry['url']})" if entry.get("url") else ""
                why = (
                    f"released.{name}: no file {path}; put the {entry['format']} release there{where}, or "
                    f"set `released.{name}.path`"
                )
                if entry.get("required", False):
                    raise ConfigError(f"config key `released.{name}.path`: {why}")
                skipped[label] = why
                continue
            digest = file_digest(path, remembered)
            check_published(name, entry, path, remembered)
        dataset = entry["dataset"]
        runs[dataset, label] = {
            "method": label,
            "method_base": entry["method"],
            "variant": {},
            "dataset": without_plan_keys(datasets[dataset]),
            "backbone": copy.deepcopy(entry.get("backbone") or config["backbone"]),
            # Nothing of ours trained it: the epochs are the release's, the rest unknown.
            "train": {"epochs": entry.get("epochs")},
            "augment": {},
            "params": {},
            "released": {
                "name": name,
                "format": entry["format"],
                "file": os.path.basename(path),
                "path": str(path),
                "part": entry.get("part"),
                "normalisation": entry.get("normalisation", "imagenet"),
                "sha256": digest,
            },
        }
        slugs[label] = released_slug(entry["method"], name)
    if remembered != before:
        digests_path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(digests_path, json.dumps(remembered, indent=1, sort_keys=True))
    return runs, slugs, skipped
