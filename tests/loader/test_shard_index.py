"""``shard_index`` equals the binary search it replaces, for any shard sizes (empty, tiny, huge)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.loader.stages import shard_index


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0), st.integers(1, 5), st.integers(1, 5000)), min_size=1, max_size=40
    ),
    st.integers(0, 3000),
    st.integers(0, 2**32 - 1),
)
def test_shard_index_equals_searchsorted(sizes: list[int], n: int, seed: int) -> None:
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(offsets[-1])
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, total, n) if total else np.zeros(0, dtype=np.int64)
    want = np.searchsorted(offsets, seq, side="right") - 1
    got = shard_index(seq, offsets)
    assert got.dtype == np.int64
    assert np.array_equal(got, want)


def test_every_first_and_last_sample_of_a_shard_lands_in_it() -> None:
    """The boundaries, where one comparison moves a sample to the next shard."""
    sizes = np.array([7, 0, 8, 9, 0, 0, 16, 7, 300])
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    full = np.flatnonzero(sizes)
    seq = np.concatenate([offsets[full], offsets[full + 1] - 1])
    assert shard_index(seq, offsets).tolist() == [*full.tolist(), *full.tolist()]
