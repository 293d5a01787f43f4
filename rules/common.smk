# What the stages share: the plan's dimensions, the wildcards' values and the param and input functions
# of more than one rule. Every value comes from the settings and PLAN, which the Snakefile made.
import json
import re
import shlex

from sslbench.plan.paths import FEATURES_FILE, PREPARED_FILE, RESULT_FILE, RUN_DIR
from sslbench.plan.workflow import code_param, job_requests

SEEDS = config["seeds"]
PROTOCOLS = config["protocols"]
PRETRAIN = sorted({p for p, _ in PLAN.runs})
TARGETS = sorted({t for targets in PLAN.targets.values() for t in targets})
RERUN_ON_CODE_CHANGE = config.get("rerun_on_code_change", False)
LABEL_OF = {slug: label for label, slug in PLAN.slugs.items()}  # folder name -> method label
# {rule: its threads and resources}, from the config's `resources` section
JOB = job_requests(config["resources"])


wildcard_constraints:
    pretrain="|".join(map(re.escape, PRETRAIN)) or "(?!)",
    target="|".join(map(re.escape, TARGETS)) or "(?!)",
    method="|".join(map(re.escape, LABEL_OF)) or "(?!)",
    seed=r"\d+",
    protocol="|".join(PROTOCOLS),
    dataset="|".join(map(re.escape, PLAN.prepared)) or "(?!)",


def written_by(output):
    """An earlier stage's output as this stage's input: its path alone, without the flags (update())
    that belong to the rule that writes it."""
    return str(output)


def run_settings(wildcards):
    return PLAN.runs[wildcards.pretrain, LABEL_OF[wildcards.method]]


def method_dir(wildcards):
    return METHODS_DIR / run_settings(wildcards)["method_base"]


def code(stage):
    """The code param of a stage's jobs: with `rerun_on_code_change`, a change to a file the job runs
    reruns it (sslbench.plan.workflow.code_param). A function of the wildcards alone: snakemake does not
    track a param function that takes `output`."""
    def param(wildcards):
        protocol = wildcards.get("protocol")
        folder = method_dir(wildcards) if stage == "pretrain" else None
        return code_param(stage, dict(wildcards.items()), RERUN_ON_CODE_CHANGE, folder, protocol)
    return param


def prepared(label):
    """A dataset's prepared file, as the input of a job that loads its images: none for a folder
    dataset, which decodes its images as they are used."""
    return [PLAN.prepared[label]] if label in PLAN.prepared else []


def input_argument(name):
    """The param `--<name> <file>` where the job has that input (one file or none), else nothing:
    derived from its input, so no param of its own."""
    def argument(wildcards, input):
        return "".join(f"--{name} {shlex.quote(path)}" for path in getattr(input, name))
    return argument
