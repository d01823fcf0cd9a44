"""Hypothesis strategies and small fake Sources shared by the tests (GUIDE §4.8)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from numpy.typing import NDArray

__all__ = ["FakeSource", "batch_sizes", "seeds", "shard_sizes", "world_sizes"]

seeds = st.integers(0, 2**63 - 1)
batch_sizes = st.integers(1, 40)
world_sizes = st.integers(1, 5)


def shard_sizes(max_shards: int = 12, max_size: int = 60) -> st.SearchStrategy[list[int]]:
    """Uneven shard sizes, empty shards included."""
    return st.lists(st.integers(0, max_size), min_size=0, max_size=max_shards)


class FakeSource:
    """A multi-shard in-memory Source with uneven shard sizes.

    Column ``x`` holds the global sample index, ``uid`` the string ``"u<index>"``, ``ids`` a ragged
    list of ``index % 4`` copies of the index, ``vec`` a fixed-size vector ``[index, -index]``.
    ``reads`` counts ``read_shard`` calls per shard.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.reads = np.zeros(len(self.sizes), dtype=np.int64)

    @property
    def columns(self) -> list[str]:
        return ["x", "uid", "ids", "vec"]

    @property
    def num_shards(self) -> int:
        return len(self.sizes)

    def shard_sizes(self) -> NDArray[np.int64]:
        return self.sizes.copy()

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        self.reads[index] += 1
        x = np.arange(self.offsets[index], self.offsets[index + 1], dtype=np.int64)
        reps = x % 4
        ids = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(reps)]).astype(np.int32)),
            pa.array(np.repeat(x, reps)),
        )
        vec = pa.FixedSizeListArray.from_arrays(pa.array(np.stack([x, -x], axis=1).reshape(-1)), 2)
        table = pa.table({"x": x, "uid": [f"u{i}" for i in x.tolist()], "ids": ids, "vec": vec})
        return table if columns is None else table.select(list(columns))

    def fingerprint(self) -> str:
        return "fake-" + "-".join(map(str, self.sizes.tolist()))
