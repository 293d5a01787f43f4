# collect: every result the plan asks for, in one table (results/failures.csv names the broken method
# folders left out of the DAG).
from sslbench.plan.workflow import record_collected
from sslbench.provenance import tree_record


COLLECTED = "results/collected.txt"  # the list of result files the table is made from
if workflow.is_main_process:  # a cluster job's own snakemake finds it written
    record_collected(COLLECTED, PLAN.result_files(SEEDS))


rule collect:
    input:
        results=PLAN.result_files(SEEDS),
        listed=COLLECTED,
    output:
        table="results/table.csv",
        failures="results/failures.csv",
    params:
        failed=json.dumps(FAILED, sort_keys=True),
        methods=str(METHODS_DIR),
        # Any code change re-collects, so that the table's `stale` marks are always those of this tree.
        code=code_digest(tree_record(METHODS_DIR)),
    localrule: True  # seconds of work: not worth a trip through a cluster queue
    log:
        "results/logs/collect.log",
    shell:
        "sslbench collect --out {output.table:q} --failures {output.failures:q} --results-dir results "
        "--methods {params.methods:q} --failed-json {params.failed:q} {input.results:q} > {log:q} 2>&1"
