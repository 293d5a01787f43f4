"""What the plan knows of each run's backbone before any job: the network built by the jobs' own code
(``sslbench.backbones``) on the meta device (no memory, no weights), fed a batch of every size the run
gives it (each crop of its views; its dataset's and every evaluation target's image size) and read as
its features are read (``backbone.features``). So an argument timm refuses, a patch size that does not
divide a crop, features a backbone cannot give and split batch norm on a network without BatchNorm2d
stop the plan, naming the key and the file that set it, instead of a job that has already deleted or
replaced a finished run.

The facts are remembered by what they depend on (the backbone's settings, the sizes, timm's version and
the code that builds it: ``FACTS_FILE``), so that planning an unchanged DAG imports no torch."""

from __future__ import annotations

import hashlib
import json
import re
from importlib.metadata import version
from pathlib import Path

from sslbench import atomic
from sslbench.errors import ConfigError
from sslbench.plan.checks import dotted, load_yaml, set_in
from sslbench.plan.limits import pretrain_processes, split_batch_norm_problem
from sslbench.plan.settings import NOT_TIMM_BACKBONES

FACTS_FILE = ".snakemake/sslbench/backbones.json"  # {key: facts}, beside the sound method folders


def backbone_facts(section: dict, image_size: int, train_sizes: list[int], eval_sizes: list[int]) -> dict:
    """What one backbone does with inputs: ``build`` (timm's refusal of its arguments, or None),
    ``train`` and ``eval`` ({size: the error of a batch of that size, or None}: the pretraining
    forward, and the features as they are read), and ``batchnorm2d`` (whether it has BatchNorm2d
    layers). Imports torch and timm: ``checked_facts`` remembers the answer."""
    import torch

    from sslbench.backbones import BackboneError, backbone_from_config, feature_reader

    facts = {"build": None, "train": {}, "eval": {}, "batchnorm2d": False}
    with torch.device("meta"):
        try:
            net = backbone_from_config({"backbone": section}, 3, image_size)
        except BackboneError as err:
            return {**facts, "build": str(err)}
        facts["batchnorm2d"] = any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
        for size in train_sizes:
            facts["train"][str(size)] = forward_problem(net, size)
        try:
            reader = feature_reader(net, section)
        except BackboneError as err:
            return {**facts, "build": str(err)}
        for size in eval_sizes:
            facts["eval"][str(size)] = forward_problem(reader, size)
    return facts


def forward_problem(net, size: int) -> str | None:
    """What a batch of two ``size``-pixel images makes ``net`` raise, in its own words, or None."""
    import torch

    try:
        net(torch.empty(2, 3, size, size))
    except (AssertionError, RuntimeError, ValueError, TypeError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no message'}"
    return None


def checked_facts(requests: dict[str, tuple], facts_file: str | Path | None) -> dict[str, dict]:
    """{key: backbone_facts(*request)} for each request, from ``facts_file`` where it was remembered;
    the rest are computed (importing torch) and remembered."""
    known = {}
    if facts_file is not None and Path(facts_file).is_file():
        try:
            known = json.loads(Path(facts_file).read_text())
        except ValueError:
            known = {}  # a damaged memory costs one recomputation, nothing else
    missing = {key: request for key, request in requests.items() if key not in known}
    for key, request in missing.items():
        known[key] = backbone_facts(*request)
    if missing and facts_file is not None:
        atomic.write_json(facts_file, known)
    return {key: known[key] for key in requests}


def facts_key(request: tuple, builder: list) -> str:
    """What a request's facts depend on: its settings and sizes, and the ``builder`` (``builder_key``)."""
    return hashlib.sha256(json.dumps([*request, *builder], sort_keys=True).encode()).hexdigest()


def builder_key() -> list[str]:
    """What builds every backbone: timm's and torch's versions and sslbench.backbones' code."""
    from sslbench.provenance import module_file, sha256_file

    return [version("timm"), version("torch"), sha256_file(module_file("sslbench.backbones"))]


def run_sizes(plan, dataset: str, run: dict) -> tuple[list[int], list[int]] | None:
    """(the crop sizes the run trains on, the image sizes its features are read at), or None where its
    dataset's size is only known once loaded (`image_size: null`)."""
    from sslbench.augment.views import view_groups

    image_size = run["dataset"].get("image_size")
    if image_size is None:
        return None
    train = []  # a released run trains nothing; the others' views were judged by plan_runs (check_views)
    if "released" not in run:
        train = sorted({group.size for group in view_groups(run["augment"] or {}, image_size, 1)})
    targets = {t for (p, _), labels in plan.targets.items() if p == dataset for t in labels}
    sizes = {plan.datasets[t].get("image_size") for t in targets} | {image_size}
    return train, sorted(s for s in sizes if s is not None)


def check_backbones(
    plan,
    config: dict,
    methods_dir: str | Path,
    sources=(),
    facts_file: str | Path | None = FACTS_FILE,
) -> None:
    """Every run's backbone against the sizes it is given, the features it is read as and the method
    settings that need a kind of backbone (``bn_splits``): the first problem is a ConfigError naming
    the run, the key, the file that set it and the fix."""
    requests, of_run, builder = {}, {}, builder_key()
    for (dataset, label), run in sorted(plan.runs.items()):
        section = run["backbone"]
        sizes = run_sizes(plan, dataset, run)
        if section["name"] in NOT_TIMM_BACKBONES or sizes is None:
            continue
        request = (section, run["dataset"]["image_size"], *sizes)
        key = facts_key(request, builder)
        requests[key], of_run[dataset, label] = request, key
    facts = checked_facts(requests, facts_file)
    processes = pretrain_processes(config)
    for (dataset, label), key in of_run.items():
        run = plan.runs[dataset, label]
        problem = backbone_problem(facts[key], run, processes)
        if problem:
            what, setting = problem
            where = key_source(run, setting, config, methods_dir, sources)
            raise ConfigError(f"{label} on {dataset}: {what} (config key `{dotted(setting)}`{where})")


def backbone_problem(facts: dict, run: dict, processes: int) -> tuple[str, list[str]] | None:
    """(what is wrong, the setting to fix) of one run with its backbone's ``facts``, or None."""
    section = run["backbone"]
    if facts["build"]:
        named = re.search(r"backbone\.(\w+)", facts["build"])  # the key its message names
        return facts["build"], ["backbone", named.group(1) if named else "args"]
    for size, problem in facts["train"].items():
        if problem:
            return (
                f"its backbone refuses the {size}-px crops of its views ({problem}); give it arguments "
                f"that take every crop size it trains on ({', '.join(facts['train'])} px), or other crops",
                ["backbone", "args"] if section.get("args") else ["augment"],
            )
    for size, problem in facts["eval"].items():
        if problem:
            return (
                f"its features cannot be read from {size}-px images ({problem}); its features are read at "
                f"every evaluation target's image size ({', '.join(facts['eval'])} px)",
                ["backbone", "args"] if section.get("args") else ["backbone", "features"],
            )
    if "released" not in run and "bn_splits" in run["params"]:
        per_process = run["train"]["batch_size"] // processes
        problem = split_batch_norm_problem(run["params"]["bn_splits"], per_process, facts["batchnorm2d"])
        if problem:
            return problem, ["bn_splits"]
    return None


def key_source(run: dict, path: list[str], config: dict, methods_dir: str | Path, sources) -> str:
    """' (set in ...)': the last of the layers of a run's settings that sets ``path`` (a backbone,
    train or method key): its variant, method_overrides, the method's config.yaml, else the suite's
    settings (``sources``)."""
    method = run["method_base"]

    def has(node) -> bool:
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    if has(run.get("variant") or {}):
        return f" (set in the variant {run['method']})"
    overrides = ["method_overrides", method]
    if has((config.get("method_overrides") or {}).get(method) or {}):
        return set_in(overrides + path, sources) or " (set in method_overrides)"
    method_file = Path(methods_dir) / method / "config.yaml"
    if method_file.is_file() and has(load_yaml(method_file)):
        return f" (set in {method_file})"
    section = path if path[0] in ("backbone", "train") else None
    return set_in(section, sources) if section else ""
