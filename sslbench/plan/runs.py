"""The plan: what a configuration asks the DAG for (runs, variants, evaluation targets, datasets),
resolved and checked before any job runs."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sslbench.errors import ConfigError
from sslbench.plan.checks import dotted, set_in
from sslbench.plan.paths import PREPARED_FILE, RESULT_FILE
from sslbench.plan.protocols import MULTILABEL_PROTOCOLS
from sslbench.plan.released import released_runs
from sslbench.plan.settings import check_layer, check_method_values, resolve_method_config, without_plan_keys

PRETRAIN_TARGET = "pretrain"  # in `targets`: each run's own pretraining dataset


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
    skipped_runs: dict[str, str] = field(default_factory=dict)  # released run (label): why it is left out
    # protocol: the method folders and run labels it evaluates (`evaluation.<protocol>.methods`); absent: all
    evaluated: dict[str, list[str]] = field(default_factory=dict)
    # (pretrain dataset, method label): the label of its floor, the untrained run of its backbone
    floors: dict[tuple[str, str], str] = field(default_factory=dict)
    # the floor runs' seeds beside the config's, and the protocols and targets they are evaluated on there
    floor_seeds: list[int] = field(default_factory=list)
    floor_protocols: list[str] = field(default_factory=list)
    floor_targets: list[str] = field(default_factory=list)

    def evaluates(self, protocol: str, pretrain: str, method: str) -> bool:
        """Whether ``protocol`` evaluates the run (pretrain, method label): its label or its method
        folder is in the protocol's `methods`, or the protocol has none."""
        chosen = self.evaluated.get(protocol)
        return chosen is None or bool({method, self.runs[pretrain, method]["method_base"]} & set(chosen))

    def is_floor(self, pretrain: str, method: str) -> bool:
        return self.floors.get((pretrain, method)) == method

    def run_seeds(self, seeds: Iterable[int]) -> list[tuple[str, str, int]]:
        """(pretrain dataset, method label, seed) of every run: each run on ``seeds``, a floor also on
        ``floor_seeds``."""
        seeds = list(seeds)
        extra = [s for s in self.floor_seeds if s not in seeds]
        return [(p, m, s) for (p, m) in self.runs for s in seeds + (extra if self.is_floor(p, m) else [])]

    def result_files(self, seeds: Iterable[int]) -> list[str]:
        """Every result JSON the plan asks for: each run's on ``seeds``, and a floor's on its extra seeds
        for ``floor_protocols`` on ``floor_targets``."""
        seeds = list(seeds)
        return [
            RESULT_FILE.format(pretrain=p, method=self.slugs[m], seed=s, target=t, protocol=protocol)
            for (p, m, s) in self.run_seeds(seeds)
            for (p2, protocol), targets in self.targets.items()
            if p2 == p and self.evaluates(protocol, p, m) and (s in seeds or protocol in self.floor_protocols)
            for t in targets
            if s in seeds or t in self.floor_targets
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
    value a run takes is checked here (``check_method_values``, ``check_views``, ``check_subsets``);
    ``sources`` (``config_sources``) let an error name the file that set the key.
    """
    from sslbench.data.registry import LAZY_DATASETS, missing_files

    methods = list(methods)
    datasets = {label: dict(section, label=label) for label, section in config["datasets"].items()}
    released = {entry["dataset"] for entry in (config.get("released") or {}).values()}
    named = (
        set(config["pretrain"])
        | released
        | {
            name
            for protocol in config["protocols"]
            for name in (config["evaluation"].get(protocol) or {}).get(
                "targets", config["evaluation"].get("targets", [])
            )
        }
    )
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
            f"config key `pretrain`{set_in(['pretrain'], sources)}: every pretraining dataset is `optional` "
            f"and absent, so nothing can run:\n{why}\nGet the files, or pretrain on a dataset that is there."
        )
    warnings = check_method_sections(config, methods_dir, methods, sources)
    # Released weights are runs too, on the dataset they were pretrained on (nothing is trained there).
    imported = [d for d in sorted(released) if d in datasets and d not in skipped and d not in pretrain]
    targets = {
        (p, protocol): protocol_targets(config, protocol, p, datasets, skipped)
        for p in pretrain + imported
        for protocol in config["protocols"]
    }
    used = set(pretrain) | set(imported) | {t for labels in targets.values() for t in labels}
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
    check_views(config, methods_dir, runs, sources)
    floors = add_floors(config, methods_dir, runs, slugs, pretrain)
    released_entries = {
        name: entry
        for name, entry in (config.get("released") or {}).items()
        if entry["dataset"] not in skipped
    }
    imported_runs, imported_slugs, skipped_runs = released_runs(
        {**config, "released": released_entries}, methods_dir, datasets, check_files
    )
    runs.update(imported_runs)
    slugs.update(imported_slugs)
    if not runs:
        why = "".join(f"\n  {label}: {reason}" for label, reason in skipped_runs.items())
        raise ConfigError(
            f"config key `methods` is empty and no released weights can run, so nothing would: name the "
            f"methods to train, or put the released files in place{why}"
        )
    check_slugs(slugs)
    check_batches(config, methods_dir, runs, targets, datasets, sources)
    evaluated, unevaluated = evaluated_methods(config, methods_dir, runs, sources)
    warnings += unevaluated
    plan_datasets = {k: without_plan_keys(v) for k, v in datasets.items()}
    prepared = {
        label: PREPARED_FILE.format(dataset=label)
        for label in sorted(used)
        if datasets[label]["name"] not in LAZY_DATASETS
    }
    floor = {**FLOOR_DEFAULTS, **(config.get("floor") or {})}
    floor_targets = sorted({p if t == PRETRAIN_TARGET else t for t in floor["targets"] for p in pretrain})
    return Plan(
        runs,
        slugs,
        targets,
        plan_datasets,
        skipped,
        warnings,
        prepared,
        skipped_runs,
        evaluated,
        floors,
        list(range(floor["seeds"])) if floors else [],
        list(floor["protocols"]),
        floor_targets,
    )


FLOOR_METHOD = "random"  # the untrained backbone: the floor of every run on its backbone
FLOOR_DEFAULTS = {"seeds": 0, "protocols": [], "targets": [PRETRAIN_TARGET]}  # config/default.yaml sets them


def floor_key(backbone: dict) -> str:
    """What makes two runs' networks the same untrained network: their backbone settings, less an input
    filter (DeepCluster's Sobel: a fixed part of its method, in front of the network)."""
    return json.dumps({k: v for k, v in backbone.items() if k != "input_filter"}, sort_keys=True)


def floor_label(backbone: dict, others: list[dict], key: str) -> str:
    """`random[<backbone name>]`; where a floor of a network of that name exists, the settings that differ
    from its (`random[test_resnet,small_stem=True]`), or, where one of them is not a plain value (the
    arguments), a digest of the settings."""
    same_name = [other for other in others if other["name"] == backbone["name"]]
    if not same_name:
        return f"{FLOOR_METHOD}[{backbone['name']}]"
    other = same_name[0]
    keys = sorted(set(backbone) | set(other))
    differ = {k: backbone.get(k) for k in keys if backbone.get(k) != other.get(k)}
    if all(isinstance(v, (bool, int, float, str)) for v in differ.values()):
        return f"{FLOOR_METHOD}[{backbone['name']}," + ",".join(f"{k}={v}" for k, v in differ.items()) + "]"
    return f"{FLOOR_METHOD}[{backbone['name']}-{hashlib.sha256(key.encode()).hexdigest()[:6]}]"


def add_floors(config: dict, methods_dir: str | Path, runs: dict, slugs: dict, pretrain: list[str]) -> dict:
    """{(pretrain dataset, method label): its floor's label} of every trained run, where the plan has
    `random`: its base run is the floor of the suite's backbone, and each other backbone a run trains
    gets a run of its own, `random[<backbone name>]` (added to ``runs`` and ``slugs``). `pixels` (no
    network) has none."""
    from sslbench.plan.settings import NOT_TIMM_BACKBONES

    floors = {}
    for p in pretrain:
        if (p, FLOOR_METHOD) not in runs:
            continue
        by_key = {floor_key(runs[p, FLOOR_METHOD]["backbone"]): FLOOR_METHOD}
        for (dataset, label), run in sorted(runs.items()):
            if dataset != p or run["backbone"]["name"] in NOT_TIMM_BACKBONES:
                continue
            key = floor_key(run["backbone"])
            if key not in by_key:
                backbone = json.loads(key)
                name = floor_label(backbone, [json.loads(k) for k in by_key], key)
                resolved = resolve_method_config(config, methods_dir, FLOOR_METHOD, {"backbone": backbone}, p)
                runs[p, name] = {**resolved, "method": name}
                slugs[name] = method_slug(name)
                by_key[key] = floors[p, name] = name
            floors[dataset, label] = by_key[key]
    return floors


def evaluated_methods(
    config: dict, methods_dir: str | Path, runs: dict, sources: Sequence[tuple[str, dict]]
) -> tuple[dict[str, list[str]], list[str]]:
    """({protocol: its `evaluation.<protocol>.methods`}, warnings). Each name is a method folder or a
    run label (``simclr[hot]``); one whose folder does not exist is an error, one this plan does not
    run is a warning (a preset's choice may name methods another plan leaves out)."""
    planned = {label for _, label in runs} | {run["method_base"] for run in runs.values()}
    chosen, warnings = {}, []
    for protocol in config["protocols"]:
        names = (config["evaluation"].get(protocol) or {}).get("methods")
        if names is None:
            continue
        key = ["evaluation", protocol, "methods"]
        unknown = [n for n in names if not (Path(methods_dir) / re.split(r"[\[ ]", n)[0]).is_dir()]
        if unknown:
            raise ConfigError(
                f"config key `{dotted(key)}`{set_in(key, sources)}: {unknown} names no method folder; the "
                f"folders under {methods_dir} are {list_method_folders(methods_dir)}. Fix the name."
            )
        warnings += [
            f"config key `{dotted(key)}`{set_in(key, sources)}: {name} is no run of this plan, so "
            f"{protocol} evaluates nothing of it"
            for name in names
            if name not in planned
        ]
        chosen[protocol] = list(names)
    return chosen, warnings


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
                f"config key `{key}`{set_in([key, unknown[0]], sources)}: unknown method(s) {unknown}; the "
                f"method folders under {methods_dir} are {list_method_folders(methods_dir)}. Fix the name "
                "or remove the entry."
            )
        warnings += [
            f"config key `{key}.{m}`{set_in([key, m], sources)}: {m} is not among the methods this run "
            f"plans ({methods}), so these settings do nothing; add it to `methods` or remove them"
            for m in named
            if m not in methods
        ]
    return warnings


def check_subsets(datasets: dict[str, dict], sources: list[tuple[str, dict]]) -> None:
    """A dataset's `subset` fits its splits, where their sizes are known before loading
    (``sslbench.data.registry.split_sizes``; the others are checked when the dataset is loaded)."""
    from sslbench.data.registry import MULTILABEL_DATASETS, split_sizes, subset_too_large

    for label, section in datasets.items():
        subset = section.get("subset") or {}
        if not subset:
            continue
        key = ["datasets", label, "subset"]
        if section["name"] in MULTILABEL_DATASETS:
            raise ConfigError(
                f"config key `{dotted(key)}`{set_in(key, sources)}: {label} ({section['name']}) is "
                "multi-label, and `subset` draws a fixed part of each class; remove it"
            )
        sizes = split_sizes(section)
        for split, size in subset.items():
            if sizes and size > sizes[split]:
                where = set_in([*key, split], sources)
                raise ConfigError(
                    f"config key `{dotted([*key, split])}`{where}: "
                    f"{subset_too_large(section['name'], split, size, sizes[split])}"
                )


def check_views(
    config: dict, methods_dir: str | Path, runs: dict, sources: Sequence[tuple[str, dict]]
) -> None:
    """Each run's views (its `augment`, merged from its layers) judged at its dataset's image size by the
    job's own judge (``check_augment``): what no layer shows alone, a crop too small for the images.
    Each layer's keys and values were judged as it was read (``check_layer``), naming its file."""
    from sslbench.augment.views import check_augment
    from sslbench.plan.backbones import key_source

    for (dataset, label), run in sorted(runs.items()):
        try:
            check_augment(run["augment"], run["dataset"].get("image_size"))
        except ConfigError as err:
            where = key_source(run, ["augment"], config, methods_dir, sources)
            raise ConfigError(f"{label} on {dataset}: {err}{where}") from None


def train_images(section: dict) -> int | None:
    """The images of a dataset's train split as the jobs load it (its `subset`, else the split's size
    where it is known before loading: ``sslbench.data.registry.split_sizes``), or None."""
    from sslbench.data.registry import split_sizes

    subset = (section.get("subset") or {}).get("train")
    if subset:
        return subset
    sizes = split_sizes(section)
    return sizes["train"] if sizes else None


def check_batches(
    config: dict,
    methods_dir: str | Path,
    runs: dict,
    targets: dict,
    datasets: dict,
    sources: Sequence[tuple[str, dict]],
) -> None:
    """Every batch size against the images it is drawn from, where their number is known before
    loading: each trained run's `train.batch_size` (and the processes it is split over), and the
    `batch_size` of each protocol that drops the last short batch (its DROPS_LAST_BATCH) on each of
    its targets. The jobs check the same with the same functions (``sslbench.plan.limits``)."""
    from sslbench.plan.backbones import key_source
    from sslbench.plan.limits import pretrain_batch_problem, pretrain_processes, protocol_batch_problem
    from sslbench.plan.protocols import mode_defaults, protocol_flag, protocol_settings

    processes = pretrain_processes(config)
    for (dataset, label), run in sorted(runs.items()):
        available = train_images(datasets[dataset])
        if "released" in run or available is None:
            continue
        problem = pretrain_batch_problem(run["train"]["batch_size"], available, processes, dataset)
        if problem:
            where = key_source(run, ["train", "batch_size"], config, methods_dir, sources)
            raise ConfigError(f"{label} on {dataset}: {problem}{where}")
    for (_, protocol), labels in sorted(targets.items()):
        settings = protocol_settings(config, protocol)
        if not protocol_flag(protocol, "DROPS_LAST_BATCH", settings):
            continue
        batch = {**mode_defaults(protocol, settings), **settings}["batch_size"]
        for target in labels:
            available = train_images(datasets[target])
            problem = available is not None and protocol_batch_problem(protocol, batch, available)
            if problem:
                key = ["evaluation", protocol, "batch_size"]
                raise ConfigError(f"config key `{dotted(key)}`{set_in(key, sources)}: {problem} ({target})")


def protocol_targets(config: dict, protocol: str, pretrain: str, datasets: dict, skipped: dict) -> list[str]:
    """The evaluation targets of one protocol for runs pretrained on ``pretrain``: its own `targets`,
    else `evaluation.targets`; `pretrain` stands for the run's own dataset."""
    from sslbench.data.registry import MULTILABEL_DATASETS

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
            f"config key `{where}.{dotted(path)}`{set_in(source + path, sources)}"
        )
        add_variant(config, methods_dir, method, label, settings, where, set_at, seen, out, False)
    for key, values in sweeps.items():
        where = f"sweeps.{method}.{key}"
        if not values:
            raise ConfigError(f"config key `{where}`: an empty list of values; give at least one value")
        named = f"config key `{where}`{set_in(['sweeps', method, key], sources)}"
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


def selected_methods(config: dict, methods_dir: str | Path) -> list[str]:
    """The methods a config asks for (``methods: all`` means every folder under methods/ but those
    ``methods_excluded`` names)."""
    found = discover_methods(methods_dir)
    wanted = config.get("methods", "all")
    if wanted == "all":
        # A name without a folder leaves nothing out: the default holds whichever folders a copy keeps.
        # Folders without method.py are reported, not skipped.
        excluded = set(config.get("methods_excluded") or [])
        return [m for m in list_method_folders(methods_dir) if m not in excluded]
    unknown = [m for m in wanted if not (Path(methods_dir) / m).is_dir()]
    if unknown:
        raise ConfigError(
            f"config key `methods`: unknown method(s) {unknown}; known methods (folders under "
            f"{methods_dir} with a method.py): {found}"
        )
    return list(wanted)
