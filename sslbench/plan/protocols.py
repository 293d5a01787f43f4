"""What planning reads of a protocol: evaluation/<protocol>.py's literals (DEFAULTS,
READS_IMAGES, NEEDS_CHECKPOINT), read from its source so that planning never imports torch."""

from __future__ import annotations

import copy
from functools import cache

from sslbench.errors import ConfigError
from sslbench.plan.checks import dotted, schema_validator, set_in, type_schema

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


# Besides the DEFAULTS, what the planner reads of a protocol module, each True where its jobs read a file
# besides the cached features, or the list of the modes that do: READS_IMAGES, the target's images (its
# prepared file); NEEDS_CHECKPOINT, the run's checkpoint. Only then is that file an input of the job.
PLANNING_LITERALS = ("READS_IMAGES", "NEEDS_CHECKPOINT")


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
    return {k: v for k, v in protocol_literals(protocol).items() if k not in PLANNING_LITERALS}


def protocol_literals(protocol: str) -> dict:
    """The DEFAULTS and PLANNING_LITERALS of evaluation/<protocol>.py, read from its source."""
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
    rules = {**defaults, **own, **dict.fromkeys(DAG_KEYS)}  # the DAG's, checked by the schema
    problems = []
    for key, value in section.items():
        path = ["evaluation", protocol, key]
        if key not in rules:
            problems.append(
                f"unknown key `{dotted(path)}`{set_in(path, sources)}; known keys here: {sorted(rules)} "
                f"(evaluation/{protocol}.py's DEFAULTS). Fix the spelling or remove it."
            )
            continue
        schema = {"enum": sorted(modes)} if key == "mode" and modes else type_schema(rules[key])
        for err in schema_validator(schema).iter_errors(value):
            problems.append(
                f"config key `{dotted(path + list(err.absolute_path))}`{set_in(path, sources)}: "
                f"{err.message} (its default in evaluation/{protocol}.py: {rules[key]!r})"
            )
    return problems


def protocol_settings(config: dict, protocol: str) -> dict:
    """A protocol's settings as the protocol takes them (DAG_KEYS are the DAG's, not the protocol's)."""
    section = config["evaluation"].get(protocol, {}) or {}
    return {k: copy.deepcopy(v) for k, v in section.items() if k not in DAG_KEYS}


def maps_argument(protocol: str, seed: int | str, seeds: list[int]) -> str:
    """`sslbench evaluate`'s ``--no-maps`` where the report will not draw the job's maps."""
    return "--no-maps" if protocol in MAP_PROTOCOLS and int(seed) != min(seeds) else ""
