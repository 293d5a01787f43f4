# sslbench: pretrain -> extract -> evaluate -> collect -> report.
# Thin by design: every rule calls the `sslbench` CLI, where the logic is tested.
import json
import os
import sys
from pathlib import Path

from snakemake.utils import min_version

from sslbench.config import (ConfigError, dataset_label, load_config, method_problems, preflight,
                             resolve_runs, selected_methods)
from sslbench.errors import expected_errors

min_version("9.0")

# methods/ and config/ sit beside this file (so -s and --directory work), but every path the DAG
# sees (params, inputs, shell arguments) is relative to the working directory: Snakemake compares
# them with the last run's, and an absolute path would retrain everything in a moved checkout.
BASE = Path(os.path.relpath(Path(workflow.basedir).resolve(), Path.cwd().resolve()))
METHODS_DIR = BASE / "methods"

# Our errors (config, method folders, data) print their message alone; SSLBENCH_DEBUG=1 adds the traceback.
with expected_errors("sslbench"):
    # The one merge rule of every reader of the settings (sslbench.config.load_config): default.yaml,
    # the --configfile presets in order, then --config; checked against config/schema.yaml, errors
    # name the key and the file that set it.
    config.update(load_config(BASE / "config", workflow.overwrite_configfiles,
                              workflow.config_settings.config))
    DATASET = dataset_label(config)
    METHODS = selected_methods(config, METHODS_DIR)
    # Broken method folders are caught here, before any training, and left out of the DAG. Unless
    # --keep-going is given, the run then stops before its first job (onstart); with it, the other
    # methods run and results/failures.csv names the broken ones.
    FAILED = method_problems(METHODS_DIR, METHODS)
    FAILED_MESSAGE = "\n".join(f"  methods/{m}: {why}" for m, why in FAILED.items())
    if FAILED:
        print(f"sslbench: broken method folder(s):\n{FAILED_MESSAGE}", file=sys.stderr)
        METHODS = [m for m in METHODS if m not in FAILED]
    RUNS = resolve_runs(config, METHODS_DIR, METHODS)  # {(dataset, method): the run's resolved settings}


onstart:
    with expected_errors("sslbench"):
        preflight(config)  # unknown backbone, missing or truncated dataset files: before any job runs
        if FAILED and not workflow.execution_settings.keep_going:
            raise ConfigError(f"broken method folder(s):\n{FAILED_MESSAGE}\nFix them, or run with "
                              "--keep-going to run the other methods (results/failures.csv will name these).")
SEEDS = config["seeds"]
PROTOCOLS = config["protocols"]
RUN = "results/{dataset}/{method}/seed{seed}"

localrules:
    all,
    collect,
    report,  # seconds of work each: not worth a trip through a cluster queue


wildcard_constraints:
    dataset=DATASET,
    method="|".join(METHODS) or "(?!)",
    seed=r"\d+",
    protocol="|".join(PROTOCOLS),


def method_config(wildcards):
    """The resolved settings of one run: a param, so changing them reruns its jobs."""
    return json.dumps(RUNS[wildcards.dataset, wildcards.method], sort_keys=True)


def method_sources(wildcards):
    """A method's code and config are inputs: editing them reruns that method's jobs."""
    folder = METHODS_DIR / wildcards.method
    return [str(p) for p in (folder / "method.py", folder / "config.yaml") if p.exists()]


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


def protocol_settings(wildcards):
    return json.dumps(config["evaluation"].get(wildcards.protocol, {}), sort_keys=True)


rule all:
    input:
        "results/report.html",


rule pretrain:
    input:
        method_sources,
    output:
        checkpoint=RUN + "/checkpoint.pt",
        log=RUN + "/train_log.csv",
        run=RUN + "/run.json",
    params:
        cfg=method_config,
        method_dir=lambda wc: str(METHODS_DIR / wc.method),
        run_dir=lambda wc, output: str(Path(output.checkpoint).parent),
        launcher=launcher,
    threads: job("pretrain")[0]
    resources:
        **job("pretrain")[1],
    log:
        RUN + "/logs/pretrain.log",
    benchmark:
        RUN + "/benchmarks/pretrain.tsv"  # wall time and peak memory of the job (sslbench bench reads these)
    shell:
        "{params.launcher} pretrain --method-dir {params.method_dir:q} --config-json {params.cfg:q} "
        "--seed {wildcards.seed} --out {params.run_dir:q} --threads {threads} --quiet > {log:q} 2>&1"


rule extract:
    input:
        RUN + "/checkpoint.pt",
    output:
        RUN + "/features.npz",
    threads: job("extract")[0]
    resources:
        **job("extract")[1],
    log:
        RUN + "/logs/extract.log",
    benchmark:
        RUN + "/benchmarks/extract.tsv"
    shell:
        "sslbench extract --checkpoint {input:q} --out {output:q} --threads {threads} > {log:q} 2>&1"


rule evaluate:
    input:
        features=RUN + "/features.npz",
        checkpoint=RUN + "/checkpoint.pt",
    output:
        RUN + "/eval/{protocol}.json",
    params:
        settings=protocol_settings,
    threads: job("evaluate")[0]
    resources:
        **job("evaluate")[1],
    log:
        RUN + "/logs/{protocol}.log",
    benchmark:
        RUN + "/benchmarks/{protocol}.tsv"
    shell:
        "sslbench evaluate --protocol {wildcards.protocol} --features {input.features:q} "
        "--checkpoint {input.checkpoint:q} --settings-json {params.settings:q} --seed {wildcards.seed} "
        "--out {output:q} --threads {threads} > {log:q} 2>&1"


rule collect:
    input:
        expand(RUN + "/eval/{protocol}.json", dataset=DATASET, method=METHODS, seed=SEEDS, protocol=PROTOCOLS),
    output:
        table="results/table.csv",
        failures="results/failures.csv",
    params:
        failed=json.dumps(FAILED, sort_keys=True),
    shell:
        "sslbench collect --out {output.table:q} --failures {output.failures:q} "
        "--failed-json {params.failed:q} {input:q}"


rule report:
    input:
        table="results/table.csv",
        failures="results/failures.csv",
        runs=expand(RUN + "/run.json", dataset=DATASET, method=METHODS, seed=SEEDS),
        paper=[str(METHODS_DIR / m / "paper.yaml") for m in METHODS if (METHODS_DIR / m / "paper.yaml").exists()],
    output:
        html=report("results/report.html", category="Report"),
        table_md=report("results/table.md", category="Tables"),
        summary=report("results/summary.csv", category="Tables"),
        comparisons=report("results/comparisons.csv", category="Tables"),
        figures=report(directory("results/figures"), patterns=["{name}.png"], category="Figures"),
    params:
        methods=str(METHODS_DIR),
        config=str(BASE / "config"),
    log:
        "results/logs/report.log",
    shell:
        "sslbench report --results results --methods {params.methods:q} --config {params.config:q} "
        "--out results > {log:q} 2>&1"
