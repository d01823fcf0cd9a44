"""take_rows: the per-shard gather equals the straightforward ``concat_tables(...).take(rows)``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from datamill.loader.cache import ShardCache
from datamill.loader.stages import take_rows

SCHEMA = pa.schema([
    ("uid", pa.int64()), ("f", pa.float32()), ("blob", pa.binary()), ("big", pa.large_binary()),
    ("s", pa.string()), ("ids", pa.list_(pa.int32())), ("vec", pa.list_(pa.int16(), 2)),
    ("opt", pa.int32()), ("flag", pa.bool_()),
])


@st.composite
def shard_tables(draw: st.DrawFn) -> list[pa.Table]:
    """Shards (some in several chunks, some empty) of binary, list, string, fixed-width and null-bearing columns."""
    tables, uid = [], 0
    for _ in range(draw(st.integers(1, 5))):
        chunks = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.integers(0, 12))
            blobs = draw(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=n, max_size=n))
            ids = draw(st.lists(st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=6)), min_size=n, max_size=n))
            opt = draw(st.lists(st.one_of(st.none(), st.integers(-9, 9)), min_size=n, max_size=n))
            chunks.append(pa.table({
                "uid": np.arange(uid, uid + n, dtype=np.int64), "f": np.arange(n, dtype=np.float32) / 3,
                "blob": pa.array(blobs, pa.binary()), "big": pa.array(blobs, pa.large_binary()),
                "s": pa.array([None if b is None else b.hex() for b in blobs], pa.string()),
                "ids": pa.array(ids, pa.list_(pa.int32())),
                "vec": pa.array([[i, -i] for i in range(n)], pa.list_(pa.int16(), 2)),
                "opt": pa.array(opt, pa.int32()), "flag": pa.array([i % 3 == 0 for i in range(n)]),
            }, schema=SCHEMA))
            uid += n
        tables.append(pa.concat_tables(chunks))
    return tables


@given(tables=shard_tables(), data=st.data())
def test_take_rows_equals_concat_then_take(tables: list[pa.Table], data: st.DataObject) -> None:
    sizes = np.array([t.num_rows for t in tables], dtype=np.int64)
    nonempty = np.flatnonzero(sizes)
    count = data.draw(st.integers(0, 40)) if len(nonempty) else 0
    table_of = np.array(data.draw(st.lists(st.sampled_from(nonempty.tolist()), min_size=count, max_size=count))
                        if count else [], dtype=np.int64)
    row = np.array([data.draw(st.integers(0, int(sizes[k]) - 1)) for k in table_of.tolist()], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    expected = pa.concat_tables(tables).take(pa.array(offsets[table_of] + row, pa.int64()))
    got = take_rows(tables, table_of, row)
    assert got.schema == expected.schema
    assert got.num_rows == expected.num_rows
    assert got.equals(expected)
    for name in SCHEMA.names:  # the same values, validity and bytes, column by column
        assert got.column(name).combine_chunks().equals(expected.column(name).combine_chunks())
        assert got.column(name).to_pylist() == expected.column(name).to_pylist()


def test_take_rows_keeps_every_shard_order_and_duplicates() -> None:
    a = pa.table({"b": pa.array([b"a0", b"a1"], pa.binary())})
    b = pa.table({"b": pa.array([b"b0", b"b1", b"b2"], pa.binary())})
    got = take_rows([a, b], np.array([1, 0, 1, 1, 0]), np.array([2, 1, 0, 2, 1]))
    assert got.column("b").to_pylist() == [b"b2", b"a1", b"b0", b"b2", b"a1"]


def test_cache_hands_out_shards_with_one_chunk_per_column() -> None:
    # a take from a column of many binary chunks combines the whole column first: read once, combine once
    chunked = pa.concat_tables([pa.table({"b": pa.array([b"x" * 5] * 3)}) for _ in range(4)])
    assert chunked.column("b").num_chunks == 4
    cache = ShardCache(lambda k: chunked)
    cache.open()
    cache.claim([0])
    cache.load(0)
    got = cache.get(0)
    assert got.column("b").num_chunks == 1
    assert got.equals(chunked)
    cache.release(0)
    cache.finish()
