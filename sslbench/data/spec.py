"""What the suite knows of one dataset: its ``DatasetSpec``, defined at the top level of its module of
``sslbench/data/datasets/``, where ``sslbench.data.registry`` finds it.

The planner imports every dataset module at each plan to read the specs (names, file checks, split
sizes, which datasets are prepared or multi-label), and a plan of nothing to do takes ~3 s where
importing torch alone takes more: so a dataset module imports torch and the helpers that use it
(``containers``, ``images``) inside its loader, never at its top level (numpy and PIL too, where it
can: each adds a tenth of a second to every plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sslbench.data.containers import Dataset
    from sslbench.data.files import FileSpec


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: how it loads, where its files are, and what the planner may know without loading it."""

    name: str  # a dataset section's `name`
    # (root, download, image_size, **options) -> Dataset, a train and a test ImageSet; its other keyword
    # arguments are the section's `options`
    loader: Callable[..., Dataset]
    source: str  # where its files come from, in words
    # (root, download, **options) -> where its files are looked for; None: it ships with a Python package
    files: Callable[..., FileSpec] | None = None
    # a section -> {split: images}, read without loading the images (None where it cannot tell)
    split_sizes: Callable[[dict], dict[str, int] | None] | None = None
    # decoded from its files batch by batch (ImageSet.paths); the others are held in memory, and the DAG
    # prepares them once per section (`sslbench prepare`)
    lazy: bool = False
    multilabel: bool = False  # labels [N, classes] in the VOC devkit's codes: no `subset`, few protocols
    channels: int | None = None  # of the images it loads, where fixed
    # whether the first job's preflight loads it; False: its files are only looked for (reading an
    # ImageNet-size folder is its first job's work)
    preflight_load: bool = True
