"""What the Snakefile asks of sslbench beyond the plan: checks before the first job (``preflight``,
``method_problems``, ``leave_out_broken_methods``), the code digest that decides reruns
(``code_param``) and what each job asks of the scheduler (``job_requests``)."""

from __future__ import annotations

import ast
import atexit
import difflib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from sslbench.errors import ConfigError
from sslbench.plan.checks import load_yaml
from sslbench.plan.paper import paper_entries
from sslbench.plan.paths import CODE_RECORD_FILES
from sslbench.plan.runs import Plan, list_method_folders
from sslbench.plan.settings import METHOD_SECTIONS, missing_config


class JobRequest(NamedTuple):
    """What each job of a rule asks of the scheduler: its ``threads`` and its snakemake ``resources``;
    ``gpus``: the GPUs of each node it runs on."""

    threads: int
    resources: dict  # gpu, mem_mb, runtime (minutes): the names the SLURM plugin turns into sbatch options
    gpus: int


def job_requests(sections: Mapping[str, Mapping]) -> dict[str, JobRequest]:
    """{rule: its JobRequest} from the config's `resources` section ({rule: {threads, gpus, mem_mb,
    runtime, nodes}}), each key left out taking its default.

    A job on several nodes is, for the SLURM plugin, an "MPI" job of one task per node: it gets
    ``--nodes``, ``--ntasks`` and the GPUs of each node as ``--gres=gpu:<gpus>`` (``--gpus`` would count
    the whole job's), and its own command starts the tasks with srun (``sslbench.launch``)."""
    requests = {}
    for rule, spec in sections.items():
        gpu, mem_mb, runtime = spec.get("gpus", 0), spec.get("mem_mb", 4000), spec.get("runtime", 30)
        resources = dict(gpu=gpu, mem_mb=mem_mb, runtime=runtime)
        nodes = spec.get("nodes", 1)
        if nodes > 1:
            # tasks_per_gpu 0: the plugin would otherwise turn `tasks` into --ntasks-per-gpu
            resources.update(gpu=0, nodes=nodes, tasks=nodes, mpi="srun", tasks_per_gpu=0)
            if gpu:
                resources["gres"] = f"gpu:{gpu}"
        requests[rule] = JobRequest(spec.get("threads", 1), resources, gpu)
    return requests


def preflight(config: dict, plan: Plan) -> None:
    """Checks that need the data: run once before the first job, not at every plan (the backbones are
    the plan's: ``sslbench.plan.backbones``). Every dataset the plan uses must be there and load (one
    whose spec says ``preflight_load=False`` is only looked for: reading an ImageNet-size folder is its
    first job's work)."""
    from sslbench.data.files import DatasetError
    from sslbench.data.registry import DATASETS, load_data, missing_files

    used = {run["dataset"]["label"] for run in plan.runs.values()}
    used |= {t for targets in plan.targets.values() for t in targets}
    for label in sorted(used):
        section = plan.datasets[label]
        try:
            why = missing_files(section)
            if why:
                raise DatasetError(why)
            spec = DATASETS.get(section["name"])
            if spec is None or spec.preflight_load:  # an unknown name: loading says so
                load_data({"dataset": section})
        except DatasetError as err:
            raise ConfigError(f"config key `datasets.{label}`: {err}") from err


def code_param(
    stage: str,
    wildcards: Mapping[str, str],
    rerun_on_code_change: bool,
    method_dir: str | Path | None = None,
    protocol: str | None = None,
) -> str:
    """The `code` param of a job of ``stage`` with ``wildcards``: a digest of the files the job runs
    (``provenance.code_record``). With ``rerun_on_code_change`` it is their digest now, so that
    snakemake reruns a job when one changes; without, the digest the job recorded, so that a code
    change reruns nothing (and turning the switch on reruns only the jobs whose code changed).

    It takes the wildcards, never the job's output: snakemake tracks no param of a function that
    takes `input` or `output` (it counts it as derived from the files)."""
    from sslbench.provenance import code_digest, code_record

    if not rerun_on_code_change:
        recorded = recorded_code(stage, CODE_RECORD_FILES[stage].format(**wildcards))
        if recorded is not None:
            return code_digest(recorded)
    return code_digest(code_record(stage, method_dir, protocol))


def record_collected(path: str | Path, result_files: list[str]) -> None:
    """The result files the table is collected from, one per line, rewritten only when the list
    changes. It is an input of collect: Snakemake reruns a job whose input set changed only from its
    own records in .snakemake/, which results/ copied from another checkout lacks, so a method added
    there would never be collected; this file's date moves exactly when the list does."""
    from sslbench.atomic import write_text

    text = "".join(f"{p}\n" for p in sorted(result_files))
    path = Path(path)
    if not path.is_file() or path.read_text() != text:
        write_text(path, text)


def recorded_code(stage: str, output: str | Path) -> dict | None:
    """The code record a finished job wrote (run.json, a features file, a result), if it did."""
    from sslbench.errors import UnreadableFileError
    from sslbench.extract.featurefile import load_meta

    if not Path(output).is_file():
        return None
    try:
        if stage == "extract":
            return load_meta(output).get("code_extract")
        if stage == "prepare":  # the same .npz-with-meta layout as a features file
            return load_meta(output).get("code")
        record = json.loads(Path(output).read_text())
        return (record["meta"] if stage in ("pretrain", "import") else record).get("code")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UnreadableFileError):
        return None  # an unreadable output is rebuilt anyway


def method_problems(
    methods_dir: str | Path, names: list[str] | None = None, checked: str | Path | None = None
) -> dict[str, str]:
    """{method: what is wrong} for method folders that cannot run, checked before any training.

    Looks at every folder under methods/ (or just ``names``): a missing method.py or config.yaml, a
    config.yaml that does not parse, a paper.yaml with missing fields, a method.py that fails to import,
    has no Method subclass or lacks a required hook, and a setting method.py reads that config.yaml
    does not set (``unset_settings``). Every problem of a folder is said, each naming its file.

    ``checked``: a JSON file of the folders found sound before, each by the digest of what the check
    reads (the folder's files, every project module they import, its paper.yaml). A folder whose
    digest is there is not imported again, so that planning an unchanged DAG needs no torch; any edit
    changes the digest and the folder is checked again. Only sound folders are remembered.
    """
    from sslbench import atomic
    from sslbench.provenance import code_digest, code_record, sha256_file

    def digest_of(folder: Path) -> str | None:  # None: nothing to remember, check the folder
        if not (folder / "method.py").is_file():
            return None
        try:
            read = code_record("pretrain", folder)
        except SyntaxError:  # the plugin loader names it
            return None
        paper = folder / "paper.yaml"
        return code_digest(read | ({"paper.yaml": sha256_file(paper)} if paper.is_file() else {}))

    root = Path(methods_dir)
    path = Path(checked) if checked is not None else None
    try:
        sound = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except ValueError:  # a damaged file: check everything again and rewrite it
        sound = {}
    remembered = dict(sound)
    problems = {}
    for name in names if names is not None else list_method_folders(root):
        folder = root / name
        digest = digest_of(folder)
        if digest is not None and sound.get(name) == digest:
            continue
        remembered.pop(name, None)
        found = folder_problems(folder)
        if found:
            problems[name] = " ".join(found)
        else:
            remembered[name] = digest
    if path is not None and remembered != sound:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps(remembered, indent=1, sort_keys=True))
    return problems


def folder_problems(folder: Path) -> list[str]:
    """What is wrong with one method folder (``method_problems``), each naming its file."""
    from sslbench.plugins import PluginError, load_method_class  # imports torch: only when checking

    found, own = [], None
    try:
        if not (folder / "config.yaml").is_file():
            raise ConfigError(missing_config(folder))
        own = load_yaml(folder / "config.yaml")
    except ConfigError as err:
        found.append(str(err))
    try:
        if (folder / "paper.yaml").exists():
            paper_entries(folder / "paper.yaml")
    except ConfigError as err:
        found.append(str(err))
    try:
        load_method_class(folder)
        if own is not None:  # what method.py reads, once it loads and config.yaml does
            unset_settings(folder, own)
    except (ConfigError, PluginError) as err:
        found.append(str(err))
    return found


# A setting method.py reads that config.yaml does not set is a KeyError in the job. Requiring a
# schema.yaml in every folder would not catch it: a newcomer's schema.yaml names the settings of the
# config.yaml beside it (copied from it, typo included), never the names method.py reads, and folders
# without settings (random, pixels) need none. What a newcomer expects is the name in method.py judged
# against config.yaml, with or without a schema.yaml: so the plan reads method.py's subscripts of its
# settings (its source, not run) and names each one config.yaml lacks.


def settings_read(source: str) -> dict[str, int]:
    """{setting: the line of its first read} of each setting a method.py reads by subscript from its
    settings: ``cfg["params"]["x"]``, or ``p["x"]`` in a function where ``p = cfg["params"]`` (a
    name bound to anything else there too is left alone; ``p.get("x", default)`` has a default)."""

    def settings(node) -> bool:  # <anything>["params"]
        return isinstance(node, ast.Subscript) and getattr(node.slice, "value", None) == "params"

    read: dict[str, int] = {}
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(function))
        bound = [
            t.id
            for n in nodes
            if isinstance(n, ast.Assign) and settings(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        ]
        stores = [n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        aliases = {name for name in bound if stores.count(name) == bound.count(name)}
        for node in nodes:
            key = getattr(node.slice, "value", None) if isinstance(node, ast.Subscript) else None
            if not isinstance(key, str) or not isinstance(node.ctx, ast.Load):
                continue
            if settings(node.value) or (isinstance(node.value, ast.Name) and node.value.id in aliases):
                read[key] = min(read.get(key, node.lineno), node.lineno)
    return read


def unset_settings(folder: Path, own: dict) -> None:
    """A ConfigError naming each setting ``folder``'s method.py reads (``settings_read``) that its
    config.yaml (``own``) does not set, with the line, the settings it does set and the fix."""
    path = folder / "method.py"
    known = sorted(k for k in own if k not in METHOD_SECTIONS)
    missing = {k: line for k, line in settings_read(path.read_text()).items() if k not in known}
    if not missing:
        return
    said = []
    for key, line in sorted(missing.items(), key=lambda item: item[1]):
        close = difflib.get_close_matches(key, known, n=1)
        said.append(
            f"{path}:{line} reads the setting {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
        )
    raise ConfigError(
        f"{'; '.join(said)}, which {folder / 'config.yaml'} does not set (its settings: {known}). Give "
        "each a value there (and its rule in schema.yaml), or fix the name in method.py."
    )


def broken_methods(failed: Mapping[str, str]) -> str:
    """The broken method folders, one line each with what is wrong."""
    return "\n".join(f"  methods/{m}: {why}" for m, why in sorted(failed.items()))


def leave_out_broken_methods(failed: Mapping[str, str], setting: str) -> None:
    """The plan's decision on the broken method folders ``failed`` ({method: what is wrong}, already left
    out of the plan), by the ``broken_methods`` setting: ``stop`` raises a ConfigError naming each and
    the fix; ``leave_out`` says which are left out now and again as the run's (or dry run's) last line,
    at exit, after Snakemake's own output."""
    if not failed:
        return
    if setting != "leave_out":
        raise ConfigError(
            f"broken method folder(s):\n{broken_methods(failed)}\nFix them, or plan and run the other "
            "methods without them: --config broken_methods=leave_out (results/failures.csv will name these)."
        )
    names = ", ".join(f"methods/{m}" for m in sorted(failed))
    print(
        f"sslbench: broken method folder(s), left out (broken_methods: leave_out):\n{broken_methods(failed)}",
        file=sys.stderr,
    )
    atexit.register(
        print,
        f"sslbench: left out (broken_methods: leave_out), broken: {names}; the problems are listed above. "
        "Fix them and rerun to plan them.",
        file=sys.stderr,
    )
