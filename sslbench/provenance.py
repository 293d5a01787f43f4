"""Where a number came from: code version, packages, device."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache, lru_cache
from importlib import metadata
from pathlib import Path

from sslbench import memo

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


def _git(*args: str, repo: Path = REPO) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def untracked(files: tuple[Path, ...], repo: Path = REPO) -> list[str] | None:
    """Those of ``files`` that the checkout ``repo`` does not track (untracked, ignored, or outside
    it): what its commit cannot have; None if git cannot tell. One `git ls-files` of the files."""
    inside, outside = [], []
    for path in files:
        try:
            inside.append(Path(path).resolve().relative_to(repo).as_posix())
        except ValueError:
            outside.append(str(path))
    if not inside:
        return outside
    tracked = _git("--literal-pathspecs", "ls-files", "-z", "--", *inside, repo=repo)
    if tracked is None:
        return None
    return sorted(set(inside) - set(tracked.split("\0"))) + outside


@lru_cache(maxsize=8)
def git_state(files: tuple[Path, ...] = (), repo: Path = REPO) -> dict:
    """The commit of the checkout ``repo`` (sslbench's) and whether the code differs from it: a tracked
    file changed anywhere, or one of ``files`` (those a job read: ``code_files``) not in it, such as a
    new method folder not yet added to git. None where git cannot tell (no checkout)."""
    commit = _git("rev-parse", "HEAD", repo=repo)
    status = _git("status", "--porcelain", "--untracked-files=no", repo=repo)
    missing = untracked(files, repo) if status is not None else None
    dirty = (bool(status) or bool(missing)) if missing is not None else None
    return {"git_commit": commit or "unknown", "git_dirty": dirty}


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


LAUNCHED_BY = "SSLBENCH_WARM_SERVER"  # in a job forked from sslbench.warm's server: that server's pid


def launch() -> str:
    """How this process started: its own process, or forked from a warm server (sslbench.warm)."""
    server = os.environ.get(LAUNCHED_BY)
    return f"forked from warm server {server}" if server else "own process"


def provenance(device, stage: str | None = None, method_dir: str | Path | None = None) -> dict:
    """Where a job ran and from what code; given its ``stage`` (and method folder), `git_dirty` also
    says whether a file the job read (``code_files``) is missing from the commit."""
    from sslbench.kernels import record

    return {
        **git_state(tuple(code_files(stage, method_dir)) if stage else ()),
        "versions": package_versions(),
        "device": device_name(device),
        "cpu_kernels": record(),
        "launch": launch(),
    }


# --------------------------------------------------------------------------- code fingerprints
# The project files a job runs: the static import closure of its stage's entry modules (every import
# of sslbench and evaluation modules, also those inside functions), its protocol's module and its
# method folder. Static, so that the planner and the job compute the same list: the job records it
# with each file's sha256 (`code_record`), the table marks a result whose recorded files differ from
# the current tree (`changed_files`), and `rerun_on_code_change` reruns the jobs whose files changed.
PROJECT_PACKAGES = ("sslbench", "evaluation")
STAGE_ENTRIES = {
    "prepare": ("sslbench.cli", "sslbench.data.prepared"),
    "pretrain": ("sslbench.cli", "sslbench.pretrain.trainer", "sslbench.extract.features"),
    "import": ("sslbench.cli", "sslbench.pretrain.released", "sslbench.extract.features"),
    "extract": ("sslbench.cli", "sslbench.extract.features"),
    "evaluate": ("sslbench.cli", "sslbench.evaluate"),
}
# Their imports are not followed: the CLI imports each command lazily, the package re-exports the
# Method contract lazily (only a method that uses it runs it, and then imports it itself).
DISPATCH_ONLY = ("sslbench", "sslbench.cli")
# Modules that import every module of a package at run time (pkgutil), which no import statement
# names: a closure that reaches one holds every file of that package's folder (its modules, followed,
# and the files they read, such as digits' split).
DISCOVERS = {"sslbench.data.registry": "sslbench.data.datasets"}
METHOD_FILE_PATTERNS = ("*.py", "config.yaml")
METHODS_KEY = "methods"  # record keys of method files: methods/<folder>/<file>


def sha256_file(path: str | Path) -> str:
    import hashlib

    with open(path, "rb") as f:  # in blocks: a released checkpoint can be hundreds of megabytes
        return hashlib.file_digest(f, "sha256").hexdigest()


def module_file(name: str) -> Path | None:
    """The source file of a project module (a package's __init__.py), or None if there is none."""
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def file_imports(path: Path, package: str) -> tuple[str, ...]:
    """Project modules a source file imports anywhere in it (relative imports resolved against
    ``package``), including ``from package import module`` and the packages on the way."""
    found = set()
    for target, names in import_statements(path, package):
        parts = target.split(".")
        found |= {".".join(parts[: i + 1]) for i in range(len(parts))}
        found |= {f"{target}.{n}" for n in names if module_file(f"{target}.{n}") is not None}
    return tuple(sorted(m for m in found if module_file(m) is not None))


def import_statements(path: Path, package: str) -> list[list]:
    """[module, names imported from it] of each import of a project module in a source file: a pure
    function of its text, so remembered between jobs (``memo``) under the text and this file's own."""
    text = path.read_text()

    def parse() -> list[list]:
        import ast

        statements = []
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Import):
                statements += [[alias.name, []] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".") if package else []
                base = parts[: len(parts) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                statements.append([module, [a.name for a in node.names]])
        return [s for s in statements if s[0].split(".")[0] in PROJECT_PACKAGES]

    return memo.remembered("imports", "\0".join((own_source(), package, text)), parse)


@cache
def own_source() -> str:
    return Path(__file__).read_text()


def import_closure(entries: tuple[str, ...], extra_files: tuple[Path, ...] = ()) -> list[Path]:
    """The source files of ``entries`` and of every project module they import, transitively."""
    files, todo, seen = set(extra_files), list(entries), set()
    for extra in extra_files:
        if extra.suffix == ".py":
            todo += file_imports(extra, "")
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name)
        if path is None:
            continue
        files.add(path)
        if name in DISCOVERS:
            found = package_files(DISCOVERS[name])
            files |= set(found)
            todo += [f"{DISCOVERS[name]}.{p.stem}" for p in found if p.suffix == ".py"]
        parts = name.split(".")
        todo += [".".join(parts[: i + 1]) for i in range(len(parts) - 1)]  # its packages run first
        if name not in DISPATCH_ONLY:
            package = name if path.name == "__init__.py" else ".".join(parts[:-1])
            todo += file_imports(path, package)
    return sorted(files)


def package_files(package: str) -> list[Path]:
    """Every file of a project package's folder (not its subfolders nor hidden files)."""
    folder = module_file(package).parent
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def method_files(method_dir: str | Path) -> list[Path]:
    folder = Path(method_dir)
    return sorted({p for pattern in METHOD_FILE_PATTERNS for p in folder.glob(pattern) if p.is_file()})


def record_key(path: Path, method_dir: Path | None) -> str:
    if method_dir is not None and path.parent == method_dir:
        return f"{METHODS_KEY}/{method_dir.name}/{path.name}"
    return path.relative_to(REPO).as_posix()


def code_record(
    stage: str, method_dir: str | Path | None = None, protocol: str | None = None
) -> dict[str, str]:
    """{file: sha256} of the project files a job of ``stage`` (prepare, pretrain, extract, evaluate) runs;
    keys are paths from the repository root (``sslbench/pretrain/trainer.py``, ``methods/moco/method.py``)."""
    folder = Path(method_dir).resolve() if method_dir is not None else None
    return {record_key(p, folder): sha256_file(p) for p in code_files(stage, method_dir, protocol)}


def code_files(stage: str, method_dir: str | Path | None = None, protocol: str | None = None) -> list[Path]:
    """The project files a job of ``stage`` runs (those ``code_record`` records), as paths."""
    folder = Path(method_dir).resolve() if method_dir is not None else None
    entries = STAGE_ENTRIES[stage] + ((f"evaluation.{protocol}",) if protocol else ())
    extra = tuple(method_files(folder)) if folder is not None else ()
    return import_closure(entries, extra)


def code_digest(record: dict[str, str]) -> str:
    """A short name of a whole record: equal records, equal digests."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]


def changed_files(record: dict[str, str], methods_dir: str | Path) -> list[str]:
    """The recorded files whose content differs now (or that are gone): method files are looked for
    in ``methods_dir``, the others in this checkout of sslbench."""
    changed = []
    for key, digest in sorted(record.items()):
        head, _, rest = key.partition("/")
        path = Path(methods_dir) / rest if head == METHODS_KEY else REPO / key
        if not path.is_file() or current_sha256(path, path.stat().st_mtime_ns) != digest:
            changed.append(key)
    return changed


@cache
def current_sha256(path: Path, mtime_ns: int) -> str:
    """sha256 of a file, cached per modification time (a table checks the same files many times)."""
    return sha256_file(path)


def tree_record(methods_dir: str | Path) -> dict[str, str]:
    """{file: sha256} of every project file: the sslbench and evaluation sources and every method
    folder's (what any job may run)."""
    files = [p for package in PROJECT_PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    record = {p.relative_to(REPO).as_posix(): current_sha256(p, p.stat().st_mtime_ns) for p in files}
    for folder in sorted(p for p in Path(methods_dir).iterdir() if p.is_dir()):
        record |= method_record(folder)
    return record


def method_record(method_dir: str | Path) -> dict[str, str]:
    """{file: sha256} of one method folder's files (its code and config.yaml)."""
    folder = Path(method_dir).resolve()
    return {record_key(p, folder): current_sha256(p, p.stat().st_mtime_ns) for p in method_files(folder)}
