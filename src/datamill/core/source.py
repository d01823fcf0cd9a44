"""The one protocol every datamill output is read through (by the loader and the server).

A source is a sequence of shards; shard ``k`` has ``shard_sizes()[k]`` rows and is read as a pyarrow
Table with the chosen columns. Row ``i`` of the source is row ``i - offsets[k]`` of shard ``k``,
where ``offsets = concat([0], cumsum(shard_sizes()))``. The loader never cares what is behind it:
a shardset dataset, a preprocessed HDF5, a BERT/word2vec Parquet, an LM corpus.

Ragged columns are pyarrow list columns (values + offsets); fixed-size tensors are
``fixed_size_list`` (possibly nested) columns, so collation can turn them into numpy without copies.

The contract every implementation keeps (checked by ``tests/contracts.py``):

* ``read_shard(k)`` returns exactly ``shard_sizes()[k]`` rows, columns in the order asked for;
* an out-of-range shard index raises :class:`~datamill.core.errors.ConfigError` (``shard`` set),
  an unknown column :class:`~datamill.core.errors.SchemaError` (``column`` set): use
  :func:`check_read_args`;
* ``fingerprint()`` changes when the content does;
* ``uid_column`` names the column that identifies a sample, or is ``None``.

Capabilities that write a format register how to recognise and open it (:func:`register_source`);
``datamill.loader.sources.open_source`` walks the registry, so the loader never imports a producer.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.checks import SHARD_SIZE, check_int
from datamill.core.errors import ConfigError, SchemaError

__all__ = [
    "FixedShards",
    "FixedShardsSource",
    "SchemaColumns",
    "Source",
    "SourceEntry",
    "TableSource",
    "check_read_args",
    "register_source",
    "register_url_source",
    "registered_sources",
    "take_rows",
    "uid_column_of",
    "uid_from_text",
    "url_source",
]


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
        """Shard ``index`` with the chosen columns (all when ``None``), exactly
        ``shard_sizes()[index]`` rows."""
        ...

    def fingerprint(self) -> str:
        """A stable identity of the content (used to check that a resume state fits)."""
        ...


def uid_column_of(source: object) -> str | None:
    """The source's ``uid_column`` attribute, ``None`` when it has none."""
    value = getattr(source, "uid_column", None)
    return value if isinstance(value, str) else None


def uid_from_text(text: str, uid_type: pa.DataType | None) -> Any:
    """A UID as a person types it (a command's argument, the web UI's search box) in the type of the
    dataset's UIDs: an integer (``1,234`` too) when they are integers or sample numbers
    (``uid_type`` ``None``), ``None`` when the text is no integer; the text for any other type.

    Examples:
        >>> uid_from_text(" 1,234", pa.int32()), uid_from_text("x", None)
        (1234, None)
        >>> uid_from_text("x", pa.string())
        'x'
    """
    if uid_type is not None and not pa.types.is_integer(uid_type):
        return text
    try:
        return int(text.strip().replace(",", ""))
    except ValueError:
        return None


def take_rows(
    source: Source, rows: Sequence[int] | NDArray[np.int64], columns: Sequence[str] | None = None
) -> pa.Table:
    """Rows ``rows`` of ``source`` (row numbers in shard order; any order, repeats allowed), in that
    order: only their shards are read (``datamill trace --show`` and the web UI's samples).

    Examples:
        >>> src = TableSource(pa.table({"x": [0, 10, 20, 30]}), shard_size=2)
        >>> take_rows(src, [3, 0, 3])["x"].to_pylist()
        [30, 0, 30]
        >>> take_rows(src, []).schema.field("x").type
        DataType(int64)
    """
    s = np.asarray(rows, dtype=np.int64)
    cols = list(source.columns) if columns is None else list(columns)
    offsets = np.concatenate([[0], np.cumsum(source.shard_sizes())]).astype(np.int64)
    shard = np.searchsorted(offsets, s, side="right") - 1
    needed = np.unique(shard)
    if not len(needed):  # no row asked: the columns' own types, learnt from the first shard
        if not source.num_shards:
            return pa.table({c: pa.array([], pa.null()) for c in cols})
        return source.read_shard(0, columns=cols).replace_schema_metadata(None).slice(0, 0)
    tables = [source.read_shard(int(k), columns=cols).replace_schema_metadata(None) for k in needed]
    base = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64)
    where = base[np.searchsorted(needed, shard)] + (s - offsets[shard])
    return (tables[0] if len(tables) == 1 else pa.concat_tables(tables)).take(pa.array(where))


def check_read_args(
    source: Source,
    index: int,
    columns: Sequence[str] | None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Validate ``read_shard`` arguments the same way in every Source; returns the columns to read.

    Raises:
        ConfigError: ``index`` is not a shard of the source (``shard`` attribute set).
        SchemaError: a column is unknown (``column`` attribute set).

    Examples:
        >>> src = TableSource(pa.table({"x": [1, 2, 3]}), shard_size=2)
        >>> check_read_args(src, 1, None)
        ['x']
        >>> check_read_args(src, 2, None)
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: shard 2: shard index out of range [0, 2)...
    """
    n = source.num_shards
    if (
        isinstance(index, bool)
        or not isinstance(index, numbers.Integral)
        or not 0 <= int(index) < n
    ):
        raise ConfigError(
            f"shard index out of range [0, {n})",
            path=path,
            shard=int(index) if isinstance(index, (int, np.integer)) else str(index),
        )
    have = source.columns
    if columns is None:
        return list(have)
    cols = [columns] if isinstance(columns, str) else list(columns)
    unknown = [c for c in cols if c not in have]
    if unknown:
        raise SchemaError(
            f"unknown column(s) {unknown}; the source has {have}", path=path, column=unknown[0]
        )
    return cols


class FixedShards:
    """Fixed-size shard arithmetic: ``num_rows`` rows cut into shards of ``shard_size`` (the last
    shorter).

    Examples:
        >>> fs = FixedShards(5, 2)
        >>> fs.num_shards, fs.sizes().tolist(), fs.bounds(2)
        (3, [2, 2, 1], (4, 5))
        >>> FixedShards(0, 2).num_shards
        0
    """

    __slots__ = ("num_rows", "shard_size")

    def __init__(self, num_rows: int, shard_size: int) -> None:
        self.shard_size: int = SHARD_SIZE(shard_size)
        self.num_rows = check_int(num_rows, name="num_rows", low=0, high=None)

    @property
    def num_shards(self) -> int:
        """Number of shards (0 for no rows)."""
        return -(-self.num_rows // self.shard_size)

    def sizes(self) -> NDArray[np.int64]:
        """Rows per shard."""
        sizes = np.full(self.num_shards, self.shard_size, dtype=np.int64)
        if len(sizes):
            sizes[-1] = self.num_rows - self.shard_size * (len(sizes) - 1)
        return sizes

    def bounds(self, index: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of shard ``index``."""
        lo = int(index) * self.shard_size
        return lo, min(self.num_rows, lo + self.shard_size)


class FixedShardsSource:
    """Mixin of a source cut into :class:`FixedShards` (``self._shards``): its shard count and
    sizes."""

    _shards: FixedShards

    @property
    def num_shards(self) -> int:
        """Number of shards."""
        return self._shards.num_shards

    def shard_sizes(self) -> NDArray[np.int64]:
        """Rows per shard (the last may be shorter)."""
        return self._shards.sizes()


class SchemaColumns:
    """Mixin of a source that keeps its ``schema``: its ``columns`` are the schema's names."""

    schema: pa.Schema

    @property
    def columns(self) -> list[str]:
        """The source's columns (its schema's names)."""
        return list(self.schema.names)


class TableSource(FixedShardsSource):
    """An in-memory pyarrow Table cut into shards of ``shard_size`` rows: the simplest Source.

    Examples:
        >>> src = TableSource(pa.table({"x": list(range(5))}), shard_size=2)
        >>> src.num_shards, src.shard_sizes().tolist(), src.read_shard(2).to_pydict()
        (3, [2, 2, 1], {'x': [4]})
        >>> isinstance(src, Source)
        True
    """

    def __init__(
        self, table: pa.Table, *, shard_size: int = 65536, uid_column: str | None = None
    ) -> None:
        if not isinstance(table, pa.Table):
            raise TypeError(f"TableSource takes a pyarrow Table, got {type(table).__name__}")
        self.table = table
        self._shards = FixedShards(table.num_rows, shard_size)
        self.shard_size = self._shards.shard_size
        if uid_column is not None and uid_column not in table.column_names:
            raise SchemaError(
                f"uid_column {uid_column!r} is not a column of the table", column=uid_column
            )
        self.uid_column = uid_column
        self._fingerprint: str | None = None

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        cols = check_read_args(self, index, columns)
        lo, hi = self._shards.bounds(index)
        return self.table.slice(lo, hi - lo).select(cols)

    def fingerprint(self) -> str:
        """A hash of the whole table's content (Arrow IPC bytes), computed once."""
        if self._fingerprint is None:
            import io

            from datamill.core.fingerprint import fingerprint_bytes, fingerprint_obj

            sink = io.BytesIO()
            with pa.ipc.new_stream(sink, self.table.schema) as w:
                w.write_table(self.table)
            self._fingerprint = fingerprint_obj(
                ["datamill.TableSource@2", fingerprint_bytes(sink.getvalue()), self.shard_size]
            )
        return self._fingerprint


@dataclass(frozen=True)
class SourceEntry:
    """How one format is recognised (``marker(path) -> bool``) and opened (``opener(path) ->
    Source``)."""

    name: str
    marker: Callable[[Path], bool]
    opener: Callable[[Path], Source]
    priority: int = 0


_REGISTRY: dict[str, SourceEntry] = {}


def register_source(
    name: str,
    *,
    marker: Callable[[Path], bool],
    opener: Callable[[Path], Source],
    priority: int = 0,
) -> None:
    """Register a format's ``(marker, opener)``; higher ``priority`` is tried first (ties: by name).

    Re-registering a name replaces the entry (modules may be reloaded).

    Examples:
        >>> register_source(
        ...     "doc-example", marker=lambda p: p.suffix == ".never", opener=lambda p: None
        ... )
        >>> "doc-example" in registered_sources()
        True
        >>> _ = _REGISTRY.pop("doc-example")
    """
    _REGISTRY[name] = SourceEntry(name, marker, opener, priority)


def registered_sources() -> dict[str, SourceEntry]:
    """Registered formats, in the order they are tried."""
    return {e.name: e for e in sorted(_REGISTRY.values(), key=lambda e: (-e.priority, e.name))}


_URL_REGISTRY: dict[str, Callable[..., Source]] = {}


def register_url_source(scheme: str, *, opener: Callable[..., Source]) -> None:
    """Register the opener of source URLs ``<scheme>://...`` and ``<scheme>+<storage>://...``
    (table formats: ``delta://``, ``iceberg+s3://``); ``opener(url, *, cache_dir, cache_limit,
    filesystem)`` returns the Source.

    Examples:
        >>> register_url_source("doc-example", opener=lambda url, **kw: None)
        >>> url_source("doc-example+s3://b/t") is not None, url_source("s3://b/t")
        (True, None)
        >>> _ = _URL_REGISTRY.pop("doc-example")
    """
    _URL_REGISTRY[scheme] = opener


def url_source(url: Any) -> Callable[..., Source] | None:
    """The opener registered for ``url``'s scheme (:func:`register_url_source`), or ``None``."""
    text = os.fspath(url) if isinstance(url, (str, os.PathLike)) else None
    if not isinstance(text, str) or "://" not in text:
        return None
    return _URL_REGISTRY.get(text.partition("://")[0].partition("+")[0])
