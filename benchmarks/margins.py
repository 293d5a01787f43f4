"""Each learned method's kNN margin over its own backbone's floor, on many seeds: what margins.md reports.

    python benchmarks/margins.py results/table.csv [--seeds 0-9] [--base-runs-only] [--metric top1_k200_t0.1]
        [--write-record benchmarks/floor_record.csv]

Reads a table of `config/margins.yaml` (or any table with the floors' seeds). Per learned method (and
`supervised`, a reference): its mean over the chosen seeds, the margin over its floor's mean over all the
floor's seeds with the report's Welch interval (sslbench.report.stats.welch_margin), the smallest
per-seed value minus the floor's mean, how many seeds fall under the floor's mean, whether the issue's
bar holds (mean margin >= 5 points, interval's lower end >= 2, no seed under the floor's mean), and,
for why the floor is a distribution: the correlation of the method's value with the same seed's floor
and the sd of the margins taken seed by seed against that of the margins against the floor's mean.
``--write-record`` writes the record the leaderboards show beside the runs of the same settings
(sslbench.report.stats.floor_record), from the methods on the chosen seeds and the floors on all theirs.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from sslbench import atomic
from sslbench.report.stats import floor_record, run_floors, welch_margin


def seed_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def margin_rows(table: pd.DataFrame, seeds: list[int]) -> pd.DataFrame:
    runs = run_floors(table).set_index("method")
    by_method = {m: rows.set_index("seed")["value"] for m, rows in table.groupby("method")}
    out = []
    for method, run in runs.iterrows():
        if run["role"] != "learned" and run["method_base"] != "supervised":
            continue
        if run["floor"] not in by_method:
            print(f"{method}: its floor ({run['floor']}) has no rows in the table; left out")
            continue
        values = by_method[method].reindex(seeds).dropna()
        floor = by_method[run["floor"]]
        margin = welch_margin(values.to_numpy(), floor.to_numpy())
        per_seed = values - floor.reindex(values.index)  # against the same seed's floor
        against_mean = values - floor.mean()
        out.append(
            {
                "method": method,
                "floor": run["floor"],
                "n": margin["n"],
                "floor_n": margin["floor_n"],
                "mean": margin["mean"],
                "margin": margin["margin"],
                "ci_low": margin["ci_low"],
                "ci_high": margin["ci_high"],
                "smallest": against_mean.min(),
                "seeds_under_floor_mean": int((against_mean < 0).sum()),
                "bar_holds": margin["margin"] >= 0.05
                and margin["ci_low"] >= 0.02
                and against_mean.min() >= 0,
                "corr_with_same_seed_floor": float(np.corrcoef(values, floor.reindex(values.index))[0, 1]),
                "sd_margin_same_seed": per_seed.std(ddof=1),
                "sd_margin_floor_mean": against_mean.std(ddof=1),
            }
        )
    return pd.DataFrame(out).sort_values("margin", ascending=False) if out else pd.DataFrame()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("table")
    parser.add_argument("--seeds", default="0-9", help="the learned methods' seeds, e.g. 0-9 or 10-19")
    parser.add_argument("--protocol", default="knn")
    parser.add_argument("--metric", default="top1_k200_t0.1")
    parser.add_argument("--eval-dataset", default=None, help="default: each run's pretraining dataset")
    parser.add_argument(
        "--base-runs-only", action="store_true", help="leave out the variants of learned methods (moco[...])"
    )
    parser.add_argument(
        "--write-record", default=None, help="write the record (e.g. benchmarks/floor_record.csv)"
    )
    args = parser.parse_args()
    table = pd.read_csv(args.table)
    table = table[(table["protocol"] == args.protocol) & (table["metric"] == args.metric)]
    target = args.eval_dataset
    table = table[table["eval_dataset"] == (target or table["pretrain_dataset"])]
    if args.base_runs_only:  # a floor of another backbone is a variant of random, and stays
        table = table[(table["method"] == table["method_base"]) | (table["method_base"] == "random")]
    seeds = seed_range(args.seeds)
    rows = margin_rows(table, seeds)
    if rows.empty:
        raise SystemExit(
            f"{args.table}: no learned run with its floor's rows ({args.protocol} {args.metric})"
        )
    if args.write_record:
        floors = table["method"].isin(rows["floor"])
        chosen = table[floors | table["seed"].isin(seeds)]
        atomic.write_text(args.write_record, floor_record(chosen).to_csv(index=False))
        print(f"record of {len(rows)} methods on seeds {args.seeds} -> {args.write_record}\n")
    floors = table[table["method"].isin(rows["floor"])].groupby("method")["value"]
    print(f"floors ({args.protocol} {args.metric}):")
    print(floors.agg(["count", "mean", "std", "min", "max"]).round(4).to_markdown())
    print(f"\nmethods on seeds {args.seeds} (margins in points of {args.metric}):")
    shown = rows.assign(**{c: rows[c] * 100 for c in ("margin", "ci_low", "ci_high", "smallest")})
    shown = shown.assign(**{c: shown[c] * 100 for c in ("sd_margin_same_seed", "sd_margin_floor_mean")})
    print(shown.round(3).to_markdown(index=False))
    print(
        f"\nmedian correlation with the same seed's floor: {rows['corr_with_same_seed_floor'].median():.2f}; "
        f"median sd of the margins, seed by seed: {rows['sd_margin_same_seed'].median() * 100:.1f} points, "
        f"against the floor's mean: {rows['sd_margin_floor_mean'].median() * 100:.1f}"
    )


if __name__ == "__main__":
    main()
