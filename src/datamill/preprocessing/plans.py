"""The data of the preprocessing pipeline: the :class:`Plan` and what passes between its stages.

:class:`Plan` (made by :func:`datamill.preprocessing.pipeline.plan`) holds everything decided before
the data is read; :class:`Block` is one prepared block of rows, :class:`Origin` where its rows come
from, :class:`Stats` what ``fit`` learnt. All are plain, picklable data, so an executor can ship
them to other processes or machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.preprocessing.balance import Balance
from datamill.preprocessing.config import PreprocessConfig, ResolvedFeature, SplitConfig
from datamill.preprocessing.features import FeatureContext
from datamill.preprocessing.missing import Carry
from datamill.preprocessing.split import SplitState

__all__ = ["Block", "Origin", "Plan", "Stats"]


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything decided before the data is read (see :func:`plan`)."""

    config: PreprocessConfig
    config_source: str | None
    features: tuple[ResolvedFeature, ...]
    #: input column → the type it is read as ("string", "float64", "raw")
    wanted: dict[str, str]
    split: SplitConfig | None
    seed: int
    #: the metadata being applied (nothing fitted, no split), or None
    applied: dict[str, Any] | None = None
    #: display name of the input file (None: in memory)
    source: str | None = None
    fingerprint: str = ""
    input_fingerprint: str | None = None
    hdf5_path: Path | None = None
    meta_path: Path | None = None
    block_rows: int = 1 << 16
    #: what the split fitted over the whole input (:func:`~datamill.preprocessing.pipeline.bind`),
    # None before
    split_state: SplitState | None = None
    #: output columns that may be absent from the input (applying metadata: inference data has no
    # targets)
    optional: tuple[str, ...] = ()
    #: rows kept by sampling: those whose rank in the sampling permutation is below this (None:
    # every row)
    sample_cut: float | None = None
    #: the input rows the sample is drawn from (the permutation's length)
    sample_rows: int = 0
    #: class balancing of the training rows (fitted by ``bind``), None: none
    balance: Balance | None = None

    def block_ranges(self, num_rows: int) -> list[tuple[int, int]]:
        """The ``(lo, hi)`` input rows of each block (one block when the input is empty)."""
        return [
            (lo, min(num_rows, lo + self.block_rows))
            for lo in range(0, max(num_rows, 1), self.block_rows)
        ]


@dataclass(frozen=True)
class Origin:
    """Where the input rows come from, for error locations and relative paths."""

    path: str | None
    base_dir: Path | None
    line_offset: (
        int | None
    )  # line of input row 0 (CSV/TSV 2, JSONL 1), None for row-addressed formats


@dataclass(frozen=True, eq=False)
class Block:
    """One block of prepared rows: per-feature cast columns (``drop_row`` rows removed) and split
    ids."""

    index: int
    lo: int  # global input row of the block's first row
    num_rows: int  # rows kept
    columns: dict[str, pa.Array]
    split: NDArray[np.int8] | None
    rows: NDArray[np.int64] | None  # global input row of each kept row (None: none dropped)
    origin: Origin

    @property
    def fit_mask(self) -> NDArray[np.bool_] | None:
        """The fit (train) rows, or None when there is no split (every row fits)."""
        return None if self.split is None else self.split == 0

    def context(self, f: ResolvedFeature) -> FeatureContext:
        """The handler context of feature ``f`` in this block."""
        o = self.origin
        return FeatureContext(
            f.name, f.column, o.path, o.base_dir, self.lo, o.line_offset, rows=self.rows
        )


@dataclass(eq=False)
class Stats:
    """What :func:`fit` learnt, merged in block order."""

    num_rows: int
    origin: Origin
    fills: dict[str, Any]  # feature → computed_fill_value
    carries: list[dict[str, Carry]]  # per block: feature → values carried in by ffill/bfill
    features: dict[str, Any]  # feature → merged handler statistics (empty when metadata is applied)
    split_counts: list[int] | None
    tokens: list[dict[str, Any]] = field(
        default_factory=list
    )  # per block: fit's tokens, for its transform
