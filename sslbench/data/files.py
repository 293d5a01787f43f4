"""Where a dataset's files are looked for, and whether they are there.

No torch here: planning (``sslbench.plan``) asks before any job runs, so that an optional evaluation
target whose files are absent is skipped with the message of how to get them, and a required one stops
the run. Each dataset's module of ``sslbench/data/datasets/`` says where its files are (a ``FileSpec``)
and parses the files ``locate`` finds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sslbench.errors import SslbenchError


class DatasetError(SslbenchError, ValueError):
    """A dataset is unknown, missing or damaged; the message names the paths and the fix."""


# Where `root=None` points for datasets that live under a data folder (the repo ignores ./data).
DATA_ROOT_ENV = "SSLBENCH_DATA"
DEFAULT_DATA_ROOT = "data"


@dataclass
class FileSpec:
    """The files of one dataset: ``names`` all in one of ``folders`` (the first that holds them)."""

    dataset: str
    folders: list[Path]
    names: list[str]
    how_to_get: str
    allow_gz: bool = False


def data_root(root) -> Path:
    if root is not None:
        return Path(root).expanduser()
    return Path(os.environ.get(DATA_ROOT_ENV, DEFAULT_DATA_ROOT)).expanduser()


def download_hint(dataset: str, folder: Path) -> str:
    return (
        f"call load_dataset({dataset!r}, root=..., download=True) (or `--download`) to fetch them "
        "with torchvision "
        f"into {folder}, or pass root= pointing at a folder that holds them"
    )


def find(folder: Path, name: str, allow_gz: bool = False) -> Path | None:
    for candidate in [folder / name] + ([folder / f"{name}.gz"] if allow_gz else []):
        if candidate.exists():
            return candidate
    return None


def locate(spec: FileSpec) -> dict[str, Path]:
    """Paths of the spec's names in the first folder that holds them all; else an error listing what
    each folder lacks and how to get the files."""
    for folder in spec.folders:
        found = {name: find(folder, name, spec.allow_gz) for name in spec.names}
        if all(found.values()):
            return found
    report = "\n".join(
        f"  {folder}: missing {', '.join(n for n in spec.names if find(folder, n, spec.allow_gz) is None)}"
        for folder in spec.folders
    )
    raise DatasetError(
        f"{spec.dataset}: dataset files not found. Looked in:\n{report}\nTo get them: {spec.how_to_get}"
    )


def section_files(files: Callable[..., FileSpec], section: dict) -> FileSpec:
    """Where the files of a config's dataset section are looked for (its `root` and `options`)."""
    return files(root=section.get("root"), **section.get("options", {}))


def files_missing(files: Callable[..., FileSpec] | None, section: dict) -> str | None:
    """Why the files of a config's dataset section cannot be found (the message names where they were
    looked for and how to get them), or None when they are there or will be downloaded (or ``files``
    is None: the dataset ships with a Python package)."""
    if files is None or section.get("download", False):
        return None
    try:
        locate(section_files(files, section))
    except DatasetError as err:
        return str(err)
    return None


def torchvision_download(class_name: str, root: Path, *variants: dict) -> None:
    """Download with torchvision's dataset class (which verifies the archive's MD5), once per variant."""
    import torchvision.datasets

    root.mkdir(parents=True, exist_ok=True)
    for arguments in variants:
        getattr(torchvision.datasets, class_name)(str(root), download=True, **arguments)


def locate_or_download(spec: FileSpec, download: bool, fetch: Callable[[], None]) -> dict[str, Path]:
    try:
        return locate(spec)
    except DatasetError:
        if not download:
            raise
    fetch()
    return locate(spec)
