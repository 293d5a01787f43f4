"""The report's page: one self-contained HTML file. Every number a table shows is read from a CSV
written beside the page (see ``tables``), figures are embedded as base64 PNGs; the page loads
nothing from anywhere else and runs no script.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass, field

import pandas as pd

from ..stats import best_methods, headline_stats, headline_table, pair_id, pair_name
from .figures import Figure
from .tables import (
    MATRIX_NOTE,
    UNKNOWN,
    Run,
    Tables,
    comparisons_display,
    cost_display,
    first_seed_runs,
    reproduced_display,
    summary_display,
    versions_display,
)

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;
color:#222;line-height:1.4}
h1{font-size:1.6em}h2{font-size:1.3em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.1em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td.text,th.text{text-align:left;white-space:normal}
tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}.note{font-size:.85em;color:#555}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.8em}
details{margin:.5em 0}summary{cursor:pointer}
"""

NUMERIC_CELL = re.compile(r"^[-+−]?[\d.]+(e[-+]?\d+)?( ± [\d.]+)?( \(n=1\))?$|^—$")


def html_table(
    frame: pd.DataFrame, table_id: str, bold: set[tuple[int, str]] = frozenset(), caption: str | None = None
) -> str:
    """A table of display strings; text columns left-aligned, numbers right-aligned."""
    text_columns = {
        c for c in frame.columns if not frame[c].astype(str).map(lambda v: bool(NUMERIC_CELL.match(v))).all()
    }
    head = "".join(
        f'<th class="{"text" if c in text_columns else "num"}">{html.escape(str(c))}</th>'
        for c in frame.columns
    )
    body = []
    for i, (_, row) in enumerate(frame.iterrows()):
        cells = []
        for c in frame.columns:
            value = html.escape(str(row[c]))
            if (i, c) in bold:
                value = f"<strong>{value}</strong>"
            cells.append(f'<td class="{"text" if c in text_columns else "num"}">{value}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table id="{table_id}">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def html_figure(png: bytes, figure_id: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="{figure_id}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def headline_html(summary: pd.DataFrame, pair: tuple[str, str], footnote: str) -> str:
    cells = headline_table(summary, pair)
    best = best_methods(headline_stats(summary, pair)["mean"])
    return methods_table_html(cells, best, f"table-headline-{pair_id(*pair)}") + note(footnote)


def methods_table_html(cells: pd.DataFrame, best: dict[str, set[str]], table_id: str) -> str:
    """Methods × columns of display strings, the best of each column in bold."""
    bold = {(i, c) for i, m in enumerate(cells.index) for c in cells.columns if m in best[c]}
    return html_table(cells.reset_index(), table_id, bold)


@dataclass
class Page:
    sections: list[str] = field(default_factory=list)

    def add(self, title: str, body: str, level: int = 2) -> None:
        self.sections.append(f"<h{level}>{html.escape(title)}</h{level}>{body}")

    def render(self, title: str) -> str:
        return (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{''.join(self.sections)}</body></html>\n"
        )


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def configs_html(runs: list[Run]) -> str:
    """The resolved config of each method (its first seed's run.json), folded."""
    parts = []
    for dataset in sorted({r.dataset for r in runs}):
        for run in first_seed_runs(runs, dataset):
            text = html.escape(json.dumps(run.cfg, indent=2, sort_keys=True))
            title = html.escape(f"{dataset} / {run.method}: resolved config")
            parts.append(f"<details><summary>{title}</summary><pre>{text}</pre></details>")
    return "".join(parts)


def render_page(tables: Tables, figures: dict[str, list[Figure]], runs: list[Run]) -> str:
    """The page: headlines, failures, reproduced vs reported, comparisons, each dataset's figures,
    cost, environment and every metric."""
    page = Page()
    for pair in tables.pairs:
        page.add(f"Headline: {pair_name(*pair)}", headline_html(tables.summary, pair, tables.footnotes[pair]))
    for matrix in tables.matrices:
        table = methods_table_html(matrix.cells, matrix.best, f"table-targets-{matrix.pretrain}")
        page.add(f"Methods × targets: {matrix.title}", table + note(MATRIX_NOTE))
    if len(tables.failures):
        page.add(
            "Failed method folders",
            html_table(tables.failures, "table-failures")
            + note("Skipped with --keep-going: fix these folders and rerun (results/failures.csv)."),
        )
    page.add(
        "Reproduced vs reported",
        (
            html_table(reproduced_display(tables.reproduced), "table-reproduced")
            if len(tables.reproduced)
            else '<p id="table-reproduced" class="note">'
            "No methods/&lt;name&gt;/paper.yaml lists reported numbers.</p>"
        )
        + note(
            "Reported: the paper's number (methods/<name>/paper.yaml). Ours: our runs with the "
            "paper's pretraining and evaluation datasets, "
            "backbone and epochs; gap = ours − reported. Otherwise: the preset that would produce it."
        ),
    )
    page.add(
        "Paired comparisons",
        html_table(comparisons_display(tables.comparisons), "table-comparisons")
        + note(
            "Each headline metric, every pair of methods, paired by seed (scipy.stats.ttest_rel). "
            "Verdict at alpha 0.05 per pair, not corrected for the number of pairs."
        ),
    )
    for pair in tables.pairs:
        page.add(
            f"Figures: {pair_name(*pair)}", "".join(figure_html(f, pair_id(*pair)) for f in figures[pair])
        )
    page.add(
        "Cost",
        html_table(cost_display(tables.cost), "table-cost")
        + note("Means over seeds; peak GPU memory is the maximum over seeds (— on CPU)."),
    )
    environment = tables.environment
    page.add(
        "Environment",
        html_table(versions_display(environment), "table-versions")
        + html_table(
            environment[["pretrain_dataset", "method", "seed", "device", "git_commit", "git_dirty"]]
            .fillna(UNKNOWN)
            .astype(str),
            "table-runs",
        )
        + configs_html(runs),
    )
    page.add(
        "All metrics",
        "<details><summary>every (pretraining dataset, evaluation dataset, method, protocol, metric)"
        "</summary>" + html_table(summary_display(tables.summary), "table-summary") + "</details>",
    )
    return page.render("sslbench report")


def figure_html(figure: Figure, dataset: str) -> str:
    if figure.png is None:
        caption = html.escape(figure.caption)
        return f'<p class="note" id="fig-{figure.kind}-{dataset}-absent">{caption}: no data.</p>'
    return html_figure(figure.png, f"fig-{figure.kind}-{dataset}", figure.caption)
