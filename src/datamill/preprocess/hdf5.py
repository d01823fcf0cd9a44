"""HDF5 output written block by block (one chunked dataset per key; CSR groups for sparse rows).

Layout: a root dataset per key, first dimension = rows; a sparse set/bag is a group with
``indices`` (int32), ``offsets`` (int64, ``n + 1``), optional ``values`` (float32), attributes
``layout="csr"`` and ``vocab_size``; the split is ``split`` (int8). The file attribute ``run_id``
ties it to the ``meta.json`` written after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.preprocess.features.base import CSR

__all__ = ["H5Writer", "read_hdf5"]

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
        if key not in self.f:
            shape = (self.num_rows, *arr.shape[1:])
            self.f.create_dataset(key, shape=shape, dtype=arr.dtype, chunks=_chunks(shape, arr.dtype.itemsize))
        ds = self.f[key]
        if ds.shape[1:] != arr.shape[1:]:
            raise DataFileError(f"feature {key!r}: block shape {arr.shape[1:]} differs from {ds.shape[1:]}")
        ds[start:start + len(arr)] = arr
        self.filled[key] = start + len(arr)

    def _write_csr(self, key: str, csr: CSR) -> None:
        if key not in self.f:
            g = self.f.create_group(key)
            g.attrs["layout"] = "csr"
            g.attrs["vocab_size"] = int(csr.vocab_size)
            g.create_dataset("indices", shape=(0,), maxshape=(None,), dtype=np.int32, chunks=(1 << 18,))
            g.create_dataset("offsets", shape=(1,), maxshape=(None,), dtype=np.int64, chunks=(1 << 16,),
                             data=np.zeros(1, np.int64))
            if csr.values is not None:
                g.create_dataset("values", shape=(0,), maxshape=(None,), dtype=np.float32, chunks=(1 << 18,))
        g = self.f[key]
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


def read_hdf5(path: str | Path) -> tuple[dict[str, NDArray[Any] | CSR], dict[str, Any]]:
    """All root datasets (CSR groups as :class:`CSR`) and the file attributes."""
    import h5py

    p = Path(path)
    if not p.is_file():
        raise DataFileNotFoundError("no such HDF5 file", path=p)
    out: dict[str, NDArray[Any] | CSR] = {}
    try:
        with h5py.File(p, "r") as f:
            for key in f:
                obj = f[key]
                if isinstance(obj, h5py.Group):
                    if obj.attrs.get("layout") == "csr":
                        out[key] = CSR(obj["indices"][()], obj["offsets"][()], int(obj.attrs["vocab_size"]),
                                       obj["values"][()] if "values" in obj else None)
                else:
                    out[key] = obj[()]
            attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    except OSError as exc:
        raise DataFileError(f"not a readable HDF5 file ({exc})", path=p) from exc
    return out, attrs
