"""scikit-learn's bundled 8x8 digits; a fixed stratified 75/25 split (1347 / 450)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sslbench.data.files import DatasetError
from sslbench.data.spec import DatasetSpec

if TYPE_CHECKING:
    from sslbench.data.containers import Dataset

# The rows of scikit-learn's digits in each split (the loader reads the images by them).
DIGITS_SPLIT_FILE = Path(__file__).with_name("digits_split.txt")


def digits_split() -> dict[str, list[int]]:
    """{split: the rows of scikit-learn's digits in it}, as DIGITS_SPLIT_FILE stores them (train's line,
    then test's, after the comments)."""
    lines = [line for line in DIGITS_SPLIT_FILE.read_text().splitlines() if not line.startswith("#")]
    return {split: [int(row) for row in line.split()] for split, line in zip(("train", "test"), lines)}


def load_digits(root=None, download=False, image_size=None) -> Dataset:
    """scikit-learn's bundled 8x8 digits; fixed stratified 75/25 split (1347 / 450).

    Read from the file scikit-learn ships (the one its load_digits reads), split by the row lists in
    digits_split.txt (its stratified train_test_split, random_state 0): importing scikit-learn would
    cost every job that loads digits more than a second.
    """
    import gzip
    import importlib.util

    import numpy as np

    from sslbench.data.containers import Dataset, in_memory

    package = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if package is None or not package.submodule_search_locations:
        raise DatasetError("dataset digits: scikit-learn is not installed; `pip install scikit-learn`")
    path = Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",")  # 64 pixels (0..16) and the label per row
    images = np.rint(rows[:, :-1].reshape(-1, 1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    labels = rows[:, -1].astype(np.int64)
    split = digits_split()
    train, test = (np.array(split[name], dtype=np.int64) for name in ("train", "test"))
    return Dataset(
        name="digits",
        train=in_memory(images[train], labels[train]),
        test=in_memory(images[test], labels[test]),
        num_classes=10,
        channels=1,
        image_size=8,
        class_names=[str(d) for d in range(10)],
    )


def split_sizes(section: dict) -> dict[str, int]:
    return {split: len(rows) for split, rows in digits_split().items()}


DIGITS = DatasetSpec(
    name="digits",
    loader=load_digits,
    source="the copy scikit-learn ships (sklearn/datasets/data/digits.csv.gz)",
    split_sizes=split_sizes,
    channels=1,
)
