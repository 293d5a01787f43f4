"""The module map of README.md ("Layout"), checked on the source: which module may import which."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

PACKAGES = ("sslbench", "evaluation")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool = False) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) of every import in a file (or only its module-level ones),
    relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.append((target, [alias.name for alias in node.names]))
    return found


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


# ARCHITECTURE.md's module map, lowest layer first: a module imports only its own row and rows above.
# The stages are folders (plan -> pretrain -> extract -> evaluate -> collect -> report); a name is a
# module or a folder, and the longest that matches a module places it.
LAYERS = [
    ["errors", "atomic", "kernels", "provenance", "memo", "launch"],
    ["kmeans", "knn", "extract.featurefile", "data.files", "weightfiles"],  # file formats every stage reads
    ["data"],  # the dataset registry, specs, loaders (data.datasets), containers, prepared files
    ["augment", "backbones", "capi_vit", "distributed", "optim", "plan.limits"],  # plan.limits: numbers alone
    ["sslbench", "kit", "plugins"],  # sslbench: the package itself; kit: what a method builds with
    ["plan"],
    ["pretrain"],
    ["extract"],
    ["evaluate"],
    ["collect"],
    ["report"],
    ["bench"],
    ["cli", "warm"],
]
LAYER = {name: i for i, row in enumerate(LAYERS) for name in row}


def layer_name(module: str) -> str:
    """sslbench.report.figures -> report; sslbench.extract.featurefile -> extract.featurefile."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYER:
            return ".".join(parts[:n])
    return parts[0] if parts else "sslbench"


def test_every_module_imports_only_its_layer_or_those_below():
    unmapped, upward = [], []
    for path in sources("sslbench"):
        here = layer_name(module_name(path))
        if here not in LAYER:
            unmapped.append(here)
            continue
        for target, names in imports(path):
            if target.split(".")[0] != "sslbench":
                continue
            modules = [f"{target}.{n}" for n in names] if target == "sslbench" else [target]
            for name in map(layer_name, modules):
                if name in LAYER and LAYER[name] > LAYER[here]:
                    upward.append((module_name(path), target))
    assert not unmapped, f"place these in README.md's module map and in LAYERS: {unmapped}"
    assert not upward


def test_sslbench_never_imports_a_protocol_or_a_method():
    """Protocols are loaded by name (results.protocol_module), methods by folder (plugins)."""
    bad = [
        (module_name(path), target)
        for path in sources("sslbench")
        for target, _ in imports(path)
        if target.split(".")[0] in ("evaluation", "methods", "sslbench_methods")
    ]
    assert not bad


def test_the_optimisation_module_needs_nothing_of_sslbench_but_its_errors():
    found = [t for t, _ in imports(REPO / "sslbench" / "optim.py") if t.split(".")[0] in PACKAGES]
    assert set(found) <= {"sslbench.errors"}, found


# What a method folder builds with: its kit, and below it the processes, the networks and the errors.
METHOD_IMPORTS = ("sslbench.kit", "sslbench.distributed", "sslbench.backbones", "sslbench.errors")


def test_a_method_imports_its_kit_and_nothing_of_a_stage():
    import sslbench

    bad = [
        (str(path.relative_to(REPO)), module)
        for path in sources("methods", "tests/methods/exerciser", "benchmarks/newcomer")
        for target, names in imports(path)
        if target.split(".")[0] == "sslbench"
        for module in ([f"{target}.{n}" for n in names] if target == "sslbench" else [target])
        if not module.startswith(tuple(f"{m}." for m in METHOD_IMPORTS) + METHOD_IMPORTS)
        and module.removeprefix("sslbench.") not in sslbench.__all__
    ]
    assert not bad


# What a plugin may not import: the stages that run it or come after it.
FORBIDDEN = {
    "evaluation": ["pretrain", "collect", "report", "bench", "cli"],
    "methods": ["pretrain.trainer", "extract", "evaluate", "collect", "report", "bench", "cli"],
}


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_protocols_and_methods_never_import_the_stages_that_run_them(folder):
    forbidden = tuple(f"sslbench.{name}" for name in FORBIDDEN[folder])
    bad = [
        (str(path.relative_to(REPO)), module)
        for path in sources(folder)
        for target, names in imports(path)
        for module in ([f"{target}.{n}" for n in names] if target == "sslbench" else [target])
        if module in forbidden or module.startswith(tuple(f"{f}." for f in forbidden))
    ]
    assert not bad


def test_no_private_name_is_reached_across_modules():
    bad = []
    for path in sources("sslbench", "evaluation", "methods"):
        here = module_name(path)
        for target, names in imports(path):
            if target.split(".")[0] in PACKAGES and target != here:
                bad += [(here, f"{target}.{n}") for n in names if n.startswith("_") and n != "__version__"]
    assert not bad


def test_no_import_cycle_at_module_level():
    graph = {}
    for path in sources("sslbench", "evaluation"):
        edges = set()
        for target, names in imports(path, top_level_only=True):
            if target.split(".")[0] in PACKAGES:
                edges.add(target)
                edges |= {f"{target}.{n}" for n in names}  # `from . import atomic` names a module
        graph[module_name(path)] = edges
    graph = {m: {t for t in edges if t in graph and t != m} for m, edges in graph.items()}

    def cycle_from(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return [node, nxt]
            if nxt not in seen:
                seen.add(nxt)
                if found := cycle_from(start, nxt, seen):
                    return [node, *found]
        return None

    assert not [c for m in graph if (c := cycle_from(m, m, set()))]


def test_planning_and_the_cached_feature_protocols_never_import_torch():
    """The Snakefile imports sslbench.plan at every plan; kNN, linear (cached), low-shot SVM and
    clustering jobs read .npz features; the report and collect read CSVs and JSON: none of them pays
    for torch."""
    modules = [
        "sslbench.plan.runs",
        "sslbench.plan.workflow",
        "sslbench.plan.backbones",  # torch only where a backbone's facts are not remembered
        "sslbench.data.registry",  # and every dataset module, which it imports
        "sslbench.kmeans",
        "sslbench.knn",
        "sslbench.extract.featurefile",
        "sslbench.evaluate",
        "sslbench.collect",
        "sslbench.report",
        "sslbench.cli",
        "evaluation.knn",
        "evaluation.linear",
        "evaluation.lowshot_svm",
        "evaluation.lowshot_logreg",
        "evaluation.clustering",
    ]
    code = f"import sys\nfor m in {modules}:\n    __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_clustering_protocol_imports_neither_sklearn_nor_scipy():
    """Its scores are numpy (evaluation.cluster_scores): sklearn.metrics would add about a second to every
    clustering job, scipy.special a fifth of one. Only the t-SNE maps import sklearn, inside tsne_map."""
    code = "import sys\nimport evaluation.clustering\nprint(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = set(ast.literal_eval(out.stdout.strip()))
    assert "evaluation" in loaded and not {"sklearn", "scipy"} & loaded
