"""trace agrees with ground truth: every batch of real in-process runs is recorded, then traced both
ways."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError
from datamill.core.source import TableSource
from datamill.lineage.index import ShardOrderIndex
from datamill.lineage.trace import Tracer, trace
from datamill.loader import Batching, Loader, Mix
from datamill.loader.order import shard_order
from datamill.loader.record import run_record
from tests.strategies import seeds

Truth = dict[tuple[int, int, int], list[int]]  # (epoch, rank, step) -> samples (in batch order)


def table_of(sizes: list[int], *, ragged: bool = False) -> tuple[pa.Table, int]:
    n = int(sum(sizes))
    cols: dict[str, Any] = {
        "i": np.arange(n, dtype=np.int64),
        "uid": [f"s{(i * 7919) % 100003}-{i}" for i in range(n)],
    }
    if ragged:
        lengths = (np.arange(n) * 37) % 11
        cols["t"] = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)),
            pa.array(np.zeros(int(lengths.sum()), dtype=np.int64)),
        )
    return pa.table(cols), n


class Source(TableSource):
    """A TableSource with uneven shards (the given sizes)."""

    def __init__(self, table: pa.Table, sizes: list[int]) -> None:
        uid = "uid" if "uid" in table.column_names else None
        super().__init__(table, shard_size=max(1, max(sizes, default=1)), uid_column=uid)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)

    @property
    def num_shards(self) -> int:
        return len(self._sizes)

    def shard_sizes(self) -> Any:
        return self._sizes.copy()

    def read_shard(self, index: int, *, columns: Any = None) -> pa.Table:
        t = self.table.slice(int(self._offsets[index]), int(self._sizes[index]))
        return t if columns is None else t.select(list(columns))

    def fingerprint(self) -> str:
        return "src-" + "-".join(map(str, self._sizes.tolist()))


def drive(
    loaders: list[Loader],
    truth: Truth,
    *,
    offset: int,
    stop_after: int | None = None,
    sample_of: Callable[[pa.Table], list[int]],
) -> None:
    """Step every rank in lockstep through the rest of its epoch (or ``stop_after`` batches),
    recording."""
    its = [iter(ld) for ld in loaders]
    taken = [0] * len(loaders)
    live = [True] * len(loaders)
    while any(live):
        for r, (ld, it) in enumerate(zip(loaders, its)):
            if not live[r] or (stop_after is not None and taken[r] >= stop_after):
                live[r] = False
                continue
            epoch = ld.epoch
            try:
                out = next(it)
            except StopIteration:
                live[r] = False
                continue
            taken[r] += 1
            batch = ld.state_dict()["batches_seen"] - 1
            truth[(epoch, r, offset + batch)] = sample_of(out)


def check(
    rec: dict[str, Any],
    truth: Truth,
    n: int,
    *,
    source: Any = None,
    filtered: Callable[[int], bool] | None = None,
    uids: list[Any] | None = None,
) -> None:
    rec = json.loads(json.dumps(rec))  # the record is plain JSON
    tracer = Tracer(rec, source=source)
    by_sample: dict[int, set[tuple[int, int, int, int]]] = defaultdict(set)
    for (e, r, s), samples in truth.items():
        for p, x in enumerate(samples):
            by_sample[x].add((e, r, s, p))
    # step -> samples, for every recorded step (and with a filter: the passing ones)
    for (e, r, s), samples in truth.items():
        got = tracer.batch(rank=r, step=s, epoch=e).samples
        if filtered is not None:
            got = [x for x in got if not filtered(x)]
        assert got == samples, (e, r, s)
    # every step of every rank the record covers that yielded nothing is empty (or fully filtered)
    for e in tracer.epochs():
        for s in range(tracer.steps_in_epoch(e)):
            for r in range(8):
                if (e, r, s) in truth:
                    continue
                try:
                    b = tracer.batch(rank=r, step=s, epoch=e)
                except ConfigError:
                    continue
                assert not b.samples or (
                    filtered is not None and all(filtered(x) for x in b.samples)
                ), (e, r, s, b)
    # sample -> (epoch, rank, step, position), both ways, for every sample
    hits = tracer.find(np.arange(n))
    got_by: dict[int, set[tuple[int, int, int, int]]] = defaultdict(set)
    for h in hits:
        if filtered is not None and filtered(h.sample):
            continue
        got_by[h.sample].add((h.epoch, h.rank, h.step, h.position))
    if filtered is None:
        assert dict(got_by) == dict(by_sample)
    else:
        # positions shift when earlier rows of the batch were filtered: compare (epoch, rank, step)
        assert {k: {v[:3] for v in vs} for k, vs in got_by.items()} == {
            k: {v[:3] for v in vs} for k, vs in by_sample.items()
        }
    if uids is not None:
        pick = sorted({0, n // 2, n - 1}) if n else []
        res = trace(rec, uids=[uids[i] for i in pick], source=source)
        assert {(h.uid, h.sample) for h in res["hits"]} <= {(uids[i], i) for i in pick}
        assert (
            len(res["hits"]) == sum(len(by_sample.get(i, ())) for i in pick) or filtered is not None
        )


def idx_of(out: pa.Table) -> list[int]:
    return out.column("i").to_pylist()


@settings(max_examples=30)
@given(
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=8),
    seed=seeds,
    bs=st.integers(1, 6),
    bs2=st.integers(1, 6),
    w0=st.integers(1, 4),
    w1=st.integers(1, 4),
    repl=st.sampled_from([1, 2]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 3)),
    frac=st.floats(0, 1),
    data=st.data(),
)
def test_trace_matches_recorded_runs_with_elastic_resize_and_resume(
    sizes: list[int],
    seed: int,
    bs: int,
    bs2: int,
    w0: int,
    w1: int,
    repl: int,
    drop_last: bool,
    shuffle: bool,
    window: int | None,
    frac: float,
    data: st.DataObject,
) -> None:
    table, n = table_of(sizes)
    src = Source(table, sizes)
    kw: dict[str, Any] = {"seed": seed, "collate": "arrow"}
    order = {"drop_last": drop_last, "shuffle": shuffle}
    truth: Truth = {}
    # run 1: world w0 * repl, stopped part-way through epoch 0 (every rank still has batches left)
    old = [
        Loader(
            src,
            bs,
            rank=r,
            world_size=w0 * repl,
            batching=Batching(window=window, replication=repl, **order),
            **kw,
        )
        for r in range(w0 * repl)
    ]
    least = min(len(ld) for ld in old)
    m = int(frac * max(0, least - 1))
    drive(old, truth, offset=0, stop_after=m, sample_of=idx_of)
    rec = old[0].run_record()
    check(rec, truth, n, source=src)
    # run 2: elastic resize to w1 ranks (and another batch size), to the end of epoch 0, then epoch
    # 1 part-way
    states = [ld.state_dict() for ld in old]
    new = [
        Loader(src, bs2, rank=r, world_size=w1, batching=Batching(window=window, **order), **kw)
        for r in range(w1)
    ]
    for ld in new:
        ld.load_state_dict(json.loads(json.dumps(states)), allow_mismatch=["batch_size"])
    elastic = bool(new[0]._elastic)
    drive(new, truth, offset=m if elastic else 0, sample_of=idx_of)
    k = data.draw(st.integers(0, max(0, min(len(ld) for ld in new) - 1)))
    drive(new, truth, offset=0, stop_after=k, sample_of=idx_of)
    rec = new[0].run_record(previous=rec)
    check(rec, truth, n, source=src)
    # run 3: a plain resume of the same configuration, to the end of epoch 1
    states = [ld.state_dict() for ld in new]
    again = [Loader.from_state(src, st_, collate="arrow") for st_ in json.loads(json.dumps(states))]
    drive(again, truth, offset=0, sample_of=idx_of)
    rec = again[0].run_record(previous=rec)
    check(rec, truth, n, source=src, uids=table.column("uid").to_pylist())


@settings(max_examples=15)
@given(
    sizes_a=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    sizes_b=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    seed=seeds,
    bs=st.integers(1, 5),
    world=st.integers(1, 3),
    epoch_size=st.integers(0, 80),
    weight=st.floats(0.1, 0.9),
)
def test_trace_matches_a_mix_with_repeats(
    sizes_a: list[int],
    sizes_b: list[int],
    seed: int,
    bs: int,
    world: int,
    epoch_size: int,
    weight: float,
) -> None:
    if not sum(sizes_a):
        sizes_a = [*sizes_a, 3]
    ta, na = table_of(sizes_a)
    tb, nb = table_of(sizes_b)
    mix = Mix(
        [
            (Source(ta.drop_columns(["uid"]), sizes_a), weight),
            (Source(tb.drop_columns(["uid"]), sizes_b), 1 - weight),
        ],
        epoch_size=epoch_size,
        names=["a", "b"],
    )

    def sample_of(out: pa.Table) -> list[int]:
        return [
            i if s == "a" else na + i
            for i, s in zip(out.column("i").to_pylist(), out.column("source").to_pylist())
        ]

    truth: Truth = {}
    loaders = [
        Loader(mix, bs, seed=seed, rank=r, world_size=world, collate="arrow") for r in range(world)
    ]
    drive(loaders, truth, offset=0, sample_of=sample_of)
    drive(loaders, truth, offset=0, sample_of=sample_of)  # epoch 1
    check(loaders[0].run_record(), truth, na + nb)


@settings(max_examples=15)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    seed=seeds,
    bs=st.integers(1, 5),
    world=st.integers(1, 3),
    drop_last=st.booleans(),
    buckets=st.integers(1, 4),
    frac=st.floats(0, 1),
)
def test_trace_matches_length_buckets_and_a_resume(
    sizes: list[int], seed: int, bs: int, world: int, drop_last: bool, buckets: int, frac: float
) -> None:
    table, n = table_of(sizes, ragged=True)
    src = Source(table, sizes)
    kw: dict[str, Any] = {
        "seed": seed,
        "batching": Batching(bucket_by="t", buckets=buckets, drop_last=drop_last),
        "collate": "arrow",
    }
    truth: Truth = {}
    old = [Loader(src, bs, rank=r, world_size=world, **kw) for r in range(world)]
    m = int(frac * max(0, min(len(ld) for ld in old) - 1))
    drive(old, truth, offset=0, stop_after=m, sample_of=idx_of)
    rec = old[0].run_record()
    new = [Loader.from_state(src, ld.state_dict(), collate="arrow") for ld in old]
    drive(new, truth, offset=0, sample_of=idx_of)
    drive(new, truth, offset=0, sample_of=idx_of)
    check(new[0].run_record(previous=rec), truth, n, source=src)


def short_only(t: pa.Table) -> Any:
    return pc.less(pc.list_value_length(t.column("t")), 5)


@settings(max_examples=15)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    seed=seeds,
    bs=st.integers(1, 6),
    world=st.integers(1, 3),
)
def test_trace_reports_samples_a_filter_rejected(
    sizes: list[int], seed: int, bs: int, world: int
) -> None:
    table, n = table_of(sizes, ragged=True)
    src = Source(table, sizes)
    long_ = set(np.flatnonzero(pc.list_value_length(table.column("t")).to_numpy() >= 5).tolist())
    truth: Truth = {}
    loaders = [
        Loader(
            src,
            bs,
            seed=seed,
            rank=r,
            world_size=world,
            collate="arrow",
            batching=Batching(filter=short_only),
        )
        for r in range(world)
    ]
    drive(loaders, truth, offset=0, sample_of=idx_of)
    rec = loaders[0].run_record()
    assert rec["filter"] is not None and rec["filter"].endswith("short_only")
    check(rec, truth, n, source=src, filtered=lambda x: x in long_)
    steps = [(e, r, s) for (e, r, s) in truth][:5]
    res = trace(rec, steps=steps, source=src, filter=short_only)
    for b in res["batches"]:
        assert b.rejected == [x in long_ for x in b.samples]
        assert [x for x, rj in zip(b.samples, b.rejected) if not rj] == truth[
            (b.epoch, b.rank, b.step)
        ]


@given(
    sizes=st.lists(st.integers(0, 400), min_size=0, max_size=30),
    seed=seeds,
    epoch=st.integers(0, 50),
    window=st.integers(1, 6),
)
def test_shard_order_index_inverts_the_order_exactly(
    sizes: list[int], seed: int, epoch: int, window: int
) -> None:
    order = shard_order(sizes, seed=seed, epoch=epoch, window=window)
    idx = ShardOrderIndex.build(sizes, seed=seed, epoch=epoch, window=window)
    np.testing.assert_array_equal(idx.at(np.arange(len(order))), order)
    pos, which = idx.where(order)
    np.testing.assert_array_equal(pos, np.arange(len(order)))
    np.testing.assert_array_equal(which, np.arange(len(order)))


def test_index_is_stored_beside_the_record_and_reused(tmp_path: Any) -> None:
    sizes = [50] * 6
    table, _ = table_of(sizes)
    src = Source(table, sizes)
    loader = Loader(src, 8, seed=4, collate="arrow")
    first = [b.column("i").to_pylist() for b in loader]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(loader.run_record()))
    assert trace(path, steps=(0, 0, 3))["batches"][0].samples == first[3]
    assert sorted(p.name for p in (tmp_path / "run.json.index").iterdir()) == ["order-v2-0.npz"]
    assert trace(path, steps=(0, 0, 3))["batches"][0].samples == first[3]  # from the stored index
    res = trace(path, uids=[table.column("uid")[7].as_py()], source=src)
    assert [(h.sample, h.epoch) for h in res["hits"]] == [(7, 0)]
    assert (tmp_path / "run.json.index" / "uids.arrow").exists()


def test_bad_records_raise_config_errors(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as err:
        trace(tmp_path / "missing.json", samples=1)
    assert err.value.path == str(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match="datamill.run/1"):
        trace(tmp_path / "x.json", samples=1)
    loader = Loader(TableSource(pa.table({"x": list(range(10))})), 3)
    with pytest.raises(ConfigError, match="not in this record"):
        trace(loader.run_record(), steps=(0, 0, 0))  # nothing iterated yet
    rec = run_record(loader)
    other = Loader(TableSource(pa.table({"x": list(range(11))})), 3)
    with pytest.raises(ConfigError, match="previous run record"):
        other.run_record(previous=rec)


def test_trace_across_an_elastic_resize_names_steps_after_the_resize() -> None:
    """4 ranks stop after 3 batches of 5; 3 ranks resume with batches of 7: their batch b is step 3
    + b."""
    sizes = [37, 0, 51, 29, 44]
    table, n = table_of(sizes)
    src = Source(table, sizes)
    truth: Truth = {}
    old = [Loader(src, 5, seed=11, rank=r, world_size=4, collate="arrow") for r in range(4)]
    drive(old, truth, offset=0, stop_after=3, sample_of=idx_of)
    rec = old[0].run_record()
    new = [Loader(src, 7, seed=11, rank=r, world_size=3, collate="arrow") for r in range(3)]
    for ld in new:
        ld.load_state_dict([o.state_dict() for o in old], allow_mismatch=["batch_size"])
    assert new[0]._elastic == ((4, (15, 15, 15, 15)),)
    drive(new, truth, offset=3, sample_of=idx_of)
    rec = new[0].run_record(previous=rec)
    assert rec["runs"][1]["elastic_batch_size"] == [5]
    check(rec, truth, n, source=src)
    b = Tracer(rec).batch(rank=2, step=3, epoch=0)
    assert (b.segment, b.batch, len(b.samples)) == (1, 0, 7)
    assert sorted(x for v in truth.values() for x in v) == list(
        range(n)
    )  # every sample once in the epoch


def test_the_package_exports_trace_as_a_function() -> None:
    import datamill.lineage

    loader = Loader(
        TableSource(pa.table({"x": list(range(9))}), shard_size=4), 3, seed=2, collate="arrow"
    )
    first = next(iter(loader)).column("x").to_pylist()
    out = datamill.lineage.trace(loader.run_record(), samples=first, steps=[(0, 0, 0)])
    assert [h.step for h in out["hits"]] == [0, 0, 0] and out["batches"][0].samples == first
