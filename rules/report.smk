# report: the tables, figures and HTML page of the collected table, the runs' records and the papers'
# numbers (methods/<name>/paper.yaml).
from sslbench.provenance import code_digest, sha256_file


rule report:
    input:
        table=rules.collect.output.table,
        failures=rules.collect.output.failures,
        runs=[written_by(rules.pretrain.output.run).format(pretrain=p, method=PLAN.slugs[m], seed=s)
              for p, m, s in PLAN.run_seeds(SEEDS)],
    output:
        html=report("results/report.html", category="Report"),
        table_md=report("results/table.md", category="Tables"),
        summary=report("results/summary.csv", category="Tables"),
        comparisons=report("results/comparisons.csv", category="Tables"),
        margins=report("results/margins.csv", category="Tables"),
        ablations=report("results/ablations.csv", category="Tables"),
        cost=report("results/cost.csv", category="Tables"),
        figures=report(directory("results/figures"), patterns=["{name}.png"], category="Figures"),
    params:
        methods=str(METHODS_DIR),
        config=str(BASE / "config"),
        # the papers' numbers (paper.yaml) by content, not as inputs: a clone's fresh file dates rerun nothing
        paper=lambda wc: code_digest(
            {m: sha256_file(p) for m in METHODS if (p := METHODS_DIR / m / "paper.yaml").exists()}
        ),
    localrule: True  # seconds of work: not worth a trip through a cluster queue
    log:
        "results/logs/report.log",
    shell:
        "sslbench report --results results --methods {params.methods:q} --config {params.config:q} "
        "--out results > {log:q} 2>&1"
