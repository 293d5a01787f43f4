"""Compare the values of two results/table.csv files, row by row.

    python benchmarks/compare_tables.py A/results/table.csv B/results/table.csv

Rows are matched by (pretraining dataset, evaluation dataset, method, seed, protocol, metric). Prints
how many values are bit-identical, how many differ (the largest difference and a few examples), and the
rows only one table has; exits 1 unless every value of both tables is identical.
"""

import sys

import pandas as pd

KEY = ["pretrain_dataset", "eval_dataset", "method", "seed", "protocol", "metric"]


def main(first: str, second: str) -> int:
    a, b = (pd.read_csv(path).set_index(KEY)["value"] for path in (first, second))
    for path, table in ((first, a), (second, b)):
        if table.index.has_duplicates:
            print(f"{path}: rows with the same key: {table.index[table.index.duplicated()][:3].tolist()}")
            return 1
    shared = a.index.intersection(b.index)
    left, right = a[shared], b[shared]
    same = (left == right) | (left.isna() & right.isna())
    print(f"{len(shared)} shared rows: {int(same.sum())} identical, {int((~same).sum())} different")
    if (~same).any():
        gap = (left - right).abs()[~same]
        print(f"largest difference {gap.max():.3g}; first differences:")
        print(pd.DataFrame({"first": left[~same], "second": right[~same]}).head(10).to_string())
    only = {first: a.index.difference(b.index), second: b.index.difference(a.index)}
    for path, rows in only.items():
        if len(rows):
            print(f"{len(rows)} rows only in {path}, e.g. {rows[0]}")
    return 0 if same.all() and not any(len(rows) for rows in only.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
