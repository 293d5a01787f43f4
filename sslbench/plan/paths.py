"""Where the DAG's files are, relative to the working directory ({method} is the label's slug)."""

from __future__ import annotations

# Where the DAG's files are, relative to the working directory ({method} is the label's slug).
RESULTS_DIR = "results"


RUN_DIR = RESULTS_DIR + "/{pretrain}/{method}/seed{seed}"


FEATURES_FILE = RUN_DIR + "/features/{target}.npz"


RESULT_FILE = RUN_DIR + "/eval/{target}/{protocol}.json"


# An in-memory dataset section loaded once (`sslbench prepare`) for every job that reads its images.
PREPARED_FILE = RESULTS_DIR + "/prepared/{dataset}.npz"


# The file in which a job of each stage records the code it ran (provenance.code_record).
CODE_RECORD_FILES = {
    "prepare": PREPARED_FILE,
    "pretrain": RUN_DIR + "/run.json",
    "import": RUN_DIR + "/run.json",
    "extract": FEATURES_FILE,
    "evaluate": RESULT_FILE,
}


# The tables the report writes beside table.md and report.html, as results/<name>.csv.
# What many seeds of the same settings showed of each method against its floor (benchmarks/margins.py
# writes it; the leaderboards show it): unlike the results, in the workflow's own folder.
FLOOR_RECORD = "benchmarks/floor_record.csv"
REPORT_TABLES = ("summary", "comparisons", "margins", "reproduced", "cost", "environment", "ablations")
