"""Collation: a batch as a pyarrow Table -> dict column name -> numpy array (or torch tensor).

* numbers / booleans -> 1-d arrays (zero-copy when there are no nulls);
* ``fixed_size_list`` (possibly nested) -> an n-d array ``(rows, *dims)`` viewing the values buffer;
* ``list`` / ``large_list`` (ragged) -> a 2-d array padded with 0 to the batch's longest row, plus a
  boolean ``<col>_mask`` (True where a value is real), built with one numpy scatter;
* strings, binaries and anything else -> an object array.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from datamill.core.errors import ConfigError
from datamill.core.optional import require
from datamill.core.ragged import offsets_from_lengths, pad

__all__ = ["MASK_SUFFIX", "collate_numpy", "collate_torch", "resolve_collate", "to_numpy"]

MASK_SUFFIX = "_mask"


def _single(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0)
        return col.combine_chunks() if col.num_chunks else pa.array([], type=col.type)
    return col


def _fixed_shape(typ: pa.DataType) -> tuple[list[int], pa.DataType]:
    dims: list[int] = []
    while pat.is_fixed_size_list(typ):
        dims.append(typ.list_size)
        typ = typ.value_type
    return dims, typ


def _flat_values(arr: pa.Array) -> pa.Array:
    while pat.is_fixed_size_list(arr.type):
        arr = arr.flatten()  # honours the slice offset
    return arr


def _padded(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(arr.offsets.to_numpy())
    if arr.null_count:
        lengths = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    flat = to_numpy(arr.flatten())  # only the non-null rows' values, in order
    return pad(
        flat, offsets_from_lengths(lengths), fill=None if flat.dtype == object else 0
    )  # strings: None


def to_numpy(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """One column to numpy (see the module docstring for the rules; ragged lists not padded here).

    Examples:
        >>> to_numpy(pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int8(), 2))).shape
        (2, 2)
    """
    arr = _single(col)
    typ = arr.type
    if pat.is_fixed_size_list(typ):
        dims, _ = _fixed_shape(typ)
        flat = _flat_values(arr)
        values = to_numpy(flat)
        return values.reshape(len(arr), *dims)
    if pat.is_integer(typ) or pat.is_floating(typ) or pat.is_boolean(typ):
        return np.asarray(arr.to_numpy(zero_copy_only=False))
    if pat.is_dictionary(typ):
        return to_numpy(arr.dictionary_decode())
    out = np.empty(len(arr), dtype=object)
    out[:] = arr.to_numpy(zero_copy_only=False) if not pat.is_nested(typ) else arr.to_pylist()
    return out


def collate_numpy(batch: pa.Table) -> dict[str, np.ndarray]:
    """A batch table -> dict of numpy arrays; ragged list columns padded with a ``<col>_mask``.

    Examples:
        >>> t = pa.table({"x": [1, 2], "ids": [[5], [6, 7, 8]], "s": ["a", "b"]})
        >>> out = collate_numpy(t)
        >>> out["x"].tolist(), out["ids"].tolist(), out["ids_mask"].tolist(), out["s"].tolist()
        ([1, 2], [[5, 0, 0], [6, 7, 8]], [[True, False, False], [True, True, True]], ['a', 'b'])
    """
    if not isinstance(batch, pa.Table):
        raise TypeError(f"collate_numpy takes a pyarrow Table, got {type(batch).__name__}")
    out: dict[str, np.ndarray] = {}
    for name, col in zip(batch.column_names, batch.columns):
        typ = col.type
        if pat.is_list(typ) or pat.is_large_list(typ):
            out[name], out[name + MASK_SUFFIX] = _padded(_single(col))
        else:
            out[name] = to_numpy(col)
    return out


def collate_torch(batch: pa.Table, *, pin_memory: bool = False) -> dict[str, Any]:
    """Like :func:`collate_numpy` but numeric arrays become torch tensors (strings stay lists).

    Signed integer columns (category/sequence ids: int8/int16/int32) become int64, what
    ``nn.Embedding`` and the losses take; floats, bools and unsigned bytes (images) keep their
    dtype.

    ``pin_memory`` pins tensors in page-locked memory when CUDA is available (a no-op on CPU-only).
    """
    torch = require("torch", extra="torch")
    pin = pin_memory and bool(torch.cuda.is_available())
    out: dict[str, Any] = {}
    for name, arr in collate_numpy(batch).items():
        if arr.dtype == object:
            out[name] = arr.tolist()
            continue
        if arr.dtype.kind == "i" and arr.dtype.itemsize < 8:  # ids -> int64 (a writeable copy)
            arr = arr.astype(np.int64)
        if not arr.flags.writeable:  # arrow buffers are read-only; torch wants writeable memory
            arr = arr.copy()
        tensor = torch.from_numpy(np.ascontiguousarray(arr))
        out[name] = tensor.pin_memory() if pin else tensor
    return out


def _identity(batch: pa.Table) -> pa.Table:
    return batch


def resolve_collate(
    collate: str | Callable[[pa.Table], Any], *, pin_memory: bool = False
) -> Callable[[pa.Table], Any]:
    """``"numpy"`` / ``"torch"`` / ``"arrow"`` (the table itself) / a callable -> the collate
    function."""
    if callable(collate):
        return collate
    if collate == "numpy":
        return collate_numpy
    if collate == "torch":
        require("torch", extra="torch")
        return functools.partial(
            collate_torch, pin_memory=pin_memory
        )  # picklable, for worker processes
    if collate == "arrow":
        return _identity
    raise ConfigError(
        f"unknown collate {collate!r}; expected one of 'arrow', 'numpy', 'torch' or a callable"
    )
