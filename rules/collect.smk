# collect: every result the plan asks for, in one table (results/failures.csv names the broken method
# folders left out of the DAG).
from sslbench.provenance import tree_record


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
    localrule: True  # seconds of work: not worth a trip through a cluster queue
    shell:
        "sslbench collect --out {output.table:q} --failures {output.failures:q} --results-dir results "
        "--methods {params.methods:q} --failed-json {params.failed:q} {input:q}"
