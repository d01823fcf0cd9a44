"""RunStream (a direct client's and a build worker's builds across leases): any sequence of leases
gives the batches, and the Arrow IPC bytes, of building each lease alone."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.source import TableSource
from datamill.loader.runs import RunAhead, RunStream, Split, build_runs, service_for
from datamill.serve.data.workers import ipc_stream
from datamill.sources import open_source


def _ipc(tables: Any) -> bytes:
    """Tables as the one Arrow IPC stream a server-built lease sends."""
    return bytes(ipc_stream(tables).to_pybytes())


def _source(n: int, shard: int) -> TableSource:
    rng = np.random.default_rng(n)
    table = pa.table(
        {
            "uid": np.arange(n, dtype=np.int64),
            "x": rng.normal(size=n).astype(np.float32),
            "ids": pa.array([list(range(i % 5)) for i in range(n)], type=pa.list_(pa.int32())),
            "s": pa.array([f"v{i % 7}" * (i % 3) for i in range(n)]),
        }
    )
    return TableSource(table, shard_size=shard)


@given(
    n=st.integers(1, 400),
    shard=st.integers(7, 90),
    batch=st.integers(1, 40),
    world=st.integers(1, 3),
    horizon=st.one_of(st.none(), st.integers(1, 9)),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    jumps=st.lists(st.booleans(), min_size=30, max_size=30),
    primes=st.lists(st.sampled_from([None, -1, 0, 1]), min_size=30, max_size=30),
)
def test_run_stream_equals_a_build_per_lease(
    n: int,
    shard: int,
    batch: int,
    world: int,
    horizon: int | None,
    cuts: list[int],
    jumps: list[bool],
    primes: list[int | None],
) -> None:
    """Leases in any order give a build per lease's batches, a batch built ahead (``prime``: a
    direct client's first batch of an epoch, while the first lease is in flight) at the lease's
    start or elsewhere included."""
    cfg = {"batch_size": batch, "seed": 5, "shuffle": True, "window": None, "drop_last": False}
    cfg.update(columns=None, plan_world=world, epoch=1)
    svc = service_for(_source(n, shard), cfg)
    stream = RunStream(svc, cfg, horizon=horizon)
    try:
        for rank in range(world):
            total = svc.num_batches(1, rank, world)
            a, i = 0, 0
            while a < total:  # leases in order, some skipping ahead (another slot's, a resume)
                b = min(total, a + cuts[i % len(cuts)])
                ahead = primes[i % len(primes)]
                if ahead is not None:  # the lease's first batch built ahead, or another one
                    stream.prime(rank, max(0, a + ahead))
                got = list(stream.batches([(rank, a, b)]))
                want = build_runs(svc, cfg, [(rank, a, b)])
                assert len(got) == len(want) == b - a
                assert _ipc(got) == _ipc(want)  # the lease's IPC bytes, as the server sends
                a = b + (1 if jumps[i % len(jumps)] else 0)
                i += 1
    finally:
        stream.close()
        svc.close()


def test_a_build_worker_builds_a_ranks_batches_ahead_whatever_the_leases_bounds(
    tmp_path: Path,
) -> None:
    """A build worker's leases of a static rank, asked in order whatever their bounds (a client's
    first leases of an epoch are sized by its rate, not ``lease_size``), come from its builds
    ahead (all but the first); a lease asked again (re-issued) is built again; the rank's last
    lease starts its next epoch; every body is the bytes of a build per lease."""
    from datamill.serve.data import workers
    from datamill.shards.dataset import ShardsetDataset

    table = _source(900, 90).table
    ShardsetDataset.create(tmp_path / "ds", table, uid="uid", shardset="main", shard_size=90)
    cfg = {"dataset": "d", "batch_size": 8, "seed": 3, "shuffle": True, "window": None}
    cfg.update(drop_last=False, columns=None, plan_world=2, epoch=0, mode="static", lease_size=6)
    svc = service_for(open_source(tmp_path / "ds"), cfg)
    path, total = str(tmp_path / "ds"), svc.num_batches(0, 1, 2)
    bounds = [0, 1, 2, 5, 6, *range(12, total, 6), total]  # sized by rate, then by lease_size
    leases = [(1, a, b) for a, b in itertools.pairwise(bounds)]
    before = dict(RunAhead.stats)
    for run in [*leases[:4], leases[2], *leases[3:]]:  # the third lease re-issued once
        assert workers._build(path, cfg, [run]) == _ipc(build_runs(svc, cfg, [run]))
        _idle(workers)  # the client trains meanwhile
    got = {k: RunAhead.stats[k] - before[k] for k in before}
    assert got["follows"] == 3  # the first lease, the re-issue, and the next epoch's start
    # every batch asked was built ahead but the first lease's and the re-issued lease's
    assert got["asked"] - got["ready"] == 1 + (leases[2][2] - leases[2][1])
    nxt = {**cfg, "epoch": 1}
    ready = RunAhead.stats["ready"]
    assert workers._build(path, nxt, [(1, 0, 3)]) == _ipc(build_runs(svc, nxt, [(1, 0, 3)]))
    assert RunAhead.stats["ready"] == ready + 3  # built when epoch 0 ended


def _idle(workers: Any) -> None:
    """Wait until the build worker's build thread has nothing left to build."""
    for rank in list(workers._RANKS.values()):
        with rank.cond:
            assert rank.cond.wait_for(lambda r=rank: not r.busy, timeout=30)


def test_a_failed_build_ahead_is_built_again_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build ahead that fails (a read error in the worker's build thread) is not an answer: the
    request for its batches builds them again, in a fresh stream, and gets the right bytes."""
    from datamill.serve.data import workers
    from datamill.shards.dataset import ShardsetDataset

    ShardsetDataset.create(
        tmp_path / "ds", _source(600, 60).table, uid="uid", shardset="main", shard_size=60
    )
    cfg = {"dataset": "f", "batch_size": 20, "seed": 4, "shuffle": True, "window": None}
    cfg.update(drop_last=False, columns=None, plan_world=1, epoch=0, mode="static", lease_size=4)
    svc = service_for(open_source(tmp_path / "ds"), cfg)
    real, calls = workers._serialized, list[Any]()

    def flaky(tables: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the build ahead after the first lease
            raise OSError("a read failed")
        return real(tables)

    monkeypatch.setattr(workers, "_serialized", flaky)
    monkeypatch.setattr(RunAhead, "CHUNK", 4)
    path = str(tmp_path / "ds")
    for a in range(0, svc.num_batches(0, 0, 1), 4):
        run = (0, a, min(svc.num_batches(0, 0, 1), a + 4))
        assert workers._build(path, cfg, [run]) == _ipc(build_runs(svc, cfg, [run]))
    assert len(calls) > 2  # the build ahead did fail, and was built again


def test_a_lease_built_in_parts_by_two_workers_is_the_bytes_of_one_build(tmp_path: Path) -> None:
    """With more build workers than plan ranks, each worker builds its part of a rank (chunks of
    batches in turn) ahead, and the HTTP process stitches a lease's parts into one stream: any
    leases' bounds (a re-issued one too) give the bytes of a build per lease, through the stitch
    and through its re-encoding fallback (a part without its layout)."""
    from datamill.serve.data import workers
    from datamill.shards.dataset import ShardsetDataset

    ShardsetDataset.create(
        tmp_path / "ds", _source(700, 70).table, uid="uid", shardset="main", shard_size=70
    )
    cfg = {"dataset": "p", "batch_size": 9, "seed": 5, "shuffle": True, "window": None}
    cfg.update(drop_last=False, columns=None, plan_world=1, epoch=0, mode="static", lease_size=7)
    svc = service_for(open_source(tmp_path / "ds"), cfg)
    path, total, chunk = str(tmp_path / "ds"), svc.num_batches(0, 0, 1), 3
    bounds = [0, 1, 2, 5, *range(12, total, 7), total]
    leases = [(a, b) for a, b in itertools.pairwise(bounds)]
    before = dict(RunAhead.stats)
    for k, (a, b) in enumerate([*leases[:3], leases[1], *leases[2:]]):  # the second re-issued
        pieces = Split(0, 2, chunk=chunk).pieces(0, a, b)
        outs = {
            p: workers._build_part(
                path, cfg, [(0, x, y) for x, y, q in pieces if q == p], (p, 2, chunk)
            )
            for p in sorted({q for _, _, q in pieces})
        }
        bodies = {p: memoryview(body) for p, (body, _) in outs.items()}
        layouts = {p: lay for p, (_, lay) in outs.items()}
        if k % 4 == 3:  # as a part of dictionaries (or of several schemas) comes
            layouts = dict.fromkeys(layouts)
        want = _ipc(build_runs(svc, cfg, [(0, a, b)]))
        assert workers._stitch(pieces, bodies, layouts) == want
        _idle(workers)
    got = {k: RunAhead.stats[k] - before[k] for k in before}
    assert got["ready"] > got["asked"] // 2  # most batches were built ahead, in both parts
