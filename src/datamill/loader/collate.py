"""Collation: a batch as a pyarrow Table -> dict column name -> numpy array (or torch tensor).

* numbers / booleans -> 1-d arrays (zero-copy when there are no nulls);
* ``fixed_size_list`` (possibly nested) -> an n-d array ``(rows, *dims)`` viewing the values buffer;
* ``list`` / ``large_list`` (ragged) -> a 2-d array padded with 0 to the batch's longest row, plus a
  boolean ``<col>_mask`` (True where a value is real), built with one numpy scatter;
* ``binary`` / ``large_binary`` (images, audio, any encoded sample) -> the batch's bytes as one
  uint8 array ``<col>`` viewing the Arrow data buffer (no copy, no Python object per sample) and
  ``<col>_offsets`` (int64, rows + 1, from 0): sample ``i`` is ``<col>[offsets[i]:offsets[i + 1]]``
  (a null is empty). ``binary="bytes"`` gives an object array of ``bytes`` instead (one Python
  object per sample, copied);
* strings and anything else -> an object array.

No step imports pandas (``pa.array`` and ``Array.to_numpy`` do, on their first call in a process):
numbers and booleans without nulls are read from the Arrow buffers (:mod:`datamill.core.arrow`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from datamill.core import arrow
from datamill.core.errors import ConfigError
from datamill.core.optional import require
from datamill.core.ragged import offsets_from_lengths, pad

__all__ = [
    "MASK_SUFFIX",
    "OFFSETS_SUFFIX",
    "BinaryOutput",
    "builtin_collate",
    "collate_numpy",
    "collate_torch",
    "column_arrays",
    "resolve_collate",
    "to_numpy",
    "to_torch",
]

MASK_SUFFIX = "_mask"
OFFSETS_SUFFIX = "_offsets"
"""``<col>_offsets``: where each sample of binary column ``<col>`` starts (rows + 1, int64)."""

BinaryOutput: TypeAlias = Literal["offsets", "bytes"]
"""How a binary column is handed out: ``"offsets"`` (values + ``<col>_offsets``) or ``"bytes"``."""


def _single(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0)
        return col.combine_chunks() if col.num_chunks else pa.nulls(0, col.type)  # no pandas
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


def _offsets(arr: pa.Array) -> np.ndarray:
    """The offsets (rows + 1) of a list/binary array, honouring its slice (a view, no pandas)."""
    dtype = np.int64 if pat.is_large_list(arr.type) or pat.is_large_binary(arr.type) else np.int32
    return np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset : arr.offset + len(arr) + 1]


def _valid(arr: pa.Array) -> np.ndarray:
    """True where ``arr`` holds a value (its validity bitmap unpacked)."""
    bits = arr.buffers()[0]
    if bits is None or not arr.null_count:
        return np.ones(len(arr), dtype=bool)
    unpacked = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little")
    return unpacked[arr.offset : arr.offset + len(arr)].astype(bool)


def _padded(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(_offsets(arr))
    if arr.null_count:
        lengths = np.where(_valid(arr), lengths, 0)
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
        if not arr.null_count and (pat.is_boolean(typ) or typ in _NUMERIC):
            return arrow.to_numpy(arr)  # from the buffers: zero-copy for numbers
        return np.asarray(arr.to_numpy(zero_copy_only=False))
    if pat.is_dictionary(typ):
        return to_numpy(arr.dictionary_decode())
    out = np.empty(len(arr), dtype=object)
    # to_pylist, not to_numpy: 3x slower on strings (~40 us per 256) but to_numpy imports pandas,
    # 0.4-2 s of the first batch of every process (and of every DataLoader worker)
    textual = pat.is_string(typ) or pat.is_large_string(typ) or pat.is_binary(typ)
    if textual or pat.is_large_binary(typ) or pat.is_nested(typ):
        out[:] = arr.to_pylist()
    else:  # timestamps, decimals, ...: numpy's conversion of them
        out[:] = arr.to_numpy(zero_copy_only=False)
    return out


def _binary(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's bytes (a uint8 view of its data buffer) and int64 offsets from 0."""
    if arr.null_count:  # a null's slot may hold bytes: make it empty
        arr = arr.fill_null(b"")
    offs = _offsets(arr)
    data = arr.buffers()[2]
    values = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
    return values[int(offs[0]) : int(offs[-1])], (offs - offs[0]).astype(np.int64)


def collate_numpy(batch: pa.Table, *, binary: BinaryOutput = "offsets") -> dict[str, np.ndarray]:
    """A batch table -> dict of numpy arrays; ragged list columns padded with a ``<col>_mask``.

    Args:
        batch: the batch.
        binary: ``"offsets"``: a binary column ``<col>`` is its bytes (uint8, a view of the Arrow
            buffer) plus ``<col>_offsets`` (int64, rows + 1); ``"bytes"``: an object array of
            ``bytes``, one per sample. Defaults to ``"offsets"``.

    Examples:
        >>> t = pa.table({"x": [1, 2], "ids": [[5], [6, 7, 8]], "s": ["a", "b"]})
        >>> out = collate_numpy(t)
        >>> out["x"].tolist(), out["ids"].tolist(), out["ids_mask"].tolist(), out["s"].tolist()
        ([1, 2], [[5, 0, 0], [6, 7, 8]], [[True, False, False], [True, True, True]], ['a', 'b'])
        >>> out = collate_numpy(pa.table({"jpg": [b"ab", b"", b"cde"]}))
        >>> out["jpg"].tobytes(), out["jpg_offsets"].tolist()
        (b'abcde', [0, 2, 2, 5])
        >>> [bytes(s) for s in np.split(out["jpg"], out["jpg_offsets"][1:-1])]  # views, per sample
        [b'ab', b'', b'cde']
        >>> collate_numpy(pa.table({"jpg": [b"ab", None]}), binary="bytes")["jpg"].tolist()
        [b'ab', None]
    """
    if not isinstance(batch, pa.Table):
        raise TypeError(f"collate_numpy takes a pyarrow Table, got {type(batch).__name__}")
    if binary not in ("offsets", "bytes"):
        raise ConfigError(f"binary must be 'offsets' or 'bytes', got {binary!r}")
    out: dict[str, np.ndarray] = {}
    for name, col in zip(batch.column_names, batch.columns):
        for key, values in column_arrays(name, _single(col), binary=binary):
            out[key] = values
    return out


def column_arrays(
    name: str, arr: pa.Array, *, binary: BinaryOutput = "offsets"
) -> list[tuple[str, np.ndarray]]:
    """What :func:`collate_numpy` makes of one column: ``(key, array)`` pairs (a list or binary
    column gives two: ``<name>`` and ``<name>_mask`` / ``<name>_offsets``).

    Examples:
        >>> [(k, v.tolist()) for k, v in column_arrays("ids", pa.array([[1], [2, 3]]))]
        [('ids', [[1, 0], [2, 3]]), ('ids_mask', [[True, False], [True, True]])]
    """
    typ = arr.type
    if pat.is_list(typ) or pat.is_large_list(typ):
        padded, mask = _padded(arr)
        return [(name, padded), (name + MASK_SUFFIX, mask)]
    if binary == "offsets" and (pat.is_binary(typ) or pat.is_large_binary(typ)):
        values, offsets = _binary(arr)
        return [(name, values), (name + OFFSETS_SUFFIX, offsets)]
    return [(name, to_numpy(arr))]


def collate_torch(
    batch: pa.Table, *, pin_memory: bool = False, binary: BinaryOutput = "offsets"
) -> dict[str, Any]:
    """Like :func:`collate_numpy` but numeric arrays become torch tensors (strings stay lists).

    Signed integer columns (category/sequence ids: int8/int16/int32) become int64, what
    ``nn.Embedding`` and the losses take; floats, bools and unsigned bytes (images) keep their
    dtype. A binary column is a uint8 tensor of its bytes plus an int64 ``<col>_offsets`` tensor
    (sample ``i`` is ``t[o[i]:o[i + 1]]``, e.g. for ``torchvision.io.decode_image``), or with
    ``binary="bytes"`` a list of ``bytes``.

    ``pin_memory`` pins tensors in page-locked memory when CUDA is available (a no-op on CPU-only).
    """
    return to_torch(collate_numpy(batch, binary=binary), pin_memory=pin_memory)


def to_torch(arrays: dict[str, np.ndarray], *, pin_memory: bool = False) -> dict[str, Any]:
    """:func:`collate_numpy`'s arrays as :func:`collate_torch` hands them out: object arrays as
    lists, signed ids as int64, the rest as tensors of their dtype (read-only arrays copied)."""
    torch = require("torch", extra="torch")
    pin = pin_memory and bool(torch.cuda.is_available())
    out: dict[str, Any] = {}
    for name, arr in arrays.items():
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


_NUMERIC = {
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float32(),
    pa.float64(),
}


def builtin_collate(collate: Callable[[pa.Table], Any]) -> tuple[str | None, bool]:
    """Which built-in collate ``collate`` is (``"numpy"``, ``"torch"``, or ``None`` for any other)
    and whether it pins memory: :func:`collate_numpy`, :func:`collate_torch`, or
    :func:`resolve_collate`'s ``functools.partial(collate_torch, pin_memory=...)``.

    Examples:
        >>> builtin_collate(collate_numpy), builtin_collate(lambda t: t)
        (('numpy', False), (None, False))
    """
    if collate is collate_numpy:
        return "numpy", False
    if collate is collate_torch:
        return "torch", False
    if (
        isinstance(collate, functools.partial)
        and collate.func is collate_torch
        and not collate.args
        and set(collate.keywords) <= {"pin_memory"}
    ):
        return "torch", bool(collate.keywords.get("pin_memory", False))
    return None, False


def _identity(batch: pa.Table) -> pa.Table:
    return batch


def resolve_collate(
    collate: str | Callable[[pa.Table], Any], *, pin_memory: bool = False
) -> Callable[[pa.Table], Any]:
    """``"numpy"`` / ``"torch"`` / ``"arrow"`` (the table itself) / a callable -> the collate
    function.

    Binary columns as ``bytes`` objects (the former default):
    ``functools.partial(collate_numpy, binary="bytes")`` (or ``collate_torch``) as the callable.
    """
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
