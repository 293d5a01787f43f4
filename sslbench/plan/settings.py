"""The suite's settings and each run's resolved settings.

The suite's (``load_config``): config/default.yaml, then each preset in order, then snakemake's
``--config``, each merged over the last and checked against config/schema.yaml. One run's, lowest
precedence first (``resolve_method_config``): the suite's ``train``, ``methods/<name>/config.yaml``,
``method_overrides.<name>``, then a variant's settings. Every checkpoint and result stores them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

from sslbench.augment.views import check_augment
from sslbench.errors import ConfigError
from sslbench.plan.checks import (
    COMMAND_LINE,
    declared_schema,
    deep_merge,
    dotted,
    load_yaml,
    parsed_yaml,
    schema_validator,
    set_in,
    source_of,
    type_schema,
)
from sslbench.plan.protocols import protocol_problems, with_protocols

# Keys a method's config.yaml may use besides its own hyperparameters.
METHOD_SECTIONS = ("train", "augment", "backbone")


DEFAULT_FILE = "default.yaml"  # in the config folder; presets are merged over it


SCHEMA_FILE = "schema.yaml"


NOT_TIMM_BACKBONES = ("pixels",)  # sslbench.backbones builds these itself


# What a method's `backbone:` may add to the suite's backbone keys (sslbench.backbones).
METHOD_BACKBONE_KEYS = ("input_filter", "args", "features")


def with_datasets(schema: dict) -> dict:
    """config/schema.yaml with the dataset names filled in (a dataset section's `name`): the datasets
    of sslbench/data/datasets/, as the registry finds them (without torch)."""
    from sslbench.data.registry import DATASETS

    schema = copy.deepcopy(schema)
    schema["$defs"]["dataset"]["properties"]["name"] = {"enum": list(DATASETS)}
    return schema


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


def without_plan_keys(section: dict) -> dict:
    """A dataset section as a job loads it: `optional` only matters to planning."""
    return {k: copy.deepcopy(v) for k, v in section.items() if k != "optional"}


def validate_config(config: dict, schema_path: str | Path, sources: list[tuple[str, dict]]) -> None:
    """Check the merged config against config/schema.yaml; one error per problem, naming the key,
    where it was set (``sources``: (file or COMMAND_LINE, its settings), in merge order), what was
    expected, and the known values where there is a list. A protocol's settings are checked against
    its module's DEFAULTS (``protocol_problems``)."""
    if "dataset" in config:  # a one-dataset key: say where datasets go
        raise ConfigError(
            f"config key `dataset`{set_in(['dataset'], sources)}: datasets are now registered by label "
            "under `datasets:` ({<label>: {name: ..., image_size: ...}}) and the ones to train on listed in "
            "`pretrain: [<label>]` (see config/default.yaml); evaluation targets are `evaluation.targets`."
        )
    schema = with_datasets(with_protocols(load_yaml(schema_path)))
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
                    f"unknown key `{dotted(key_path)}`{set_in(key_path, sources)}; "
                    f"known keys here: {known}. Fix the spelling or remove it."
                )
            continue
        where = set_in(path, sources)
        hint = ""
        if (
            source_of(path, sources) == COMMAND_LINE
            and err.validator == "type"
            and isinstance(err.instance, str)
        ):
            hint = (
                " (--config reads every value inside a list or mapping as a string: put it in a --configfile)"
            )
        problems.append(f"config key `{dotted(path)}`{where}: {err.message}{hint}")
    if not problems:  # the schema says which protocols there are
        for protocol, section in (config.get("evaluation") or {}).items():
            if protocol != "targets" and isinstance(section, dict):
                problems += protocol_problems(protocol, section, sources)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


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
    # a training key the schema knows but default.yaml leaves absent (e.g. step_factor) may be set here too
    known_train = set(config["train"]) | set(train_schema()["properties"])
    unknown_train = sorted(set(train) - known_train)
    if unknown_train:
        raise ConfigError(
            f"{method_file}: unknown key(s) {unknown_train} under `train`; known: {sorted(known_train)}"
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


@cache
def suite_schema() -> dict:
    """config/schema.yaml of this checkout (what ``load_config`` validates the suite's settings with)."""
    from sslbench.provenance import REPO

    return load_yaml(REPO / "config" / SCHEMA_FILE)


def train_schema() -> dict:
    """The schema's `train` section as one layer of a run's settings gives it: any subset of its keys."""
    return {k: v for k, v in suite_schema()["properties"]["train"].items() if k != "required"}


def method_rules(folder: Path) -> dict[str, tuple[dict, str]]:
    """{setting: (its JSON schema, where the schema comes from)} of a method folder: the type of the
    setting's value in config.yaml, under the keywords the folder's schema.yaml declares for it."""
    if not (folder / "config.yaml").is_file():  # named as itself, not as a schema.yaml naming no setting
        raise ConfigError(missing_config(folder))
    texts = tuple(
        p.read_text() if p.is_file() else "" for p in (folder / "config.yaml", folder / METHOD_SCHEMA_FILE)
    )
    return cached_method_rules(folder, *texts)


def missing_config(folder: Path) -> str:
    """What to say of a method folder without config.yaml."""
    return (
        f"{folder / 'config.yaml'}: missing. A method folder holds its settings there, with the paper's "
        "values (`{}` for a method without any, as methods/random/config.yaml); copy "
        "methods/_template/config.yaml to start."
    )


@cache
def cached_method_rules(folder: Path, config_text: str, schema_text: str) -> dict[str, tuple[dict, str]]:
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
        try:
            schema, replaces = declared_schema(inferred, keywords)
        except ValueError as err:
            raise ConfigError(f"{schema_file}: `{key}`: {err}") from None
        given = f"{schema_file}'s {json.dumps(keywords)}"
        rules[key] = (schema, given if replaces else f"{why} and {given}")
    return rules


def check_method_values(
    config: dict, methods_dir: str | Path, method: str, sources: Sequence[tuple[str, dict]] = ()
) -> None:
    """The values of a method's config.yaml and of its `method_overrides` follow their rules
    (``check_layer``); a variant's are checked as it is added (``add_variant``)."""
    folder = Path(methods_dir) / method
    method_file = folder / "config.yaml"
    own = load_yaml(method_file) if method_file.exists() else {}
    check_layer(own, folder, lambda path: f"{method_file}: key `{dotted(path)}`")
    overrides = (config.get("method_overrides") or {}).get(method) or {}
    source = ["method_overrides", method]
    check_layer(
        overrides,
        folder,
        lambda path: f"config key `{dotted(source + path)}`{set_in(source + path, sources)}",
    )


def check_layer(settings: dict, folder: Path, set_at) -> None:
    """One layer of a method's settings (its config.yaml, an override, a variant): each training
    setting follows config/schema.yaml's `train`, each of the method's own the rule of
    ``method_rules``, its views (`augment`) the job's own judge of them (``check_augment``; a whole
    run's views are judged again at its image size by ``plan_runs``). ``set_at(path)`` names where
    the key at ``path`` was set. Unknown keys are left to ``resolve_method_config``, which lists the
    known ones."""
    rules = method_rules(folder)
    if settings.get("augment") is not None:  # null is read as {} (the default views): nothing to judge
        try:
            check_augment(settings["augment"])
        except ConfigError as err:
            raise ConfigError(f"{set_at(['augment'])}: {err}") from None
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
