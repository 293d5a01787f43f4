"""The report: the DAG's last stage turns ``results/table.csv`` and the run folders into tables
(CSV, Markdown), figures (PNG) and one self-contained HTML page.

- tables:  reads the inputs, computes every table and writes them as CSV (and table.md)
- figures: draws what the runs and the protocols wrote (nothing is computed again here)
- page:    the HTML page, every number from the CSVs beside it
"""

from __future__ import annotations

from pathlib import Path

from sslbench import atomic
from sslbench.report.figures import draw_ablations, draw_figures
from sslbench.report.page import render_page
from sslbench.report.tables import (
    ReportInputError,
    compute_tables,
    read_floor_record,
    read_runs,
    read_table,
    write_tables,
)

__all__ = ["ReportInputError", "build_report"]


def build_report(
    results_dir: str | Path,
    methods_dir: str | Path,
    config_dir: str | Path,
    out_dir: str | Path,
    floor_record: str | Path | None = None,
) -> Path:
    """Write summary.csv, comparisons.csv, margins.csv, reproduced.csv, cost.csv, environment.csv,
    ablations.csv, table.md, figures/*.png and report.html into ``out_dir``; return the path of
    report.html. ``floor_record``: the record on many seeds the leaderboards show (where it exists)."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    table = read_table(results_dir)
    runs = read_runs(results_dir, table)
    record = read_floor_record(floor_record)
    tables = compute_tables(table, runs, results_dir, methods_dir, config_dir, record)
    write_tables(tables, out_dir)
    figures = {pair: draw_figures(pair, tables, runs, out_dir / "figures") for pair in tables.pairs}
    ablations = draw_ablations(tables.ablations, out_dir / "figures")
    return atomic.write_text(out_dir / "report.html", render_page(tables, figures, ablations, runs))
