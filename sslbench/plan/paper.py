"""A method's paper.yaml: the numbers its paper reports, beside which the report sets ours; and the
plan's check of a method folder's paper.yaml and README.md (``check_method_folders``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from sslbench.errors import ConfigError
from sslbench.plan.checks import load_yaml
from sslbench.plan.protocols import protocol_names

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

# The metric names each protocol writes (evaluation/<protocol>.py's `evaluate`), as full-match patterns.
# The names depend on the settings (kNN's variants, low-shot's ks, clustering's overcluster), so there is
# no literal to read them from: this is their one list, kept true by tests/plan/test_paper.py (every
# protocol has its entry; the names each writes with its DEFAULTS match).
METRIC_PATTERNS: dict[str, tuple[str, ...]] = {
    "clustering": (r"ami", r"nmi", r"ari", r"ami_k[0-9.e+-]+x"),  # ami_k{m:g}x
    "finetune": (r"top1", r"top5"),
    # top1_k200_t0.1: variant_name(k, temperature); few-shot: top1_k1_t0.07_n1_mean (n images per class)
    "knn": (r"top[15]_k\d+_t[0-9.e+-]+", r"top[15]_k\d+_t[0-9.e+-]+_n\d+_(mean|std)"),
    "linear": (r"top1", r"top5"),
    "lowshot_logreg": (r"top1_(n\d+|[0-9.e+-]+pct)_(mean|std|draw\d+)",),  # subset_name: n5, 1pct
    "lowshot_svm": (r"map_k\d+_(mean|std|min|max)", r"top1_k\d+_mean"),
    "semisup": (r"top[15]_(1pct|10pct)",),  # FRACTIONS
}

# What methods/_template/paper.yaml holds for the author to replace: {key: (is it the placeholder, fix)}.
# Its datasets, backbone, epochs, protocol and metric are real values a paper may report, so they stay.
PLACEHOLDERS = {
    "value": (lambda v: v == 0, "write the paper's number, a fraction in [0, 1]"),
    "source": (
        lambda v: isinstance(v, str) and re.search(r"\bTable N\b", v) is not None,
        'say where the number is printed (e.g. "Table 3 of the paper", or the official README\'s table)',
    ),
}

# The sections of methods/_template/README.md that every method folder's README.md holds (`## <name>`).
README_SECTIONS = ("Implemented", "Deviations")

TEMPLATE = "methods/_template"


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


def check_method_folders(methods_dir: str | Path, methods: list[str]) -> None:
    """Raise one ConfigError naming every problem of these method folders' paper.yaml and README.md
    (``paper_problems``, ``readme_problems``): the plan calls it, so that no misspelt or percent
    "reported" number reaches the report. A folder without a paper.yaml (a baseline) has none to check."""
    problems = []
    for name in methods:
        folder = Path(methods_dir) / name
        if (folder / "paper.yaml").exists():
            problems += paper_problems(folder / "paper.yaml")
        problems += readme_problems(folder / "README.md")
    if problems:
        raise ConfigError("method folder(s) to fix:\n" + "\n".join(f"  {p}" for p in problems))


def paper_problems(path: str | Path) -> list[str]:
    """What is wrong with a paper.yaml's entries, each naming the file, the entry, the key and the fix:
    a protocol that is not one of evaluation/'s, a metric that protocol does not write, a value that is
    no fraction in [0, 1], a placeholder of the template left in. Datasets, backbone and epochs are
    recorded as given."""
    try:
        entries = paper_entries(path)
    except ConfigError as err:
        return [str(err)]
    protocols = protocol_names()
    problems = []
    for i, entry in enumerate(entries):
        where = f"{path}: results[{i}]"
        protocol, metric, value = entry["protocol"], entry["metric"], entry["value"]
        if protocol not in protocols:
            problems.append(
                f"{where}.protocol: unknown protocol {protocol!r}; known protocols (evaluation/*.py): "
                f"{protocols}. Fix the spelling."
            )
        elif protocol not in METRIC_PATTERNS:
            problems.append(
                f"{where}.metric: sslbench/plan/paper.py's METRIC_PATTERNS names no metric of {protocol}: "
                "add the names its evaluate() writes there."
            )
        elif not metric_known(protocol, metric):
            problems.append(
                f"{where}.metric: {protocol} writes no metric {metric!r}; its metrics are named "
                f"{list(METRIC_PATTERNS[protocol])} (patterns). Fix the spelling, or name the metric "
                "the paper's number is."
            )
        problems += [f"{where}.value: {p}" for p in value_problems(value)]
        for key, (is_placeholder, fix) in PLACEHOLDERS.items():
            if is_placeholder(entry[key]):
                problems.append(
                    f"{where}.{key}: {entry[key]!r} is the placeholder of {TEMPLATE}/paper.yaml: {fix}."
                )
    return problems


def metric_known(protocol: str, metric) -> bool:
    """Whether ``protocol`` writes a metric named ``metric`` (METRIC_PATTERNS)."""
    return isinstance(metric, str) and any(re.fullmatch(p, metric) for p in METRIC_PATTERNS.get(protocol, ()))


def value_problems(value) -> list[str]:
    """Why a reported value is not a fraction in [0, 1] (what the protocols write); none if it is."""
    fraction = "write the paper's number as a fraction in [0, 1] (0.8906 for 89.06%)"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return [f"{value!r} is not a number: {fraction}"]
    if 1 < value <= 100:
        return [
            f"looks like a percent: write {value / 100:.10g} for {value} (values are fractions in [0, 1])"
        ]
    if not 0 <= value <= 1:
        return [f"{value!r} is outside [0, 1]: {fraction}"]
    return []


def readme_problems(path: str | Path) -> list[str]:
    """A method folder's README.md missing, or without a ``## <section>`` heading of README_SECTIONS."""
    path = Path(path)
    fix = f"(see {TEMPLATE}/README.md: the paper, what is implemented and every deviation)"
    if not path.is_file():
        sections = ", ".join(f"`## {s}`" for s in README_SECTIONS)
        return [f"{path}: missing; every method folder needs one, with the sections {sections} {fix}"]
    headings = {m.group(1).strip() for m in re.finditer(r"^##[ \t]+(.+)$", path.read_text(), re.MULTILINE)}
    return [
        f"{path}: no `## {section}` heading; add that section {fix}"
        for section in README_SECTIONS
        if not any(h == section or h.startswith(f"{section} ") for h in headings)
    ]
