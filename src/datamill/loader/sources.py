"""Sources over datamill's file outputs (every one follows :class:`datamill.core.source.Source`).

* :class:`ParquetSource` - a Parquet file or a folder of them (BERT / word2vec samples, any table);
  shards are row groups (default) or whole files.
* :class:`HDF5Source` - a preprocessed HDF5 (one dataset per column at the root, first dimension =
  rows; multi-dimensional datasets become nested ``fixed_size_list`` columns; CSR groups
  ``indices``/``offsets`` with ``layout="csr"`` become list columns); shards are row ranges.
* ``CorpusSource`` - the LM corpus source, defined by :mod:`datamill.text` and re-exported here.
* ``ShardsetDataset`` (:mod:`datamill.shards`) is itself a Source.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.errors import DataFileError, DataFileNotFoundError, SchemaError
from datamill.core.fingerprint import fingerprint_obj

if TYPE_CHECKING:
    from datamill.text import CorpusSource

__all__ = ["CorpusSource", "HDF5Source", "ParquetSource", "open_source"]

_TAIL = 1 << 16


def _tail_hash(path: Path) -> str:
    import xxhash

    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - _TAIL))
        return xxhash.xxh3_128_hexdigest(f.read())


class ParquetSource:
    """A Parquet file, or every ``*.parquet`` file of a folder (sorted by name), as shards.

    Args:
        path: a ``.parquet`` file or a folder.
        shard_by: ``"row_group"`` (each row group a shard) or ``"file"``. Defaults to ``"row_group"``.

    Raises:
        DataFileNotFoundError: the path (or any Parquet file in the folder) does not exist.
        DataFileError: a file is not Parquet. SchemaError: files of a folder disagree on the schema.

    Examples:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "a.parquet"
        >>> pq.write_table(pa.table({"x": list(range(5))}), p, row_group_size=2)
        >>> src = ParquetSource(p)
        >>> src.num_shards, src.shard_sizes().tolist(), src.read_shard(1).to_pydict()
        (3, [2, 2, 1], {'x': [2, 3]})
    """

    def __init__(self, path: str | os.PathLike[str], *, shard_by: Literal["row_group", "file"] = "row_group") -> None:
        root = Path(path)
        if not root.exists():
            raise DataFileNotFoundError("no such Parquet file or folder", path=root)
        if shard_by not in ("row_group", "file"):
            raise ValueError(f"shard_by must be 'row_group' or 'file', got {shard_by!r}")
        files = sorted(p for p in root.rglob("*.parquet") if p.is_file()) if root.is_dir() else [root]
        if not files:
            raise DataFileNotFoundError("folder holds no *.parquet file", path=root)
        self.path, self.files, self.shard_by = root, files, shard_by
        self._meta: list[pq.FileMetaData] = []
        schema: pa.Schema | None = None
        shards: list[tuple[int, int | None, int]] = []  # (file, row group or None, rows)
        for i, f in enumerate(files):
            try:
                md = pq.read_metadata(f)
            except (OSError, pa.ArrowException) as exc:
                raise DataFileError(f"not a readable Parquet file ({exc})", path=f) from exc
            s = md.schema.to_arrow_schema()
            if schema is None:
                schema = s
            elif not s.equals(schema, check_metadata=False):
                raise SchemaError(f"schema differs from {files[0].name}'s: {s} vs {schema}", path=f)
            self._meta.append(md)
            if shard_by == "file":
                shards.append((i, None, md.num_rows))
            else:
                shards += [(i, g, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
        assert schema is not None
        self.schema = schema
        self._shards = shards

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    def shard_sizes(self) -> NDArray[np.int64]:
        return np.array([n for _, _, n in self._shards], dtype=np.int64)

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        i, group, _ = self._shards[index]
        cols = None if columns is None else list(columns)
        try:
            pf = pq.ParquetFile(self.files[i], metadata=self._meta[i], memory_map=True)
            table = pf.read(columns=cols) if group is None else pf.read_row_group(group, columns=cols)
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(f"cannot read {'row group ' + str(group) if group is not None else 'file'} ({exc})",
                                path=self.files[i], shard=index) from exc
        return table.replace_schema_metadata(None)

    def fingerprint(self) -> str:
        return fingerprint_obj([self.shard_by, self.schema.remove_metadata().to_string(),
                                [[f.name, f.stat().st_size, _tail_hash(f)] for f in self.files]])

    def __repr__(self) -> str:
        return f"ParquetSource({os.fspath(self.path)!r}, shards={self.num_shards}, rows={int(self.shard_sizes().sum())})"


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
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.shard_size = shard_size
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

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    @property
    def num_shards(self) -> int:
        return -(-self.num_rows // self.shard_size)

    def shard_sizes(self) -> NDArray[np.int64]:
        sizes = np.full(self.num_shards, self.shard_size, dtype=np.int64)
        if len(sizes):
            sizes[-1] = self.num_rows - self.shard_size * (len(sizes) - 1)
        return sizes

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
        lo = index * self.shard_size
        hi = min(self.num_rows, lo + self.shard_size)
        names = self.columns if columns is None else list(columns)
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
        return fingerprint_obj([self.columns, self.num_rows, self.shard_size, st.st_size, _tail_hash(self.path)])

    def __repr__(self) -> str:
        return f"HDF5Source({os.fspath(self.path)!r}, rows={self.num_rows}, shards={self.num_shards})"


def open_source(path: str | os.PathLike[str]) -> Any:
    """The right Source for a datamill output: shardset dataset folder (``dataset.json``), LM corpus
    folder (``corpus.json``), ``.hdf5`` file, Parquet file or folder.

    Raises:
        DataFileNotFoundError: nothing there. DataFileError: not a format the loader reads.
    """
    from datamill.core.constants import DATASET_MANIFEST, HDF5_SUFFIX

    p = Path(path)
    if not p.exists():
        raise DataFileNotFoundError("no such file or folder", path=p)
    if p.is_dir() and (p / DATASET_MANIFEST).exists():
        from datamill.shards import ShardsetDataset

        return ShardsetDataset(p)
    if p.is_dir() and (p / "corpus.json").exists():
        from datamill.text import CorpusSource

        return CorpusSource(p)
    if p.suffix in (HDF5_SUFFIX, ".h5"):
        return HDF5Source(p)
    if p.is_dir() or p.suffix in (".parquet", ".pq"):
        return ParquetSource(p)
    raise DataFileError("not a source the loader reads", path=p,
                        hint="pass a shardset dataset folder, a corpus folder, a .hdf5 file or Parquet file/folder")


def __getattr__(name: str) -> Any:
    if name == "CorpusSource":  # defined by the text capability; imported on first use
        from datamill.text import CorpusSource

        return CorpusSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
