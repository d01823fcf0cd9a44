"""``datamill plan``: the planned shard reads and peak memory equal what a real run does."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.cli import main
from datamill.loader import Batching, Loader, Workers
from datamill.loader.planner import plan_run, shuffle_quality
from tests.strategies import FakeSource, seeds, shard_sizes


class CountingSource(FakeSource):
    """Records every read_shard call, in call order."""

    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__(sizes)
        self.calls: list[int] = []
        self._lock = threading.Lock()

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        with self._lock:
            self.calls.append(int(index))
        return super().read_shard(index, columns=columns)


@given(
    sizes=shard_sizes(max_shards=10, max_size=80),
    bs=st.integers(1, 30),
    world=st.integers(1, 3),
    seed=seeds,
    window=st.integers(1, 4),
    prefetch=st.integers(1, 3),
    workers=st.integers(0, 2),
    drop_last=st.booleans(),
)
@settings(max_examples=30)
def test_planned_reads_and_peak_equal_a_real_run(
    sizes: list[int],
    bs: int,
    world: int,
    seed: int,
    window: int,
    prefetch: int,
    workers: int,
    drop_last: bool,
) -> None:
    world = min(world, max(1, sum(sizes)))  # plan_run refuses more ranks than samples (issue 27)
    plan = plan_run(
        sizes,
        batch_size=bs,
        world_size=world,
        seed=seed,
        batching=Batching(window=window, drop_last=drop_last),
        workers=Workers(prefetch=prefetch, threads=workers),
    )
    for rank in range(world):
        src = CountingSource(sizes)
        loader = Loader(
            src,
            bs,
            seed=seed,
            rank=rank,
            world_size=world,
            batching=Batching(window=window, drop_last=drop_last),
            workers=Workers(prefetch=prefetch, threads=workers),
        )
        for _ in loader:
            pass
        planned = plan.ranks[rank]
        # reads run in a small thread pool: the same shards, each once, and in the planned order up
        # to the few reads in flight at once
        assert sorted(src.calls) == sorted(planned["reads"])
        threads = min(8, max(2, prefetch))
        assert all(abs(planned["reads"].index(k) - i) < threads for i, k in enumerate(src.calls))
        assert loader.service.stats()["peak_shards_in_memory"] == planned["peak_shards"]


def test_cache_limit_and_epochs_change_the_bytes_fetched() -> None:
    sizes = [100] * 12
    unbounded = plan_run(sizes, batch_size=10, world_size=2, epochs=2, batching=Batching(window=2))
    assert [e["fetches"] for e in unbounded.epochs] == [12, 0]  # the second epoch hits the cache
    small = plan_run(
        sizes, batch_size=10, world_size=2, epochs=2, cache_limit=400, batching=Batching(window=2)
    )
    assert small.epochs[1]["fetches"] > 0 and small.epochs[0]["fetched_bytes"] == 1200
    per_rank = plan_run(
        sizes, batch_size=10, world_size=2, epochs=1, ranks_per_node=1, batching=Batching(window=2)
    )
    assert per_rank.epochs[0]["fetches"] == sum(len(r["reads"]) for r in per_rank.ranks)


def test_shuffle_quality_ranks_orders() -> None:
    sizes = np.array([1000] * 20)
    shard_of = np.repeat(np.arange(20), sizes)
    plain = shuffle_quality(np.arange(20_000), shard_of)
    narrow = plan_run(sizes, batch_size=100, batching=Batching(window=1)).epochs[0]["quality"]
    wide = plan_run(sizes, batch_size=100, batching=Batching(window=20)).epochs[0]["quality"]
    assert plain["entropy_bits"] == 0 and plain["same_shard"] > 0.99
    assert narrow["same_shard"] > 0.99
    assert wide["same_shard"] < 0.1
    assert wide["entropy_bits"] > narrow["entropy_bits"] > plain["entropy_bits"]


def test_plan_cli_prints_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": np.arange(5000)}), path, row_group_size=500)
    assert (
        main(
            [
                "-q",
                "plan",
                str(path),
                "--batch-size",
                "64",
                "--world-size",
                "2",
                "--window",
                "2",
                "--cache-limit",
                "0.01",
                "--epochs",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "5,000 samples in 10 shards" in out and "rank 1:" in out and "epoch 1: fetched" in out
    assert (
        main(["-q", "plan", str(path), "--batch-size", "64", "--read-speed", "100", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["read_bytes_per_s"] == 100 * 2**20 and len(data["ranks"][0]["reads"]) == 10
