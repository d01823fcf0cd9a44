"""RunStream (a direct client's and a build worker's builds across leases): any sequence of leases
gives the batches, and the Arrow IPC bytes, of building each lease alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.source import TableSource
from datamill.serve.direct import RunStream, build_runs, service_for
from datamill.serve.server import to_ipc


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
)
def test_run_stream_equals_a_build_per_lease(
    n: int,
    shard: int,
    batch: int,
    world: int,
    horizon: int | None,
    cuts: list[int],
    jumps: list[bool],
) -> None:
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
                got = list(stream.batches([(rank, a, b)]))
                want = build_runs(svc, cfg, [(rank, a, b)])
                assert len(got) == len(want) == b - a
                assert to_ipc(got) == to_ipc(want)  # the lease's IPC bytes, as the server sends
                a = b + (1 if jumps[i % len(jumps)] else 0)
                i += 1
    finally:
        stream.close()
        svc.close()
