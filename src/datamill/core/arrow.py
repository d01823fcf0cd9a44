"""numpy <-> Arrow without ``pa.array`` or ``to_numpy``: what a hot path needs, from buffers.

``pa.array`` (and ``pa.scalar``) check their argument against pandas types, which imports pandas
(about 0.5 s) the first time in a process, even for a numpy array (``Array.to_numpy`` too); a
command that never touches pandas (``datamill bert``) should not pay for it. These build the same
arrays from buffers, zero-copy for contiguous numpy arrays (booleans are bit-packed).

Examples:
    >>> import numpy as np
    >>> from_numpy(np.array([1, 2, 3], dtype=np.int32)).to_pylist()
    [1, 2, 3]
    >>> from_numpy(np.array([True, False, True])).to_pylist()
    [True, False, True]
    >>> large_strings(["a", "é", ""]).to_pylist()
    ['a', 'é', '']
    >>> to_numpy(from_numpy(np.array([False, True, True])).slice(1)).tolist()
    [True, True]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

__all__ = ["from_numpy", "joined", "large_strings", "list_array", "to_numpy"]

_TYPES = {
    np.dtype(t): a
    for t, a in [
        (np.int8, pa.int8()),
        (np.int16, pa.int16()),
        (np.int32, pa.int32()),
        (np.int64, pa.int64()),
        (np.uint8, pa.uint8()),
        (np.uint16, pa.uint16()),
        (np.uint32, pa.uint32()),
        (np.uint64, pa.uint64()),
        (np.float32, pa.float32()),
        (np.float64, pa.float64()),
    ]
}

_DTYPES = {a: t for t, a in _TYPES.items()}


def from_numpy(values: NDArray[Any]) -> pa.Array:
    """A 1-D numpy array of a primitive type (or bool) as an Arrow array without nulls."""
    arr = np.ascontiguousarray(values)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D array, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        bits = np.packbits(arr, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(arr), [None, pa.py_buffer(bits)])
    if arr.dtype not in _TYPES:
        raise TypeError(f"no Arrow primitive type for numpy dtype {arr.dtype}")
    return pa.Array.from_buffers(_TYPES[arr.dtype], len(arr), [None, pa.py_buffer(arr)])


def list_array(offsets: NDArray[Any], values: NDArray[Any]) -> pa.ListArray:
    """``list<values>`` from int32 offsets (length n + 1) and the flat values."""
    return pa.ListArray.from_arrays(
        from_numpy(np.asarray(offsets, dtype=np.int32)), from_numpy(values)
    )


def large_strings(items: Sequence[str]) -> pa.Array:
    """A ``large_string`` array of Python strings."""
    encoded = [s.encode("utf-8") for s in items]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(
        np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:]
    )
    return pa.LargeStringArray.from_buffers(
        len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))
    )


def to_numpy(arr: pa.Array | pa.ChunkedArray) -> NDArray[Any]:
    """A primitive or boolean Arrow array without nulls as numpy (a view when the layout allows)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise ValueError(f"expected no nulls, found {arr.null_count}")
    buf = arr.buffers()[1]
    n, off = len(arr), arr.offset
    if pa.types.is_boolean(arr.type):
        if buf is None:
            return np.zeros(0, dtype=np.bool_)
        bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
        return bits[off : off + n].astype(np.bool_)
    dtype = _DTYPES.get(arr.type)
    if dtype is None:
        raise TypeError(f"no numpy dtype for Arrow type {arr.type}")
    if buf is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype)[off : off + n]


def joined(parts: Sequence[Any]) -> pa.Buffer:
    """``parts`` (bytes-like) one after the other in one new buffer of Arrow's default pool.

    A ``bytes`` over 32 MiB (glibc's largest ``mmap`` threshold) gets fresh pages each time, which
    the kernel faults in again (25,600 faults, ~45 ms of CPU, for each 100 MiB on our 2-core VM);
    the default pool (mimalloc) reuses the memory of the buffers freed before
    (``benchmarks/RESULTS.md``). So a server copies a lease out of its build worker's slot with
    this.

    Examples:
        >>> joined([b"ab", memoryview(b"cde")]).to_pybytes()
        b'abcde'
    """
    views = [memoryview(x).cast("B") for x in parts]
    out = pa.allocate_buffer(sum(len(v) for v in views))
    dest, at = memoryview(out).cast("B"), 0
    for v in views:
        dest[at : at + len(v)] = v
        at += len(v)
    return out
