# evaluate: each protocol on the features of each (run, target). A job reads more than the features only
# where its protocol module says so (READS_IMAGES, NEEDS_CHECKPOINT): only those files are its inputs,
# so that a new prepared file or checkpoint reruns no protocol that never opens it.
from sslbench.plan.protocols import (
    maps_argument,
    protocol_needs_checkpoint,
    protocol_reads_images,
    protocol_settings,
)


# The same for every job of a protocol: its settings, and whether it loads the target's images (semisup,
# linear in mode paper) or reads the run's checkpoint (semisup, linear).
SETTINGS = {p: protocol_settings(config, p) for p in PROTOCOLS}
IMAGE_PROTOCOLS = {p for p in PROTOCOLS if protocol_reads_images(p, SETTINGS[p])}
CHECKPOINT_PROTOCOLS = {p for p in PROTOCOLS if protocol_needs_checkpoint(p, SETTINGS[p])}


def images_read(wildcards):
    return prepared(wildcards.target) if wildcards.protocol in IMAGE_PROTOCOLS else []


rule evaluate:
    input:
        # written by extract, or for the run's own dataset by pretrain (ruleorder)
        features=written_by(rules.extract.output.features),
        checkpoint=branch(
            lambda wc: wc.protocol in CHECKPOINT_PROTOCOLS, then=[written_by(rules.pretrain.output.checkpoint)]
        ),
        prepared=images_read,
    output:
        update(RESULT_FILE),  # kept in place while it reruns (rules/pretrain.smk)
    params:
        settings=lambda wc: json.dumps(SETTINGS[wc.protocol], sort_keys=True),
        checkpoint=input_argument("checkpoint"),
        prepared=input_argument("prepared"),
        # t-SNE maps only for the seed the report draws
        maps=lambda wc: maps_argument(wc.protocol, wc.seed, SEEDS),
        code=code("evaluate"),
    threads: JOB["evaluate"].threads
    resources:
        **JOB["evaluate"].resources,
    log:
        RUN_DIR + "/logs/{target}_{protocol}.log",
    benchmark:
        RUN_DIR + "/benchmarks/{target}_{protocol}.tsv"
    shell:
        "sslbench evaluate --protocol {wildcards.protocol} --features {input.features:q} "
        "--settings-json {params.settings:q} --seed {wildcards.seed} "
        "--out {output:q} --threads {threads} {params.maps} {params.checkpoint} {params.prepared} "
        "> {log:q} 2>&1"
