"""Ragged (CSR) kernels, written once: list -> CSR, CSR concatenation, padding, id dtypes.

A ragged column is always ``values`` + int64 ``offsets`` (``len = rows + 1``): row ``i`` is
``values[offsets[i]:offsets[i + 1]]``. These functions build, join and pad such columns with whole
array operations (no Python loop per row or per value):

* :func:`offsets_from_lengths`, :func:`ranges`: the two index helpers every kernel needs, and
  :func:`runs`, the inverse of :func:`ranges` (ids -> ``[start, stop)`` runs);
* :func:`csr_from_arrays` (a list of per-row arrays, e.g. tokenizer encodings' ids) and
  :func:`encodings_to_csr` (objects with ``.ids``: ``tokenizers.Encoding``),
  :func:`csr_from_arrow` (a pyarrow list array, slices and nulls honoured),
  :func:`concat_csr` (consecutive parts, e.g. encoded chunks);
* :func:`pad`: CSR -> ``(rows, width, ...)`` padded array + boolean mask, right or left, rows
  longer than ``width`` cut to their first ``width`` values;
* :func:`smallest_int_dtype`: the smallest integer dtype that holds a largest id, signed (Ludwig's
  ``int_type``) or unsigned, or the first of an explicit dtype ladder.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import DTypeLike, NDArray

__all__ = [
    "concat_csr",
    "csr_from_arrays",
    "csr_from_arrow",
    "encodings_to_csr",
    "offsets_from_lengths",
    "pad",
    "ranges",
    "runs",
    "smallest_int_dtype",
]

_SIGNED = (np.int8, np.int16, np.int32, np.int64)
_UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)


def offsets_from_lengths(lengths: Iterable[int] | NDArray[np.integer[Any]]) -> NDArray[np.int64]:
    """Row lengths -> int64 offsets starting at 0 (``len = rows + 1``).

    Examples:
        >>> offsets_from_lengths([2, 0, 3]).tolist()
        [0, 2, 2, 5]
    """
    arr = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
    out = np.zeros(len(arr) + 1, np.int64)
    np.cumsum(arr, out=out[1:])
    return out


def ranges(
    starts: NDArray[np.integer[Any]], lengths: NDArray[np.integer[Any]]
) -> NDArray[np.int64]:
    """Concatenation of ``arange(s, s + l)`` for every pair, without a Python loop.

    Examples:
        >>> ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
        [5, 6, 9, 10, 11]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    out = np.arange(total, dtype=np.int64)
    before = np.cumsum(lengths) - lengths
    out += np.repeat(np.asarray(starts, dtype=np.int64) - before, lengths)
    return out


def runs(units: Iterable[int] | NDArray[np.int64]) -> list[tuple[int, int]]:
    """Integer ids (a served iteration's units, say) as sorted ``[start, stop)`` runs, each id once:
    the inverse of :func:`ranges` (vectorised for an array past a few hundred ids, where a plain
    loop is faster).

    Examples:
        >>> runs([0, 1, 2, 5, 6, 9])
        [(0, 3), (5, 7), (9, 10)]
        >>> runs([3, 0, 0, 1])  # each unit once, as for a large array
        [(0, 2), (3, 4)]
        >>> runs(np.flatnonzero(np.arange(600) % 300 < 2))
        [(0, 2), (300, 302)]
        >>> runs(np.arange(600)[::-1] % 300)  # a large array in any order, repeats once
        [(0, 300)]
    """
    if isinstance(units, np.ndarray):
        n = len(units)
        if n and int(units[-1]) - int(units[0]) == n - 1 and (units[1:] - units[:-1] == 1).all():
            return [(int(units[0]), int(units[-1]) + 1)]  # a lease's consecutive units: one run
        if n > 256:
            u = units
            if not (u[1:] > u[:-1]).all():  # sorted, each unit once (np.unique: 2.3 s for 2M)
                u = np.sort(u)
                u = u[np.concatenate([[True], u[1:] != u[:-1]])]
            cut = np.flatnonzero(np.diff(u) != 1) + 1
            starts = u[np.concatenate([[0], cut])]
            stops = u[np.concatenate([cut - 1, [len(u) - 1]])]
            return [(int(a), int(b) + 1) for a, b in zip(starts, stops)]
        units = units.tolist()  # Python ints at once, not a numpy scalar per unit
    vs = sorted(set(units))  # ints, or numpy integers (made ints in the runs returned)
    if not vs:
        return []
    if vs[-1] - vs[0] == len(vs) - 1:  # consecutive ids (a lease's acknowledged batches): one run
        return [(int(vs[0]), int(vs[-1]) + 1)]
    out: list[tuple[int, int]] = []
    start = prev = vs[0]
    for v in vs[1:]:
        if v != prev + 1:
            out.append((int(start), int(prev) + 1))
            start = v
        prev = v
    out.append((int(start), int(prev) + 1))
    return out


def csr_from_arrays(
    rows: Sequence[NDArray[Any]] | Sequence[Sequence[Any]], *, dtype: DTypeLike = np.int32
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """Per-row arrays (or lists) -> ``(values, offsets)``: one concatenation, ``values`` in
    ``dtype``.

    Examples:
        >>> v, o = csr_from_arrays([[4, 5], [], [6]])
        >>> v.tolist(), v.dtype.name, o.tolist()
        ([4, 5, 6], 'int32', [0, 2, 2, 3])
    """
    arrays = [np.asarray(r, dtype=dtype) for r in rows]
    offsets = offsets_from_lengths(np.fromiter((len(a) for a in arrays), np.int64, len(arrays)))
    values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)
    return values.astype(dtype, copy=False), offsets


def encodings_to_csr(
    encodings: Sequence[Any], *, dtype: DTypeLike = np.int32
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """Tokenizer encodings (objects with ``.ids``, e.g. ``tokenizers.Encoding``) -> ``(ids,
    offsets)``.

    One C conversion per encoding (``np.asarray(e.ids)``), then one concatenation.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> ids, off = encodings_to_csr([E(ids=[7, 8]), E(ids=[9])])
        >>> ids.tolist(), off.tolist()
        ([7, 8, 9], [0, 2, 3])
    """
    return csr_from_arrays([np.asarray(e.ids, dtype=dtype) for e in encodings], dtype=dtype)


def concat_csr(
    parts: Sequence[tuple[NDArray[Any], NDArray[np.int64]]], *, dtype: DTypeLike = np.int32
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """Consecutive CSR parts (each with offsets from 0) -> one ``(values, offsets)``.

    Examples:
        >>> v, o = concat_csr(
        ...     [(np.array([1, 2]), np.array([0, 2])), (np.array([3]), np.array([0, 0, 1]))]
        ... )
        >>> v.tolist(), o.tolist()
        ([1, 2, 3], [0, 2, 2, 3])
    """
    if not parts:
        return np.zeros(0, dtype=dtype), np.zeros(1, np.int64)
    values = np.concatenate([v for v, _ in parts])
    offsets = offsets_from_lengths(np.concatenate([np.diff(o) for _, o in parts]))
    return values.astype(dtype, copy=False), offsets


def csr_from_arrow(arr: pa.Array | pa.ChunkedArray) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """A pyarrow list (or large list) array -> ``(values, offsets from 0)``, zero-copy where arrow
    allows.

    Slices are honoured; a null row is an empty row.

    Examples:
        >>> v, o = csr_from_arrow(pa.array([[1, 2], None, [3]]).slice(1))
        >>> v.tolist(), o.tolist()
        ([3], [0, 0, 1])
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
        values = pc.list_flatten(arr).to_numpy(
            zero_copy_only=False
        )  # the non-null rows' values, in order
        return values, offsets_from_lengths(lengths)
    off = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)[off[0] : off[-1]]
    return values, off - off[0]


def pad(
    values: NDArray[Any],
    offsets: NDArray[np.integer[Any]],
    width: int | None = None,
    *,
    fill: Any = 0,
    dtype: DTypeLike | None = None,
    side: Literal["right", "left"] = "right",
) -> tuple[NDArray[Any], NDArray[np.bool_]]:
    """CSR rows -> a ``(rows, width, *values.shape[1:])`` array padded with ``fill``, and the mask
    of real cells.

    Args:
        values: the flat values (1-D, or N-D: each row holds sub-arrays of ``values.shape[1:]``).
        offsets: row bounds into ``values`` (need not start at 0; rows must be in order).
        width: the padded width; rows longer than it keep their first ``width`` values.
            Defaults to ``None`` (the longest row).
        fill: the padding value (``None`` for object arrays). Defaults to ``0``.
        dtype: the output dtype. Defaults to ``None`` (``values.dtype``).
        side: ``"right"`` (values first, padding after) or ``"left"``. Defaults to ``"right"``.

    Returns:
        ``(padded, mask)``: ``mask[i, j]`` is true where ``padded[i, j]`` holds a value.

    Examples:
        >>> p, m = pad(np.array([5, 6, 7, 8]), np.array([0, 3, 3, 4]), 2, side="left")
        >>> p.tolist(), m.sum(axis=1).tolist()
        ([[5, 6], [0, 0], [0, 8]], [2, 0, 1])
        >>> pad(np.array([1, 2, 3]), np.array([0, 1, 3]), fill=-1)[0].tolist()
        [[1, -1], [2, 3]]
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    if width is None:
        width = int(lengths.max()) if n else 0
    clipped = np.minimum(lengths, width)
    out = np.full(
        (n, width, *values.shape[1:]), fill, dtype=values.dtype if dtype is None else dtype
    )
    cols = np.arange(width, dtype=np.int64)
    mask = cols < clipped[:, None] if side == "right" else cols >= (width - clipped)[:, None]
    if n == 0 or width == 0:
        return out, mask
    if (clipped == lengths).all():  # rows are whole and consecutive: no gather
        src = values[offsets[0] : offsets[-1]]
    else:
        src = values[ranges(offsets[:-1], clipped)]
    out[mask] = src
    return out, mask


def smallest_int_dtype(
    max_value: int, *, signed: bool = True, dtypes: Sequence[DTypeLike] | None = None
) -> np.dtype[Any]:
    """The first integer dtype that holds ``0 .. max_value``.

    The ladder is ``int8, int16, int32, int64`` (``signed=True``: Ludwig's ``int_type``),
    ``uint8 .. uint64`` (``signed=False``), or ``dtypes`` when given (e.g. corpus files use
    ``(uint16, int32, int64)``).

    Raises:
        ValueError: ``max_value`` does not fit the last dtype of the ladder, or is negative.

    Examples:
        >>> (
        ...     smallest_int_dtype(127).name,
        ...     smallest_int_dtype(128).name,
        ...     smallest_int_dtype(255, signed=False).name,
        ... )
        ('int8', 'int16', 'uint8')
        >>> smallest_int_dtype(70_000, dtypes=(np.uint16, np.int32)).name
        'int32'
    """
    if max_value < 0:
        raise ValueError(f"max_value must be >= 0, got {max_value}")
    ladder = dtypes if dtypes is not None else (_SIGNED if signed else _UNSIGNED)
    for candidate in ladder:
        dt = np.dtype(candidate)
        if max_value <= np.iinfo(dt).max:
            return dt
    raise ValueError(f"{max_value} does not fit any of {[np.dtype(d).name for d in ladder]}")
