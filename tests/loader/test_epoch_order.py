"""The epoch order held per shard (:class:`EpochOrder`) is the global order, any slice of it."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from datamill.loader.order import EpochOrder, global_order, shard_order


@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    window=st.integers(1, 6),
    shuffle=st.booleans(),
    cuts=st.lists(st.integers(0, 1200), min_size=2, max_size=8),
)
def test_any_slice_of_the_order_held_per_shard_is_the_global_orders(
    sizes: list[int], seed: int, epoch: int, window: int, shuffle: bool, cuts: list[int]
) -> None:
    full = global_order(sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    eo = EpochOrder(sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=window, cache_windows=2)
    assert len(eo) == len(full) == sum(sizes)
    for a, b in zip(sorted(cuts), sorted(cuts)[1:]):
        np.testing.assert_array_equal(eo.take(a, b), full[a:b])
    np.testing.assert_array_equal(np.sort(full), np.arange(len(full)))


def test_windows_are_independent_so_a_batch_needs_only_its_windows() -> None:
    sizes = [1000] * 400
    eo = EpochOrder(sizes, seed=5, epoch=2, window=4, cache_windows=0)
    late = eo.take(390_000, 390_100)  # the last window, computed alone
    np.testing.assert_array_equal(
        late, shard_order(sizes, seed=5, epoch=2, window=4)[390_000:390_100]
    )
    held = sum(a.nbytes for a in (eo._perm, eo._psizes, eo._pcum, eo._starts, eo._wstart))
    assert held <= 48 * len(sizes) and not eo._cache  # O(shards): nothing per sample is kept
