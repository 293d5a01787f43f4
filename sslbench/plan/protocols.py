"""What planning reads of a protocol: evaluation/<protocol>.py's literals (DEFAULTS, RULES,
READS_IMAGES, NEEDS_CHECKPOINT, DROPS_LAST_BATCH), read from its source so that planning never imports
torch; and the one judge of a protocol's settings, which the plan and the protocol's job both call."""

from __future__ import annotations

import copy
import json
from functools import cache

from sslbench.errors import ConfigError
from sslbench.plan.checks import declared_schema, dotted, schema_validator, set_in, type_schema

# The protocols whose code takes multi-label targets ([N, classes] in the VOC devkit's codes);
# tests/extract/test_transfer.py checks this against what each protocol does with such features.
MULTILABEL_PROTOCOLS = ("lowshot_svm",)


# Protocols whose side file also holds maps that only the report's figures use (clustering's t-SNE),
# which it draws for each run's first seed: the other seeds skip them (see maps_argument).
MAP_PROTOCOLS = ("clustering",)


PROTOCOL_PACKAGE = "evaluation"  # evaluation/<protocol>.py

# Keys of `evaluation.<protocol>` that the DAG reads, not the protocol: what it evaluates (`targets`, the
# datasets; `methods`, the runs, by method folder or run label), checked by the schema and the plan.
DAG_KEYS = ("targets", "methods")


# Besides the DEFAULTS, what the planner reads of a protocol module, each True where its jobs do it, or
# the list of the modes that do: READS_IMAGES, the target's images (its prepared file); NEEDS_CHECKPOINT,
# the run's checkpoint (only then is that file an input of the job); DROPS_LAST_BATCH, dropping the last
# short batch of each epoch (so its `batch_size` must fit the target's train split).
PLANNING_LITERALS = ("READS_IMAGES", "NEEDS_CHECKPOINT", "DROPS_LAST_BATCH")


# A protocol's ranges: {setting: JSON-schema keywords} (draft 2020-12), merged over the type of the
# setting's default as a method folder's schema.yaml over its config.yaml, for the key in whichever
# mode's DEFAULTS it is. Optional: without it, a setting need only have its default's type.
RULES_LITERAL = "RULES"


FIX = "Give a value that fits, or remove the key for the default."  # after each refused value


def protocol_names() -> list[str]:
    """The protocols there are: the modules evaluation/<name>.py with a DEFAULTS (a new file is a new
    protocol; common.py and the like hold shared code)."""
    from sslbench.provenance import module_file

    folder = module_file(PROTOCOL_PACKAGE).parent
    return sorted(
        path.stem
        for path in folder.glob("*.py")
        if "DEFAULTS" in module_literals(str(path), path.read_text())
    )


def with_protocols(schema: dict) -> dict:
    """config/schema.yaml with the protocol names filled in: `protocols` items and `evaluation` keys."""
    names, schema = protocol_names(), copy.deepcopy(schema)
    schema["properties"]["protocols"]["items"] = {"enum": names}
    evaluation = schema["properties"]["evaluation"]["properties"]
    evaluation.update({name: {"$ref": "#/$defs/protocol"} for name in names})
    return schema


def protocol_defaults(protocol: str) -> dict[str, dict]:
    """{name: value} of the module-level ``DEFAULTS`` (and ``<MODE>_DEFAULTS``, a mode's own, with its
    `mode`) of evaluation/<protocol>.py, read from its source: sslbench loads a protocol only by name
    to run it, and several import torch, which planning never does. The protocol's own code keeps the
    one definition, so each must be a literal."""
    return {
        k: v
        for k, v in protocol_literals(protocol).items()
        if k not in PLANNING_LITERALS and k != RULES_LITERAL
    }


def protocol_literals(protocol: str) -> dict:
    """The DEFAULTS, RULES and PLANNING_LITERALS of evaluation/<protocol>.py, read from its source."""
    from sslbench.provenance import module_file

    path = module_file(f"{PROTOCOL_PACKAGE}.{protocol}")
    return copy.deepcopy(module_literals(str(path), path.read_text()))


def protocol_reads_images(protocol: str, settings: dict) -> bool:
    """Whether a protocol's job with these settings loads its target's images (semisup, linear in
    mode "paper"), and so reads the target's prepared file, rather than the cached features alone."""
    return protocol_flag(protocol, "READS_IMAGES", settings)


def protocol_needs_checkpoint(protocol: str, settings: dict) -> bool:
    """Whether a protocol's job with these settings reads the run's checkpoint (NEEDS_CHECKPOINT), rather
    than the cached features alone."""
    return protocol_flag(protocol, "NEEDS_CHECKPOINT", settings)


def protocol_flag(protocol: str, name: str, settings: dict) -> bool:
    """A PLANNING_LITERALS flag of a protocol's job with these settings: the module's bool, or whether
    the job's mode is in its list of modes; False where the module leaves it out."""
    literals = protocol_literals(protocol)
    flag = literals.get(name, False)
    if isinstance(flag, bool):
        return flag
    return (settings or {}).get("mode", literals["DEFAULTS"].get("mode")) in flag


@cache
def module_literals(path: str, text: str) -> dict:
    import ast

    found = {}
    for node in ast.parse(text, path).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        name = getattr(target, "id", "")
        if name == "DEFAULTS" or name.endswith("_DEFAULTS") or name in (*PLANNING_LITERALS, RULES_LITERAL):
            try:
                found[name] = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(
                    f"{path}: {name} must be a literal (planning reads it unimported)"
                ) from None
    return found


def protocol_problems(protocol: str, section: dict, sources: list[tuple[str, dict]]) -> list[str]:
    """What is wrong with `evaluation.<protocol>`: a key the protocol does not take (``mode_defaults``;
    DAG_KEYS are the DAG's, checked by the schema), a value its rule refuses (``setting_problems``)."""
    known = {**mode_defaults(protocol, section), **dict.fromkeys(DAG_KEYS)}
    problems = []
    for key in section:
        if key not in known:
            path = ["evaluation", protocol, key]
            problems.append(
                f"unknown key `{dotted(path)}`{set_in(path, sources)}; known keys here: {sorted(known)} "
                f"(evaluation/{protocol}.py's DEFAULTS). Fix the spelling or remove it."
            )
    return problems + setting_problems(protocol, section, sources)


def mode_defaults(protocol: str, settings: dict) -> dict:
    """{setting: default} of what a protocol takes with these settings (``defaults_of_mode``)."""
    return defaults_of_mode(protocol_literals(protocol), chosen_mode(settings))


def chosen_mode(settings: dict) -> str | None:
    """The mode these settings choose; None for the default mode (and for a mode that is no string,
    which the `mode` rule refuses)."""
    mode = (settings or {}).get("mode")
    return mode if isinstance(mode, str) else None


def defaults_of_mode(literals: dict, mode: str | None) -> dict:
    """{setting: default} of a protocol module's ``literals`` in ``mode``: its DEFAULTS, and where the
    mode has its own (linear's `mode: paper`, PAPER_DEFAULTS), that mode's keys too, which win (the
    default mode's keys are taken and ignored there)."""
    defaults = literals["DEFAULTS"]
    mode = defaults.get("mode") if mode is None else mode
    own = [d for name, d in literals.items() if name.endswith("DEFAULTS") and d.get("mode") == mode]
    return {**defaults, **(own[0] if own else {})}


def setting_problems(protocol: str, settings: dict, sources: list[tuple[str, dict]] = ()) -> list[str]:
    """Each of a protocol's settings whose value its rule (``setting_rules``) refuses, naming the key
    (`evaluation.<protocol>.<key>`), where it was set (``sources``: the plan's), the rule and the fix.
    The plan reports these before any job and the protocol's job raises them
    (``evaluation.common.check_rules``), in the same words. Keys it does not take are the caller's."""
    rules = setting_rules(protocol, settings)
    problems = []
    for key, value in settings.items():
        if key not in rules:
            continue
        schema, why = rules[key]
        path = ["evaluation", protocol, key]
        for err in schema_validator(schema).iter_errors(value):
            problems.append(
                f"config key `{dotted(path + list(err.absolute_path))}`{set_in(path, sources)}: "
                f"{err.message} ({why}). {FIX}"
            )
    return problems


def setting_rules(protocol: str, settings: dict) -> dict[str, tuple[dict, str]]:
    """{setting: (its JSON schema, where the schema comes from)} of what a protocol takes with these
    settings (``cached_setting_rules``; shared, not to be changed)."""
    from sslbench.provenance import module_file

    path = module_file(f"{PROTOCOL_PACKAGE}.{protocol}")
    return cached_setting_rules(protocol, str(path), path.read_text(), chosen_mode(settings))


@cache
def cached_setting_rules(
    protocol: str, path: str, text: str, mode: str | None
) -> dict[str, tuple[dict, str]]:
    """The rules of a protocol module's source ``text`` in ``mode``: the type of each default under the
    keywords its RULES declare for that key; `mode` is one of the modes, where the module has modes.
    Once per source and mode: checking the declared schemas costs far more than judging a value."""
    literals = module_literals(path, text)
    declared = literals.get(RULES_LITERAL, {})
    every = [d for name, d in literals.items() if name.endswith("DEFAULTS")]
    modes, every_key = sorted(d["mode"] for d in every if "mode" in d), sorted({k for d in every for k in d})
    file = f"{PROTOCOL_PACKAGE}/{protocol}.py"
    for key, keywords in declared.items():
        if key not in every_key or not isinstance(keywords, dict):
            raise ConfigError(
                f"{file}: RULES' `{key}` must be one of its settings ({every_key}), mapped to JSON-schema "
                "keywords (e.g. {'exclusiveMinimum': 0})"
            )
    rules = {}
    for key, default in defaults_of_mode(literals, mode).items():
        inferred = type_schema(default)
        why = f"{file}'s rule for `{key}`: the type of its default ({default!r})"
        if key == "mode" and modes:
            rules[key] = ({"enum": modes}, f"the modes of {file}: its DEFAULTS and <MODE>_DEFAULTS")
        elif key in declared:
            try:
                schema, replaces = declared_schema(inferred, declared[key])
            except ValueError as err:
                raise ConfigError(f"{file}: RULES' `{key}`: {err}") from None
            given = f"RULES' {json.dumps(declared[key])}"
            rules[key] = (schema, f"{file}'s rule for `{key}`: {given}" if replaces else f"{why} and {given}")
        else:
            rules[key] = (inferred, why)
    return rules


def protocol_settings(config: dict, protocol: str) -> dict:
    """A protocol's settings as the protocol takes them (DAG_KEYS are the DAG's, not the protocol's)."""
    section = config["evaluation"].get(protocol, {}) or {}
    return {k: copy.deepcopy(v) for k, v in section.items() if k not in DAG_KEYS}


def maps_argument(protocol: str, seed: int | str, seeds: list[int]) -> str:
    """`sslbench evaluate`'s ``--no-maps`` where the report will not draw the job's maps."""
    return "--no-maps" if protocol in MAP_PROTOCOLS and int(seed) != min(seeds) else ""
