"""Configuration: the one loader of the suite's settings, method discovery and the resolved
settings of each run.

The suite's settings (``load_config``): config/default.yaml, then each preset in order, then
snakemake's ``--config`` overrides, each merged over the last. The settings of one run
(``resolve_runs``), lowest precedence first: the suite's ``train`` settings, the method's own
``methods/<name>/config.yaml``, then ``method_overrides.<name>``. The resolved settings of a run are
stored in every checkpoint and result, so a number never loses the settings that produced it.
The Snakefile, the CLI's bench, the report's statistics and the tests all read settings through
these two functions.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from .errors import ConfigError, SslbenchError  # noqa: F401  (ConfigError is this module's to raise)

# Keys a method's config.yaml may use besides its own hyperparameters.
METHOD_SECTIONS = ("train", "augment", "backbone")
# What a method may set of the backbone (sslbench.backbones): the network itself is the suite's.
METHOD_BACKBONE_KEYS = ("input_filter",)
DEFAULT_FILE = "default.yaml"  # in the config folder; presets are merged over it
SCHEMA_FILE = "schema.yaml"


def load_config(
    config_dir: str | Path,
    presets: Iterable[str | Path] = (),
    overrides: Mapping | None = None,
    validate: bool = True,
) -> dict:
    """The suite's settings: ``config_dir/default.yaml``, each preset in order, then ``overrides``
    (snakemake's ``--config``), each merged over the last by ``deep_merge`` (snakemake's own rule
    for ``--configfile`` and ``--config``). Checked against ``config_dir/schema.yaml`` unless
    ``validate`` is false; an error names the key and the file that set it."""
    files = [Path(config_dir) / DEFAULT_FILE, *map(Path, presets)]
    merged: dict = {}
    for file in files:
        merged = deep_merge(merged, load_yaml(file))
    merged = deep_merge(merged, dict(overrides or {}))
    if validate:
        validate_config(merged, Path(config_dir) / SCHEMA_FILE, files)
    return merged


def dataset_label(cfg: dict) -> str:
    """The name results and tables use: ``dataset.label`` (e.g. imagenet100) or the loader's name.
    ``cfg`` is the suite's settings or a run's resolved settings (both have a ``dataset`` section)."""
    return cfg["dataset"].get("label") or cfg["dataset"]["name"]


def resolve_runs(
    config: dict, methods_dir: str | Path, methods: Iterable[str]
) -> dict[tuple[str, str], dict]:
    """{(dataset label, method label): resolved settings} of every run the suite trains.

    Today one pretraining dataset and one setting per method (the label is the method's folder).
    Several pretraining datasets and method variants (a sweep over a method's settings, labelled
    like ``moco[queue_size=4096]``) become more keys here; the Snakefile's DAG follows the keys.
    """
    dataset = dataset_label(config)
    return {(dataset, method): resolve_method_config(config, methods_dir, method) for method in methods}


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


def validate_config(config: dict, schema_path: str | Path, config_files: list[str | Path]) -> None:
    """Check the merged config against config/schema.yaml; one error per problem, naming the key,
    the file(s) that set it, what was expected, and the known values where there is a list."""
    import jsonschema

    schema = load_yaml(schema_path)
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        path = list(err.absolute_path)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            for key in extra:
                key_path = path + [key]
                known = sorted(err.schema.get("properties", {}))
                problems.append(
                    f"unknown key `{_dotted(key_path)}`{_where(key_path, config_files)}; "
                    f"known keys here: {known}. Fix the spelling or remove it."
                )
            continue
        problems.append(f"config key `{_dotted(path)}`{_where(path, config_files)}: {err.message}")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _dotted(path: list) -> str:
    return ".".join(map(str, path)) or "<top level>"


def _where(path: list, config_files: list[str | Path]) -> str:
    """' (set in a.yaml)': the last config file that sets this key, since later files win."""
    found = None
    for file in config_files:
        node = load_yaml(file)
        for part in path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                break
        else:
            found = file
    return f" (set in {found})" if found else ""


def preflight(config: dict) -> None:
    """Checks that need torch/timm or the data: run once before the first job, not at every plan."""
    import timm

    from .data import DatasetError, load_data

    name = config["backbone"]["name"]
    if name not in timm.list_models():
        raise ConfigError(
            f"config key `backbone.name`: {name!r} is not a timm model; similar names: "
            f"{timm.list_models(f'*{name}*')[:10] or 'none'} (see timm.list_models())"
        )
    data = config["dataset"]
    if data["name"] != "imagefolder":  # an ImageNet-size folder is checked by its first job instead
        try:
            load_data(config)
        except DatasetError as err:
            raise ConfigError(f"config key `dataset`: {err}") from err


PAPER_FIELDS = ("dataset", "backbone", "epochs", "protocol", "metric", "value", "source")


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


def method_problems(methods_dir: str | Path, names: list[str] | None = None) -> dict[str, str]:
    """{method: what is wrong} for method folders that cannot run, checked before any training.

    Looks at every folder under methods/ (or just ``names``): a missing method.py, a config.yaml
    that does not parse, a paper.yaml with missing fields, and a method.py that fails to import, has no
    Method subclass or lacks a required hook.
    """
    from .plugins import PluginError, load_method_class  # imports torch: only when checking

    root = Path(methods_dir)
    problems = {}
    for name in names if names is not None else list_method_folders(root):
        folder = root / name
        try:
            if (folder / "config.yaml").exists():
                load_yaml(folder / "config.yaml")
            if (folder / "paper.yaml").exists():
                paper_entries(folder / "paper.yaml")
            load_method_class(folder)
        except (ConfigError, PluginError) as err:
            problems[name] = str(err)
    return problems


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
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


def resolve_method_config(config: dict, methods_dir: str | Path, method: str) -> dict:
    """The full settings of one method's training run."""
    folder = Path(methods_dir) / method
    method_file = folder / "config.yaml"
    own = load_yaml(method_file) if method_file.exists() else {}
    overrides = config.get("method_overrides", {}).get(method, {}) or {}
    for key in overrides:
        if key not in own and key not in METHOD_SECTIONS:
            raise ConfigError(
                f"config key `method_overrides.{method}.{key}`: {method} has no setting {key!r}; "
                f"its settings (in {method_file}) are {sorted(own)} plus {list(METHOD_SECTIONS)}"
            )
    merged = deep_merge(own, overrides)
    train = deep_merge(config["train"], merged.pop("train", {}) or {})
    unknown_train = sorted(set(train) - set(config["train"]))
    if unknown_train:
        raise ConfigError(
            f"{method_file}: unknown key(s) {unknown_train} under `train`; known: {sorted(config['train'])}"
        )
    augment = merged.pop("augment", {}) or {}
    backbone = merged.pop("backbone", {}) or {}
    unknown_backbone = sorted(set(backbone) - set(METHOD_BACKBONE_KEYS))
    if unknown_backbone:
        raise ConfigError(
            f"{method_file} (or method_overrides.{method}.backbone): key(s) {unknown_backbone} under "
            f"`backbone`: a method may set only {list(METHOD_BACKBONE_KEYS)} there (the network is the "
            "suite's `backbone` section)"
        )
    return {
        "method": method,
        "dataset": copy.deepcopy(config["dataset"]),
        "backbone": {**copy.deepcopy(config["backbone"]), **backbone},
        "train": train,
        "augment": augment,
        "params": merged,
    }
