# report: the tables, figures and HTML page of the collected table, the runs' records and the papers'
# numbers (methods/<name>/paper.yaml).
from sslbench.provenance import code_digest, sha256_file
from sslbench.plan.paths import FLOOR_RECORD, REPORT_TABLES


rule report:
    input:
        table=rules.collect.output.table,
        failures=rules.collect.output.failures,
        runs=[written_by(rules.pretrain.output.run).format(pretrain=p, method=PLAN.slugs[m], seed=s)
              for p, m, s in PLAN.run_seeds(SEEDS)],
    # every file the report writes, each with its caption (rules/captions/) for `snakemake --report`
    output:
        html=report("results/report.html", caption="captions/report.rst", category="Report"),
        table_md=report("results/table.md", caption="captions/table_md.rst", category="Tables"),
        **{
            name: report(f"results/{name}.csv", caption=f"captions/{name}.rst", category="Tables")
            for name in REPORT_TABLES
        },
        figures=report(
            directory("results/figures"), patterns=["{name}.png"], caption="captions/figures.rst", category="Figures"
        ),
    params:
        methods=str(METHODS_DIR),
        config=str(BASE / "config"),
        # the papers' numbers (paper.yaml) by content, not as inputs: a clone's fresh file dates rerun nothing
        paper=lambda wc: code_digest(
            {m: sha256_file(p) for m in METHODS if (p := METHODS_DIR / m / "paper.yaml").exists()}
        ),
        # the record on many seeds the leaderboards show, by content likewise (absent: none shown)
        record=str(BASE / FLOOR_RECORD),
        record_digest=lambda wc: sha256_file(p) if (p := BASE / FLOOR_RECORD).exists() else "",
    localrule: True  # seconds of work: not worth a trip through a cluster queue
    log:
        "results/logs/report.log",
    shell:
        "sslbench report --results results --methods {params.methods:q} --config {params.config:q} "
        "--floor-record {params.record:q} --out results > {log:q} 2>&1"
