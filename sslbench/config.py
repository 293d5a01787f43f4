"""Configuration: the one loader of the suite's settings, method discovery and the resolved
settings of each run.

The suite's settings (``load_config``): config/default.yaml, then each preset in order, then
snakemake's ``--config`` overrides, each merged over the last. What the DAG runs (``plan_runs``):
the runs, keyed by (pretraining dataset, method label), each protocol's evaluation targets and the
datasets they load. The settings of one run, lowest precedence first: the suite's ``train``
settings, the method's own ``methods/<name>/config.yaml``, ``method_overrides.<name>``, then a
variant's settings (``variants``, ``sweeps``). The resolved settings of a run are stored in every
checkpoint and result, so a number never loses the settings that produced it. The Snakefile, the
CLI, the report's statistics and the tests all read settings through these functions.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from .errors import ConfigError, SslbenchError  # noqa: F401  (ConfigError is this module's to raise)

# Keys a method's config.yaml may use besides its own hyperparameters.
METHOD_SECTIONS = ("train", "augment", "backbone")
DEFAULT_FILE = "default.yaml"  # in the config folder; presets are merged over it
SCHEMA_FILE = "schema.yaml"
COMMAND_LINE = "snakemake's --config"  # where a setting given on the command line was set
NOT_TIMM_BACKBONES = ("pixels",)  # sslbench.backbones builds these itself
# What a method's `backbone:` may add to the suite's backbone keys (sslbench.backbones).
METHOD_BACKBONE_KEYS = ("input_filter",)
# The protocols whose code takes multi-label targets ([N, classes] in the VOC devkit's codes);
# tests/test_transfer.py checks this against what each protocol does with such features.
MULTILABEL_PROTOCOLS = ("lowshot_svm",)
# Protocols whose side file also holds maps that only the report's figures use (clustering's t-SNE),
# which it draws for each run's first seed: the other seeds skip them (see maps_argument).
MAP_PROTOCOLS = ("clustering",)


def load_config(
    config_dir: str | Path,
    presets: Iterable[str | Path] = (),
    overrides: Mapping | None = None,
    validate: bool = True,
) -> dict:
    """The suite's settings: ``config_dir/default.yaml``, each preset in order, then ``overrides``
    (snakemake's ``--config``), each merged over the last by ``deep_merge`` (snakemake's own rule
    for ``--configfile`` and ``--config``). Checked against ``config_dir/schema.yaml`` unless
    ``validate`` is false; an error names the key and the file (or --config) that set it."""
    sources = config_sources(config_dir, presets, overrides)
    merged: dict = {}
    for _, settings in sources:
        merged = deep_merge(merged, settings)
    if validate:
        validate_config(merged, Path(config_dir) / SCHEMA_FILE, sources)
    return merged


def config_sources(
    config_dir: str | Path, presets: Iterable[str | Path] = (), overrides: Mapping | None = None
) -> list[tuple[str, dict]]:
    """(file or COMMAND_LINE, its settings) of each source of the settings, in merge order: what an
    error reads to name where a key was set (``plan_runs`` takes them for the same reason)."""
    sources = [(str(f), load_yaml(f)) for f in (Path(config_dir) / DEFAULT_FILE, *map(Path, presets))]
    return sources + [(COMMAND_LINE, dict(overrides or {}))]


def dataset_label(cfg: dict) -> str:
    """The name results and tables use for a run's pretraining dataset (its key under ``datasets``).
    ``cfg`` is a run's resolved settings, whose ``dataset`` section carries its label."""
    return cfg["dataset"].get("label") or cfg["dataset"]["name"]


# Where the DAG's files are, relative to the working directory ({method} is the label's slug).
RESULTS_DIR = "results"
RUN_DIR = RESULTS_DIR + "/{pretrain}/{method}/seed{seed}"
FEATURES_FILE = RUN_DIR + "/features/{target}.npz"
RESULT_FILE = RUN_DIR + "/eval/{target}/{protocol}.json"
# An in-memory dataset section loaded once (`sslbench prepare`) for every job that reads its images.
PREPARED_FILE = RESULTS_DIR + "/prepared/{dataset}.npz"
PRETRAIN_TARGET = "pretrain"  # in `targets`: each run's own pretraining dataset
PROTOCOL_PACKAGE = "evaluation"  # evaluation/<protocol>.py
MAX_SLUG_LENGTH = 120


@dataclass
class Plan:
    """What a configuration asks the DAG for, resolved and checked before any job runs."""

    runs: dict[tuple[str, str], dict]  # (pretrain dataset, method label): the run's resolved settings
    slugs: dict[str, str]  # method label: its folder name under results/{pretrain}/
    targets: dict[tuple[str, str], list[str]]  # (pretrain dataset, protocol): evaluation targets
    datasets: dict[str, dict]  # label: the dataset section a job loads (label included)
    skipped: dict[str, str] = field(default_factory=dict)  # optional dataset: why it is left out
    warnings: list[str] = field(default_factory=list)  # settings that do nothing in this plan
    # label: its PREPARED_FILE, for each dataset the plan loads that is held in memory
    prepared: dict[str, str] = field(default_factory=dict)

    def result_files(self, seeds: Iterable[int]) -> list[str]:
        """Every result JSON the plan asks for."""
        return [
            RESULT_FILE.format(pretrain=p, method=self.slugs[m], seed=s, target=t, protocol=protocol)
            for (p, m) in self.runs
            for s in seeds
            for (p2, protocol), targets in self.targets.items()
            if p2 == p
            for t in targets
        ]


def resolve_runs(
    config: dict, methods_dir: str | Path, methods: Iterable[str]
) -> dict[tuple[str, str], dict]:
    """{(pretraining dataset, method label): resolved settings} of every run the suite trains."""
    return plan_runs(config, methods_dir, methods, check_files=False).runs


def plan_runs(
    config: dict,
    methods_dir: str | Path,
    methods: Iterable[str],
    check_files: bool = True,
    sources: Sequence[tuple[str, dict]] = (),
) -> Plan:
    """The runs, their evaluation targets and the datasets they need.

    A run is (pretraining dataset, method label, seed); its settings are resolved by
    ``resolve_method_config``, then a variant's settings (``variants``, ``sweeps``) on top. With
    ``check_files``, an ``optional`` dataset whose files are absent is left out (``Plan.skipped`` says
    why and how to get it); a required one is checked by ``preflight`` before the first job. Every
    value a run takes is checked here (``check_method_values``, ``check_subsets``); ``sources``
    (``config_sources``) let an error name the file that set the key.
    """
    from .datafiles import LAZY_DATASETS, missing_files

    methods = list(methods)
    datasets = {label: dict(section, label=label) for label, section in config["datasets"].items()}
    named = set(config["pretrain"]) | {
        name
        for protocol in config["protocols"]
        for name in (config["evaluation"].get(protocol) or {}).get(
            "targets", config["evaluation"].get("targets", [])
        )
    }
    skipped = {}
    for label in sorted(named & set(datasets)) if check_files else []:
        why = missing_files(datasets[label]) if datasets[label].get("optional") else None
        if why:
            skipped[label] = why
    pretrain = [p for p in config["pretrain"] if p not in skipped]
    unknown = [p for p in pretrain if p not in datasets]
    if unknown:
        raise ConfigError(
            f"config key `pretrain`: unknown dataset(s) {unknown}; the datasets registered under "
            f"`datasets` are {sorted(datasets)}. Register it there or fix the name."
        )
    if not pretrain:  # a run that can do nothing is no success
        why = "\n".join(f"  {label}: {skipped[label]}" for label in config["pretrain"])
        raise ConfigError(
            f"config key `pretrain`{_where(['pretrain'], sources)}: every pretraining dataset is `optional` "
            f"and absent, so nothing can run:\n{why}\nGet the files, or pretrain on a dataset that is there."
        )
    warnings = check_method_sections(config, methods_dir, methods, sources)
    targets = {
        (p, protocol): protocol_targets(config, protocol, p, datasets, skipped)
        for p in pretrain
        for protocol in config["protocols"]
    }
    used = set(pretrain) | {t for labels in targets.values() for t in labels}
    check_subsets({label: datasets[label] for label in sorted(used)}, sources)
    runs, slugs = {}, {}
    for method in methods:
        check_method_values(config, methods_dir, method, sources)
        for label, variant in method_variants(config, methods_dir, method, sources).items():
            slugs[label] = method_slug(label)
            for p in pretrain:
                runs[p, label] = {
                    **resolve_method_config(config, methods_dir, method, variant, p),
                    "method": label,
                }
    check_slugs(slugs)
    plan_datasets = {k: without_plan_keys(v) for k, v in datasets.items()}
    prepared = {
        label: PREPARED_FILE.format(dataset=label)
        for label in sorted(used)
        if datasets[label]["name"] not in LAZY_DATASETS
    }
    return Plan(runs, slugs, targets, plan_datasets, skipped, warnings, prepared)


def check_method_sections(
    config: dict, methods_dir: str | Path, methods: list[str], sources: list[tuple[str, dict]]
) -> list[str]:
    """`method_overrides`, `variants` and `sweeps` name method folders: an unknown one is an error; one
    that this plan does not train is a warning (returned), since its settings then do nothing."""
    warnings = []
    for key in ("method_overrides", "variants", "sweeps"):
        named = list(config.get(key) or {})
        unknown = [m for m in named if not (Path(methods_dir) / m).is_dir()]
        if unknown:
            raise ConfigError(
                f"config key `{key}`{_where([key, unknown[0]], sources)}: unknown method(s) {unknown}; the "
                f"method folders under {methods_dir} are {list_method_folders(methods_dir)}. Fix the name "
                "or remove the entry."
            )
        warnings += [
            f"config key `{key}.{m}`{_where([key, m], sources)}: {m} is not among the methods this run "
            f"plans ({methods}), so these settings do nothing; add it to `methods` or remove them"
            for m in named
            if m not in methods
        ]
    return warnings


def check_subsets(datasets: dict[str, dict], sources: list[tuple[str, dict]]) -> None:
    """A dataset's `subset` fits its splits, where their sizes are known before loading
    (``datafiles.split_sizes``; the others are checked when the dataset is loaded)."""
    from .datafiles import MULTILABEL_DATASETS, split_sizes, subset_too_large

    for label, section in datasets.items():
        subset = section.get("subset") or {}
        if not subset:
            continue
        key = ["datasets", label, "subset"]
        if section["name"] in MULTILABEL_DATASETS:
            raise ConfigError(
                f"config key `{_dotted(key)}`{_where(key, sources)}: {label} ({section['name']}) is "
                "multi-label, and `subset` draws a fixed part of each class; remove it"
            )
        sizes = split_sizes(section)
        for split, size in subset.items():
            if sizes and size > sizes[split]:
                where = _where([*key, split], sources)
                raise ConfigError(
                    f"config key `{_dotted([*key, split])}`{where}: "
                    f"{subset_too_large(section['name'], split, size, sizes[split])}"
                )


def without_plan_keys(section: dict) -> dict:
    """A dataset section as a job loads it: `optional` only matters to planning."""
    return {k: copy.deepcopy(v) for k, v in section.items() if k != "optional"}


def protocol_targets(config: dict, protocol: str, pretrain: str, datasets: dict, skipped: dict) -> list[str]:
    """The evaluation targets of one protocol for runs pretrained on ``pretrain``: its own `targets`,
    else `evaluation.targets`; `pretrain` stands for the run's own dataset."""
    from .datafiles import MULTILABEL_DATASETS

    section = config["evaluation"].get(protocol, {}) or {}
    key = f"evaluation.{protocol}.targets" if "targets" in section else "evaluation.targets"
    names = section.get("targets", config["evaluation"].get("targets", [PRETRAIN_TARGET]))
    out = []
    for name in names:
        label = pretrain if name == PRETRAIN_TARGET else name
        if label not in datasets:
            raise ConfigError(
                f"config key `{key}`: unknown target {name!r}; a target is `{PRETRAIN_TARGET}` (each run's "
                f"own dataset) or a dataset registered under `datasets`: {sorted(datasets)}. Register it "
                "or fix the name."
            )
        if label in skipped or label in out:
            continue
        if datasets[label]["name"] in MULTILABEL_DATASETS and protocol not in MULTILABEL_PROTOCOLS:
            raise ConfigError(
                f"config key `{key}`: target {label} ({datasets[label]['name']}) is multi-label, and "
                f"{protocol} needs one class per image; only {list(MULTILABEL_PROTOCOLS)} take(s) "
                f"multi-label targets. Remove {label} from `{key}` (set `evaluation.{protocol}.targets` "
                "if it comes from `evaluation.targets`)."
            )
        out.append(label)
    return out


# Besides the DEFAULTS, what the planner reads of a protocol module: READS_IMAGES, True where its jobs
# load their target's images (not only the cached features), or the list of the modes that do.
PLANNING_LITERALS = ("READS_IMAGES",)


def protocol_defaults(protocol: str) -> dict[str, dict]:
    """{name: value} of the module-level ``DEFAULTS`` (and ``<MODE>_DEFAULTS``, a mode's own, with its
    `mode`) of evaluation/<protocol>.py, read from its source: sslbench loads a protocol only by name
    to run it, and several import torch, which planning never does. The protocol's own code keeps the
    one definition, so each must be a literal."""
    return {k: v for k, v in protocol_literals(protocol).items() if k not in PLANNING_LITERALS}


def protocol_literals(protocol: str) -> dict:
    """The DEFAULTS and PLANNING_LITERALS of evaluation/<protocol>.py, read from its source."""
    from .provenance import module_file

    path = module_file(f"{PROTOCOL_PACKAGE}.{protocol}")
    return copy.deepcopy(module_literals(str(path), path.read_text()))


def protocol_reads_images(protocol: str, settings: dict) -> bool:
    """Whether a protocol's job with these settings loads its target's images (semisup, linear in
    mode "paper"), and so reads the target's prepared file, rather than the cached features alone."""
    literals = protocol_literals(protocol)
    reads = literals.get("READS_IMAGES", False)
    if isinstance(reads, bool):
        return reads
    return (settings or {}).get("mode", literals["DEFAULTS"].get("mode")) in reads


@cache
def module_literals(path: str, text: str) -> dict:
    import ast

    found = {}
    for node in ast.parse(text, path).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        name = getattr(target, "id", "")
        if name == "DEFAULTS" or name.endswith("_DEFAULTS") or name in PLANNING_LITERALS:
            try:
                found[name] = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(
                    f"{path}: {name} must be a literal (planning reads it unimported)"
                ) from None
    return found


def protocol_problems(protocol: str, section: dict, sources: list[tuple[str, dict]]) -> list[str]:
    """What is wrong with `evaluation.<protocol>`: a key its DEFAULTS lack, a value of another type
    than its default's. A protocol with modes (linear's `mode: paper`, PAPER_DEFAULTS) takes a mode's
    own keys, besides the default mode's (which that mode ignores)."""
    literals = protocol_defaults(protocol)
    defaults = literals["DEFAULTS"]
    modes = {d["mode"]: d for d in literals.values() if "mode" in d}
    mode = section.get("mode", defaults.get("mode"))
    own = modes.get(mode, {}) if isinstance(mode, str) else {}
    rules = {**defaults, **own, "targets": None}  # targets: the DAG's, checked by the schema
    problems = []
    for key, value in section.items():
        path = ["evaluation", protocol, key]
        if key not in rules:
            problems.append(
                f"unknown key `{_dotted(path)}`{_where(path, sources)}; known keys here: {sorted(rules)} "
                f"(evaluation/{protocol}.py's DEFAULTS). Fix the spelling or remove it."
            )
            continue
        schema = {"enum": sorted(modes)} if key == "mode" and modes else type_schema(rules[key])
        for err in schema_validator(schema).iter_errors(value):
            problems.append(
                f"config key `{_dotted(path + list(err.absolute_path))}`{_where(path, sources)}: "
                f"{err.message} (its default in evaluation/{protocol}.py: {rules[key]!r})"
            )
    return problems


def protocol_settings(config: dict, protocol: str) -> dict:
    """A protocol's settings as the protocol takes them (`targets` is the DAG's, not the protocol's)."""
    section = config["evaluation"].get(protocol, {}) or {}
    return {k: copy.deepcopy(v) for k, v in section.items() if k != "targets"}


def maps_argument(protocol: str, seed: int | str, seeds: list[int]) -> str:
    """`sslbench evaluate`'s ``--no-maps`` where the report will not draw the job's maps."""
    return "--no-maps" if protocol in MAP_PROTOCOLS and int(seed) != min(seeds) else ""


# --------------------------------------------------------------------------- method variants


def method_variants(
    config: dict, methods_dir: str | Path, method: str, sources: Sequence[tuple[str, dict]] = ()
) -> dict[str, dict]:
    """{label: the variant's settings} of one method folder: the base (``{}``, labelled by the folder
    name), each entry of ``variants.<method>`` and one per value of ``sweeps.<method>``.

    A sweep value that resolves to the base's settings is the base run itself. Two explicit variants
    (or one and the base) with the same settings, a sweep over a key the method lacks, a value of the
    wrong type or out of its range (``check_method_values``), or an empty list of values are errors
    naming the key.
    """
    explicit = (config.get("variants") or {}).get(method) or []
    sweeps = (config.get("sweeps") or {}).get(method) or {}
    base = resolve_method_config(config, methods_dir, method)
    seen = {settings_key(base): method}
    out = {method: {}}
    for i, entry in enumerate(explicit):
        where = f"variants.{method}[{i}]"
        settings = {k: v for k, v in entry.items() if k != "name"}
        if not settings:
            raise ConfigError(f"config key `{where}`: a variant needs at least one setting besides `name`")
        label = f"{method}[{entry['name']}]" if "name" in entry else variant_label(method, settings)
        source = ["variants", method, i]
        set_at = lambda path, source=source, where=where: (
            f"config key `{where}.{_dotted(path)}`{_where(source + path, sources)}"
        )
        add_variant(config, methods_dir, method, label, settings, where, set_at, seen, out, False)
    for key, values in sweeps.items():
        where = f"sweeps.{method}.{key}"
        if not values:
            raise ConfigError(f"config key `{where}`: an empty list of values; give at least one value")
        named = f"config key `{where}`{_where(['sweeps', method, key], sources)}"
        for value in values:
            settings = nest({key: value})
            label = variant_label(method, settings)
            set_at = lambda path, named=named: named
            add_variant(config, methods_dir, method, label, settings, where, set_at, seen, out, True)
    return out


def add_variant(
    config, methods_dir, method, label, settings, where, set_at, seen, out, same_as_base_ok
) -> None:
    check_layer(settings, Path(methods_dir) / method, set_at)
    try:
        resolved = resolve_method_config(config, methods_dir, method, settings)
    except ConfigError as err:
        raise ConfigError(f"config key `{where}`: {err}") from None
    key = settings_key(resolved)
    if key in seen:
        if same_as_base_ok and seen[key] == method:
            return  # the base run already has this value
        raise ConfigError(
            f"config key `{where}`: {label} resolves to the same settings as {seen[key]}; remove one "
            "(each run of the DAG must differ in its settings)"
        )
    if label in out:
        raise ConfigError(f"config key `{where}`: two variants are labelled {label}; give them other names")
    seen[key] = label
    out[label] = settings


def settings_key(resolved: dict) -> str:
    return json.dumps({k: v for k, v in resolved.items() if k not in ("method", "variant")}, sort_keys=True)


def nest(flat: dict) -> dict:
    """{"train.lr": 0.1} -> {"train": {"lr": 0.1}}: a sweep's key may name a setting of a section."""
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = str(key).split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def flatten(settings: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 0.1}} -> {"train.lr": 0.1}."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def variant_label(method: str, settings: dict) -> str:
    """``moco[momentum=0.9,queue_size=256]``: the overridden settings, sorted, dotted into sections."""

    def text(value) -> str:
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    return f"{method}[{','.join(f'{k}={text(v)}' for k, v in sorted(flatten(settings).items()))}]"


def method_slug(label: str) -> str:
    """A method label as a path component: ``moco[queue_size=256]`` -> ``moco@queue_size=256``.

    No glob or wildcard metacharacters (``Path.glob`` reads ``[`` as a character class, snakemake
    ``{`` as a wildcard), no spaces: pairs are joined by ``+``, anything else unsafe becomes ``-``.
    """
    base, _, inner = label.partition("[")
    if not inner:
        return base
    return base + "@" + re.sub(r"[^A-Za-z0-9._=+-]", "-", inner.removesuffix("]").replace(",", "+"))


def check_slugs(slugs: dict[str, str]) -> None:
    by_slug: dict[str, list[str]] = {}
    for label, slug in slugs.items():
        by_slug.setdefault(slug, []).append(label)
        if len(slug) > MAX_SLUG_LENGTH:
            raise ConfigError(
                f"config key `variants`/`sweeps`: {label} is too long for a folder name ({len(slug)} "
                f"characters, at most {MAX_SLUG_LENGTH}); give the variant a `name`"
            )
    clashes = [labels for labels in by_slug.values() if len(labels) > 1]
    if clashes:
        raise ConfigError(
            f"config key `variants`: {clashes[0]} would share the folder {method_slug(clashes[0][0])}; give "
            "one of them a `name`"
        )


def discover_methods(methods_dir: str | Path) -> list[str]:
    """Every folder under methods/ with a method.py; names starting with _ or . are skipped."""
    return [
        name
        for name in list_method_folders(methods_dir)
        if (Path(methods_dir) / name / "method.py").is_file()
    ]


def list_method_folders(methods_dir: str | Path) -> list[str]:
    """Folders that look like methods, with or without method.py (to report broken ones)."""
    root = Path(methods_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def validate_config(config: dict, schema_path: str | Path, sources: list[tuple[str, dict]]) -> None:
    """Check the merged config against config/schema.yaml; one error per problem, naming the key,
    where it was set (``sources``: (file or COMMAND_LINE, its settings), in merge order), what was
    expected, and the known values where there is a list. A protocol's settings are checked against
    its module's DEFAULTS (``protocol_problems``)."""
    if "dataset" in config:  # the one-dataset key of earlier versions
        raise ConfigError(
            f"config key `dataset`{_where(['dataset'], sources)}: datasets are now registered by label "
            "under `datasets:` ({<label>: {name: ..., image_size: ...}}) and the ones to train on listed in "
            "`pretrain: [<label>]` (see config/default.yaml); evaluation targets are `evaluation.targets`."
        )
    schema = load_yaml(schema_path)
    validator = schema_validator(schema)
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        path = list(err.absolute_path)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            for key in extra:
                key_path = path + [key]
                known = sorted(err.schema.get("properties", {}))
                problems.append(
                    f"unknown key `{_dotted(key_path)}`{_where(key_path, sources)}; "
                    f"known keys here: {known}. Fix the spelling or remove it."
                )
            continue
        where = _where(path, sources)
        hint = ""
        if (
            _source(path, sources) == COMMAND_LINE
            and err.validator == "type"
            and isinstance(err.instance, str)
        ):
            hint = (
                " (--config reads every value inside a list or mapping as a string: put it in a --configfile)"
            )
        problems.append(f"config key `{_dotted(path)}`{where}: {err.message}{hint}")
    if not problems:  # the schema says which protocols there are
        for protocol, section in (config.get("evaluation") or {}).items():
            if protocol != "targets" and isinstance(section, dict):
                problems += protocol_problems(protocol, section, sources)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _dotted(path: list) -> str:
    return ".".join(map(str, path)) or "<top level>"


def _where(path: list, sources: list[tuple[str, dict]]) -> str:
    """' (set in a.yaml)': where the key was set (``_source``), or nothing where no source sets it."""
    found = _source(path, sources)
    return f" (set in {found})" if found else ""


def _source(path: list, sources: list[tuple[str, dict]]) -> str | None:
    """The last source (file or the command line) that sets this key, since later ones win."""
    found = None
    for name, node in sources:
        for part in path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                break
        else:
            found = name
    return found


def preflight(config: dict, plan: Plan) -> None:
    """Checks that need torch/timm or the data: run once before the first job, not at every plan.
    Every dataset the plan uses must be there (a folder dataset is only looked for: reading an
    ImageNet-size folder is its first job's work)."""
    import timm

    from .data import DatasetError, load_data
    from .datafiles import missing_files

    names = {run["backbone"]["name"] for run in plan.runs.values()} - set(NOT_TIMM_BACKBONES)
    for name in sorted(names):
        if name not in timm.list_models():
            raise ConfigError(
                f"config key `backbone.name`: {name!r} is not a timm model; similar names: "
                f"{timm.list_models(f'*{name}*')[:10] or 'none'} (see timm.list_models())"
            )
    used = {run["dataset"]["label"] for run in plan.runs.values()}
    used |= {t for targets in plan.targets.values() for t in targets}
    for label in sorted(used):
        section = plan.datasets[label]
        try:
            why = missing_files(section)
            if why:
                raise DatasetError(why)
            if section["name"] != "imagefolder":
                load_data({"dataset": section})
        except DatasetError as err:
            raise ConfigError(f"config key `datasets.{label}`: {err}") from err


# The file in which a job of each stage records the code it ran (provenance.code_record).
CODE_RECORD_FILES = {
    "prepare": PREPARED_FILE,
    "pretrain": RUN_DIR + "/run.json",
    "extract": FEATURES_FILE,
    "evaluate": RESULT_FILE,
}


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
    from .provenance import code_digest, code_record

    if not rerun_on_code_change:
        recorded = recorded_code(stage, CODE_RECORD_FILES[stage].format(**wildcards))
        if recorded is not None:
            return code_digest(recorded)
    return code_digest(code_record(stage, method_dir, protocol))


def recorded_code(stage: str, output: str | Path) -> dict | None:
    """The code record a finished job wrote (run.json, a features file, a result), if it did."""
    from .errors import UnreadableFileError
    from .featurefile import load_meta

    if not Path(output).is_file():
        return None
    try:
        if stage == "extract":
            return load_meta(output).get("code_extract")
        if stage == "prepare":  # the same .npz-with-meta layout as a features file
            return load_meta(output).get("code")
        record = json.loads(Path(output).read_text())
        return (record["meta"] if stage == "pretrain" else record).get("code")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UnreadableFileError):
        return None  # an unreadable output is rebuilt anyway


PAPER_FIELDS = (
    "pretrain_dataset",
    "eval_dataset",
    "backbone",
    "epochs",
    "protocol",
    "metric",
    "value",
    "source",
)


def paper_entries(path: str | Path) -> list[dict]:
    """The entries of a method's paper.yaml, each with every field of PAPER_FIELDS."""
    entries = load_yaml(path).get("results", []) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: `results` must be a list of {{{', '.join(PAPER_FIELDS)}}} entries")
    for i, entry in enumerate(entries):
        missing = [k for k in PAPER_FIELDS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise ConfigError(
                f"{path}: results[{i}] lacks {missing}; every entry needs {list(PAPER_FIELDS)} "
                "(see methods/_template/paper.yaml)"
            )
    return entries


def method_problems(
    methods_dir: str | Path, names: list[str] | None = None, checked: str | Path | None = None
) -> dict[str, str]:
    """{method: what is wrong} for method folders that cannot run, checked before any training.

    Looks at every folder under methods/ (or just ``names``): a missing method.py, a config.yaml
    that does not parse, a paper.yaml with missing fields, and a method.py that fails to import, has no
    Method subclass or lacks a required hook.

    ``checked``: a JSON file of the folders found sound before, each by the digest of what the check
    reads (the folder's files, every project module they import, its paper.yaml). A folder whose
    digest is there is not imported again, so that planning an unchanged DAG needs no torch; any edit
    changes the digest and the folder is checked again. Only sound folders are remembered.
    """
    from . import atomic
    from .provenance import code_digest, code_record, sha256_file

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
        from .plugins import PluginError, load_method_class  # imports torch: only when checking

        try:
            if (folder / "config.yaml").exists():
                load_yaml(folder / "config.yaml")
            if (folder / "paper.yaml").exists():
                paper_entries(folder / "paper.yaml")
            load_method_class(folder)
            remembered[name] = digest
        except (ConfigError, PluginError) as err:
            problems[name] = str(err)
    if path is not None and remembered != sound:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps(remembered, indent=1, sort_keys=True))
    return problems


def load_yaml(path: str | Path) -> dict:
    """A YAML file's mapping (a copy: the caller may change it). A plan reads each method's
    config.yaml several times: equal text is parsed once (by libyaml where it is installed)."""
    path = Path(path)
    return copy.deepcopy(parsed_yaml(str(path), path.read_text()))


@cache
def parsed_yaml(path: str, text: str) -> dict:
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}). Fix the syntax of this file.") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys to values at the top level, got {type(data).__name__}"
        )
    return data


def deep_merge(base: dict, override: dict) -> dict:
    """A new dict: ``override`` wins; nested mappings are merged, everything else replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def selected_methods(config: dict, methods_dir: str | Path) -> list[str]:
    """The methods a config asks for (``methods: all`` means every folder under methods/)."""
    found = discover_methods(methods_dir)
    wanted = config.get("methods", "all")
    if wanted == "all":
        return list_method_folders(methods_dir)  # folders without method.py are reported, not skipped
    unknown = [m for m in wanted if not (Path(methods_dir) / m).is_dir()]
    if unknown:
        raise ConfigError(
            f"config key `methods`: unknown method(s) {unknown}; known methods (folders under "
            f"{methods_dir} with a method.py): {found}"
        )
    return list(wanted)


def resolve_method_config(
    config: dict,
    methods_dir: str | Path,
    method: str,
    variant: dict | None = None,
    pretrain: str | None = None,
) -> dict:
    """The full settings of one method's training run on ``pretrain`` (default: the first of the
    config's `pretrain` datasets), with a variant's settings over the method's own."""
    folder = Path(methods_dir) / method
    method_file = folder / "config.yaml"
    own = load_yaml(method_file) if method_file.exists() else {}
    overrides = config.get("method_overrides", {}).get(method, {}) or {}
    check_method_keys(overrides, own, method, method_file, f"config key `method_overrides.{method}.")
    check_method_keys(variant or {}, own, method, method_file, "")
    merged = deep_merge(deep_merge(own, overrides), variant or {})
    train = deep_merge(config["train"], merged.pop("train", {}) or {})
    unknown_train = sorted(set(train) - set(config["train"]))
    if unknown_train:
        raise ConfigError(
            f"{method_file}: unknown key(s) {unknown_train} under `train`; known: {sorted(config['train'])}"
        )
    augment = merged.pop("augment", {}) or {}
    backbone = deep_merge(config["backbone"], merged.pop("backbone", {}) or {})
    unknown_backbone = sorted(set(backbone) - set(config["backbone"]) - set(METHOD_BACKBONE_KEYS))
    if unknown_backbone:
        raise ConfigError(
            f"{method_file} (or method_overrides.{method}.backbone): unknown key(s) {unknown_backbone} under "
            f"`backbone`; known: {sorted(set(config['backbone']) | set(METHOD_BACKBONE_KEYS))}"
        )
    label = pretrain or config["pretrain"][0]
    return {
        "method": method,
        "method_base": method,
        "variant": copy.deepcopy(variant or {}),
        "dataset": without_plan_keys({**config["datasets"][label], "label": label}),
        "backbone": backbone,
        "train": train,
        "augment": augment,
        "params": merged,
    }


def check_method_keys(settings: dict, own: dict, method: str, method_file: Path, where: str) -> None:
    """Every key of ``settings`` is one of the method's settings or a section it may override."""
    for key in settings:
        if key not in own and key not in METHOD_SECTIONS:
            named = f"{where}{key}`: " if where else ""
            raise ConfigError(
                f"{named}{method} has no setting {key!r}; its settings (in {method_file}) are "
                f"{sorted(own)} plus {list(METHOD_SECTIONS)}"
            )


# --------------------------------------------------------------------------- the values of settings
# One rule per setting, checked wherever it can be given, before any job: a training setting by
# config/schema.yaml's `train` section (in the suite's `train`, a method's config.yaml, its
# method_overrides, variants and sweeps alike); a method's own setting by the type of its value in
# the method's config.yaml, under what its schema.yaml declares (a range, the values it takes, another
# type); a protocol's by its module's DEFAULTS.
METHOD_SCHEMA_FILE = "schema.yaml"  # in a method folder
TYPE_KEYWORDS = ("type", "enum", "const")  # a declaration with one of these replaces the inferred type


def schema_validator(schema: dict):
    """A JSON-schema (draft 2020-12) validator whose integers are ints: 2.0 is no epoch count, and a
    bool is no number. One per schema: a plan checks the same few rules many times."""
    return compiled_validator(json.dumps(schema, sort_keys=True))


@cache
def compiled_validator(schema_json: str):
    return validator_class()(json.loads(schema_json))


@cache
def validator_class():
    import jsonschema

    base = jsonschema.Draft202012Validator
    strict = base.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=strict)


def type_schema(value) -> dict:
    """The JSON schema of a default's type: an int is an integer, a float any number, None anything;
    a list's items have the type of its elements where they share one, a mapping's keys their own."""
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        kinds = [type_schema(item) for item in value]
        if kinds and all(k == kinds[0] for k in kinds):
            return {"type": "array", "items": kinds[0]}
        if kinds and all(k.get("type") in ("integer", "number") for k in kinds):
            return {"type": "array", "items": {"type": "number"}}
        return {"type": "array"}
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: type_schema(v) for k, v in value.items()}}
    return {}


@cache
def suite_schema() -> dict:
    """config/schema.yaml of this checkout (what ``load_config`` validates the suite's settings with)."""
    from .provenance import REPO

    return load_yaml(REPO / "config" / SCHEMA_FILE)


def train_schema() -> dict:
    """The schema's `train` section as one layer of a run's settings gives it: any subset of its keys."""
    return {k: v for k, v in suite_schema()["properties"]["train"].items() if k != "required"}


def method_rules(folder: Path) -> dict[str, tuple[dict, str]]:
    """{setting: (its JSON schema, where the schema comes from)} of a method folder: the type of the
    setting's value in config.yaml, under the keywords the folder's schema.yaml declares for it."""
    texts = tuple(
        p.read_text() if p.is_file() else "" for p in (folder / "config.yaml", folder / METHOD_SCHEMA_FILE)
    )
    return cached_method_rules(folder, *texts)


@cache
def cached_method_rules(folder: Path, config_text: str, schema_text: str) -> dict[str, tuple[dict, str]]:
    import jsonschema

    config_file, schema_file = folder / "config.yaml", folder / METHOD_SCHEMA_FILE
    own = parsed_yaml(str(config_file), config_text)
    rules = {
        k: (type_schema(v), f"the type of its value in {config_file} ({v!r})")
        for k, v in own.items()
        if k not in METHOD_SECTIONS
    }
    declared = parsed_yaml(str(schema_file), schema_text)
    for key, keywords in declared.items():
        if key not in rules or not isinstance(keywords, dict):
            raise ConfigError(
                f"{schema_file}: `{key}` must be one of the settings of {config_file} ({sorted(rules)}), "
                "mapped to JSON-schema keywords (e.g. {exclusiveMinimum: 0})"
            )
        inferred, why = rules[key]
        if set(TYPE_KEYWORDS) & set(keywords):
            schema, why = keywords, f"{schema_file}'s {json.dumps(keywords)}"
        else:
            schema, why = deep_merge(inferred, keywords), f"{why} and {schema_file}'s {json.dumps(keywords)}"
        try:
            validator_class().check_schema(schema)
        except jsonschema.SchemaError as err:
            raise ConfigError(f"{schema_file}: `{key}`: not a JSON schema ({err.message})") from None
        rules[key] = (schema, why)
    return rules


def check_method_values(
    config: dict, methods_dir: str | Path, method: str, sources: Sequence[tuple[str, dict]] = ()
) -> None:
    """The values of a method's config.yaml and of its `method_overrides` follow their rules
    (``check_layer``); a variant's are checked as it is added (``add_variant``)."""
    folder = Path(methods_dir) / method
    method_file = folder / "config.yaml"
    own = load_yaml(method_file) if method_file.exists() else {}
    check_layer(own, folder, lambda path: f"{method_file}: key `{_dotted(path)}`")
    overrides = (config.get("method_overrides") or {}).get(method) or {}
    source = ["method_overrides", method]
    check_layer(
        overrides,
        folder,
        lambda path: f"config key `{_dotted(source + path)}`{_where(source + path, sources)}",
    )


def check_layer(settings: dict, folder: Path, set_at) -> None:
    """One layer of a method's settings (its config.yaml, an override, a variant): each training
    setting follows config/schema.yaml's `train`, each of the method's own the rule of
    ``method_rules``. ``set_at(path)`` names where the key at ``path`` was set. Unknown keys are left
    to ``resolve_method_config``, which lists the known ones."""
    rules = method_rules(folder)
    train = settings.get("train")
    if train is not None and not isinstance(train, dict):
        raise ConfigError(f"{set_at(['train'])}: {train!r} is not a mapping of training settings")
    if train:
        schema = train_schema()
        for err in schema_validator(schema).iter_errors(train):
            if err.validator == "additionalProperties":
                extra = sorted(set(err.instance) - set(schema["properties"]))
                raise ConfigError(
                    f"{set_at(['train', extra[0]])}: unknown training setting {extra[0]!r}; known: "
                    f"{sorted(schema['properties'])}. Fix the spelling or remove it."
                )
            path = ["train", *err.absolute_path]
            raise ConfigError(f"{set_at(path)}: {err.message} (config/{SCHEMA_FILE}'s rule for `train`)")
    for key, value in settings.items():
        if key not in rules:
            continue
        schema, why = rules[key]
        for err in schema_validator(schema).iter_errors(value):
            path = [key, *err.absolute_path]
            raise ConfigError(f"{set_at(path)}: {err.message} ({folder.name}'s `{key}` takes {why})")
