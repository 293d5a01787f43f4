# sslbench: prepare -> pretrain -> extract -> evaluate -> collect -> report.
# Thin by design: every rule calls the `sslbench` CLI, where the logic is tested. This file loads the
# settings and plans the runs; rules/ holds one file per stage (common.smk: what they share), included
# in the pipeline's order, as a stage names the outputs of those before it (rules.<stage>.output).
import os
import sys
from pathlib import Path

from snakemake.utils import min_version

from sslbench.errors import expected_errors
from sslbench.plan.backbones import check_backbones
from sslbench.plan.paper import check_method_folders
from sslbench.plan.runs import plan_runs, selected_methods
from sslbench.plan.settings import config_sources, load_config
from sslbench.plan.workflow import leave_out_broken_methods, method_problems, preflight

min_version("9.0")

# methods/ and config/ sit beside this file (so -s and --directory work), but every path the DAG
# sees (params, inputs, shell arguments) is relative to the working directory: Snakemake compares
# them with the last run's, and an absolute path would retrain everything in a moved checkout.
BASE = Path(os.path.relpath(Path(workflow.basedir).resolve(), Path.cwd().resolve()))
METHODS_DIR = BASE / "methods"

# No snakemake.utils.validate(config, schema=...): load_config checks this merged dict against the same
# schema and names the file behind a bad key; a second pass could never fail, and costs ~10 ms a plan.
# Errors name the file that set a key, so the --configfile list and the --config dict are read apart
# (`config` merges them): no public interface gives either, hence these Workflow attributes.
PRESETS, OVERRIDES = workflow.overwrite_configfiles, workflow.config_settings.config

# Our errors (config, method folders, data) print their message alone; SSLBENCH_DEBUG=1 adds the traceback.
with expected_errors("sslbench", print_traceback=True):
    # The one merge rule of every reader of the settings (sslbench.plan.settings.load_config): default.yaml,
    # the --configfile presets in order, then --config; checked against config/schema.yaml, errors
    # name the key and the file that set it.
    config.update(load_config(BASE / "config", PRESETS, OVERRIDES))
    SOURCES = config_sources(BASE / "config", PRESETS, OVERRIDES)
    METHODS = selected_methods(config, METHODS_DIR)
    # Broken method folders are caught here, before any training: the plan stops naming them (`snakemake
    # -n` too), or with `broken_methods: leave_out` plans the others and says which were left out.
    # A folder found sound before with the same code is not imported again (no torch to plan).
    FAILED = method_problems(METHODS_DIR, METHODS, checked=".snakemake/sslbench/sound_methods.json")
    METHODS = [m for m in METHODS if m not in FAILED]
    if workflow.is_main_process:  # a job's own snakemake process (a cluster's) plans on quietly
        leave_out_broken_methods(FAILED, config["broken_methods"])
    # {(pretraining dataset, method label): the run's resolved settings}, each (pretraining dataset,
    # protocol)'s evaluation targets, the datasets they load; every value a run takes is checked here
    # (README "When something goes wrong"), errors naming the file (SOURCES) that set the key.
    PLAN = plan_runs(config, METHODS_DIR, METHODS, sources=SOURCES)
    check_method_folders(METHODS_DIR, METHODS)  # paper.yaml (reported numbers) and README.md sections
    # Each run's backbone against the sizes it is given and the features it is read as (torch only when
    # a backbone's facts are not remembered in .snakemake/sslbench/backbones.json).
    check_backbones(PLAN, config, METHODS_DIR, SOURCES)
    for label, why in PLAN.skipped.items():
        print(f"sslbench: skipping dataset {label} (datasets.{label}.optional):\n  {why}", file=sys.stderr)
    for label, why in PLAN.skipped_runs.items():
        print(f"sslbench: skipping {label}:\n  {why}", file=sys.stderr)
    for warning in PLAN.warnings:
        print(f"sslbench: warning: {warning}", file=sys.stderr)


onstart:
    with expected_errors("sslbench", print_traceback=True):
        preflight(config, PLAN)  # unknown backbone, missing or truncated dataset files: before any job runs


onsuccess:
    # The first command shows the result: the leaderboard, and where the rest is (the report's imports
    # are paid here, at the end, never while planning).
    from sslbench.plan.paths import FLOOR_RECORD
    from sslbench.report.tables import finished_message

    with expected_errors("sslbench", print_traceback=True):
        print(finished_message(Path("results"), BASE / FLOOR_RECORD))


include: "rules/common.smk"
include: "rules/prepare.smk"
include: "rules/pretrain.smk"
include: "rules/extract.smk"
include: "rules/evaluate.smk"
include: "rules/collect.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    localrule: True
    input:
        rules.report.output.html,
