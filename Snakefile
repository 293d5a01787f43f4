# sslbench: prepare -> pretrain -> extract -> evaluate -> collect -> report.
# Thin by design: every rule calls the `sslbench` CLI, where the logic is tested.
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.utils import min_version

from sslbench.errors import ConfigError
from sslbench.plan.paths import FEATURES_FILE, PREPARED_FILE, RESULT_FILE, RUN_DIR
from sslbench.plan.protocols import maps_argument, protocol_reads_images, protocol_settings
from sslbench.plan.runs import plan_runs, selected_methods
from sslbench.plan.settings import config_sources, load_config
from sslbench.plan.workflow import code_param, method_problems, preflight
from sslbench.errors import expected_errors
from sslbench.provenance import code_digest, tree_record

min_version("9.0")

# methods/ and config/ sit beside this file (so -s and --directory work), but every path the DAG
# sees (params, inputs, shell arguments) is relative to the working directory: Snakemake compares
# them with the last run's, and an absolute path would retrain everything in a moved checkout.
BASE = Path(os.path.relpath(Path(workflow.basedir).resolve(), Path.cwd().resolve()))
METHODS_DIR = BASE / "methods"

# Our errors (config, method folders, data) print their message alone; SSLBENCH_DEBUG=1 adds the traceback.
with expected_errors("sslbench"):
    # The one merge rule of every reader of the settings (sslbench.plan.settings.load_config): default.yaml,
    # the --configfile presets in order, then --config; checked against config/schema.yaml, errors
    # name the key and the file that set it.
    config.update(load_config(BASE / "config", workflow.overwrite_configfiles,
                              workflow.config_settings.config))
    SOURCES = config_sources(BASE / "config", workflow.overwrite_configfiles, workflow.config_settings.config)
    METHODS = selected_methods(config, METHODS_DIR)
    # Broken method folders are caught here, before any training, and left out of the DAG. Unless
    # --keep-going is given, the run then stops before its first job (onstart); with it, the other
    # methods run and results/failures.csv names the broken ones.
    # A folder found sound before with the same code is not imported again (no torch to plan).
    FAILED = method_problems(METHODS_DIR, METHODS, checked=".snakemake/sslbench/sound_methods.json")
    FAILED_MESSAGE = "\n".join(f"  methods/{m}: {why}" for m, why in FAILED.items())
    if FAILED:
        print(f"sslbench: broken method folder(s):\n{FAILED_MESSAGE}", file=sys.stderr)
        METHODS = [m for m in METHODS if m not in FAILED]
    # {(pretraining dataset, method label): the run's resolved settings}, each (pretraining dataset,
    # protocol)'s evaluation targets, the datasets they load; every value a run takes is checked here
    # (README "When something goes wrong"), errors naming the file (SOURCES) that set the key.
    PLAN = plan_runs(config, METHODS_DIR, METHODS, sources=SOURCES)
    for label, why in PLAN.skipped.items():
        print(f"sslbench: skipping dataset {label} (datasets.{label}.optional):\n  {why}", file=sys.stderr)
    for warning in PLAN.warnings:
        print(f"sslbench: warning: {warning}", file=sys.stderr)
    LABEL_OF = {slug: label for label, slug in PLAN.slugs.items()}  # folder name -> method label


onstart:
    with expected_errors("sslbench"):
        preflight(config, PLAN)  # unknown backbone, missing or truncated dataset files: before any job runs
        if FAILED and not workflow.execution_settings.keep_going:
            raise ConfigError(f"broken method folder(s):\n{FAILED_MESSAGE}\nFix them, or run with "
                              "--keep-going to run the other methods (results/failures.csv will name these).")
SEEDS = config["seeds"]
PROTOCOLS = config["protocols"]
PRETRAIN = sorted({p for p, _ in PLAN.runs})
TARGETS = sorted({t for targets in PLAN.targets.values() for t in targets})
RERUN_ON_CODE_CHANGE = config.get("rerun_on_code_change", False)

localrules:
    all,
    collect,
    report,  # seconds of work each: not worth a trip through a cluster queue
    # Seconds too, and every job of its dataset waits for it; this process already loads each in-memory
    # dataset once before the first job (preflight), so the files are there and it fits in memory here.
    prepare,


wildcard_constraints:
    pretrain="|".join(map(re.escape, PRETRAIN)) or "(?!)",
    target="|".join(map(re.escape, TARGETS)) or "(?!)",
    method="|".join(map(re.escape, LABEL_OF)) or "(?!)",
    seed=r"\d+",
    protocol="|".join(PROTOCOLS),
    dataset="|".join(map(re.escape, PLAN.prepared)) or "(?!)",

# The pretrain job writes its own dataset's features (features/{pretrain}.npz); extract the others.
ruleorder: pretrain > extract


def run_settings(wildcards):
    return PLAN.runs[wildcards.pretrain, LABEL_OF[wildcards.method]]


def method_config(wildcards):
    """The resolved settings of one run: a param, so changing them reruns its jobs."""
    return json.dumps(run_settings(wildcards), sort_keys=True)


def method_dir(wildcards):
    return METHODS_DIR / run_settings(wildcards)["method_base"]


def method_sources(wildcards):
    """A method's code and config are inputs: editing them reruns that method's jobs."""
    folder = method_dir(wildcards)
    return [str(p) for p in (folder / "method.py", folder / "config.yaml") if p.exists()]


def code(stage):
    """The code param of a stage's jobs: with `rerun_on_code_change`, a change to a file the job runs
    reruns it (sslbench.plan.workflow.code_param). A function of the wildcards alone: snakemake does not
    track a param function that takes `output`."""
    def param(wildcards):
        protocol = wildcards.get("protocol")
        folder = method_dir(wildcards) if stage == "pretrain" else None
        return code_param(stage, dict(wildcards.items()), RERUN_ON_CODE_CHANGE, folder, protocol)
    return param


def job(rule_name):
    """threads and resources of a rule, from the config's `resources` section."""
    spec = config["resources"][rule_name]
    return spec.get("threads", 1), dict(gpu=spec.get("gpus", 0), mem_mb=spec.get("mem_mb", 4000),
                                       runtime=spec.get("runtime", 30))


def launcher(wildcards, resources):
    """One process, or torchrun DDP over the GPUs the job asked for."""
    if resources.gpu > 1:
        return f"torchrun --standalone --nproc-per-node {resources.gpu} -m sslbench.cli"
    return "sslbench"


def settings_of(wildcards):
    return json.dumps(protocol_settings(config, wildcards.protocol), sort_keys=True)


def target_section(wildcards):
    return json.dumps(PLAN.datasets[wildcards.target], sort_keys=True)


def prepared(label):
    """A dataset's prepared file, as the input of a job that loads its images: none for a folder
    dataset, which decodes its images as they are used."""
    return [PLAN.prepared[label]] if label in PLAN.prepared else []


def images_read(wildcards):
    """The target's prepared file for a protocol whose job loads its images (semisup, linear in mode
    paper); none for those on the cached features alone, which a new prepared file must not rerun."""
    settings = protocol_settings(config, wildcards.protocol)
    return prepared(wildcards.target) if protocol_reads_images(wildcards.protocol, settings) else []


def prepared_argument(wildcards, input):
    """--prepared where the job has the file: derived from its input, so no param of its own."""
    return "".join(f"--prepared {shlex.quote(path)}" for path in input.prepared)  # one file or none


rule all:
    input:
        "results/report.html",


rule prepare:
    output:
        PREPARED_FILE,
    params:
        section=lambda wc: json.dumps(PLAN.datasets[wc.dataset], sort_keys=True),  # a change reruns it
        code=code("prepare"),
    threads: 1
    log:
        "results/prepared/logs/{dataset}.log",
    benchmark:
        "results/prepared/benchmarks/{dataset}.tsv"
    shell:
        "sslbench prepare --dataset-json {params.section:q} --out {output:q} --threads {threads} > {log:q} 2>&1"


rule pretrain:
    input:
        sources=method_sources,
        prepared=lambda wc: prepared(wc.pretrain),
    output:
        run=RUN_DIR + "/run.json",
        checkpoint=RUN_DIR + "/checkpoint.pt",
        log=RUN_DIR + "/train_log.csv",
        features=RUN_DIR + "/features/{pretrain}.npz",
    params:
        cfg=method_config,
        method_dir=lambda wc: str(method_dir(wc)),
        run_dir=lambda wc, output: str(Path(output.checkpoint).parent),
        launcher=launcher,
        prepared=prepared_argument,
        code=code("pretrain"),
    threads: job("pretrain")[0]
    resources:
        **job("pretrain")[1],
    log:
        RUN_DIR + "/logs/pretrain.log",
    benchmark:
        RUN_DIR + "/benchmarks/pretrain.tsv"  # wall time and peak memory of the job (sslbench bench reads these)
    shell:
        "{params.launcher} pretrain --method-dir {params.method_dir:q} --config-json {params.cfg:q} "
        "--seed {wildcards.seed} --out {params.run_dir:q} --features-out {output.features:q} {params.prepared} "
        "--threads {threads} --quiet > {log:q} 2>&1"


rule extract:
    input:
        checkpoint=RUN_DIR + "/checkpoint.pt",
        prepared=lambda wc: prepared(wc.target),
    output:
        FEATURES_FILE,
    params:
        target=target_section,
        prepared=prepared_argument,
        code=code("extract"),
    threads: job("extract")[0]
    resources:
        **job("extract")[1],
    log:
        RUN_DIR + "/logs/extract_{target}.log",
    benchmark:
        RUN_DIR + "/benchmarks/extract_{target}.tsv"
    shell:
        "sslbench extract --checkpoint {input.checkpoint:q} --target-json {params.target:q} --out {output:q} "
        "{params.prepared} --threads {threads} > {log:q} 2>&1"


rule evaluate:
    input:
        features=FEATURES_FILE,
        checkpoint=RUN_DIR + "/checkpoint.pt",
        prepared=images_read,
    output:
        RESULT_FILE,
    params:
        settings=settings_of,
        prepared=prepared_argument,
        maps=lambda wc: maps_argument(wc.protocol, wc.seed, SEEDS),  # t-SNE maps for the seed the report draws
        code=code("evaluate"),
    threads: job("evaluate")[0]
    resources:
        **job("evaluate")[1],
    log:
        RUN_DIR + "/logs/{target}_{protocol}.log",
    benchmark:
        RUN_DIR + "/benchmarks/{target}_{protocol}.tsv"
    shell:
        "sslbench evaluate --protocol {wildcards.protocol} --features {input.features:q} "
        "--checkpoint {input.checkpoint:q} --settings-json {params.settings:q} --seed {wildcards.seed} "
        "--out {output:q} --threads {threads} {params.maps} {params.prepared} > {log:q} 2>&1"


rule collect:
    input:
        PLAN.result_files(SEEDS),
    output:
        table="results/table.csv",
        failures="results/failures.csv",
    params:
        failed=json.dumps(FAILED, sort_keys=True),
        methods=str(METHODS_DIR),
        # Any code change re-collects, so that the table's `stale` marks are always those of this tree.
        code=code_digest(tree_record(METHODS_DIR)),
    shell:
        "sslbench collect --out {output.table:q} --failures {output.failures:q} --results-dir results "
        "--methods {params.methods:q} --failed-json {params.failed:q} {input:q}"


rule report:
    input:
        table="results/table.csv",
        failures="results/failures.csv",
        runs=[RUN_DIR.format(pretrain=p, method=PLAN.slugs[m], seed=s) + "/run.json" for p, m in PLAN.runs
              for s in SEEDS],
        paper=[str(METHODS_DIR / m / "paper.yaml") for m in METHODS if (METHODS_DIR / m / "paper.yaml").exists()],
    output:
        html=report("results/report.html", category="Report"),
        table_md=report("results/table.md", category="Tables"),
        summary=report("results/summary.csv", category="Tables"),
        comparisons=report("results/comparisons.csv", category="Tables"),
        ablations=report("results/ablations.csv", category="Tables"),
        cost=report("results/cost.csv", category="Tables"),
        figures=report(directory("results/figures"), patterns=["{name}.png"], category="Figures"),
    params:
        methods=str(METHODS_DIR),
        config=str(BASE / "config"),
    log:
        "results/logs/report.log",
    shell:
        "sslbench report --results results --methods {params.methods:q} --config {params.config:q} "
        "--out results > {log:q} 2>&1"
