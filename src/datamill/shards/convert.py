"""Conversions: a preprocessed HDF5 or a BERT Parquet into a shardset dataset, and back to one table.

HDF5 (the preprocessing format): one dataset per key at the root, first dimension = rows; a CSR
group (``layout="csr"``, ``indices`` + ``offsets``) becomes a list column; a multi-dimensional array
becomes a (nested) ``fixed_size_list`` column. A ``uid`` column (the row number) is added when the
file has none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.io import atomic_path
from datamill.shards.dataset import ShardsetDataset

__all__ = ["export", "from_bert_parquet", "from_hdf5", "hdf5_to_table"]


def _array(values: np.ndarray) -> pa.Array:
    if values.dtype.kind in ("S", "O"):
        return pa.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in values.tolist()])
    if values.ndim == 1:
        return pa.array(values)
    flat: pa.Array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def hdf5_to_table(path: str | os.PathLike[str], *, uid: str = "uid") -> pa.Table:
    """Read a preprocessed HDF5 file into a table (see the module docstring).

    Raises:
        DataFileNotFoundError: no such file.
        DataFileError: not HDF5, or datasets of different lengths.
    """
    import h5py

    name = os.fspath(path)
    if not os.path.exists(name):
        raise DataFileNotFoundError("no such HDF5 file", path=name)
    cols: dict[str, pa.Array] = {}
    try:
        with h5py.File(name, "r") as f:
            for key in f:
                obj = f[key]
                if isinstance(obj, h5py.Group):
                    if obj.attrs.get("layout") != "csr":
                        continue
                    offsets = np.asarray(obj["offsets"][()], dtype=np.int64)
                    cols[key] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(obj["indices"][()]))
                else:
                    cols[key] = _array(obj[()])
    except OSError as exc:
        raise DataFileError(f"cannot read as HDF5: {exc}", path=name) from exc
    lengths = {k: len(v) for k, v in cols.items()}
    if len(set(lengths.values())) > 1:
        raise DataFileError(f"datasets have different numbers of rows: {lengths}", path=name)
    table = pa.table(cols)
    if uid not in table.column_names:
        table = table.add_column(0, uid, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table


def from_hdf5(path: str | os.PathLike[str], root: str | os.PathLike[str], /, *, shard_size: int,
              shardset: str = "features", uid: str = "uid") -> ShardsetDataset:
    """A preprocessed HDF5 → a new shardset dataset with one shardset."""
    return ShardsetDataset.create(root, hdf5_to_table(path, uid=uid), uid=uid, shardset=shardset,
                                  shard_size=shard_size)


def from_bert_parquet(path: str | os.PathLike[str], root: str | os.PathLike[str], /, *, shard_size: int,
                      shardset: str = "bert", uid: str = "uid") -> ShardsetDataset:
    """A BERT Parquet (``build_bert_samples`` output) → a dataset; ``uid`` = row number if absent."""
    return ShardsetDataset.create(root, path, uid=uid, shardset=shardset, shard_size=shard_size, add_uid=True)


def export(ds: ShardsetDataset, out: str | os.PathLike[str], /, *, columns: Sequence[str] | None = None,
           join: str = "left") -> pa.Table:
    """Write the joined dataset to one Parquet or CSV file (atomically); returns the table.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> d = tempfile.mkdtemp()
        >>> ds = ShardsetDataset.create(d + "/ds", pa.table({"uid": [1, 2, 3]}), uid="uid", shardset="a",
        ...                             shard_size=2)
        >>> ds = ds.add("b", pa.table({"uid": [2], "y": [7]}), route=True)
        >>> export(ds, d + "/all.csv").to_pydict()
        {'uid': [1, 2, 3], 'y': [None, 7, None]}
        >>> export(ds, d + "/some.parquet", join="inner").num_rows
        1
    """
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    table = ds.to_table(columns=columns, join=join)
    target: Any = os.fspath(out)
    with atomic_path(target) as tmp:
        if target.lower().endswith(".csv"):
            pcsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)
    return table
