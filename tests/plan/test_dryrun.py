"""What the plan would run, read from Snakemake's own summary table."""

from sslbench.plan.dryrun import REASONS, planned_jobs, planned_lines, summary_jobs

# the shape of `snakemake --summary`: one line per output file, a job's outputs sharing its log file
SUMMARY = "\n".join(
    "\t".join(fields)
    for fields in [
        ("output_file", "date", "rule", "log-file(s)", "status", "plan"),
        ("r/run.json", "-", "pretrain", "r/logs/pretrain.log", "params changed", "update pending"),
        ("r/checkpoint.pt", "-", "pretrain", "r/logs/pretrain.log", "params changed", "update pending"),
        ("r/eval/knn.json", "-", "evaluate", "r/logs/knn.log", "ok", "update pending"),
        ("s/eval/knn.json", "-", "evaluate", "s/logs/knn.log", "ok", "no update"),
        ("results/table.csv", "-", "collect", "-", "ok", "update pending"),
        ("results/failures.csv", "-", "collect", "-", "ok", "update pending"),
        ("t/eval/knn.json", "-", "evaluate", "t/logs/knn.log", "missing", "update pending"),
    ]
)


def test_each_pending_job_once_with_its_reason():
    jobs = summary_jobs("Building DAG of jobs...\n" + SUMMARY)
    assert [(j.rule, j.output, j.why) for j in jobs] == [
        ("pretrain", "r/run.json", REASONS["params changed"]),
        ("evaluate", "r/eval/knn.json", REASONS["ok"]),
        ("collect", "results/table.csv", REASONS["ok"]),
        ("evaluate", "t/eval/knn.json", "missing"),
    ]


def test_lines_list_jobs_with_a_reason_of_their_own_and_count_the_rest():
    jobs = summary_jobs(SUMMARY)
    lines = planned_lines(jobs, "snakemake --cores all", listed=1)
    assert lines == [
        "The plan runs 4 jobs (`snakemake --cores all`):",
        f"  - pretrain r/run.json: {REASONS['params changed']}",
        f"  - evaluate: 1 jobs, as {REASONS['ok']}",
        f"  - collect: 1 jobs, as {REASONS['ok']}",
        "  - evaluate t/eval/knn.json: missing",
    ]
    missing = [f"{d}/eval/knn.json\t-\tevaluate\t{d}/logs/knn.log\tmissing\tupdate pending" for d in "abc"]
    assert planned_lines(summary_jobs("\n".join(missing)), "c", listed=1)[1:] == [
        "  - evaluate a/eval/knn.json: missing",
        "  - evaluate: 2 more, as missing",
    ]
    assert planned_lines([], "c") == ["The plan runs nothing (`c`)."]


def test_a_plan_that_fails_is_an_error_naming_the_command(tmp_path):
    import pytest

    from sslbench.errors import SslbenchError

    with pytest.raises(SslbenchError, match="could not plan"):
        planned_jobs([], cwd=tmp_path)  # no Snakefile here
