"""The HDF5 layout of preprocessed data: its one writer (:class:`H5Writer`) and its one reader.

Layout: a root dataset per key, first dimension = rows; a sparse set/bag is a group with
``indices`` (int32), ``offsets`` (int64, ``n + 1``), optional ``values`` (float32), attributes
``layout="csr"`` and ``vocab_size``; the split is ``split`` (int8). The file attribute ``run_id``
ties it to the ``meta.json`` written after it.

Reading goes through one place, :func:`_layout` (which root objects are columns, their row counts)
and :func:`_read_column` (rows ``lo:hi`` of one column as numpy or :class:`CSR`):
:func:`read_hdf5` reads whole columns with them, :class:`HDF5Source` (the
:class:`~datamill.core.source.Source` of the loader, registered as ``"hdf5"``) row ranges,
converted to Arrow (multi-dimensional datasets become nested ``fixed_size_list`` columns, CSR
groups list columns).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.constants import HDF5_SUFFIX
from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.parquet import tail_hash
from datamill.core.source import FixedShards, FixedShardsSource, check_read_args, register_source
from datamill.preprocessing.features.base import CSR

if TYPE_CHECKING:
    import h5py

__all__ = ["H5Writer", "HDF5Source", "hdf5_name", "key_of", "read_hdf5"]

_ESCAPED = re.compile(r"%(25|2F)")


def hdf5_name(key: str) -> str:
    """The HDF5 dataset name of an output key: ``%`` and ``/`` percent-encoded, ``.``/``..`` as
    ``%2E``.

    Ludwig accepts any feature name; HDF5 reads ``/`` as a group separator and refuses ``.``, so
    those are escaped in the file only (the metadata and every API use the name as written).

    Examples:
        >>> hdf5_name("bill/length (mm)"), key_of(hdf5_name("bill/length (mm)")), hdf5_name("100%")
        ('bill%2Flength (mm)', 'bill/length (mm)', '100%25')
    """
    if key in (".", ".."):
        return key.replace(".", "%2E")
    return key.replace("%", "%25").replace("/", "%2F")


def key_of(name: str) -> str:
    """The output key of an HDF5 dataset name (the inverse of :func:`hdf5_name`)."""
    if name in ("%2E", "%2E%2E"):
        return name.replace("%2E", ".")
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "/", name)


_CHUNK_BYTES = 1 << 20


def _chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...] | None:
    if shape[0] == 0:
        return None
    row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * itemsize)
    return (max(1, min(shape[0], _CHUNK_BYTES // row)), *shape[1:])


class H5Writer:
    """Append blocks of arrays to an open ``h5py.File`` holding ``num_rows`` rows in total."""

    def __init__(self, f: Any, num_rows: int) -> None:
        self.f = f
        self.num_rows = num_rows
        self.filled: dict[str, int] = {}

    def write(self, key: str, value: NDArray[Any] | CSR) -> None:
        """Append one block of rows for ``key``."""
        if isinstance(value, CSR):
            self._write_csr(key, value)
            return
        arr = np.ascontiguousarray(value)
        start = self.filled.get(key, 0)
        name = hdf5_name(key)
        if name not in self.f:
            shape = (self.num_rows, *arr.shape[1:])
            self.f.create_dataset(
                name, shape=shape, dtype=arr.dtype, chunks=_chunks(shape, arr.dtype.itemsize)
            )
        ds = self.f[name]
        if ds.shape[1:] != arr.shape[1:]:
            raise DataFileError(
                f"feature {key!r}: block shape {arr.shape[1:]} differs from {ds.shape[1:]}"
            )
        ds[start : start + len(arr)] = arr
        self.filled[key] = start + len(arr)

    def _write_csr(self, key: str, csr: CSR) -> None:
        name = hdf5_name(key)
        if name not in self.f:
            g = self.f.create_group(name)
            g.attrs["layout"] = "csr"
            g.attrs["vocab_size"] = int(csr.vocab_size)
            g.create_dataset(
                "indices", shape=(0,), maxshape=(None,), dtype=np.int32, chunks=(1 << 18,)
            )
            g.create_dataset(
                "offsets",
                shape=(1,),
                maxshape=(None,),
                dtype=np.int64,
                chunks=(1 << 16,),
                data=np.zeros(1, np.int64),
            )
            if csr.values is not None:
                g.create_dataset(
                    "values", shape=(0,), maxshape=(None,), dtype=np.float32, chunks=(1 << 18,)
                )
        g = self.f[name]
        n_old = g["indices"].shape[0]
        idx = np.asarray(csr.indices, dtype=np.int32)
        off = np.asarray(csr.offsets, dtype=np.int64)
        g["indices"].resize((n_old + len(idx),))
        g["indices"][n_old:] = idx
        o_old = g["offsets"].shape[0]
        g["offsets"].resize((o_old + len(off) - 1,))
        g["offsets"][o_old:] = off[1:] - off[0] + n_old
        if "values" in g and csr.values is not None:
            g["values"].resize((n_old + len(idx),))
            g["values"][n_old:] = np.asarray(csr.values, dtype=np.float32)
        self.filled[key] = self.filled.get(key, 0) + len(off) - 1


def _open(path: Path) -> h5py.File:
    """The file opened read-only (DataFileNotFoundError / DataFileError when absent or not HDF5)."""
    if not path.is_file():
        raise DataFileNotFoundError("no such HDF5 file", path=path)
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise DataFileError(f"not a readable HDF5 file ({exc})", path=path) from exc


def _layout(f: h5py.File) -> tuple[dict[str, int], set[str]]:
    """(column → rows, CSR columns) of an open file: root datasets and ``layout="csr"`` groups,
    sorted."""
    import h5py

    lengths: dict[str, int] = {}
    csr: set[str] = set()
    for stored in sorted(f.keys(), key=key_of):
        obj, name = f[stored], key_of(stored)
        if isinstance(obj, h5py.Group):
            if obj.attrs.get("layout") != "csr":
                continue
            csr.add(name)
            lengths[name] = int(obj["offsets"].shape[0]) - 1
        else:
            lengths[name] = int(obj.shape[0]) if obj.shape else 1
    return lengths, csr


def _read_column(
    f: h5py.File, name: str, lo: int | None, hi: int | None, *, csr: bool
) -> NDArray[Any] | CSR:
    """Rows ``lo:hi`` of a column (``None, None``: all of it, scalars included); CSR offsets rebased
    to 0."""
    obj = f[hdf5_name(name)]
    if csr:
        offs = np.asarray(obj["offsets"][lo : None if hi is None else hi + 1], dtype=np.int64)
        a, b = int(offs[0]), int(offs[-1])
        values = obj["values"][a:b] if "values" in obj else None
        return CSR(obj["indices"][a:b], offs - a, int(obj.attrs["vocab_size"]), values)
    if lo is None and hi is None:
        data: NDArray[Any] = obj[()]
        return data
    sliced: NDArray[Any] = obj[lo:hi]
    return sliced


_SPLIT_IDS = {
    "0": 0,
    "train": 0,
    "training": 0,
    "1": 1,
    "validation": 1,
    "val": 1,
    "valid": 1,
    "2": 2,
    "test": 2,
    "testing": 2,
}


def _split_id(split: str | int) -> int:
    from datamill.core.errors import ConfigError

    key = str(split).strip().lower()
    if key not in _SPLIT_IDS:
        raise ConfigError(f"unknown split {split!r}; valid: train, validation, test (or 0, 1, 2)")
    return _SPLIT_IDS[key]


def _take_csr(value: CSR, take: NDArray[np.int64]) -> CSR:
    """Rows ``take`` of a CSR block."""
    starts, ends = value.offsets[take], value.offsets[take + 1]
    lengths = ends - starts
    offsets = np.zeros(len(take) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    return CSR(
        value.indices[flat],
        offsets,
        value.vocab_size,
        None if value.values is None else value.values[flat],
    )


def read_hdf5(path: str | Path) -> tuple[dict[str, NDArray[Any] | CSR], dict[str, Any]]:
    """All columns (CSR groups as :class:`CSR`) and the file attributes.

    Raises:
        DataFileNotFoundError: no such file. DataFileError: not a readable HDF5 file.

    Examples:
        >>> import tempfile, h5py
        >>> p = Path(tempfile.mkdtemp()) / "d.hdf5"
        >>> with h5py.File(p, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(3)); f.attrs["run_id"] = "r1"
        >>> data, attrs = read_hdf5(p)
        >>> data["x"].tolist(), attrs["run_id"]
        ([0, 1, 2], 'r1')
    """
    p = Path(path)
    with _open(p) as f:
        try:
            lengths, csr = _layout(f)
            out = {name: _read_column(f, name, None, None, csr=name in csr) for name in lengths}
            attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        except (OSError, KeyError) as exc:
            raise DataFileError(f"not a readable HDF5 file ({exc})", path=p) from exc
    return out, attrs


class HDF5Source(FixedShardsSource):
    """A preprocessed HDF5 file: each root dataset (or CSR group) a column, row ranges as shards.

    Args:
        path: the ``.hdf5`` file.
        shard_size: rows per shard. Defaults to ``65536``.
        split: read only the rows of this split (``"train"``/``"validation"``/``"test"``, also
            ``training``/``val``/``0``/``1``/``2``), so a loader gives full batches of one split;
            the ``split`` column is then left out. Defaults to ``None`` (every row).

    Raises:
        DataFileNotFoundError: no such file. DataFileError: not HDF5, columns of different lengths,
        or ``split`` given for a file without a ``split`` dataset. ConfigError: an unknown split
        name.

    Examples:
        >>> import tempfile, h5py
        >>> p = Path(tempfile.mkdtemp()) / "d.hdf5"
        >>> with h5py.File(p, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(5))
        ...     _ = f.create_dataset("img", data=np.zeros((5, 2, 3)))
        >>> src = HDF5Source(p, shard_size=2)
        >>> src.columns, src.shard_sizes().tolist(), str(src.read_shard(2).schema.field("img").type)
        (['img', 'x'], [2, 2, 1], 'fixed_size_list<item: fixed_size_list<item: double>[3]>[2]')
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shard_size: int = 65536,
        split: str | int | None = None,
    ) -> None:
        self.path = Path(path)
        FixedShards(0, shard_size)  # validates shard_size
        self.shard_size = int(shard_size)
        self.split = None if split is None else _split_id(split)
        self._rows: NDArray[np.int64] | None = None
        with _open(self.path) as f:
            try:
                lengths, self._csr = _layout(f)
                if self.split is not None:
                    if "split" not in lengths or "split" in self._csr:
                        raise DataFileError(
                            "the file has no split dataset",
                            path=self.path,
                            hint="preprocess with a split (the default), or drop split=",
                        )
                    self._rows = np.flatnonzero(np.asarray(f["split"][()]) == self.split).astype(
                        np.int64
                    )
                    del lengths["split"]
            except (OSError, KeyError) as exc:
                raise DataFileError(f"not a readable HDF5 file ({exc})", path=self.path) from exc
        if not lengths:
            raise DataFileError("HDF5 file has no datasets at its root", path=self.path)
        if len(set(lengths.values())) > 1:
            raise DataFileError(
                f"root datasets have different numbers of rows: {lengths}",
                path=self.path,
                hint="every column of a preprocessed HDF5 must have one row per sample",
            )
        self._columns = list(lengths)
        self.num_rows = next(iter(lengths.values())) if self._rows is None else len(self._rows)
        self._shards = FixedShards(self.num_rows, self.shard_size)
        self.uid_column: str | None = None

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    @staticmethod
    def _to_arrow(data: NDArray[Any]) -> pa.Array:
        if data.dtype.kind in "SO":
            return pa.array(
                [v.decode("utf-8") if isinstance(v, bytes) else v for v in data.tolist()]
            )
        flat = pa.array(np.ascontiguousarray(data).reshape(-1))
        for dim in reversed(data.shape[1:]):
            flat = pa.FixedSizeListArray.from_arrays(flat, dim)
        return flat

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        names = check_read_args(self, index, columns, path=self.path)
        lo, hi = self._shards.bounds(index)
        arrays = []
        take = None
        if (
            self._rows is not None
        ):  # the shard's rows of the split: read their span, keep those rows
            rows = self._rows[lo:hi]
            lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
            take = rows - lo
        with _open(self.path) as f:
            for name in names:
                try:
                    value = _read_column(f, name, lo, hi, csr=name in self._csr)
                    if take is not None:
                        value = _take_csr(value, take) if isinstance(value, CSR) else value[take]
                    if isinstance(value, CSR):
                        arrays.append(
                            pa.LargeListArray.from_arrays(
                                pa.array(value.offsets), pa.array(value.indices)
                            )
                        )
                    else:
                        arrays.append(self._to_arrow(value))
                except (OSError, KeyError, ValueError) as exc:
                    raise DataFileError(
                        f"cannot read rows {lo}..{hi - 1} ({exc})",
                        path=self.path,
                        column=name,
                        row=lo,
                        shard=index,
                    ) from exc
        return pa.table(dict(zip(names, arrays)))

    def fingerprint(self) -> str:
        st = self.path.stat()
        return fingerprint_obj(
            [
                self.columns,
                self.num_rows,
                self.shard_size,
                st.st_size,
                tail_hash(self.path),
                *([] if self.split is None else [self.split]),
            ]
        )

    def __repr__(self) -> str:
        split = (
            "" if self.split is None else f", split={('train', 'validation', 'test')[self.split]!r}"
        )
        return (
            f"HDF5Source({os.fspath(self.path)!r}, rows={self.num_rows}, "
            f"shards={self.num_shards}{split})"
        )


register_source(
    "hdf5", marker=lambda p: p.is_file() and p.suffix in (HDF5_SUFFIX, ".h5"), opener=HDF5Source
)
