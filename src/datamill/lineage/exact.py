"""Exact row equality over Arrow columns, vectorised: cheap 64-bit row keys, then exact checks.

Most columns have exact codes (:mod:`datamill.lineage.packed`: numbers by their range, short
strings by their inline bytes, ...), packed side by side into a few ``uint64`` words per row, so
rows are equal exactly when their words are. The other columns (lists, long strings) are kept as
views of their buffers and compared element by element. :func:`row_keys` mixes the words (and the
other columns' hashes) into one ``uint64`` per row: equal rows get equal keys, unequal rows almost
always differ, and :func:`rows_equal` decides every candidate pair exactly, so a key collision
never becomes a reported duplicate. :func:`leaks` and :func:`duplicate_groups` build on both.
The work is split by column over ``threads`` threads (numpy and Arrow release the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.parallel import ordered_map
from datamill.lineage.packed import Code, column_codes, mix_words, pack
from datamill.lineage.rowhash import (
    column_hash,
    is_bytes_type,
    is_list_type,
    mix64,
    segment_hash,
)

__all__ = ["Columns", "duplicate_groups", "leaks", "row_keys", "rows_equal"]

U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]
BOOL = NDArray[np.bool_]
IDX = NDArray[np.integer[Any]]
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xBF58476D1CE4E5B9)
_NULL = np.uint64(0xA0761D6478BD642F)
_MASK = np.array([(1 << (8 * m)) - 1 for m in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_WORDS_MAX = 24
"""Strings Arrow cannot dictionary-encode (a list's values): up to this many bytes keyed by their
8-byte words, longer ones by a polynomial over their bytes."""


@dataclass
class _Col:
    """One column prepared for keys and comparisons (numpy views of its Arrow buffers)."""

    kind: str  # "fixed", "bytes", "list", "struct", "dict"
    arr: pa.Array
    valid: BOOL | None = None
    values: NDArray[np.generic] | None = None  # fixed: the values
    indices: I64 | None = None  # dict: the indices
    starts: IDX | None = None  # bytes / list: each row's first byte / element
    lengths: I64 | None = None
    words: U64 | None = None  # bytes: a uint64 view with a stride of one byte
    raw: NDArray[np.uint8] | None = None  # bytes: the data buffer
    code: U64 | None = None  # strings: their ids in the column (dictionary_encode), exact
    children: list[_Col] = field(default_factory=list)


def _prepare(column: pa.Array | pa.ChunkedArray) -> _Col:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr, pa.ChunkedArray):  # an empty chunked array
        arr = pa.array([], type=arr.type)
    typ = arr.type
    if is_bytes_type(typ):
        return _bytes_col(arr, None)  # (nulls: in the codes, or :func:`_parts`)
    valid = _validity(arr) if arr.null_count else None
    if pat.is_boolean(typ):
        arr = pc.cast(arr, pa.uint8())
        typ = arr.type
    if pat.is_null(typ) or (pat.is_dictionary(typ) and len(arr.dictionary) == 0):  # all null
        return _Col("fixed", arr, np.zeros(len(arr), dtype=bool), values=np.zeros(len(arr), "u1"))
    if pat.is_dictionary(typ):
        idx = np.asarray(arr.indices.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return _Col("dict", arr, valid, indices=idx, children=[_prepare(arr.dictionary)])
    if pat.is_struct(typ):
        return _Col("struct", arr, valid, children=[_prepare(f) for f in arr.flatten()])
    if is_list_type(typ):
        return _list_col(arr, valid)
    return _fixed_col(arr, valid)


def _list_col(arr: pa.Array, valid: BOOL | None) -> _Col:
    typ = arr.type
    if pat.is_fixed_size_list(typ):
        size = typ.list_size
        starts = (np.arange(len(arr), dtype=np.int64) + arr.offset) * size
        lengths = np.full(len(arr), size, dtype=np.int64)
    else:
        off = np.asarray(arr.offsets, dtype=np.int64)
        starts, lengths = off[:-1], np.diff(off)
    return _Col("list", arr, valid, starts=starts, lengths=lengths, children=[_prepare(arr.values)])


def _fixed_col(arr: pa.Array, valid: BOOL | None) -> _Col:
    """A fixed-width column: its values as unsigned words, or as bytes (decimals, fixed binary)."""
    typ = arr.type
    width = typ.bit_width // 8 if typ.bit_width and typ.bit_width % 8 == 0 else 0
    if not width:
        raise TypeError(f"no exact comparison for Arrow type {typ}")
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=(arr.offset + len(arr)) * width)
    raw = raw[arr.offset * width :]
    if width in (1, 2, 4, 8):
        return _Col("fixed", arr, valid, values=raw.view(f"<u{width}"))
    starts = np.arange(len(arr), dtype=np.int64) * width
    lengths = np.full(len(arr), width, dtype=np.int64)
    return _Col("bytes", arr, valid, starts=starts, lengths=lengths, words=_word_view(raw), raw=raw)


def _validity(arr: pa.Array) -> BOOL:
    """The validity bitmap as bools (one ``unpackbits``)."""
    bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    unpacked = np.unpackbits(bits, count=arr.offset + len(arr), bitorder="little")
    return unpacked[arr.offset :].view(bool)


def _word_view(data: NDArray[np.uint8]) -> U64:
    """``view[i]`` = the 8 bytes from byte ``i`` as a little-endian uint64 (zero-padded)."""
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = data
    return np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))


def _bytes_col(arr: pa.Array, valid: BOOL | None) -> _Col:
    """A string/binary column; its byte views are made when first needed (:func:`_parts`)."""
    return _Col("bytes", arr, valid)


def _parts(col: _Col) -> _Col:
    """Fill in a string column's starts, lengths and word view (once)."""
    if col.words is None:
        arr = col.arr
        large = pat.is_large_string(arr.type) or pat.is_large_binary(arr.type)
        odt = np.int64 if large else np.int32
        off = np.frombuffer(arr.buffers()[1], dtype=odt, count=arr.offset + len(arr) + 1)
        off = off[arr.offset :]
        data = arr.buffers()[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        col.lengths = np.diff(off).astype(np.int64)
        col.starts = cast(IDX, off[:-1])
        col.words, col.raw = _word_view(raw), raw
        col.valid = _validity(arr) if arr.null_count else None
    return col


def _word(col: _Col, rows: I64 | None, k: int) -> U64:
    """Bytes ``8k .. 8k + 7`` of each row's string (zero past its end)."""
    _parts(col)
    assert col.words is not None and col.starts is not None and col.lengths is not None
    starts = col.starts if rows is None else col.starts[rows]
    lengths = col.lengths if rows is None else col.lengths[rows]
    if k == 0:
        w = col.words[starts]
        w &= _MASK[np.minimum(lengths, 8)]
    else:
        w = col.words[np.minimum(starts + 8 * k, len(col.words) - 1)]  # (masked past the end)
        w &= _MASK[np.clip(lengths - 8 * k, 0, 8)]
    return w


def _key(col: _Col) -> U64:
    """A uint64 per row: equal values give equal keys."""
    n = len(col.arr)
    if col.kind == "fixed":
        assert col.values is not None
        h = col.values.astype(np.uint64, copy=False)  # (read only by the callers)
    elif col.kind == "bytes":
        code = _dictionary_code(col.arr)
        if code is not None:  # strings: their ids in this column (Arrow's hash table), exact
            col.code = code
            return code
        _parts(col)
        assert col.lengths is not None and col.starts is not None and col.words is not None
        top = int(col.lengths.max()) if n else 0
        if top <= _WORDS_MAX:
            h = col.lengths.astype(np.uint64)
            for k in range((top + 7) // 8):
                h *= _K1
                h ^= _word(col, None, k)
        else:  # long strings: a polynomial over the bytes (one prefix sum)
            assert col.raw is not None
            offsets = np.append(col.starts, col.starts[-1] + col.lengths[-1]).astype(np.int64)
            h = segment_hash(col.raw.astype(np.uint64), offsets)
    elif col.kind == "dict":
        assert col.indices is not None
        h = _key(col.children[0])[col.indices]
    else:
        h = column_hash(col.arr)
    if col.valid is not None:
        h = np.where(col.valid, h, _NULL)
    return h


def _dictionary_code(arr: pa.Array) -> U64 | None:
    """Exact codes of a column's values: ids of ``dictionary_encode``, nulls ``2**63``."""
    try:
        idx = pc.dictionary_encode(arr).indices
    except pa.ArrowNotImplementedError:
        return None
    ids = np.asarray(idx.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    code = ids.astype(np.uint64)
    if idx.null_count:
        code[ids < 0] = np.uint64(1 << 63)
    return code


def row_keys(table: pa.Table, columns: Sequence[str], /) -> U64:
    """One uint64 per row, equal for rows with equal ``columns`` (within this table only).

    Not a content hash to compare across builds (see :mod:`datamill.lineage.rowhash`): numbers
    are keyed by their offset from the column's minimum, short strings by their bytes, and the
    columns mixed cheaply.

    Examples:
        >>> k = row_keys(pa.table({"a": ["x", "y", "x"], "b": [1, 2, 1]}), ["a", "b"])
        >>> bool(k[0] == k[2]), bool(k[0] == k[1])
        (True, False)
    """
    return Columns.of(table, columns).keys()


def _keys(cols: list[_Col], n: int) -> U64:
    """The fallback columns' keys, mixed (xor, multiply, a shift every 8 columns)."""
    h = np.zeros(n, dtype=np.uint64)
    for i, col in enumerate(cols):  # (h ^ key) * odd: a bijection of h per column
        h ^= _key(col)
        h *= _K2
        if i % 8 == 7:
            h ^= h >> np.uint64(29)
    return h


def _equal(col: _Col, a: I64, b: I64) -> BOOL:
    """``col[a[i]] == col[b[i]]`` exactly (two nulls are equal)."""
    if col.code is not None:
        return np.asarray(col.code[a] == col.code[b], dtype=bool)
    if col.kind == "fixed":
        assert col.values is not None
        eq = col.values[a] == col.values[b]
    elif col.kind == "dict":
        assert col.indices is not None
        eq = _equal(col.children[0], col.indices[a], col.indices[b])
    elif col.kind == "struct":
        eq = np.ones(len(a), dtype=bool)
        for child in col.children:
            eq &= _equal(child, a, b)
    else:
        if col.kind == "bytes":
            _parts(col)
        assert col.lengths is not None and col.starts is not None
        eq = col.lengths[a] == col.lengths[b]
        if col.kind == "bytes":
            for k in range((int(col.lengths.max()) + 7) // 8 if len(col.lengths) else 0):
                todo = np.flatnonzero(eq & (col.lengths[a] > 8 * k))
                if not len(todo):
                    break
                eq[todo] = _word(col, a[todo], k) == _word(col, b[todo], k)
        else:
            eq &= _elements_equal(col, a, b, eq)
    if col.valid is not None:
        va, vb = col.valid[a], col.valid[b]
        eq = np.where(va & vb, eq, va == vb)
    return np.asarray(eq, dtype=bool)


def _elements_equal(col: _Col, a: I64, b: I64, same_length: BOOL) -> BOOL:
    """For list rows of equal length: are all their elements equal?"""
    assert col.lengths is not None and col.starts is not None
    out = same_length.copy()
    todo = np.flatnonzero(same_length & (col.lengths[a] > 0))
    if not len(todo):
        return out
    lengths = col.lengths[a[todo]]
    total = int(lengths.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ea = np.repeat(col.starts[a[todo]], lengths) + within
    eb = np.repeat(col.starts[b[todo]], lengths) + within
    child = _equal(col.children[0], ea, eb)
    out[todo] = np.logical_and.reduceat(child, np.cumsum(lengths) - lengths)
    return out


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr, pa.ChunkedArray):  # an empty chunked array
        arr = pa.array([], type=arr.type)
    return arr


def _threads(threads: int | None) -> int:
    return min(4, os.cpu_count() or 1) if threads is None else max(1, threads)


@dataclass
class Columns:
    """Columns of a table prepared once for :func:`rows_equal` (and their row keys).

    ``words`` hold the packed exact codes of the columns that have them; ``cols`` the others.
    """

    cols: list[_Col]
    num_rows: int
    words: list[U64] = field(default_factory=list)
    threads: int = 1

    @classmethod
    def of(
        cls, table: pa.Table, columns: Sequence[str], /, *, threads: int | None = None
    ) -> Columns:
        """Prepare ``columns`` of ``table`` on ``threads`` threads (default: the cores, at most 4).

        The result (keys, equality) does not depend on ``threads``.
        """
        workers = _threads(threads)

        def prepare(k: int) -> list[tuple[pa.Array, list[Code] | None]]:
            arrays = [_array(table.column(c)) for c in columns[k::workers]]
            return [(a, column_codes(a)) for a in arrays]

        parts = list(ordered_map(prepare, range(workers), threads=workers))  # (one task a thread)
        done = [parts[i % workers][i // workers] for i in range(len(columns))]
        others = [_prepare(a) for a, code in done if code is None]
        exact = [c for _, code in done if code is not None for c in code]
        return cls(others, table.num_rows, pack(exact, threads=workers), workers)

    def keys(self) -> U64:
        """:func:`row_keys` of the prepared columns."""
        n = self.num_rows
        halves = [self.words[0::2], self.words[1::2]]  # (two chains, whatever the threads)
        a, b = ordered_map(lambda w: mix_words(w, n), halves, threads=min(2, self.threads))
        h = mix64(a)
        h ^= b
        if self.cols:
            h = mix64(h)
            h ^= _keys(self.cols, n)
        return mix64(h)


def rows_equal(columns: Columns, a: I64, b: I64, /) -> BOOL:
    """``row a[i] == row b[i]`` over every prepared column, exactly.

    Examples:
        >>> c = Columns.of(pa.table({"s": ["ab", "ab", None], "x": [[1], [1], None]}), ["s", "x"])
        >>> rows_equal(c, np.array([0, 0, 2]), np.array([1, 2, 2])).tolist()
        [True, False, True]
    """

    def words_equal(words: list[U64]) -> BOOL:
        eq = np.ones(len(a), dtype=bool)
        for w in words:  # (most candidates are equal: no point narrowing them down)
            eq &= w[a] == w[b]
        return eq

    halves = [columns.words[0::2], columns.words[1::2]]
    x, y = ordered_map(words_equal, halves, threads=min(2, columns.threads))
    x &= y
    for col in columns.cols:
        x &= _equal(col, a, b)
    return x


def leaks(columns: Columns, keys: U64, train: I64, rows: I64, /) -> tuple[I64, I64]:
    """``(row, training row)`` for each of ``rows`` that equals a ``train`` row exactly.

    Rows are matched by key (one sort of the training keys), and each match is checked with
    :func:`rows_equal`; a row whose key matched an unequal training row (a key collision) is
    compared with every training row of that key.

    Examples:
        >>> t = pa.table({"x": [1, 2, 1, 3], "s": ["a", "b", "a", "b"]})
        >>> c = Columns.of(t, ["x", "s"])
        >>> r, tr = leaks(c, c.keys(), np.array([0, 1]), np.array([2, 3]))
        >>> r.tolist(), tr.tolist()
        ([2], [0])
    """
    if not len(train) or not len(rows):
        z = np.zeros(0, dtype=np.int64)
        return z, z
    order = np.argsort(keys[train])  # (not stable: each key's smallest training row is below)
    sorted_keys = keys[train][order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]]))
    unique = sorted_keys[starts]
    first = np.minimum.reduceat(train[order], starts)  # the smallest training row of each key
    rk = keys[rows]
    i = np.searchsorted(unique, rk).clip(max=len(unique) - 1)
    hit = np.flatnonzero(unique[i] == rk)
    cand_r, cand_t = rows[hit], first[i[hit]]
    ok = rows_equal(columns, cand_r, cand_t)
    out_r, out_t = [cand_r[ok]], [cand_t[ok]]
    ends = np.append(starts[1:], len(sorted_keys))
    for j in np.flatnonzero(~ok).tolist():  # key collisions: rare, so one row at a time
        g = int(i[hit[j]])
        others = train[order[starts[g] : ends[g]]]
        same = rows_equal(columns, np.full(len(others), cand_r[j]), others)
        if same.any():
            out_r.append(cand_r[j : j + 1])
            out_t.append(np.array([others[same].min()], dtype=np.int64))
    r, t = np.concatenate(out_r), np.concatenate(out_t)
    if len(out_r) > 1 or (len(r) > 1 and bool((r[1:] < r[:-1]).any())):
        by_row = np.argsort(r, kind="stable")
        r, t = r[by_row], t[by_row]
    return r, t


def duplicate_groups(columns: Columns, keys: U64, /) -> I64:
    """A group id per row: rows are in one group exactly when they are equal.

    Groups are numbered by their first row (group ``g`` starts at row ``g``'s first appearance),
    so ``ids[i] == i`` for the first row of each group.

    Examples:
        >>> c = Columns.of(pa.table({"s": ["a", "b", "a", None, None]}), ["s"])
        >>> duplicate_groups(c, c.keys()).tolist()
        [0, 1, 0, 3, 3]
    """
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    ks = order.astype(np.int64)
    sk = keys[order]
    new = np.ones(n, dtype=bool)
    new[1:] = sk[1:] != sk[:-1]
    head = ks[np.flatnonzero(new)[np.cumsum(new) - 1]] if n else ks  # first row of each key
    ids = head.copy()
    multi = np.flatnonzero(ks != head)
    ok = rows_equal(columns, ks[multi], head[multi])
    for j in multi[~ok].tolist():  # key collisions: rare; compare with earlier rows of the key
        row = int(ks[j])
        lo = int(np.searchsorted(sk, sk[j], side="left"))
        earlier = ks[lo:j]
        same = rows_equal(columns, np.full(len(earlier), row), earlier)
        ids[j] = int(ids[lo + int(np.argmax(same))]) if same.any() else row
    out = np.empty(n, dtype=np.int64)
    out[ks] = ids
    return out
