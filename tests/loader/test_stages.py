"""take_rows equals the straightforward ``concat_tables(...).take(rows)``; warm-up windows keep the
order pure."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.loader import Batching, Loader
from datamill.loader.cache import ShardCache
from datamill.loader.order import shard_order, window_bounds
from datamill.loader.service import BatchService
from datamill.loader.stages import EpochPlan, take_rows
from tests.strategies import FakeSource, seeds, shard_sizes

SCHEMA = pa.schema(
    [
        ("uid", pa.int64()),
        ("f", pa.float32()),
        ("blob", pa.binary()),
        ("big", pa.large_binary()),
        ("s", pa.string()),
        ("ids", pa.list_(pa.int32())),
        ("vec", pa.list_(pa.int16(), 2)),
        ("opt", pa.int32()),
        ("flag", pa.bool_()),
        ("toks", pa.list_(pa.int32())),  # lists without nulls: the vectorised path
        ("emb", pa.large_list(pa.float32())),
    ]
)


@st.composite
def shard_tables(draw: st.DrawFn) -> list[pa.Table]:
    """Shards (some in several chunks, some empty) of binary, list, string, fixed-width and
    null-bearing columns."""
    tables, uid = [], 0
    for _ in range(draw(st.integers(1, 5))):
        chunks = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.integers(0, 12))
            blobs = draw(
                st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=n, max_size=n)
            )
            ids = draw(
                st.lists(
                    st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=6)),
                    min_size=n,
                    max_size=n,
                )
            )
            opt = draw(st.lists(st.one_of(st.none(), st.integers(-9, 9)), min_size=n, max_size=n))
            chunks.append(
                pa.table(
                    {
                        "uid": np.arange(uid, uid + n, dtype=np.int64),
                        "f": np.arange(n, dtype=np.float32) / 3,
                        "blob": pa.array(blobs, pa.binary()),
                        "big": pa.array(blobs, pa.large_binary()),
                        "s": pa.array([None if b is None else b.hex() for b in blobs], pa.string()),
                        "ids": pa.array(ids, pa.list_(pa.int32())),
                        "vec": pa.array([[i, -i] for i in range(n)], pa.list_(pa.int16(), 2)),
                        "opt": pa.array(opt, pa.int32()),
                        "flag": pa.array([i % 3 == 0 for i in range(n)]),
                        "toks": pa.array(
                            [list(range(uid + i, uid + i + (i * 7 + uid) % 5)) for i in range(n)],
                            pa.list_(pa.int32()),
                        ),
                        "emb": pa.array(
                            [[float(uid + i)] * (i % 3) for i in range(n)],
                            pa.large_list(pa.float32()),
                        ),
                    },
                    schema=SCHEMA,
                )
            )
            uid += n
        tables.append(pa.concat_tables(chunks))
    return tables


@given(tables=shard_tables(), data=st.data())
def test_take_rows_equals_concat_then_take(tables: list[pa.Table], data: st.DataObject) -> None:
    sizes = np.array([t.num_rows for t in tables], dtype=np.int64)
    nonempty = np.flatnonzero(sizes)
    count = data.draw(st.integers(0, 40)) if len(nonempty) else 0
    table_of = np.array(
        data.draw(st.lists(st.sampled_from(nonempty.tolist()), min_size=count, max_size=count))
        if count
        else [],
        dtype=np.int64,
    )
    row = np.array(
        [data.draw(st.integers(0, int(sizes[k]) - 1)) for k in table_of.tolist()], dtype=np.int64
    )
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
    # a take from a column of many binary chunks combines the whole column first: read once, combine
    # once
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


# ------------------------------------------------------------------ warm-up windows (a pure order)


@given(n=st.integers(0, 300), window=st.integers(1, 70), warmup=st.booleans())
def test_window_bounds_partition_the_shards_and_double_while_warming_up(
    n: int, window: int, warmup: bool
) -> None:
    bounds = window_bounds(n, window=window, warmup=warmup)
    assert [a for a, _ in bounds] == ([0] + [b for _, b in bounds[:-1]] if bounds else [])
    assert (bounds[-1][1] if bounds else 0) == n
    sizes = [b - a for a, b in bounds]
    expected = [min(2**i if warmup else window, window) for i in range(len(sizes))]
    assert sizes[:-1] == expected[:-1]
    if sizes:
        assert 1 <= sizes[-1] <= expected[-1]


@given(sizes=shard_sizes(), seed=seeds, epoch=st.integers(0, 5), window=st.integers(1, 6))
def test_warmup_order_is_a_permutation_whose_windows_hold_their_shards(
    sizes: list[int], seed: int, epoch: int, window: int
) -> None:
    order = shard_order(sizes, seed=seed, epoch=epoch, window=window, warmup=True)
    np.testing.assert_array_equal(np.sort(order), np.arange(sum(sizes)))
    np.testing.assert_array_equal(
        order, shard_order(sizes, seed=seed, epoch=epoch, window=window, warmup=True)
    )
    if sizes and min(sizes) > 0:  # the first window is one whole shard
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        shard_of = np.searchsorted(offsets, order, side="right") - 1
        first = int(shard_of[0])
        assert set(shard_of[: sizes[first]].tolist()) == {first}


@settings(max_examples=10)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=12), seed=seeds)
def test_warmup_loader_visits_every_sample_once_and_matches_the_service(
    sizes: list[int], seed: int
) -> None:
    src = FakeSource(sizes)
    got = np.concatenate(
        [b["x"] for b in Loader(src, 7, seed=seed, batching=Batching(warmup=True))]
    )
    np.testing.assert_array_equal(np.sort(got), np.arange(sum(sizes)))
    with BatchService(src, batch_size=7, seed=seed, batching=Batching(warmup=True)) as svc:
        served = np.concatenate([r.output["x"] for r in svc.build(0, 0, range(svc.num_batches(0)))])
        np.testing.assert_array_equal(got, served)
        np.testing.assert_array_equal(got, svc.plan(0).seq)
        # the server's O(shards) path (EpochOrder) gives the same samples
        np.testing.assert_array_equal(got, svc.batch_samples(0, 0, list(range(svc.num_batches(0)))))
        assert svc.config()["warmup"] is True
    assert (
        "warmup" not in BatchService(src, batch_size=7).config()
    )  # the default order's states are unchanged


def test_warmup_first_batch_needs_one_shard_not_a_window() -> None:
    src = FakeSource([50] * 12)
    plain = BatchService(src, batch_size=8, seed=3, batching=Batching(window=12)).plan(0)
    warm = BatchService(src, batch_size=8, seed=3, batching=Batching(window=12, warmup=True)).plan(
        0
    )
    assert len(np.unique(plain.shard[:8])) > 1
    assert len(np.unique(warm.shard[:50])) == 1  # the first window is one shard
    assert len(np.unique(warm.shard[50:150])) == 2


@given(tables=shard_tables(), data=st.data())
def test_take_rows_of_null_free_binary_and_strings_equals_concat_then_take(
    tables: list[pa.Table], data: st.DataObject
) -> None:
    # the view gather: null-free binary/string columns, values inline (<= 12 bytes) and in data
    # buffers
    def fill(t: pa.Table) -> pa.Table:
        blobs = [(b or b"") * 3 for b in t.column("blob").to_pylist()]
        opt = [i or 0 for i in t.column("opt").to_pylist()]
        return (
            t.set_column(2, "blob", pa.array(blobs, pa.binary()))
            .set_column(3, "big", pa.array(blobs, pa.large_binary()))
            .set_column(4, "s", pa.array([b.hex() for b in blobs], pa.string()))
            .set_column(7, "opt", pa.array(opt, pa.int32()))
        )

    test_take_rows_equals_concat_then_take.hypothesis.inner_test([fill(t) for t in tables], data)  # type: ignore[attr-defined]


def test_take_rows_never_reuses_the_views_of_a_table_gone() -> None:
    # the per-table views are kept by the table's id while it lives: a new table (which may get a
    # freed table's id) must be gathered from its own buffers
    for i in range(30):
        tables = [
            pa.table({"b": pa.array([bytes([i, k]) * (8 + r) for r in range(4)]), "x": [i] * 4})
            for k in range(3)
        ]
        got = take_rows(tables, np.array([2, 0, 1]), np.array([3, 0, 2]))
        assert got.column("b").to_pylist() == [
            bytes([i, 2]) * 11,
            bytes([i, 0]) * 8,
            bytes([i, 1]) * 10,
        ]
        assert got.column("x").to_pylist() == [i] * 3
        gone = [weakref.ref(t) for t in tables]
        del tables  # freed here (reference counts): a full gc.collect() per round took 0.3 s
        if any(r() is not None for r in gone):  # in a whole-suite session, 8.8 s of this test
            gc.collect()
        assert all(r() is None for r in gone)


def test_an_epoch_over_parquet_never_imports_pandas(tmp_path: Path) -> None:
    # pa.array and Array.to_numpy import pandas on their first call (0.4-2 s of a first batch)
    rng = np.random.default_rng(0)
    for k in range(3):
        n = 40
        lengths = rng.integers(1, 9, n)
        table = pa.table(
            {
                "uid": np.arange(k * n, (k + 1) * n),
                "x": rng.random(n, dtype=np.float32),
                "flag": rng.random(n) < 0.5,
                "image": [rng.bytes(int(m) * 100) for m in lengths],
                "ids": [list(range(int(m))) for m in lengths],
                "name": [f"s{i}" for i in range(n)],
            }
        )
        pq.write_table(table, tmp_path / f"part-{k}.parquet")
    opening = "from datamill.core.parquet import ParquetSource\n"
    assert not _an_epoch_imports_pandas(opening + f"src = ParquetSource({str(tmp_path)!r})\n")


def _an_epoch_imports_pandas(opening: str) -> bool:
    """Whether a fresh process that runs ``opening`` (it sets ``src``) and one epoch of a Loader
    over ``src`` (120 samples) has pandas imported at the end."""
    code = (
        "import sys\n"
        "from datamill.loader import Loader\n"
        f"{opening}"
        "n = sum(len(b['uid']) for b in Loader(src, 16, seed=1))\n"
        "assert n == 120, n\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip() != "False"


def test_opening_a_shardset_dataset_and_an_epoch_never_import_pandas(tmp_path: Path) -> None:
    """The mapping's shard column read from its buffer: pyarrow's ``to_numpy()`` imports pandas
    on its first call (0.17 s of every open of a dataset)."""
    from datamill.shards import ShardsetDataset

    files = []
    for k in range(3):
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(pa.table({"uid": np.arange(k * 40, (k + 1) * 40), "x": np.ones(40)}), path)
        files.append(str(path))
    ShardsetDataset.create(tmp_path / "ds", files, uid="uid", shardset="features")
    opening = "from datamill.shards import ShardsetDataset\n"
    assert not _an_epoch_imports_pandas(
        opening + f"src = ShardsetDataset({str(tmp_path / 'ds')!r})\n"
    )


@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    seed=st.integers(0, 50),
    window=st.one_of(st.none(), st.integers(1, 3)),
    world=st.integers(1, 3),
    batch=st.integers(1, 25),
    drop_last=st.booleans(),
)
def test_an_epochs_build_reader_takes_the_plans_shard_figures(
    sizes: list[int], seed: int, window: int | None, world: int, batch: int, drop_last: bool
) -> None:
    """A build of every batch of a plan reads the plan's per-shard first/last batches instead of
    computing them again over every position: the same figures."""
    from datamill.loader.cache import BuildReader

    plan = EpochPlan.make(
        np.asarray(sizes),
        seed=seed,
        epoch=1,
        shuffle=True,
        window=window,
        rank=world - 1,
        world_size=world,
        drop_last=drop_last,
        batch_size=batch,
    )
    every = np.arange(plan.total_batches, dtype=np.int64)
    fast = BuildReader(ShardCache(lambda k: pa.table({"k": [k]})), plan, every, prefetch=2)
    slow = BuildReader.__new__(BuildReader)
    slow._shards_of(plan, every)
    assert fast.by_first.tolist() == slow.by_first.tolist()
    assert fast.by_last.tolist() == slow.by_last.tolist()
    used = fast.by_first
    assert fast.first[used].tolist() == slow.first[used].tolist()
    assert fast.last.tolist() == slow.last.tolist()
