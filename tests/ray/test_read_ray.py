"""datamill.ray.read_dataset: shards as Ray Data blocks; streaming_split(2) consumers get every
sample once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.ray import read_dataset
from datamill.shards import ShardsetDataset

pytestmark = pytest.mark.ray


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(9)
    blobs = [
        rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8).tobytes() for _ in range(n)
    ]
    ids = [rng.integers(0, 50, int(rng.integers(0, 7))).tolist() for _ in range(n)]
    return pa.table(
        {
            "uid": np.arange(n, dtype=np.int64),
            "image": pa.array(blobs, pa.binary()),
            "ids": pa.array(ids, pa.list_(pa.int64())),
        }
    )


def _consume_split(ds: Any, n: int) -> list[list[dict[str, Any]]]:
    """Two Ray Train-style consumers of ``streaming_split(2)``, each in its own thread."""
    its = ds.streaming_split(2, equal=False)
    got: list[list[dict[str, Any]]] = [[], []]
    errors: list[BaseException] = []

    def consume(i: int) -> None:
        try:
            for batch in its[i].iter_batches(batch_size=32, batch_format="pyarrow"):
                got[i].extend(batch.to_pylist())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return got


def test_shardset_and_parquet_read_as_blocks_and_split_to_two_consumers(
    ray_cluster: Any, tmp_path: Path
) -> None:
    table = _table(300)
    expected = {r["uid"]: r for r in table.to_pylist()}
    ShardsetDataset.create(tmp_path / "ds", table, uid="uid", shardset="s", shard_size=40)
    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(3):
        pq.write_table(table.slice(i * 100, 100), folder / f"part-{i}.parquet")
    for path, blocks in ((tmp_path / "ds", 8), (folder, 3)):
        ds = read_dataset(path)
        assert ds.count() == 300
        assert ds.materialize().num_blocks() == blocks  # one block per shard
        parts = _consume_split(ds, 300)
        assert all(parts), "each consumer got some rows"
        rows = parts[0] + parts[1]
        uids = [r["uid"] for r in rows]
        assert sorted(uids) == list(range(300)), "every sample exactly once"
        for r in rows:
            assert (
                r["image"] == expected[r["uid"]]["image"] and r["ids"] == expected[r["uid"]]["ids"]
            )
