"""RunStream (a direct client's and a build worker's builds across leases): any sequence of leases
gives the batches, and the Arrow IPC bytes, of building each lease alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.source import TableSource
from datamill.loader.runs import RunStream, build_runs, service_for
from datamill.serve.server import to_ipc
from datamill.sources import open_source


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
                assert to_ipc(got) == to_ipc(want)  # the lease's IPC bytes, as the server sends
                a = b + (1 if jumps[i % len(jumps)] else 0)
                i += 1
    finally:
        stream.close()
        svc.close()


def test_a_build_worker_builds_the_next_lease_ahead(tmp_path: Path) -> None:
    """A build worker's leases of a static rank, asked in order, come from its builds ahead (all but
    the first); a lease asked out of order (re-issued) is built again; every body is the bytes of a
    build per lease."""
    from datamill.serve.data import workers
    from datamill.shards.dataset import ShardsetDataset

    table = _source(900, 90).table
    ShardsetDataset.create(tmp_path / "ds", table, uid="uid", shardset="main", shard_size=90)
    cfg = {"dataset": "d", "batch_size": 32, "seed": 3, "shuffle": True, "window": None}
    cfg.update(drop_last=False, columns=None, plan_world=2, epoch=0, mode="static", lease_size=3)
    svc = service_for(open_source(tmp_path / "ds"), cfg)
    workers._init(None)
    before = dict(workers.AHEAD_STATS)
    path = str(tmp_path / "ds")
    total = svc.num_batches(0, 1, 2)
    leases = [(1, a, min(total, a + 3)) for a in range(0, total, 3)]
    order = [*leases[:3], leases[1], *leases[3:]]  # the second lease re-issued once
    for run in order:
        assert workers._build(path, cfg, [run]) == to_ipc(build_runs(svc, cfg, [run]))
    workers._drain()
    built = workers.AHEAD_STATS["built"] - before["built"]
    used = workers.AHEAD_STATS["used"] - before["used"]
    assert used == len(leases) - 1  # each lease after the first came built (not the re-issue)
    # each lease but the first once, and the one after the re-issue once more (its restart)
    assert built == len(leases)


def test_a_failed_build_ahead_is_built_again_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build ahead that fails (a read error in the worker's thread) is not an answer: the request
    for that lease builds it again, in a fresh stream, and gets the right bytes."""
    from datamill.serve.data import workers
    from datamill.shards.dataset import ShardsetDataset

    ShardsetDataset.create(
        tmp_path / "ds", _source(600, 60).table, uid="uid", shardset="main", shard_size=60
    )
    cfg = {"dataset": "f", "batch_size": 20, "seed": 4, "shuffle": True, "window": None}
    cfg.update(drop_last=False, columns=None, plan_world=1, epoch=0, mode="static", lease_size=4)
    svc = service_for(open_source(tmp_path / "ds"), cfg)
    real, failed = workers._lease_bytes, list[Any]()

    def flaky(stream: Any, runs: Any) -> bytes:
        if tuple(runs) == ((0, 8, 12),) and not failed:
            failed.append(runs)
            raise OSError("a read failed")
        return real(stream, runs)

    monkeypatch.setattr(workers, "_lease_bytes", flaky)
    workers._init(None)
    path = str(tmp_path / "ds")
    for a in range(0, svc.num_batches(0, 0, 1), 4):
        run = (0, a, min(svc.num_batches(0, 0, 1), a + 4))
        assert workers._build(path, cfg, [run]) == to_ipc(build_runs(svc, cfg, [run]))
    workers._drain()
    assert failed  # the build ahead of lease (0, 8, 12) did fail
