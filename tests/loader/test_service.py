"""The BatchService: any rank's batches on request, one shard cache shared by concurrent builds,
bounded memory, public accounting, resume states."""

from __future__ import annotations

import pickle
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, ResumeStateError
from datamill.loader import (
    Accounting,
    Batching,
    BatchResult,
    BatchService,
    EpochPlan,
    Loader,
    Workers,
)
from datamill.loader.cache import KeptBytes, ShardCache
from datamill.loader.order import split_sizes
from datamill.loader.runs import service_for
from tests.strategies import FakeSource, batch_sizes, seeds, shard_sizes, world_sizes


def xs(results: Any) -> list[list[int]]:
    return [r.output["x"].tolist() for r in results]


def loader_xs(src: FakeSource, bs: int, **kw: Any) -> list[list[int]]:
    return [b["x"].tolist() for b in Loader(src, bs, **kw)]


@given(
    sizes=shard_sizes(),
    bs=batch_sizes,
    world=world_sizes,
    seed=seeds,
    drop_last=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_plan_and_num_batches_match_the_pure_order(
    sizes: list[int], bs: int, world: int, seed: int, drop_last: bool, epoch: int
) -> None:
    svc = BatchService(
        FakeSource(sizes),
        batch_size=bs,
        seed=seed,
        batching=Batching(window=2, drop_last=drop_last),
    )
    for rank in range(world):
        plan = svc.plan(epoch, rank, world)
        want = EpochPlan.make(
            svc.sizes,
            seed=seed,
            epoch=epoch,
            shuffle=True,
            window=2,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            batch_size=bs,
        )
        np.testing.assert_array_equal(plan.seq, want.seq)
        assert plan.total_batches == want.total_batches == svc.num_batches(epoch, rank, world)
        assert svc.plan(epoch, rank, world) is plan  # cached
        assert svc.resume_state(
            epoch=epoch, batches_seen=plan.total_batches, rank=rank, world_size=world
        )["samples_seen"] == len(plan.seq)


def test_build_any_rank_and_any_batches_equals_the_loader() -> None:
    src = FakeSource([37, 0, 55, 21, 64, 9])
    svc = BatchService(
        src, batch_size=8, seed=3, batching=Batching(window=2), workers=Workers(threads=2)
    )
    for world in (1, 3):
        for rank in range(world):
            want = loader_xs(
                src, 8, seed=3, batching=Batching(window=2), rank=rank, world_size=world, epoch=1
            )
            assert xs(svc.build(1, rank, range(len(want)), world_size=world)) == want
            some = [k for k in range(len(want)) if k % 3 != 1]
            assert xs(svc.build(1, rank, some, world_size=world)) == [want[k] for k in some]
    s = svc.stats()
    assert s["active_builds"] == 0 and s["shards_in_memory"] == 0 and s["builds"] == 8


def test_server_style_one_batch_per_request_in_any_order() -> None:
    """A server builds batch k of any rank per request; cache_shards keeps shards between
    requests."""
    src = FakeSource([40] * 12)
    world = 3
    want = {
        r: loader_xs(src, 10, seed=5, batching=Batching(window=3), rank=r, world_size=world)
        for r in range(world)
    }
    requests = [(r, k) for r in range(world) for k in range(len(want[r]))]
    random.Random(0).shuffle(requests)
    with BatchService(
        src, batch_size=10, seed=5, cache_shards=3, batching=Batching(window=3)
    ) as svc:
        for r, k in requests:
            (res,) = list(svc.build(0, r, [k], world_size=world))
            assert (res.batch, res.rank, res.epoch) == (k, r, 0)
            assert res.output["x"].tolist() == want[r][k]
        assert svc.stats()["shards_in_memory"] <= 3  # only the kept ones once no build is active
    src.reads[:] = 0
    in_order = BatchService(src, batch_size=10, seed=5, cache_shards=3, batching=Batching(window=3))
    for r in range(world):
        for k in range(len(want[r])):
            list(in_order.build(0, r, [k], world_size=world))
    assert (
        src.reads.sum() <= 12 + 2 * world
    )  # in-order requests reread at most the boundary windows


def test_a_build_workers_service_reads_each_shard_once_over_epochs_when_they_fit() -> None:
    """A build worker kept two windows of released shards, so each new epoch's order read and
    decoded nearly every shard again (a served epoch's first pass ran at 0.57-0.74x in-process);
    with ``cache_bytes`` the shards that fit are kept across epochs. A count given is kept
    exactly."""
    src = FakeSource([40] * 12)
    cfg = {"batch_size": 10, "seed": 5, "shuffle": True, "window": 2, "drop_last": False}
    cfg.update(columns=None, plan_world=1)
    want = None
    for budget in (0, 1 << 20):
        svc = service_for(src, cfg, cache_bytes=budget)
        src.reads[:] = 0
        got = [
            [r.output["x"].to_pylist() for r in svc.build_samples(e, 0, range(svc.num_batches(e)))]
            for e in range(3)
        ]
        assert want is None or got == want  # the same batches
        want = got
        assert (src.reads.sum() == 12) == (budget > 0), src.reads.tolist()
        assert (0 < svc.stats()["shards_kept_bytes"] <= budget) == (budget > 0)
    assert service_for(src, cfg, cache_shards=1, cache_bytes=1 << 20).cache_bytes == 0


@given(
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=12),
    keep=st.integers(0, 3),
    budget=st.integers(0, 1024),
    order=st.randoms(use_true_random=False),
)
def test_shard_cache_keeps_the_most_recent_released_shards_that_fit(
    sizes: list[int], keep: int, budget: int, order: random.Random
) -> None:
    """Against a model: the ``keep`` most recently released shards, and before them, oldest
    dropped first, those the budget holds; a shard kept is not read again."""
    cache = ShardCache(
        lambda k: pa.table({"x": np.zeros(sizes[k], np.int64)}), keep=keep, keep_bytes=budget
    )
    recent: list[int] = []
    extra: list[int] = []
    reads = 0
    cache.open()
    for _ in range(3):  # later passes reuse what the earlier ones kept
        ks = list(range(len(sizes)))
        order.shuffle(ks)
        cache.claim(ks)
        for k in ks:
            reads += k not in recent and k not in extra
            recent, extra = [j for j in recent if j != k], [j for j in extra if j != k]
            cache.load(k).result()
            cache.release(k)
            recent.append(k)
            if len(recent) > keep:
                extra.append(recent.pop(0))
                while sum(8 * sizes[j] for j in extra) > budget:
                    extra.pop(0)
            assert cache.in_memory == len(recent) + len(extra)
            assert cache.kept_bytes == sum(8 * sizes[j] for j in extra)
            assert cache.reads == reads
    cache.finish()
    cache.close()
    assert cache.in_memory == cache.kept_bytes == 0


def test_services_sharing_a_budget_give_up_the_shards_kept_longest() -> None:
    """A build worker's services share one budget: a service no client uses any more gives its
    shards up to the one in use (each kept up to the whole budget before)."""
    src = FakeSource([40] * 12)
    cfg = {"batch_size": 10, "shuffle": True, "window": 2, "drop_last": False, "columns": None}
    budget = KeptBytes(1 << 20)
    old, new = (service_for(src, {**cfg, "seed": s}, cache_bytes=budget) for s in (1, 2))
    for svc in (old, new):
        for e in range(2):
            list(svc.build_samples(e, 0, range(svc.num_batches(e))))
    assert old.stats()["shards_kept_bytes"] > 0 and new.stats()["shards_kept_bytes"] > 0
    used = budget.used
    assert used == old.stats()["shards_kept_bytes"] + new.stats()["shards_kept_bytes"]
    budget.limit = new.stats()["shards_kept_bytes"]  # room for the newer service's shards only
    list(new.build_samples(2, 0, range(new.num_batches(2))))
    assert old.stats()["shards_kept_bytes"] == 0 < new.stats()["shards_kept_bytes"] <= budget.limit


def test_concurrent_ranks_share_a_shard_that_sequential_builds_read_twice() -> None:
    # 95 samples over 2 ranks: rank 0 is 0..47, rank 1 is 48..94, so both need shard 4 (40..49)
    src = FakeSource([10] * 9 + [5])
    svc = BatchService(
        src, batch_size=5, batching=Batching(shuffle=False), workers=Workers(prefetch=1)
    )
    g0, g1 = svc.build(0, 0, range(10), world_size=2), svc.build(0, 1, range(10), world_size=2)
    got0, got1 = [], []
    for a, b in zip(g0, g1):  # both builds active at once (a lockstep, like DDP ranks)
        got0.append(a.output["x"].tolist())
        got1.append(b.output["x"].tolist())
    assert (
        svc.stats()["shards_in_memory"] == 1
    )  # g1 is suspended after its last batch: still holds it
    g1.close()  # (zip stopped at g0's end) closing releases the build's shards
    assert [x for b in got0 for x in b] == list(range(48)) and [x for b in got1 for x in b] == list(
        range(48, 95)
    )
    assert src.reads.tolist() == [1] * 10  # shard 4 read once, reused by the other rank
    s = svc.stats()
    assert s["shards_read"] == 10 and s["shards_reused"] == 1 and s["shards_in_memory"] == 0
    src.reads[:] = 0
    list(svc.build(0, 0, range(10), world_size=2))
    list(svc.build(0, 1, range(10), world_size=2))
    assert src.reads[4] == 2  # dropped once no active build needed it
    src.reads[:] = 0
    keep = BatchService(
        src,
        batch_size=5,
        cache_shards=1,
        batching=Batching(shuffle=False),
        workers=Workers(prefetch=1),
    )
    list(keep.build(0, 0, range(10), world_size=2))
    list(keep.build(0, 1, range(10), world_size=2))
    assert src.reads[4] == 1  # ...unless kept for later builds


def test_threads_building_every_rank_at_once_stay_correct_and_bounded() -> None:
    src = FakeSource([50] * 40)
    world, window, prefetch = 4, 4, 2
    svc = BatchService(
        src,
        batch_size=8,
        seed=11,
        batching=Batching(window=window),
        workers=Workers(prefetch=prefetch, threads=2),
    )
    want = [
        loader_xs(src, 8, seed=11, batching=Batching(window=window), rank=r, world_size=world)
        for r in range(world)
    ]

    def run(rank: int) -> tuple[list[list[int]], int]:
        results = list(svc.build(0, rank, range(svc.num_batches(0, rank, world)), world_size=world))
        return xs(results), max(r.peak_shards_in_memory for r in results)

    with ThreadPoolExecutor(world) as pool:
        got = list(pool.map(run, range(world)))
    assert [g for g, _ in got] == want
    s = svc.stats()
    assert (
        s["yielded"] == s["read"] == 2000 and s["active_builds"] == 0 and s["shards_in_memory"] == 0
    )
    # each active rank holds about two windows (at a window boundary) plus its prefetch
    assert s["peak_shards_in_memory"] <= world * (2 * window + prefetch)
    assert s["shards_read"] + s["shards_reused"] >= 40


def test_loader_memory_and_reads_through_the_service() -> None:
    src = FakeSource([50] * 40)
    loader = Loader(src, 8, seed=3, batching=Batching(window=4), workers=Workers(prefetch=2))
    list(loader)
    s, t = loader.stats(), loader.service.stats()
    assert s["shards_read"] == t["shards_read"] == 40 and t["shards_reused"] == 0
    assert s["peak_shards_in_memory"] == t["peak_shards_in_memory"] <= 2 * 4 + 2


def test_build_rejects_bad_batch_numbers_and_ranks() -> None:
    svc = BatchService(FakeSource([10, 10]), batch_size=4)
    assert list(svc.build(0, 0, [])) == []
    for bad in ([2, 1], [1, 1], [-1], [5]):
        with pytest.raises(ConfigError, match="ascending"):
            svc.build(0, 0, bad)
    with pytest.raises(ConfigError, match="rank"):
        svc.build(0, 2, [0], world_size=2)
    with pytest.raises(ConfigError):
        svc.plan(-1)
    with pytest.raises(ConfigError):
        BatchService(FakeSource([3]), batch_size=0)
    with pytest.raises(ConfigError):
        BatchService(FakeSource([3]), batch_size=2, cache_shards=-1)


def _drop_odd(t: pa.Table) -> pa.Array:
    return pc.equal(pc.bit_wise_and(t["x"], 1), 0)


def _fragile(t: pa.Table) -> pa.Table:
    if any(x % 7 == 3 for x in t.column("x").to_pylist()):
        raise RuntimeError("bad sample")
    return t


def test_results_carry_public_accounting_and_accounting_applies_max_errors() -> None:
    src = FakeSource([30, 30])
    svc = BatchService(
        src,
        batch_size=8,
        columns="x",
        batching=Batching(shuffle=False, filter=_drop_odd, transform=_fragile, max_errors=3),
    )
    results = list(svc.build(0, 0, range(svc.num_batches(0))))
    assert all(isinstance(r, BatchResult) for r in results)
    assert sum(r.read for r in results) == 60 and sum(r.filtered for r in results) == 30
    failed = [i for r in results for _, i, _ in r.failed]
    assert failed == [x for x in range(0, 60, 2) if x % 7 == 3] == [10, 24, 38, 52]
    assert sum(r.yielded for r in results) == 30 - 4 and svc.stats()["failed"] == 4
    acc = svc.accounting()
    assert acc.max_errors == 3
    with pytest.raises(DataFileError) as info:
        for r in results:
            acc.add(r)
    assert info.value.uid == 52 and isinstance(info.value.__cause__, RuntimeError)
    assert acc.failed == 4 and [e[1] for e in acc.errors] == failed
    counting = Accounting(max_errors=None)
    for r in results:
        counting.add(r)
    assert counting.as_dict()["failed"] == 4 and counting.as_dict()["yielded"] == 26
    with pytest.raises(ConfigError):
        Accounting(max_errors=-1)


def test_resume_state_round_trip_and_mismatches() -> None:
    src = FakeSource([20, 20])
    svc = BatchService(src, batch_size=4, seed=9)
    loader = Loader(src, 4, seed=9, rank=1, world_size=2)
    it = iter(loader)
    next(it)
    state = svc.resume_state(epoch=0, batches_seen=1, rank=1, world_size=2)
    saved = loader.state_dict()
    assert saved.pop("counts") == {
        "read": 4,
        "filtered": 0,
        "failed": 0,
        "yielded": 4,
    }  # the Loader adds its counts
    assert state == saved
    assert svc.check_state(state, rank=1, world_size=2) == (0, 1)
    with pytest.raises(ResumeStateError, match="rank: saved 1, now 0"):
        svc.check_state(state)
    assert svc.check_state(state, allow_mismatch=["rank", "world_size"]) == (0, 1)
    with pytest.raises(ResumeStateError, match="must be a dict"):
        svc.check_state([1, 2])  # type: ignore[arg-type]


def test_config_fingerprint_replace_and_pickle() -> None:
    src = FakeSource([10, 10, 3])
    svc = BatchService(src, batch_size=4, seed=2, columns=["x"], batching=Batching(window=2))
    assert svc.config(rank=1, world_size=2) == {
        "batch_size": 4,
        "columns": ["x"],
        "drop_last": False,
        "rank": 1,
        "shuffle": True,
        "window": 2,
        "world_size": 2,
    }
    assert svc.fingerprint() == src.fingerprint()
    arrow = svc.replace(collate="arrow")
    (res,) = list(arrow.build(0, 0, [0]))
    assert isinstance(res.output, pa.Table) and res.output.column_names == ["x"]
    list(svc.build(0, 0, [0, 1]))
    clone = pickle.loads(pickle.dumps(svc))
    assert xs(clone.build(0, 0, range(6))) == xs(svc.build(0, 0, range(6)))
    assert clone.stats()["builds"] == 1  # runtime counters stay in the process that built


def test_plans_are_kept_for_two_epochs() -> None:
    svc = BatchService(FakeSource([10] * 5), batch_size=4)
    for epoch in range(4):
        for rank in range(2):
            svc.plan(epoch, rank, 2)
    assert svc.stats()["plans_cached"] == 4
    one = BatchService(FakeSource([10] * 5), batch_size=4, plan_epochs=1)
    one.plan(0), one.plan(1)
    assert one.stats()["plans_cached"] == 1 and one.replace(seed=1).plan_epochs == 1
    svc.close()
    assert svc.stats()["plans_cached"] == 0 and xs(svc.build(3, 0, [0])) == [
        svc.plan(3).seq[:4].tolist()
    ]


@pytest.mark.torch
def test_torch_adapter_leaves_the_users_loader_alone() -> None:
    torch = pytest.importorskip("torch")
    from datamill.loader.torch import TorchLoaderDataset

    src = FakeSource([40] * 3)
    loader = Loader(src, 8, seed=1, columns=["x"])
    collate_before = loader.collate_fn
    ds = TorchLoaderDataset(loader)
    ds.set_epoch(2)
    got = [b["x"].tolist() for b in torch.utils.data.DataLoader(ds, batch_size=None)]
    assert got == loader_xs(src, 8, seed=1, columns=["x"], epoch=2)
    ds.load_state_dict(ds.state_dict(batches_consumed=3))
    assert (
        loader.epoch == 0
        and loader.collate_fn is collate_before
        and loader.state_dict()["batches_seen"] == 0
    )


@given(sizes=shard_sizes(), world=st.integers(1, 5000), drop_last=st.booleans())
def test_rank_samples_of_every_rank_are_the_rank_split_sizes(
    sizes: list[int], world: int, drop_last: bool
) -> None:
    # regression: each rank's count used to build the whole split list (O(world) per rank,
    # O(world^2) per served iteration: minutes for 65,536 ranks); each count is now computed alone
    svc = BatchService(
        FakeSource(sizes), batch_size=1, seed=0, batching=Batching(drop_last=drop_last)
    )
    want = split_sizes(svc.epoch_samples(), world_size=world, drop_last=drop_last)
    assert [svc.rank_samples(r, world) for r in range(world)] == want


class _Unsized(FakeSource):
    """A source that says it reads from object storage, without its shards' bytes."""

    remote = True


class _Remote(_Unsized):
    """The same with ``nbytes`` bytes per shard."""

    def __init__(self, sizes: list[int], nbytes: int) -> None:
        super().__init__(sizes)
        self.nbytes = nbytes

    def shard_nbytes(self) -> NDArray[np.int64]:
        return np.full(self.num_shards, self.nbytes, dtype=np.int64)


@pytest.mark.parametrize(
    ("nbytes", "window", "reads"),
    [
        (6_000_000, None, 6),
        (100_000, None, 8),
        (1 << 30, None, 2),
        (100_000, 1, 2),
        (None, None, 6),
    ],
)
def test_remote_reads_are_sized_from_the_shard_bytes_and_the_window(
    nbytes: int | None, window: int | None, reads: int
) -> None:
    # issue 41: GETs in flight ~ READ_AHEAD_BYTES by the median object, 2..8, <= two windows
    src = _Unsized([10] * 20) if nbytes is None else _Remote([10] * 20, nbytes)
    svc = BatchService(src, batch_size=4, batching=Batching(window=window))
    assert svc.warmup and svc.reads == reads
    assert svc._cache._threads == max(reads, svc.workers.prefetch)
    local = BatchService(FakeSource([10] * 20), batch_size=4)  # not remote: no warm-up, 2 reads
    assert not local.warmup and local.reads == 2
