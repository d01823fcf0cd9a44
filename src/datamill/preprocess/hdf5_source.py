"""``HDF5Source``: a preprocessed HDF5 file read as a :class:`~datamill.core.source.Source`.

One dataset per column at the root, first dimension = rows; multi-dimensional datasets become nested
``fixed_size_list`` columns; CSR groups ``indices``/``offsets`` with ``layout="csr"`` become list
columns; shards are row ranges.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.constants import HDF5_SUFFIX
from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.parquet import tail_hash
from datamill.core.source import FixedShards, check_read_args, register_source

__all__ = ["HDF5Source"]


def _h5py() -> Any:
    import h5py

    return h5py


class HDF5Source:
    """A preprocessed HDF5 file: each root dataset (or CSR group) a column, row ranges as shards.

    Args:
        path: the ``.hdf5`` file.
        shard_size: rows per shard. Defaults to ``65536``.

    Raises:
        DataFileNotFoundError: no such file. DataFileError: not HDF5, or columns of different lengths.

    Examples:
        >>> import tempfile, h5py
        >>> p = Path(tempfile.mkdtemp()) / "d.hdf5"
        >>> with h5py.File(p, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(5)); _ = f.create_dataset("img", data=np.zeros((5, 2, 3)))
        >>> src = HDF5Source(p, shard_size=2)
        >>> src.columns, src.shard_sizes().tolist(), str(src.read_shard(2).schema.field("img").type)
        (['img', 'x'], [2, 2, 1], 'fixed_size_list<item: fixed_size_list<item: double>[3]>[2]')
    """

    def __init__(self, path: str | os.PathLike[str], *, shard_size: int = 65536) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataFileNotFoundError("no such HDF5 file", path=self.path)
        FixedShards(0, shard_size)  # validates shard_size
        self.shard_size = int(shard_size)
        h5py = _h5py()
        lengths: dict[str, int] = {}
        self._csr: set[str] = set()
        try:
            with h5py.File(self.path, "r") as f:
                for name in sorted(f.keys()):
                    obj = f[name]
                    if isinstance(obj, h5py.Group):
                        if obj.attrs.get("layout") != "csr":
                            continue
                        self._csr.add(name)
                        lengths[name] = int(obj["offsets"].shape[0]) - 1
                    else:
                        lengths[name] = int(obj.shape[0]) if obj.shape else 1
        except OSError as exc:
            raise DataFileError(f"not a readable HDF5 file ({exc})", path=self.path) from exc
        if not lengths:
            raise DataFileError("HDF5 file has no datasets at its root", path=self.path)
        if len(set(lengths.values())) > 1:
            raise DataFileError(f"root datasets have different numbers of rows: {lengths}", path=self.path,
                                hint="every column of a preprocessed HDF5 must have one row per sample")
        self._columns = list(lengths)
        self.num_rows = next(iter(lengths.values()))
        self._shards = FixedShards(self.num_rows, self.shard_size)
        self.uid_column: str | None = None

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    @property
    def num_shards(self) -> int:
        return self._shards.num_shards

    def shard_sizes(self) -> NDArray[np.int64]:
        return self._shards.sizes()

    @staticmethod
    def _to_arrow(data: np.ndarray) -> pa.Array:
        if data.dtype.kind in "SO":
            return pa.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in data.tolist()])
        flat = pa.array(np.ascontiguousarray(data).reshape(-1))
        for dim in reversed(data.shape[1:]):
            flat = pa.FixedSizeListArray.from_arrays(flat, dim)
        return flat

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        h5py = _h5py()
        names = check_read_args(self, index, columns, path=self.path)
        lo, hi = self._shards.bounds(index)
        arrays = []
        with h5py.File(self.path, "r") as f:
            for name in names:
                try:
                    if name in self._csr:
                        g = f[name]
                        offs = np.asarray(g["offsets"][lo:hi + 1], dtype=np.int64)
                        values = pa.array(g["indices"][offs[0]:offs[-1]])
                        arrays.append(pa.LargeListArray.from_arrays(pa.array(offs - offs[0]), values))
                    else:
                        arrays.append(self._to_arrow(f[name][lo:hi]))
                except (OSError, KeyError, ValueError) as exc:
                    raise DataFileError(f"cannot read rows {lo}..{hi - 1} ({exc})", path=self.path,
                                        column=name, row=lo, shard=index) from exc
        return pa.table(dict(zip(names, arrays)))

    def fingerprint(self) -> str:
        st = self.path.stat()
        return fingerprint_obj([self.columns, self.num_rows, self.shard_size, st.st_size, tail_hash(self.path)])

    def __repr__(self) -> str:
        return f"HDF5Source({os.fspath(self.path)!r}, rows={self.num_rows}, shards={self.num_shards})"



register_source("hdf5", marker=lambda p: p.is_file() and p.suffix in (HDF5_SUFFIX, ".h5"), opener=HDF5Source)
