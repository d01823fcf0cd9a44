"""Per-row content hashes of Arrow columns, vectorised over the buffers (no per-row Python).

:func:`column_hash` gives one ``uint64`` per row of a column: fixed-width values are mixed from
their bits, strings and binaries by a polynomial over their bytes (``numpy`` segment sums over the
values buffer), lists recursively from their elements' hashes, nulls as a constant. Equal values
give equal hashes in every process (no salt); :func:`row_hash` combines several columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

__all__ = [
    "HASH_VERSION",
    "column_hash",
    "is_bytes_type",
    "is_list_type",
    "mix64",
    "row_hash",
    "segment_hash",
]

HASH_VERSION = "datamill.rowhash@1"
"""Bumped whenever the hashes change."""

U64 = NDArray[np.uint64]
_NULL = np.uint64(0x9E3779B97F4A7C15)
_MUL = np.uint64(0x100000001B3)  # the polynomial's base (odd)


def mix64(x: U64) -> U64:
    """The splitmix64 finaliser, elementwise (wrapping ``uint64`` arithmetic).

    Examples:
        >>> mix64(np.array([0, 1], dtype=np.uint64)).tolist()[1] != 1
        True
    """
    z = np.asarray(x, dtype=np.uint64).copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


_BLOCK = 1 << 12


def _table(base: int, n: int) -> U64:
    p = np.full(max(1, n), np.uint64(base), dtype=np.uint64)
    p[0] = 1
    return np.multiply.accumulate(p)


_LOW = _table(0x100000001B3, _BLOCK)
_LOW_INV = _table(pow(0x100000001B3, -1, 1 << 64), _BLOCK)


def _pow_at(k: NDArray[np.int64], *, inverse: bool = False) -> U64:
    """``M ** k`` (or ``M ** -k``) mod ``2**64`` for each ``k``: two small tables, ``k = q * 4096 +
    r``."""
    low = _LOW_INV if inverse else _LOW
    high = _table(
        int(low[-1]) * int(low[1]) % (1 << 64), int(k.max()) // _BLOCK + 1 if len(k) else 1
    )
    return high[k // _BLOCK] * low[k % _BLOCK]


def segment_hash(values: U64, offsets: NDArray[np.int64]) -> U64:
    """Polynomial hash of each segment ``values[offsets[i]:offsets[i + 1]]``, mixed with its length.

    ``sum((v_k + 1) * M**(k - start))`` for the segment's ``k``, from one prefix sum over the whole
    buffer: ``(P[end] - P[start]) * M**-start`` (``M`` is odd, so it has an inverse mod ``2**64``).
    """
    lengths = np.diff(offsets)
    lo, hi = int(offsets[0]), int(offsets[-1])
    vals = values[lo:hi]
    prefix = np.zeros(len(vals) + 1, dtype=np.uint64)
    np.cumsum((vals + np.uint64(1)) * _pow_at(np.arange(len(vals), dtype=np.int64)), out=prefix[1:])
    starts = offsets[:-1] - lo
    out = (prefix[offsets[1:] - lo] - prefix[starts]) * _pow_at(starts, inverse=True)
    return mix64(out ^ mix64(lengths.astype(np.uint64) + np.uint64(0x51)))


def _fixed_bits(arr: pa.Array) -> U64:
    """The bits of a fixed-width primitive column as uint64 (values of nulls: anything)."""
    typ = arr.type
    width = typ.bit_width // 8
    buf = arr.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8, count=(arr.offset + len(arr)) * width)[
        arr.offset * width :
    ]
    if width in (1, 2, 4, 8):
        return raw.view(f"<u{width}").astype(np.uint64)
    words = raw.reshape(len(arr), width)  # decimals and other wide types: hash the row's bytes
    return segment_hash(
        words.reshape(-1).astype(np.uint64), np.arange(len(arr) + 1, dtype=np.int64) * width
    )


def column_hash(column: pa.Array | pa.ChunkedArray, /) -> U64:
    """One ``uint64`` per row of ``column`` that changes when the row's value does.

    Examples:
        >>> h = column_hash(pa.array(["a", "bc", None, "a", ""]))
        >>> bool(h[0] == h[3]), len(set(h.tolist()))
        (True, 4)
        >>> g = column_hash(pa.array([[1, 2], [], None, [1, 2], [2, 1]]))
        >>> bool(g[0] == g[3]), bool(g[0] == g[4]), bool(g[1] == g[2])
        (True, False, False)
    """
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 0:
            return np.zeros(0, dtype=np.uint64)
        return column_hash(
            column.combine_chunks()
        )  # one pass over one buffer (many small chunks are slow)
    arr = column
    typ = arr.type
    tag = np.uint64(hash_type_tag(typ))
    if pat.is_dictionary(typ):
        return column_hash(arr.dictionary_decode())
    if pat.is_boolean(typ):
        arr = pc.cast(arr, pa.uint8())
        typ = arr.type
    if len(arr) == 0:
        return np.zeros(0, dtype=np.uint64)
    if pat.is_null(typ):
        return np.full(len(arr), _NULL, dtype=np.uint64)
    h = _values_hash(arr, tag)
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        h = np.where(valid, h, _NULL)
    return h


def is_bytes_type(typ: pa.DataType) -> bool:
    """String or binary, large or not (values + offsets)."""
    return any(
        f(typ) for f in (pat.is_string, pat.is_binary, pat.is_large_string, pat.is_large_binary)
    )


def is_list_type(typ: pa.DataType) -> bool:
    """A list, large list or fixed-size list."""
    return any(f(typ) for f in (pat.is_list, pat.is_large_list, pat.is_fixed_size_list))


def _values_hash(arr: pa.Array, tag: np.uint64) -> U64:
    """:func:`column_hash` of a non-empty array's values, by type family (nulls not yet marked)."""
    typ = arr.type
    if (
        pat.is_string(typ)
        or pat.is_binary(typ)
        or pat.is_large_string(typ)
        or pat.is_large_binary(typ)
    ):
        odt = np.int64 if pat.is_large_string(typ) or pat.is_large_binary(typ) else np.int32
        raw = np.frombuffer(arr.buffers()[1], dtype=odt, count=arr.offset + len(arr) + 1)[
            arr.offset :
        ]
        data = arr.buffers()[2]
        values = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        return segment_hash(values.astype(np.uint64), raw.astype(np.int64))
    if is_list_type(typ):
        offsets = (
            (np.arange(len(arr) + 1, dtype=np.int64) + arr.offset) * typ.list_size
            if pat.is_fixed_size_list(typ)
            else np.asarray(arr.offsets, dtype=np.int64)
        )
        return segment_hash(column_hash(arr.values), offsets.astype(np.int64))
    if pat.is_struct(typ):
        h = np.zeros(len(arr), dtype=np.uint64)
        for i in range(typ.num_fields):
            h = mix64(h * _MUL + column_hash(arr.field(i)))
        return h
    if typ.bit_width and typ.bit_width % 8 == 0:
        return mix64(_fixed_bits(arr) ^ tag)
    raise TypeError(f"no row hash for Arrow type {typ}")


def hash_type_tag(typ: pa.DataType) -> int:
    """A small constant per type family, so 1 (int) and 1.0 (float) hash apart."""
    if pat.is_floating(typ):
        return 0xF1
    if pat.is_signed_integer(typ):
        return 0x51
    if pat.is_unsigned_integer(typ):
        return 0x55
    return 0x77


def row_hash(table: pa.Table, /, columns: Sequence[str] | None = None) -> U64:
    """One hash per row over ``columns`` (all by default), order-sensitive in the columns.

    Examples:
        >>> t = pa.table({"a": [1, 2, 1], "b": ["x", "y", "x"]})
        >>> h = row_hash(t)
        >>> bool(h[0] == h[2]), bool(h[0] == h[1])
        (True, False)
    """
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for name in table.column_names if columns is None else columns:
        h = mix64(h * _MUL + column_hash(table.column(name)))
    return h
