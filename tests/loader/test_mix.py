"""Weighted mixing: exact largest-remainder counts per epoch, no repeats within a quota, columns
unioned with nulls, a source column, resumable (plain and elastic), rank-split."""

from __future__ import annotations

import collections
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, SchemaError
from datamill.core.source import TableSource
from datamill.loader import BatchService, Loader, Mix
from datamill.loader.mix import quotas
from tests.contracts import check_resume, check_source
from tests.strategies import FakeSource, batch_sizes, seeds, shard_sizes

weights = st.lists(st.integers(0, 10), min_size=1, max_size=4).filter(lambda w: sum(w) > 0)


def mix_of(sizes: list[list[int]], ws: list[int], **kwargs: Any) -> Mix:
    return Mix(
        [(FakeSource(s), w) for s, w in zip(sizes, ws)],
        names=[f"s{i}" for i in range(len(ws))],
        **kwargs,
    )


@given(ws=weights, total=st.integers(0, 10_000))
def test_quotas_are_exact_largest_remainder(ws: list[int], total: int) -> None:
    q = quotas(ws, total=total)
    assert sum(q) == total
    for n, w in zip(q, ws):
        assert abs(Fraction(n) - Fraction(total * w, sum(ws))) < 1


@given(
    ws=weights,
    data=st.data(),
    seed=seeds,
    epoch=st.integers(0, 5),
    shuffle=st.booleans(),
    stopping=st.sampled_from([None, "first_exhausted", "all_exhausted"]),
)
@settings(max_examples=40)
def test_each_epoch_has_exact_counts_and_no_repeats_within_a_quota(
    ws: list[int], data: st.DataObject, seed: int, epoch: int, shuffle: bool, stopping: Any
) -> None:
    sizes = [
        data.draw(shard_sizes(max_shards=4, max_size=30).filter(lambda s: sum(s) > 0)) for _ in ws
    ]
    kwargs = {"stopping": stopping} if stopping else {"epoch_size": data.draw(st.integers(0, 200))}
    mix = mix_of(sizes, ws, **kwargs)
    seq = mix.epoch_sequence(seed=seed, epoch=epoch, shuffle=shuffle, window=2)
    assert len(seq) == mix.epoch_length() == sum(mix.quotas())
    np.testing.assert_array_equal(
        seq, mix.epoch_sequence(seed=seed, epoch=epoch, shuffle=shuffle, window=2)
    )
    offsets = np.concatenate([[0], np.cumsum([sum(s) for s in sizes])])
    src = np.searchsorted(offsets, seq, side="right") - 1
    for i, quota in enumerate(mix.quotas()):
        mine = seq[src == i]
        assert len(mine) == quota  # exact, every epoch
        counts = np.bincount(mine - offsets[i], minlength=sum(sizes[i]))
        passes = quota // sum(sizes[i])
        assert (
            counts.min() >= passes and counts.max() <= passes + 1
        )  # no repeat before the source is used up
    total = [sum(s) for s in sizes]
    n, share = mix.epoch_length(), [Fraction(w, sum(ws)) for w in ws]
    if stopping == "first_exhausted":  # the largest epoch whose exact shares fit every source
        assert all(q <= t for q, t in zip(mix.quotas(), total))
        assert any((n + 1) * p > t for p, t in zip(share, total) if p)
    if stopping == "all_exhausted":  # the smallest epoch whose exact shares cover every source
        assert all(q >= t for q, t, w in zip(mix.quotas(), total, ws) if w)
        assert n == 0 or any((n - 1) * p < t for p, t in zip(share, total) if p)


@given(ws=weights, data=st.data(), bs=batch_sizes, seed=seeds, world=st.integers(1, 3))
@settings(max_examples=20)
def test_loader_over_a_mix_rank_split_and_resume(
    ws: list[int], data: st.DataObject, bs: int, seed: int, world: int
) -> None:
    sizes = [
        data.draw(shard_sizes(max_shards=4, max_size=30).filter(lambda s: sum(s) > 0)) for _ in ws
    ]
    mix = mix_of(sizes, ws, epoch_size=data.draw(st.integers(0, 150)))
    got = collections.Counter(
        (s, x)
        for r in range(world)
        for b in Loader(mix, bs, seed=seed, rank=r, world_size=world)
        for s, x in zip(b["source"].tolist(), b["x"].tolist())
    )
    offsets = np.concatenate([[0], np.cumsum([sum(s) for s in sizes])])
    seq = mix.epoch_sequence(seed=seed, epoch=0, window=Loader(mix, bs).service.window)
    src = np.searchsorted(offsets, seq, side="right") - 1
    want = collections.Counter(
        (f"s{i}", int(g - offsets[i])) for i, g in zip(src.tolist(), seq.tolist())
    )
    assert got == want  # the ranks together read exactly the epoch's schedule
    total = len(Loader(mix, bs, seed=seed))
    midpoint = data.draw(st.integers(0, total), label="midpoint")

    def make(state: dict[str, Any] | None) -> Loader:
        return (
            Loader(mix, bs, seed=seed, collate="arrow")
            if state is None
            else Loader.from_state(mix, state, collate="arrow")
        )

    check_resume(make, midpoint)


def test_columns_are_unioned_with_nulls_and_each_row_names_its_source() -> None:
    a = TableSource(
        pa.table({"ids": pa.array([[1], [2, 3]], pa.list_(pa.int32())), "label": [0, 1]})
    )
    b = TableSource(pa.table({"ids": pa.array([[7, 8, 9]], pa.list_(pa.int64())), "text": ["hi"]}))
    mix = Mix([(a, 2), (b, 1)], epoch_size=6, names=["wiki", "code"])
    check_source(
        mix,
        reopen=lambda: Mix([(a, 2), (b, 1)], epoch_size=6, names=["wiki", "code"]),
        different=Mix([(a, 1), (b, 1)], epoch_size=6, names=["wiki", "code"]),
    )
    assert mix.columns == ["ids", "label", "text", "source"]
    assert mix.schema().field("ids").type == pa.list_(pa.int64())
    rows = [r for t in Loader(mix, 4, seed=0, collate="arrow") for r in t.to_pylist()]
    assert collections.Counter(r["source"] for r in rows) == {"wiki": 4, "code": 2}
    assert all(r["text"] is None and r["label"] is not None for r in rows if r["source"] == "wiki")
    assert all(
        r == {"ids": [7, 8, 9], "label": None, "text": "hi", "source": "code"}
        for r in rows
        if r["source"] == "code"
    )
    batch = next(iter(Loader(mix, 6, seed=0)))  # numpy collate pads the unified ragged column
    assert batch["ids"].shape[0] == 6 and set(batch["source"].tolist()) == {"wiki", "code"}


def test_proportions_hold_within_every_stretch_of_the_epoch() -> None:
    mix = mix_of([[100] * 5, [100] * 5], [3, 1], epoch_size=400)
    svc = BatchService(mix, batch_size=20, seed=5, collate="arrow")
    for res in svc.build(0, 0, range(svc.num_batches(0))):
        counts = collections.Counter(res.output.column("source").to_pylist())
        assert abs(counts["s0"] - 15) <= 1  # 3:1 in every batch of 20, not just over the epoch


def test_mix_errors() -> None:
    a = FakeSource([3])
    with pytest.raises(ConfigError, match="not both"):
        Mix([(a, 1)], epoch_size=3, stopping="all_exhausted")
    with pytest.raises(ConfigError, match="weights"):
        Mix([(a, -1)], epoch_size=3)
    with pytest.raises(ConfigError, match="empty"):
        Mix([(a, 1), (FakeSource([]), 1)], epoch_size=4)
    with pytest.raises(SchemaError) as info:
        Mix(
            [(TableSource(pa.table({"x": [1]})), 1), (TableSource(pa.table({"x": [[1]]})), 1)],
            epoch_size=2,
        ).schema()
    assert info.value.column == "x"


def test_elastic_resume_over_a_mix_keeps_the_epoch_schedule() -> None:
    mix = mix_of([[40, 25], [30]], [2, 1], epoch_size=120)
    old = [Loader(mix, 7, seed=9, rank=r, world_size=2) for r in range(2)]
    seen = []
    for ld in old:
        it = iter(ld)
        for _ in range(3):
            b = next(it)
            seen += list(zip(b["source"].tolist(), b["x"].tolist()))
    new = [Loader(mix, 5, seed=9, rank=r, world_size=3) for r in range(3)]
    for ld in new:
        ld.load_state_dict([o.state_dict() for o in old], allow_mismatch=["batch_size"])
    rest = [p for ld in new for b in ld for p in zip(b["source"].tolist(), b["x"].tolist())]
    whole = [
        p
        for r in range(2)
        for b in Loader(mix, 7, seed=9, rank=r, world_size=2)
        for p in zip(b["source"].tolist(), b["x"].tolist())
    ]
    assert collections.Counter(seen + rest) == collections.Counter(whole)
