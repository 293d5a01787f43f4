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

from sslbench.report.figures import Figure
from sslbench.report.stats import (
    ALPHA,
    HEADLINE,
    MISSING,
    SAME_MARK,
    Leaderboard,
    best_methods,
    comparison_kind,
    comparison_matrix,
    family_resolution,
    headline_stats,
    headline_table,
    pair_id,
    pair_name,
)
from sslbench.report.tables import (
    STALE_NOTE,
    Run,
    Tables,
    comparisons_display,
    cost_display,
    first_seed_runs,
    fmt_points,
    headline_notes,
    known_text,
    leaderboard_display,
    leaderboard_notes,
    mark_stale,
    marks_notes,
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
table.matrix td,table.matrix th{padding:.1em .1em;font-size:.72em}
table.matrix th.col{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;vertical-align:bottom}
table.matrix th.text{overflow-wrap:anywhere}
table.matrix td.better{background:#d9f0d3}table.matrix td.worse{background:#fbe0dc}
table.matrix td.better.resolved{background:#1b7837;color:#fff;font-weight:bold}
table.matrix td.worse.resolved{background:#b2182b;color:#fff;font-weight:bold}
table.matrix td.better.exact{background:#a6dba0;font-style:italic}
table.matrix td.worse.exact{background:#f4a582;font-style:italic}
table.matrix td.tie{background:#fff}
table.matrix td.self{background:#eee}table.matrix td.untested{background:#fff;color:#888}
"""

NUMBER = r"[-+−]?[\d.]+(e[-+]?\d+)?"
# a number, with its std, one-seed or same-on-every-seed mark, seed count or interval where it has them
NUMERIC_CELL = re.compile(
    rf"^{NUMBER}( ± [\d.]+)?( \(n=1\)| {SAME_MARK})?( \(n=\d+\))?( \[{NUMBER}, {NUMBER}\])?$|^—$"
)


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


def leaderboard_html(board: Leaderboard, stale: set[str]) -> str:
    table = html_table(leaderboard_display(board, stale), f"table-leaderboard-{pair_id(*board.pair)}")
    return table + "".join(map(note, leaderboard_notes(board)))


def headline_html(summary: pd.DataFrame, pair: tuple[str, str], footnote: str, stale: set[str]) -> str:
    cells = headline_table(summary, pair)
    best = best_methods(headline_stats(summary, pair)["mean"])
    table = methods_table_html(cells, best, f"table-headline-{pair_id(*pair)}", stale)
    return table + "".join(map(note, headline_notes(summary, pair, footnote, cells)))


def methods_table_html(cells: pd.DataFrame, best: dict[str, set[str]], table_id: str, stale: set[str]) -> str:
    """Methods × columns of display strings, the best of each column in bold, stale methods marked."""
    bold = {(i, c) for i, m in enumerate(cells.index) for c in cells.columns if m in best[c]}
    return html_table(mark_stale(cells, stale).reset_index(), table_id, bold)


def comparison_cell(row: str, column: str, diff, low, high, p, p_adjusted, n) -> str:
    """One cell of a methods × methods matrix (``comparison_matrix``'s values at row, column): row −
    column in % points, coloured by sign (a tie is white), strong where Holm's correction resolves it,
    pale within noise, italic where it is the same on every seed (exact); the interval and p-values
    in its title."""
    if row == column:
        return '<td class="self"></td>'
    if not pd.notna(diff):
        return f'<td class="untested">{MISSING}</td>'
    side = "better" if diff > 0 else "worse" if diff < 0 else "tie"
    kind = comparison_kind(n, p_adjusted)
    tests = {
        "untested": "untested (n < 2)",
        "exact": "the same difference on every seed: no test",
    }.get(kind, f"95% CI {fmt_points(low)} to {fmt_points(high)}, p = {p:.3g}, Holm p = {p_adjusted:.3g}")
    title = f"{row} − {column}: {fmt_points(diff)} % points, {tests}, n = {int(n)}"
    return f'<td class="{side} {kind}" title="{html.escape(title)}">{fmt_points(diff, 1)}</td>'


def comparison_matrix_html(
    comparisons: pd.DataFrame, pair: tuple[str, str], protocol: str, metric: str
) -> str:
    parts = comparison_matrix(comparisons, pair, protocol, metric)
    methods = list(parts["diff"].index)
    # one array per statistic: a cell reads six numbers by position, not six labelled look-ups
    grids = [parts[k].to_numpy() for k in ("diff", "ci_low", "ci_high", "p", "p_adjusted", "n")]
    head = "<th></th>" + "".join(f'<th class="col">{html.escape(m)}</th>' for m in methods)
    body = [
        f'<tr><th class="text">{html.escape(row)}</th>'
        + "".join(comparison_cell(row, c, *(g[i, j] for g in grids)) for j, c in enumerate(methods))
        + "</tr>"
        for i, row in enumerate(methods)
    ]
    table_id = f"matrix-{pair_id(*pair)}-{protocol}-{metric}"
    return (
        f'<table class="matrix" id="{html.escape(table_id)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


COMPARISON_NOTE = (
    "Cell: mean over shared seeds of row − column, in % points (paired by seed); 0: a tie. Green: the row "
    "is better, red: worse. Each matrix is one family of tests: the paired t-test of every two methods "
    "(the same p as scipy.stats.ttest_rel), corrected by Holm's step-down method for the family-wise "
    "error rate within the matrix (one pretraining dataset, evaluation dataset, protocol and metric). "
    f"Dark and bold: Holm-adjusted p < {ALPHA} (the verdict names the better method); pale: within "
    "noise; italic: the same difference on every seed, so no test (the verdict says exact); grey: one "
    "shared seed (untested). Hover a cell for its 95% interval (mean ± t(0.975, n−1)·sd/√n), raw and "
    "adjusted p and n. Every pair: comparisons.csv."
)


def comparisons_html(tables: Tables) -> str:
    """Per dataset pair, one methods × methods matrix per headline metric compared, then the full
    pairwise table folded."""
    comparisons = tables.comparisons
    parts = []
    for pair in tables.pairs:
        of_pair = comparisons[
            (comparisons["pretrain_dataset"] == pair[0]) & (comparisons["eval_dataset"] == pair[1])
        ]
        present = set(zip(of_pair["protocol"], of_pair["metric"]))
        for label, protocol, metric in HEADLINE:
            if (protocol, metric) in present:
                parts.append(f"<h3>{html.escape(pair_name(*pair))}: {html.escape(label)}</h3>")
                parts.append(comparison_matrix_html(comparisons, pair, protocol, metric))
                parts.append(note(family_resolution(comparisons, pair, protocol, metric)))
    return (
        "".join(parts)
        + note(COMPARISON_NOTE)
        + "<details><summary>every pair, every headline metric (comparisons.csv)</summary>"
        + html_table(comparisons_display(tables.comparisons), "table-comparisons")
        + "</details>"
    )


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


def reproduced_html(reproduced: pd.DataFrame) -> str:
    """Our numbers beside the papers' where this run has the paper's settings; the other reported
    numbers in one list, grouped by what would reproduce them."""
    ours = reproduced[(reproduced["n"] > 0) | (reproduced["released_n"] > 0)]
    table = (
        html_table(reproduced_display(ours), "table-reproduced")
        if len(ours)
        else '<p id="table-reproduced" class="note">No reported number has a run with its settings here.</p>'
    )
    items = [
        f"<li>{html.escape(hint)}: "
        + html.escape(
            ", ".join(dict.fromkeys(f"{r.method} {r.protocol}/{r.metric}" for r in rows.itertuples()))
        )
        + "</li>"
        for hint, rows in reproduced[reproduced["n"] == 0].groupby("reproduce", sort=True)
        if hint
    ]
    listed = f'<h3>To reproduce</h3><ul id="list-to-reproduce">{"".join(items)}</ul>' if items else ""
    return (
        table
        + note(
            "Reported: the paper's number (methods/<name>/paper.yaml). Released weights, our protocol: "
            "the authors' own checkpoint (config `released`) through our protocol, which tells our "
            "evaluation apart from our training. Ours: our runs with the paper's pretraining and "
            "evaluation datasets, backbone and epochs; gap = ours − reported. "
            "Every row, with its source and the preset that would produce the missing ones: reproduced.csv."
        )
        + listed
    )


def ablations_html(ablations: list[Figure]) -> str:
    return "".join(figure_html(f, "sweeps") for f in ablations) + note(
        "Every point of these figures: ablations.csv (setting, dataset pair, method, value, mean, std, "
        "ci95, n)."
    )


def render_page(
    tables: Tables, figures: dict[str, list[Figure]], ablations: list[Figure], runs: list[Run]
) -> str:
    """The page: leaderboards, headlines, methods × targets, failures, reproduced vs reported,
    comparisons, each dataset pair's figures, ablations, cost, environment and every metric."""
    page = Page()
    for board in tables.leaderboards:
        page.add(
            f"Leaderboard: {pair_name(*board.pair)}, {board.label}",
            leaderboard_html(board, tables.stale(board.pair)),
        )
    for pair in tables.pairs:
        body = headline_html(tables.summary, pair, tables.footnotes[pair], tables.stale(pair))
        page.add(f"Headline: {pair_name(*pair)}", body)
    for matrix in tables.matrices:
        stale = tables.stale((matrix.pretrain, matrix.pretrain))
        table = methods_table_html(
            matrix.cells, matrix.best, f"table-targets-{matrix.pretrain}-{matrix.protocol}", stale
        )
        page.add(f"Methods × targets: {matrix.title}", table + "".join(map(note, matrix.notes)))
    if any(tables.stale(pair) for pair in tables.pairs):
        page.sections.append(f'<p class="note" id="stale-note">{html.escape(STALE_NOTE)}</p>')
    if len(tables.failures):
        page.add(
            "Failed method folders",
            html_table(tables.failures, "table-failures")
            + note(
                "Left out as broken (broken_methods: leave_out): fix these folders and rerun "
                "(results/failures.csv)."
            ),
        )
    page.add("Reproduced vs reported", reproduced_html(tables.reproduced))
    page.add("Paired comparisons", comparisons_html(tables))
    for pair in tables.pairs:
        page.add(
            f"Figures: {pair_name(*pair)}", "".join(figure_html(f, pair_id(*pair)) for f in figures[pair])
        )
    if ablations:
        page.add("Ablations", ablations_html(ablations))
    page.add(
        "Cost",
        html_table(cost_display(tables.cost), "table-cost")
        + note("Means over seeds; peak GPU memory is the maximum over seeds (— on CPU)."),
    )
    page.add("Environment", environment_html(tables.environment, runs))
    page.add("All metrics", summary_html(tables.summary))
    return page.render("sslbench report")


def summary_html(summary: pd.DataFrame) -> str:
    cells = summary_display(summary)
    return (
        "<details><summary>every (pretraining dataset, evaluation dataset, method, protocol, metric)"
        "</summary>"
        + html_table(cells, "table-summary")
        + "".join(map(note, marks_notes(cells)))
        + "</details>"
    )


def environment_html(environment: pd.DataFrame, runs: list[Run]) -> str:
    columns = ["pretrain_dataset", "method", "seed", "device", "git_commit", "git_dirty"]
    return (
        html_table(versions_display(environment), "table-versions")
        + html_table(environment[columns].map(known_text), "table-runs")
        + configs_html(runs)
    )


def figure_html(figure: Figure, dataset: str) -> str:
    if figure.png is None:
        caption = html.escape(figure.caption)
        return f'<p class="note" id="fig-{figure.kind}-{dataset}-absent">{caption}: no data.</p>'
    return html_figure(figure.png, f"fig-{figure.kind}-{dataset}", figure.caption)
