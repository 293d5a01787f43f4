"""What every settings check shares: YAML files, merging, JSON-schema validators and
naming the file that set a key."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import yaml

from sslbench.errors import ConfigError

COMMAND_LINE = "snakemake's --config"  # where a setting given on the command line was set


def dotted(path: list) -> str:
    return ".".join(map(str, path)) or "<top level>"


def set_in(path: list, sources: list[tuple[str, dict]]) -> str:
    """' (set in a.yaml)': where the key was set (``source_of``), or nothing where no source sets it."""
    found = source_of(path, sources)
    return f" (set in {found})" if found else ""


def source_of(path: list, sources: list[tuple[str, dict]]) -> str | None:
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


TYPE_KEYWORDS = ("type", "enum", "const")  # a declaration with one of these replaces the inferred type


def declared_schema(inferred: dict, keywords: dict) -> tuple[dict, bool]:
    """(a setting's JSON schema, whether ``keywords`` replaced ``inferred``): the type inferred from its
    value (``type_schema``) under the keywords declared for it (a range, the values it takes), or the
    declaration alone where it names a type of its own (TYPE_KEYWORDS). A ValueError where the result
    is no JSON schema."""
    import jsonschema

    replaces = bool(set(TYPE_KEYWORDS) & set(keywords))
    schema = copy.deepcopy(keywords) if replaces else deep_merge(inferred, keywords)
    try:
        validator_class().check_schema(schema)
    except jsonschema.SchemaError as err:
        raise ValueError(f"not a JSON schema ({err.message})") from None
    return schema, replaces


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
