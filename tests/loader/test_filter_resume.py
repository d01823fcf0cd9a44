"""Filters with exact resumption: counts carried in the state; refill=True full batches resume
exactly."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import DataFileError, ResumeStateError
from datamill.loader import Batching, Loader
from tests.contracts import check_resume
from tests.strategies import FakeSource, batch_sizes, seeds, shard_sizes


def keep_some(modulus: int) -> Any:
    """A deterministic filter dropping about 1 in ``modulus`` samples (scattered by a multiplicative
    hash)."""

    def fn(t: pa.Table) -> Any:
        return t.column("x").to_numpy() * 7919 % 13 % modulus != 0

    return fn


@given(
    sizes=shard_sizes(max_shards=6),
    bs=batch_sizes,
    seed=seeds,
    modulus=st.integers(2, 5),
    data=st.data(),
)
@settings(max_examples=30)
def test_refill_batches_are_full_and_resume_exactly(
    sizes: list[int], bs: int, seed: int, modulus: int, data: st.DataObject
) -> None:
    src = FakeSource(sizes)
    flt = keep_some(modulus)
    full = [
        b["x"].tolist()
        for b in Loader(src, bs, seed=seed, batching=Batching(filter=flt, refill=True, window=2))
    ]
    plain = [
        x
        for b in Loader(src, bs, seed=seed, batching=Batching(filter=flt, window=2))
        for x in b["x"].tolist()
    ]
    assert [x for b in full for x in b] == plain  # the same samples in the same order, re-cut
    assert all(len(b) == bs for b in full[:-1]) and (not full or 0 < len(full[-1]) <= bs)
    midpoint = data.draw(st.integers(0, len(full)), label="midpoint")

    def make(state: dict[str, Any] | None) -> Loader:
        if state is None:
            return Loader(src, bs, seed=seed, batching=Batching(filter=flt, refill=True, window=2))
        return Loader.from_state(src, state, batching=Batching(filter=flt))

    check_resume(make, midpoint)


@given(
    sizes=shard_sizes(max_shards=6),
    bs=batch_sizes,
    seed=seeds,
    refill=st.booleans(),
    data=st.data(),
)
@settings(max_examples=20)
def test_resumed_counts_equal_the_uninterrupted_run(
    sizes: list[int], bs: int, seed: int, refill: bool, data: st.DataObject
) -> None:
    src = FakeSource(sizes)
    flt = keep_some(3)
    whole = Loader(src, bs, seed=seed, batching=Batching(filter=flt, refill=refill))
    n_out = sum(1 for _ in whole)
    want = {k: whole.stats()[k] for k in ("read", "filtered", "failed", "yielded")}
    stop = data.draw(st.integers(0, n_out), label="stop")
    first = Loader(src, bs, seed=seed, batching=Batching(filter=flt, refill=refill))
    it = iter(first)
    for _ in range(stop):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = Loader.from_state(src, state, batching=Batching(filter=flt))
    rest = sum(1 for _ in resumed)
    assert stop + rest == n_out
    assert {k: resumed.stats()[k] for k in want} == want


def test_max_errors_budget_holds_across_resumption() -> None:
    src = FakeSource([30, 30])

    def fails_on_sevens(t: pa.Table) -> pa.Table:
        if (t.column("x").to_numpy() % 7 == 0).any():
            raise ValueError("seven")
        return t

    def run(loader: Loader, limit: int | None = None) -> int:
        n = 0
        for _ in loader:
            n += 1
            if limit is not None and n >= limit:
                break
        return n

    whole = Loader(src, 6, seed=1, batching=Batching(transform=fails_on_sevens, max_errors=5))
    got: list[int] = []
    with pytest.raises(DataFileError):  # 9 multiples of 7 in 0..59: the 6th failure raises
        for _ in whole:
            got.append(1)
    k = len(got)
    assert k >= 2
    first = Loader(src, 6, seed=1, batching=Batching(transform=fails_on_sevens, max_errors=5))
    run(first, k - 1)
    assert first.state_dict()["counts"]["failed"] > 0
    resumed = Loader.from_state(
        src,
        json.loads(json.dumps(first.state_dict())),
        batching=Batching(transform=fails_on_sevens, max_errors=5),
    )
    more: list[int] = []
    with pytest.raises(DataFileError):  # the budget counts the failures before the resume too
        for _ in resumed:
            more.append(1)
    assert len(more) == 1  # raises exactly where the uninterrupted run did


def test_refill_state_mismatch_and_elastic_refusal() -> None:
    src = FakeSource([20, 20])
    flt = keep_some(3)
    a = Loader(src, 4, seed=0, batching=Batching(filter=flt, refill=True))
    next(iter(a))
    with pytest.raises(ResumeStateError, match="refill: saved True, now False"):
        Loader(src, 4, seed=0, batching=Batching(filter=flt)).load_state_dict(a.state_dict())
    b = Loader(
        src, 5, seed=1, batching=Batching(filter=flt, refill=True)
    )  # a seed whose order stops mid-batch here
    it = iter(b)
    next(it), next(it)
    st0 = b.state_dict()
    assert (st0["batches_seen"], st0["skip"]) == (
        3,
        1,
    )  # 10 rows emitted: batch 3 started, 1 of its rows sent
    with pytest.raises(ResumeStateError, match="re-split"):
        Loader(
            src, 5, seed=1, rank=0, world_size=2, batching=Batching(filter=flt, refill=True)
        ).load_state_dict(st0)
