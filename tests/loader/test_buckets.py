"""Length-bucketed batches: every sample once per epoch, same-bucket batches, deterministic,
resumable."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, ResumeStateError, SchemaError
from datamill.core.source import TableSource
from datamill.loader import Batching, Loader
from datamill.loader.buckets import bucket_arrange, bucket_boundaries, padding_of
from tests.contracts import check_resume
from tests.strategies import batch_sizes, seeds


def ragged_source(lengths: list[int], shard_size: int) -> TableSource:
    tokens = pa.array([[i] * n for i, n in enumerate(lengths)], pa.list_(pa.int64()))
    return TableSource(
        pa.table({"x": np.arange(len(lengths)), "tokens": tokens}), shard_size=shard_size
    )


@given(
    lengths=st.lists(st.integers(0, 50), max_size=300),
    bs=batch_sizes,
    chunk=st.integers(1, 120),
    buckets=st.integers(1, 6),
    seed=seeds,
)
def test_bucket_arrange_is_a_permutation_with_few_mixed_batches(
    lengths: list[int], bs: int, chunk: int, buckets: int, seed: int
) -> None:
    arr = np.asarray(lengths, dtype=np.int64)
    bounds = bucket_boundaries(arr, buckets)
    perm = bucket_arrange(
        arr, batch_size=bs, chunk=chunk, boundaries=bounds, rng=np.random.default_rng(seed)
    )
    assert sorted(perm.tolist()) == list(range(len(arr)))
    step = max(bs, -(-chunk // bs) * bs)
    for lo in range(
        0, len(arr), step
    ):  # each chunk: its own samples; at most (buckets - 1) mixed full batches
        part = perm[lo : lo + step]
        assert sorted(part.tolist()) == list(range(lo, min(len(arr), lo + step)))
        ids = np.searchsorted(bounds, arr[part], side="right")
        mixed = sum(
            len(set(ids[i : i + bs].tolist())) > 1 for i in range(0, len(part) - len(part) % bs, bs)
        )
        assert mixed <= len(bounds)


@given(
    lengths=st.lists(st.integers(0, 30), max_size=150),
    bs=batch_sizes,
    seed=seeds,
    world=st.integers(1, 3),
    drop_last=st.booleans(),
)
@settings(max_examples=25)
def test_bucketed_loader_sees_every_sample_once_per_epoch(
    lengths: list[int], bs: int, seed: int, world: int, drop_last: bool
) -> None:
    src = ragged_source(lengths, 17)
    runs = [
        [
            b["x"].tolist()
            for b in Loader(
                src,
                bs,
                seed=seed,
                rank=r,
                world_size=world,
                batching=Batching(bucket_by="tokens", buckets=3, window=2, drop_last=drop_last),
            )
        ]
        for r in range(world)
    ]
    got = [x for run in runs for b in run for x in b]
    assert len(got) == len(set(got))
    if not drop_last:
        assert sorted(got) == list(range(len(lengths)))
    again = [
        b["x"].tolist()
        for b in Loader(
            src,
            bs,
            seed=seed,
            rank=0,
            world_size=world,
            batching=Batching(bucket_by="tokens", buckets=3, window=2, drop_last=drop_last),
        )
    ]
    assert again == runs[0]  # deterministic


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=120),
    bs=batch_sizes,
    seed=seeds,
    data=st.data(),
)
@settings(max_examples=15)
def test_bucketed_loader_resumes_exactly(
    lengths: list[int], bs: int, seed: int, data: st.DataObject
) -> None:
    src = ragged_source(lengths, 13)
    total = len(Loader(src, bs))
    midpoint = data.draw(st.integers(0, total), label="midpoint")

    def make(state: dict[str, Any] | None) -> Loader:
        if state is None:
            return Loader(
                src, bs, seed=seed, batching=Batching(bucket_by="tokens", buckets=[5, 12], window=2)
            )
        return Loader.from_state(src, state)

    check_resume(make, midpoint)


def test_bucketing_saves_padding() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 512, size=4000).tolist()
    src = ragged_source(lengths, 500)
    arr = np.asarray(lengths)

    def padding(loader: Loader) -> int:
        seq = loader.plan().seq
        return padding_of(arr[seq], batch_size=32)[0]

    plain, bucketed = (
        padding(Loader(src, 32, seed=1)),
        padding(Loader(src, 32, seed=1, batching=Batching(bucket_by="tokens"))),
    )
    assert bucketed < plain / 4


def test_bucketing_errors() -> None:
    src = ragged_source([1, 2, 3], 2)
    with pytest.raises(SchemaError) as info:
        Loader(src, 2, batching=Batching(bucket_by="nope"))
    assert info.value.column == "nope"
    with pytest.raises(SchemaError, match="list or string"):
        Loader(src, 2, batching=Batching(bucket_by="x")).plan()
    a, b = (
        Loader(src, 1, rank=r, world_size=2, batching=Batching(bucket_by="tokens"))
        for r in range(2)
    )
    with pytest.raises(ResumeStateError, match="bucket_by"):
        Loader(src, 1, batching=Batching(bucket_by="tokens")).load_state_dict(
            [a.state_dict(), b.state_dict()]
        )
    with pytest.raises(ConfigError, match="buckets"):
        Loader(src, 1, batching=Batching(bucket_by="tokens", buckets=0))
