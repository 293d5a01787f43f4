"""One line per run of a results/table.csv: each protocol's headline metric, averaged over seeds, as
RESULTS.md's tables show them.

    python benchmarks/summary_table.py results/table.csv [--seeds 0-2] [--dataset digits]

Columns (a protocol the table lacks is left out): kNN top-1 (k 200, T 0.1), linear top-1, finetune top-1,
semisup top-1 on 1 % and 10 % of the labels, the low-shot SVM's mAP at 4 images a class, clustering NMI;
`seeds` is how many seeds each line averages. Rows sorted by kNN, best first. Evaluated on the pretraining
set unless `--dataset` names a transfer target.
"""

import argparse

import pandas as pd

COLUMNS = {  # (protocol, metric): header
    ("knn", "top1_k200_t0.1"): "kNN k200",
    ("linear", "top1"): "linear",
    ("finetune", "top1"): "finetune",
    ("semisup", "top1_1pct"): "semisup 1%",
    ("semisup", "top1_10pct"): "semisup 10%",
    ("lowshot_svm", "map_k4_mean"): "SVM k4 mAP",
    ("clustering", "nmi"): "NMI",
}


def seed_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def summary(table: pd.DataFrame, seeds: list[int], dataset: str | None) -> pd.DataFrame:
    rows = table[table["seed"].isin(seeds)]
    rows = rows[rows["eval_dataset"] == (dataset or rows["pretrain_dataset"])]
    picked = rows.set_index(["protocol", "metric"]).index.isin(list(COLUMNS))
    if not picked.any():
        raise SystemExit(f"no rows of seeds {seeds} evaluated on {dataset or 'the pretraining set'}")
    rows = rows[picked].assign(
        header=[COLUMNS[key] for key in zip(rows["protocol"][picked], rows["metric"][picked])]
    )
    means = rows.pivot_table(index="method", columns="header", values="value", aggfunc="mean")
    means = means[[h for h in COLUMNS.values() if h in means.columns]]
    counts = rows[rows["header"] == "kNN k200"].groupby("method")["seed"].nunique().rename("seeds")
    order = "kNN k200" if "kNN k200" in means.columns else means.columns[0]
    return means.join(counts).sort_values(order, ascending=False).round(3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("table")
    parser.add_argument("--seeds", default="0-2", help="a range, e.g. 0-2 (default) or 0-9")
    parser.add_argument(
        "--dataset", default=None, help="the evaluation dataset (default: the pretraining set)"
    )
    args = parser.parse_args()
    print(summary(pd.read_csv(args.table), seed_range(args.seeds), args.dataset).to_markdown())


if __name__ == "__main__":
    main()
