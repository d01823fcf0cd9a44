"""Hypothesis strategies and small fake Sources shared by the tests (GUIDE §4.8)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from numpy.typing import NDArray

__all__ = [
    "COLUMN_KINDS",
    "LEAF_TYPES",
    "FakeSource",
    "arrow_columns",
    "batch_cuts",
    "batch_sizes",
    "seeds",
    "shard_sizes",
    "world_sizes",
]

seeds = st.integers(0, 2**63 - 1)
batch_sizes = st.integers(1, 40)
world_sizes = st.integers(1, 5)


def shard_sizes(max_shards: int = 12, max_size: int = 60) -> st.SearchStrategy[list[int]]:
    """Uneven shard sizes, empty shards included."""
    return st.lists(st.integers(0, max_size), min_size=0, max_size=max_shards)


_INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_UINTS = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
LEAF_TYPES = [*_INTS, *_UINTS, pa.float32(), pa.float64(), pa.bool_()]
"""The types of numbers and booleans (the leaves of fixed-size lists) :func:`arrow_columns`
draws."""
COLUMN_KINDS = [  # what arrow_columns draws
    "number",
    "fixed_size_list",
    "binary",
    "string",
    "list",
    "float16",
    "dictionary",
    "timestamp",
]


def _leaf_values(typ: pa.DataType) -> st.SearchStrategy[Any]:
    if typ in _INTS or typ in _UINTS:
        info = np.iinfo(np.dtype(str(typ)))
        return st.integers(int(info.min), int(info.max))
    if typ == pa.float32():
        return st.floats(width=32)  # NaN and infinities included
    if typ == pa.float64():
        return st.floats()
    return st.booleans()


def _maybe_null(values: st.SearchStrategy[Any], *, nulls: bool) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values) if nulls else values


@st.composite
def arrow_columns(
    draw: st.DrawFn, n: int, kind: str | None = None, leaf: pa.DataType | None = None
) -> pa.Array:
    """A column of ``n`` rows of a random type (``kind``, one of :data:`COLUMN_KINDS`, or any):
    numbers and booleans of every width (``leaf``, one of :data:`LEAF_TYPES`, or any), fixed-size
    lists (nested too) of them, binary, strings, ragged lists, float16, dictionaries, timestamps;
    without nulls, with a few or with many."""
    kind = draw(st.sampled_from(COLUMN_KINDS)) if kind is None else kind
    nulls = draw(st.sampled_from(["none", "few", "many"]))

    def rows(values: st.SearchStrategy[Any], count: int = n) -> list[Any]:
        out = draw(
            st.lists(_maybe_null(values, nulls=nulls == "many"), min_size=count, max_size=count)
        )
        if nulls == "few" and count:  # some batches with nulls, some without
            for i in draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=3)):
                out[i] = None
        return out

    leaf = draw(st.sampled_from(LEAF_TYPES)) if leaf is None else leaf
    if kind == "number":
        return pa.array(rows(_leaf_values(leaf)), type=leaf)
    if kind == "fixed_size_list":
        dims = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2))
        flat = rows(_leaf_values(leaf), n * int(np.prod(dims)))
        nested = np.array(flat, dtype=object).reshape(n, *dims).tolist()
        if draw(st.integers(0, 4)) == 0:  # now and then a null list
            nested = [None if draw(st.booleans()) else x for x in nested]
        typ = leaf
        for dim in reversed(dims):
            typ = pa.list_(typ, dim)
        return pa.array(nested, type=typ)
    if kind == "binary":
        typ = draw(st.sampled_from([pa.binary(), pa.large_binary()]))
        return pa.array(rows(st.binary(max_size=6)), type=typ)
    if kind == "string":
        typ = draw(st.sampled_from([pa.string(), pa.large_string()]))
        return pa.array(rows(st.text(max_size=4)), type=typ)
    if kind == "list":
        typ = draw(st.sampled_from([pa.list_(pa.int32()), pa.large_list(pa.string())]))
        item = st.integers(-9, 9) if typ == pa.list_(pa.int32()) else st.text(max_size=2)
        return pa.array(rows(st.lists(item, max_size=3)), type=typ)
    if kind == "float16":
        bits = draw(st.lists(st.integers(0, 2**16 - 1), min_size=n, max_size=n))  # NaNs too
        mask = (
            draw(st.lists(st.booleans(), min_size=n, max_size=n))
            if nulls != "none"
            else [False] * n
        )
        values = np.array(bits, np.uint16).view(np.float16)
        return pa.array(values, mask=np.array(mask, dtype=bool))
    if kind == "dictionary":
        return pa.array(rows(st.sampled_from(["a", "b", "c"])), pa.string()).dictionary_encode()
    return pa.array(rows(st.integers(0, 10**12)), pa.timestamp("ms"))


def batch_cuts(n: int, *, empty: bool = True) -> st.SearchStrategy[list[int]]:
    """Batch sizes adding up to ``n``: a batch size, a smaller last batch, size-1 batches, and (with
    ``empty``) empty batches."""
    return st.lists(st.integers(0 if empty else 1, max(n, 1)), max_size=2 * n + 2).map(
        lambda sizes: _cut_to(sizes, n, empty=empty)
    )


def _cut_to(sizes: list[int], n: int, *, empty: bool) -> list[int]:
    out: list[int] = []
    left = n
    for size in sizes:
        take = min(size, left)
        if take or empty:
            out.append(take)
        left -= take
    if left or not out:
        out.append(left)
    return out


class FakeSource:
    """A multi-shard in-memory Source with uneven shard sizes.

    Column ``x`` holds the global sample index, ``uid`` the string ``"u<index>"``, ``ids`` a ragged
    list of ``index % 4`` copies of the index, ``vec`` a fixed-size vector ``[index, -index]``.
    ``reads`` counts ``read_shard`` calls per shard.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.reads = np.zeros(len(self.sizes), dtype=np.int64)

    @property
    def columns(self) -> list[str]:
        return ["x", "uid", "ids", "vec"]

    @property
    def num_shards(self) -> int:
        return len(self.sizes)

    def shard_sizes(self) -> NDArray[np.int64]:
        return self.sizes.copy()

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        self.reads[index] += 1
        x = np.arange(self.offsets[index], self.offsets[index + 1], dtype=np.int64)
        reps = x % 4
        ids = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(reps)]).astype(np.int32)),
            pa.array(np.repeat(x, reps)),
        )
        vec = pa.FixedSizeListArray.from_arrays(pa.array(np.stack([x, -x], axis=1).reshape(-1)), 2)
        table = pa.table({"x": x, "uid": [f"u{i}" for i in x.tolist()], "ids": ids, "vec": vec})
        return table if columns is None else table.select(list(columns))

    def fingerprint(self) -> str:
        return "fake-" + "-".join(map(str, self.sizes.tolist()))
