# pretrain: one run per (pretraining dataset, method label, seed), which also writes the features of its
# own dataset (extract does the other targets'). A released run imports its file instead of training.
from sslbench.launch import prefix as launch_prefix
from sslbench.provenance import code_digest, method_record

IMPORTED = sorted({PLAN.slugs[label] for (_, label), run in PLAN.runs.items() if "released" in run})
TRAINED = sorted(set(PLAN.slugs.values()) - set(IMPORTED))


def method_config(wildcards):
    """The resolved settings of one run: a param, so changing them reruns its jobs."""
    return json.dumps(run_settings(wildcards), sort_keys=True)


def method_code(wildcards):
    """A digest of the method folder's code and config.yaml: a param, not inputs, so that editing them
    reruns that method's jobs while a clone with the same files and a copied results/ reruns nothing
    (inputs are judged by file dates, which a clone or a copy resets)."""
    return code_digest(method_record(method_dir(wildcards)))


def launcher(wildcards, resources):
    """One process, torchrun DDP over the GPUs the job asked for, or one torchrun agent per node (its
    `tasks`) of a job on several nodes."""
    if "mpi" in resources.keys():
        return launch_prefix(resources.nodes, resources.tasks, JOB["pretrain"].gpus)
    return launch_prefix(1, 1, resources.gpu)


rule pretrain:
    wildcard_constraints:
        method="|".join(map(re.escape, TRAINED)) or "(?!)",
    input:
        prepared=lambda wc: prepared(wc.pretrain),
    # update(): Snakemake keeps a finished run's files in place while the job runs (a copy goes to
    # .snakemake/backups/) and puts them back if it fails, instead of deleting them before it starts.
    output:
        run=update(RUN_DIR + "/run.json"),
        checkpoint=update(RUN_DIR + "/checkpoint.pt"),
        log=update(RUN_DIR + "/train_log.csv"),
        features=update(RUN_DIR + "/features/{pretrain}.npz"),
    params:
        cfg=method_config,
        method_code=method_code,
        method_dir=lambda wc: str(method_dir(wc)),
        run_dir=lambda wc, output: str(Path(output.checkpoint).parent),
        launcher=launcher,
        prepared=input_argument("prepared"),
        code=code("pretrain"),
        # what the job measures while it trains (not a training setting: its run's settings stay the same)
        monitor=json.dumps(config["monitor"], sort_keys=True),
        # the trackers that also get the log (not a training setting either)
        logging=json.dumps(config["logging"], sort_keys=True),
    threads: JOB["pretrain"].threads
    resources:
        **JOB["pretrain"].resources,
    log:
        RUN_DIR + "/logs/pretrain.log",
    benchmark:  # wall time and peak memory of the job (sslbench bench reads these)
        RUN_DIR + "/benchmarks/pretrain.tsv"
    shell:
        "{params.launcher} pretrain --method-dir {params.method_dir:q} --config-json {params.cfg:q} "
        "--seed {wildcards.seed} --out {params.run_dir:q} --features-out {output.features:q} "
        "{params.prepared} --monitor-json {params.monitor:q} --logging-json {params.logging:q} "
        "--threads {threads} --quiet > {log:q} 2>&1"


rule import_released:
    wildcard_constraints:
        method="|".join(map(re.escape, IMPORTED)) or "(?!)",
    input:
        # the file's sha256 is in the run's settings (cfg): a changed file reruns this job and its results
        prepared=lambda wc: prepared(wc.pretrain),
    output:
        run=update(rules.pretrain.output.run),
        checkpoint=update(rules.pretrain.output.checkpoint),
        features=update(rules.pretrain.output.features),
    params:
        cfg=method_config,
        run_dir=lambda wc, output: str(Path(output.checkpoint).parent),
        prepared=input_argument("prepared"),
        code=code("import"),
    threads: JOB["extract"].threads
    resources:
        **JOB["extract"].resources,
    log:
        RUN_DIR + "/logs/import.log",
    shell:
        "sslbench import --config-json {params.cfg:q} --seed {wildcards.seed} --out {params.run_dir:q} "
        "--features-out {output.features:q} {params.prepared} --threads {threads} --quiet > {log:q} 2>&1"
