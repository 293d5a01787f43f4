"""Where a number came from: code version, packages, device."""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "torch",
    "torchvision",
    "timm",
    "faiss-cpu",
    "faiss-gpu",
    "scikit-learn",
    "numpy",
    "pandas",
    "snakemake",
)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_state() -> dict:
    """The commit of the sslbench checkout and whether its tracked files differ from it."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit or "unknown", "git_dirty": bool(status) if status is not None else None}


@lru_cache(maxsize=1)
def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    versions["python"] = platform.python_version()
    return versions


def device_name(device) -> str:
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()})"


def provenance(device) -> dict:
    return {**git_state(), "versions": package_versions(), "device": device_name(device)}
