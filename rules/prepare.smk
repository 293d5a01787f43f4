# prepare: each in-memory dataset the plan loads, decoded once into a file that every job reading its
# images takes as an input (a folder dataset has none: its jobs decode images as they use them).


rule prepare:
    output:
        update(PREPARED_FILE),  # kept in place while it reruns (rules/pretrain.smk)
    params:
        section=lambda wc: json.dumps(PLAN.datasets[wc.dataset], sort_keys=True),  # a change reruns it
        code=code("prepare"),
    threads: 1
    # Seconds of work, and every job of its dataset waits for it; this process already loads each in-memory
    # dataset once before the first job (preflight), so the files are there and it fits in memory here.
    localrule: True
    log:
        "results/prepared/logs/{dataset}.log",
    benchmark:
        "results/prepared/benchmarks/{dataset}.tsv"
    shell:
        "sslbench prepare --dataset-json {params.section:q} --out {output:q} --threads {threads} "
        "> {log:q} 2>&1"
