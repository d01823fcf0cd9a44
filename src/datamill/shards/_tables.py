"""Input tables for shardset writes: a pa.Table, or a Parquet/CSV/HDF5 file (local or URI) read into
one."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa

from datamill.core.errors import SchemaError
from datamill.core.io import read_table
from datamill.preprocessing.hdf5 import HDF5Source
from datamill.shards._fs import file_format, read_any, resolve

__all__ = ["ShardInput", "TableInput", "conform", "hdf5_to_table", "load_table"]

TableInput: TypeAlias = "pa.Table | str | os.PathLike[str]"
"""One table: an in-memory table or a Parquet / CSV / preprocessed HDF5 file (path or URI)."""
ShardInput: TypeAlias = "TableInput | Sequence[str | os.PathLike[str]]"
"""One table, or a list of shard files (Parquet/CSV; their order is the shard index)."""

_HDF5_READ_ROWS = 1 << 20  # rows per HDF5 read (one shard of the HDF5Source)


def hdf5_to_table(path: str | os.PathLike[str], *, uid: str = "uid") -> pa.Table:
    """Read a preprocessed HDF5 file into one table through
    :class:`~datamill.preprocessing.hdf5.HDF5Source`.

    A CSR group becomes a list column, a multi-dimensional dataset a (nested) ``fixed_size_list``
    column; ``uid`` (the row number) is added when the file has no such column.

    Raises:
        DataFileNotFoundError: no such file.
        DataFileError: not HDF5, no datasets, or datasets of different lengths.

    Examples:
        >>> import tempfile, h5py
        >>> p = tempfile.mkdtemp() + "/t.hdf5"
        >>> with h5py.File(p, "w") as f:
        ...     _ = f.create_dataset("img", data=np.zeros((2, 3), np.uint8))
        >>> t = hdf5_to_table(p)
        >>> t.column_names, t.num_rows, str(t.schema.field("img").type)
        (['uid', 'img'], 2, 'fixed_size_list<item: uint8>[3]')
    """
    src = HDF5Source(path, shard_size=_HDF5_READ_ROWS)
    if src.num_shards:
        parts = [src.read_shard(k) for k in range(src.num_shards)]
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    else:
        table = pa.table({c: pa.array([], pa.null()) for c in src.columns})
    if uid not in table.column_names:
        table = table.add_column(0, uid, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table


def load_table(source: TableInput, *, uid: str | None = None, add_uid: bool = False) -> pa.Table:
    """A pa.Table, or a Parquet/CSV/HDF5 file (local or URI) read into one; ``add_uid`` adds row
    numbers."""
    if isinstance(source, pa.Table):
        table = source
    else:
        text = os.fspath(source)
        if text.lower().endswith((".hdf5", ".h5")):
            return hdf5_to_table(text, uid=uid or "uid")
        if "://" in text:
            loc = resolve(text)
            table = read_any(loc.fs, loc.path, display=text)
        else:
            # local: the core reader names the line of a bad CSV row, checks UTF-8, reads zip
            # members
            file_format(text.rsplit(":", 1)[-1] if ".zip:" in text else text)
            table = read_table(text)
    if add_uid and uid is not None and uid not in table.column_names:
        table = table.add_column(0, uid, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table


def conform(table: pa.Table, schema: pa.Schema | None, *, display: str, k: int) -> pa.Table:
    """``table`` without schema metadata, columns in ``schema``'s order and cast to its types."""
    table = table.replace_schema_metadata(None)
    if schema is None:
        return table
    if sorted(table.column_names) != sorted(schema.names):
        raise SchemaError(
            f"expected columns {sorted(schema.names)}, got {sorted(table.column_names)}",
            path=display,
            shard=k,
            hint="every shard of a shardset has the same columns",
        )
    table = table.select(schema.names)
    if table.schema.equals(schema):
        return table
    try:
        return table.cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise SchemaError(
            f"column types differ from the first shard: {exc}", path=display, shard=k
        ) from exc
