"""Missing values, block by block: mergeable statistics, fill values, and ``bfill``/``ffill``
carries.

Strategies (Ludwig's): ``fill_with_const`` (``fill_value``), ``fill_with_mode``, ``fill_with_mean``
(numbers), ``fill_with_false`` and ``fill_with_true`` (binary), ``bfill``, ``ffill`` (from the
neighbouring rows of the same dataset; leftover edge nulls fall back to the type's constant),
``drop_row``. Which strategies a type accepts and its defaults are declared by its handler class
(:class:`~datamill.preprocessing.features.base.FeatureHandler`).

Everything here is decomposable into blocks: :func:`fit_missing` gives one block's
:class:`MissingStats` (sum and count for the mean, value counts for the mode, the first and last
non-null values for ``bfill``/``ffill``), :meth:`MissingStats.merge` combines them in block order,
:func:`carries` gives every block the value ``ffill`` carries into it from the blocks before and
``bfill`` from the blocks after, and :func:`apply_fill` fills one block with them. The result equals
filling the whole column at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = ["Carry", "MissingStats", "STRATEGIES", "apply_fill", "carries", "fit_missing"]  # noqa: RUF022 - Python sorted() order (house rule)

STRATEGIES = (
    "fill_with_const",
    "fill_with_mode",
    "fill_with_mean",
    "fill_with_false",
    "fill_with_true",
    "bfill",
    "ffill",
    "drop_row",
)

#: strategies whose fill value comes from statistics of the fit rows
FITTED = ("fill_with_mean", "fill_with_mode", "fill_with_false", "fill_with_true")
#: strategies that take values from the neighbouring rows
NEIGHBOURS = ("bfill", "ffill")


@dataclass(frozen=True)
class Carry:
    """What ``ffill`` carries into a block (the last non-null value before it) and ``bfill`` (the
    first after)."""

    before: Any = None
    after: Any = None


@dataclass(frozen=True)
class MissingStats:
    """Mergeable missing-value statistics of one block of a column.

    ``count``/``total``: non-null fit rows and their sum (``fill_with_mean``);
    ``values``/``counts``:
    distinct non-null fit values and their counts (``fill_with_mode``); ``first``/``last``: the
    block's first and last non-null values over all rows (``bfill``/``ffill``).
    """

    count: int = 0
    total: float = 0.0
    values: pa.Array | None = None
    counts: NDArray[np.int64] | None = None
    first: Any = None
    last: Any = None

    def merge(self, later: MissingStats) -> MissingStats:
        """Combine with the statistics of the block that follows this one."""
        values, counts = self.values, self.counts
        if later.values is not None and later.counts is not None:
            if values is None or counts is None:
                values, counts = later.values, later.counts
            else:
                table = pa.table(
                    {
                        "v": pa.concat_arrays([values, later.values]),
                        "c": pa.array(np.concatenate([counts, later.counts]), pa.int64()),
                    }
                )
                agg = table.group_by("v").aggregate([("c", "sum")])
                values = agg.column("v").combine_chunks()
                counts = agg.column("c_sum").to_numpy().astype(np.int64)
        return MissingStats(
            self.count + later.count,
            self.total + later.total,
            values,
            counts,
            self.first if self.first is not None else later.first,
            later.last if later.last is not None else self.last,
        )

    def mean(self) -> float | None:
        """Mean of the non-null fit values (None when there are none)."""
        return self.total / self.count if self.count else None

    def mode(self) -> Any:
        """The most frequent fit value, ties broken by the smallest (None when there are none)."""
        if self.values is None or self.counts is None or len(self.counts) == 0:
            return None
        best = np.flatnonzero(self.counts == self.counts.max())
        return pc.min(self.values.take(pa.array(best))).as_py()


def fit_missing(
    column: pa.Array, strategy: str, fit_mask: NDArray[np.bool_] | None
) -> MissingStats:
    """One block's :class:`MissingStats` for ``strategy`` (only what that strategy needs is
    computed).

    ``fit_mask`` selects the fit (train) rows for the fitted strategies; ``None``: every row.

    Examples:
        >>> a = fit_missing(pa.array([1.0, None]), "fill_with_mean", None)
        >>> b = fit_missing(pa.array([None, 5.0, 3.0]), "fill_with_mean", None)
        >>> a.merge(b).mean()
        3.0
    """
    if strategy in FITTED:
        fit = column.filter(pa.array(fit_mask)) if fit_mask is not None else column
        valid = fit.drop_null()
        if strategy == "fill_with_mean":
            total = pc.sum(valid).as_py() if len(valid) else 0.0
            return MissingStats(count=len(valid), total=float(total or 0.0))
        if len(valid) == 0:
            return MissingStats()
        vc = pc.value_counts(valid)
        return MissingStats(
            values=vc.field("values"),
            counts=vc.field("counts").to_numpy(zero_copy_only=False).astype(np.int64),
        )
    if strategy in NEIGHBOURS and len(column) > column.null_count:
        valid = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
        return MissingStats(
            first=column[int(valid[0])].as_py(), last=column[int(valid[-1])].as_py()
        )
    return MissingStats()


def carries(blocks: list[MissingStats]) -> list[Carry]:
    """Per block, the last non-null value of the blocks before it and the first of the blocks after
    it.

    Examples:
        >>> s = [MissingStats(first=1, last=2), MissingStats(), MissingStats(first=5, last=6)]
        >>> [(c.before, c.after) for c in carries(s)]
        [(None, 5), (2, 5), (2, None)]
    """
    before: list[Any] = []
    last = None
    for s in blocks:
        before.append(last)
        last = s.last if s.last is not None else last
    after: list[Any] = []
    first = None
    for s in reversed(blocks):
        after.append(first)
        first = s.first if s.first is not None else first
    return [Carry(b, a) for b, a in zip(before, reversed(after))]


def apply_fill(
    column: pa.Array | pa.ChunkedArray,
    strategy: str,
    fill: Any,
    *,
    carry: Carry | None = None,
    edge_fill: Any = None,
) -> pa.Array:
    """Fill the nulls of one block of ``column`` (already cast to the handler's type).

    ``fill``: the value of the constant / fitted strategies. ``bfill``/``ffill`` take values from
    the neighbouring rows, then from ``carry`` (the neighbouring blocks), then ``edge_fill``.

    Examples:
        >>> apply_fill(
        ...     pa.array([None, 1.0, None]), "ffill", None, carry=Carry(before=7.0), edge_fill=0.0
        ... ).to_pylist()
        [7.0, 1.0, 1.0]
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count == 0:
        return column
    if strategy in NEIGHBOURS:
        column = (
            pc.fill_null_forward(column) if strategy == "ffill" else pc.fill_null_backward(column)
        )
        neighbour = (
            None if carry is None else (carry.before if strategy == "ffill" else carry.after)
        )
        if column.null_count and neighbour is not None:
            column = pc.fill_null(column, pa.scalar(neighbour, column.type))
        if column.null_count == 0:
            return column
        fill = edge_fill
    if fill is None:
        return column
    return pc.fill_null(column, pa.scalar(fill, column.type))
