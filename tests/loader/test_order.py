"""The pure order functions: permutations, windows, rank/worker splits, determinism across
processes."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.loader.order import (
    default_window,
    epoch_order,
    global_order,
    num_batches,
    shard_order,
    split_for_rank,
    worker_batches,
)
from tests.strategies import seeds, shard_sizes, world_sizes


@given(n=st.integers(0, 4_000), seed=seeds, epoch=st.integers(0, 100), world=world_sizes)
def test_epoch_order_is_deterministic_permutation_split_exactly_once(
    n: int, seed: int, epoch: int, world: int
) -> None:
    order = epoch_order(n, seed=seed, epoch=epoch)
    assert order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    np.testing.assert_array_equal(order, epoch_order(n, seed=seed, epoch=epoch))
    parts = [split_for_rank(order, rank=r, world_size=world, drop_last=False) for r in range(world)]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert [len(p) for p in parts] == sorted(
        (len(p) for p in parts), reverse=True
    )  # first ranks get the extra


@given(
    sizes=shard_sizes(),
    seed=seeds,
    epoch=st.integers(0, 50),
    window=st.integers(1, 5),
    world=world_sizes,
)
def test_shard_order_is_permutation_and_windows_hold_their_shards(
    sizes: list[int], seed: int, epoch: int, window: int, world: int
) -> None:
    order = shard_order(sizes, seed=seed, epoch=epoch, window=window)
    n = sum(sizes)
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    np.testing.assert_array_equal(order, shard_order(sizes, seed=seed, epoch=epoch, window=window))
    # every window of the order covers whole shards: the samples of one shard are never split across
    # windows (checked without empty shards, which take a window slot but leave no trace in the
    # order)
    nonempty = [s for s in sizes if s > 0]
    offsets = np.concatenate([[0], np.cumsum(nonempty)])
    shard_of = (
        np.searchsorted(
            offsets, shard_order(nonempty, seed=seed, epoch=epoch, window=window), side="right"
        )
        - 1
    )
    # reconstruct window boundaries: consecutive runs of `window` distinct shards (in
    # first-appearance order)
    first_pos = {int(s): i for i, s in reversed(list(enumerate(shard_of)))}
    ordered = sorted(first_pos, key=first_pos.__getitem__)
    for w0 in range(0, len(ordered), window):
        group = set(ordered[w0 : w0 + window])
        pos = np.flatnonzero(np.isin(shard_of, list(group)))
        assert len(pos) == 0 or pos.max() - pos.min() + 1 == len(pos), (
            "a window's samples are contiguous"
        )
    dropped = [
        split_for_rank(order, rank=r, world_size=world, drop_last=True) for r in range(world)
    ]
    assert len({len(p) for p in dropped}) == 1 and sum(map(len, dropped)) == n - n % world
    assert len(np.unique(np.concatenate(dropped))) == n - n % world


def test_two_epochs_differ_and_seeds_differ() -> None:
    sizes = [100] * 20
    a, b = shard_order(sizes, seed=1, epoch=0), shard_order(sizes, seed=1, epoch=1)
    c = shard_order(sizes, seed=2, epoch=0)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(epoch_order(50, seed=0, epoch=0), epoch_order(50, seed=0, epoch=1))


def test_window_mixes_shards_within_batches() -> None:
    order = shard_order([1000] * 8, seed=0, epoch=0, window=4)
    first_batch_shards = set((order[:256] // 1000).tolist())
    assert len(first_batch_shards) == 4  # a batch draws from every shard of its window


def test_same_seed_same_order_in_another_process() -> None:
    code = (
        "import json; from datamill.loader.order import shard_order, epoch_order; "
        "print(json.dumps([shard_order([7, 0, 13, 5, 9], seed=42, epoch=3, window=2).tolist(), "
        "epoch_order(30, seed=42, epoch=3).tolist()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    other = json.loads(out.stdout)
    assert other[0] == shard_order([7, 0, 13, 5, 9], seed=42, epoch=3, window=2).tolist()
    assert other[1] == epoch_order(30, seed=42, epoch=3).tolist()


def test_unshuffled_and_helpers() -> None:
    assert global_order([2, 3], seed=0, epoch=0, shuffle=False).tolist() == [0, 1, 2, 3, 4]
    assert num_batches(0, batch_size=3) == 0 and num_batches(7, batch_size=3) == 3
    assert default_window([]) == 1
    workers = [list(worker_batches(10, worker=w, num_workers=3, start=2)) for w in range(3)]
    assert sorted(itertools.chain.from_iterable(workers)) == list(range(2, 10))


@pytest.mark.parametrize(
    "kwargs",
    [{"rank": 2, "world_size": 2}, {"rank": -1, "world_size": 2}, {"rank": 0, "world_size": 0}],
)
def test_split_for_rank_rejects_bad_ranks(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="rank"):
        split_for_rank(np.arange(4), **kwargs)


def test_negative_seed_or_window_rejected() -> None:
    with pytest.raises(ValueError):
        epoch_order(3, seed=-1, epoch=0)
    with pytest.raises(ValueError):
        shard_order([3], seed=0, epoch=0, window=0)
