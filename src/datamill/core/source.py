"""The one protocol every datamill output is read through (by the loader, later the server).

A source is a sequence of shards; shard ``k`` has ``shard_sizes()[k]`` rows and is read as a pyarrow
Table with the chosen columns. Row ``i`` of the source is row ``i - offsets[k]`` of shard ``k``,
where ``offsets = concat([0], cumsum(shard_sizes()))``. The loader never cares what is behind it:
a shardset dataset, a preprocessed HDF5, a BERT/word2vec Parquet, an LM corpus.

Ragged columns are pyarrow list columns (values + offsets); fixed-size tensors are
``fixed_size_list`` (possibly nested) columns, so collation can turn them into numpy without copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

__all__ = ["Source", "TableSource"]


@runtime_checkable
class Source(Protocol):
    """Shard-structured, column-selectable, read-only data."""

    @property
    def columns(self) -> list[str]:
        """Every column a caller may select."""
        ...

    @property
    def num_shards(self) -> int:
        """Number of shards."""
        ...

    def shard_sizes(self) -> NDArray[np.int64]:
        """Rows per shard, shape ``(num_shards,)``."""
        ...

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        """Shard ``index`` with the chosen columns (all when ``None``), exactly ``shard_sizes()[index]`` rows."""
        ...

    def fingerprint(self) -> str:
        """A stable identity of the content (used to check that a resume state fits)."""
        ...


class TableSource:
    """An in-memory pyarrow Table cut into shards of ``shard_size`` rows: the simplest Source.

    Examples:
        >>> src = TableSource(pa.table({"x": list(range(5))}), shard_size=2)
        >>> src.num_shards, src.shard_sizes().tolist(), src.read_shard(2).to_pydict()
        (3, [2, 2, 1], {'x': [4]})
        >>> isinstance(src, Source)
        True
    """

    def __init__(self, table: pa.Table, *, shard_size: int = 65536) -> None:
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.table = table
        self.shard_size = shard_size

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)

    @property
    def num_shards(self) -> int:
        return max(1, -(-self.table.num_rows // self.shard_size)) if self.table.num_rows else 0

    def shard_sizes(self) -> NDArray[np.int64]:
        n, s = self.table.num_rows, self.shard_size
        sizes = np.full(self.num_shards, s, dtype=np.int64)
        if len(sizes):
            sizes[-1] = n - s * (len(sizes) - 1)
        return sizes

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        t = self.table.slice(index * self.shard_size, self.shard_size)
        return t if columns is None else t.select(list(columns))

    def fingerprint(self) -> str:
        from datamill.core.fingerprint import fingerprint_obj

        return fingerprint_obj([self.table.schema.to_string(), self.table.num_rows, self.shard_size,
                                [c.to_pylist()[:1] for c in self.table.slice(0, 1).columns]])
