"""Blocks of batches built straight into a worker's shared memory equal the in-process batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.core.source import TableSource
from datamill.loader.collate import collate_numpy
from datamill.loader.procs import _unpack
from datamill.loader.procs_place import Placed, place_block
from datamill.loader.procs_worker import _collated
from datamill.loader.service import BatchService
from datamill.loader.stages import assemble


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 6, n)
    lengths[:40] = 0  # a whole batch of empty lists: width 0
    return pa.table(
        {
            "uid": np.arange(n),
            "small": rng.integers(-100, 100, n).astype(np.int8),
            "f": rng.random(n).astype(np.float32),
            "pair": pa.FixedSizeListArray.from_arrays(
                pa.array(np.arange(2 * n, dtype=np.int16)), 2
            ),
            "ids": pa.array([list(range(int(k))) for k in lengths], pa.list_(pa.int32())),
            "blob": pa.array([rng.bytes(int(k)) for k in rng.integers(0, 9, n)], pa.binary()),
            # one length (an image size): the same bytes as rows of varying length
            "image": pa.array([rng.bytes(20) for _ in range(n)], pa.binary()),
        }
    )


@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_placed_block_equals_the_collated_batches(mode: str) -> None:
    svc = BatchService(TableSource(_table(900), shard_size=70), batch_size=20, seed=5)
    plan = svc.plan(0)
    shards = {k: svc._read_shard(k) for k in range(svc.source.num_shards)}
    task = [0, 1, 2, 5, 9, 44]  # not consecutive (a worker of several), the last one short
    regions: list[np.ndarray] = []

    def alloc(n: int) -> tuple[Any, np.ndarray]:
        regions.append(np.full(n, 0xAB, dtype=np.uint8))  # garbage: padding must be written
        return len(regions) - 1, regions[-1]

    placed = place_block(plan, shards.__getitem__, task, mode=mode, alloc=alloc)
    assert placed is not None and len(regions) == 1
    expected = [_collated(t, mode) for t in assemble(plan, shards.__getitem__, task)]
    for res, want in zip(placed, expected, strict=True):
        assert isinstance(res.output, Placed) and want is not None
        got = _unpack(pa.py_buffer(regions[0]), res.output.layout)
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            np.testing.assert_array_equal(got[k], want[k])
    assert [r.output.last for r in placed] == [False] * 5 + [True]
    assert placed[-1].yielded == 900 - 44 * 20


def test_blocks_not_placed_are_left_to_the_caller() -> None:
    strings = pa.table({"s": ["a", "b", "c"] * 10})
    svc = BatchService(TableSource(strings, shard_size=7), batch_size=4, seed=0)
    get = {k: svc._read_shard(k) for k in range(5)}.__getitem__
    assert place_block(svc.plan(0), get, [0, 1], mode="numpy", alloc=lambda n: None) is None
    svc = BatchService(TableSource(_table(50), shard_size=7), batch_size=4, seed=0)
    get = {k: svc._read_shard(k) for k in range(8)}.__getitem__
    # no free slot: built as in process
    assert place_block(svc.plan(0), get, [0, 1], mode="numpy", alloc=lambda n: None) is None
    assert collate_numpy(assemble(svc.plan(0), get, [0])[0])["uid"].shape == (4,)
