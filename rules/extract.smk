# extract: the features of a trained run on each evaluation target other than its pretraining dataset.


def target_section(wildcards):
    return json.dumps(PLAN.datasets[wildcards.target], sort_keys=True)


rule extract:
    input:
        checkpoint=written_by(rules.pretrain.output.checkpoint),
        prepared=lambda wc: prepared(wc.target),
    output:
        features=update(FEATURES_FILE),  # kept in place while it reruns (rules/pretrain.smk)
    params:
        target=target_section,
        prepared=input_argument("prepared"),
        code=code("extract"),
    threads: JOB["extract"].threads
    resources:
        **JOB["extract"].resources,
    log:
        RUN_DIR + "/logs/extract_{target}.log",
    benchmark:
        RUN_DIR + "/benchmarks/extract_{target}.tsv"
    shell:
        "sslbench extract --checkpoint {input.checkpoint:q} --target-json {params.target:q} --out {output:q} "
        "{params.prepared} --threads {threads} > {log:q} 2>&1"


# The pretrain and import jobs write their own dataset's features (features/{pretrain}.npz); extract the
# others.
ruleorder: pretrain > extract
ruleorder: import_released > extract
