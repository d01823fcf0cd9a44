"""Elastic resumption: states saved with W ranks resume on any W' ranks, every sample exactly
once."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.core.source import TableSource
from datamill.loader import Batching, BatchService, Loader
from datamill.loader.order import remaining_positions, split_for_rank
from tests.strategies import FakeSource, batch_sizes, seeds, shard_sizes, world_sizes


def run(loader: Loader, limit: int | None = None) -> list[int]:
    """Samples of up to ``limit`` batches of the loader's current epoch (the iterator is left
    open)."""
    out: list[int] = []
    it = iter(loader)
    for i, b in enumerate(it):
        out += b["x"].tolist()
        if limit is not None and i + 1 >= limit:
            break
    return out


def roundtrip(state: Any) -> Any:
    return json.loads(json.dumps(state))


@given(
    n=st.integers(0, 300),
    hist=st.lists(
        st.tuples(st.integers(1, 5), st.lists(st.integers(0, 80), min_size=5, max_size=5)),
        max_size=3,
    ),
)
def test_remaining_positions_partition(n: int, hist: list[tuple[int, list[int]]]) -> None:
    pos = np.arange(n)
    consumed: list[int] = []
    history = []
    for world, wants in hist:
        parts = [split_for_rank(pos, rank=r, world_size=world) for r in range(world)]
        cs = tuple(min(w, len(p)) for w, p in zip(wants, parts))
        consumed += [x for p, c in zip(parts, cs) for x in p[:c].tolist()]
        history.append((world, cs))
        pos = remaining_positions(n, history=tuple(history))
    assert sorted(consumed + pos.tolist()) == list(range(n))
    assert (np.diff(pos) > 0).all()


@given(
    sizes=shard_sizes(max_shards=8),
    bs=batch_sizes,
    new_bs=batch_sizes,
    world=world_sizes,
    new_world=world_sizes,
    seed=seeds,
    lockstep=st.booleans(),
    data=st.data(),
)
@settings(max_examples=40)
def test_elastic_resume_sees_every_sample_exactly_once(
    sizes: list[int],
    bs: int,
    new_bs: int,
    world: int,
    new_world: int,
    seed: int,
    lockstep: bool,
    data: st.DataObject,
) -> None:
    src = FakeSource(sizes)
    old = [
        Loader(src, bs, seed=seed, rank=r, world_size=world, batching=Batching(window=2))
        for r in range(world)
    ]
    if lockstep:
        k = data.draw(st.integers(0, max(len(ld) for ld in old)), label="stop")
        stops = [k] * world
    else:
        stops = [data.draw(st.integers(0, len(ld)), label=f"stop{r}") for r, ld in enumerate(old)]
    seen = [x for ld, k in zip(old, stops) for x in (run(ld, k) if k else [])]
    states = [roundtrip(ld.state_dict()) for ld in old]
    given_states: Any = states[0] if lockstep else states
    new = [
        Loader(src, new_bs, seed=seed, rank=r, world_size=new_world, batching=Batching(window=2))
        for r in range(new_world)
    ]
    for ld in new:
        ld.load_state_dict(given_states, allow_mismatch=["batch_size"])
    # stop again part-way and resume on the original world size: the history chains
    again = data.draw(st.integers(0, 3), label="again")
    rest = [x for ld in new for x in (run(ld, min(again, len(ld))) if min(again, len(ld)) else [])]
    states2 = [roundtrip(ld.state_dict()) for ld in new]
    final = [
        Loader.from_state(
            src, states2, rank=r, world_size=world, batch_size=bs, allow_mismatch=["batch_size"]
        )
        for r in range(world)
    ]
    rest += [x for ld in final for x in run(ld)]
    got = seen + rest
    assert sorted(got) == list(range(sum(sizes)))  # every sample exactly once in the epoch
    # the next epoch is the plain epoch of the new world size
    assert all(ld.epoch == 1 and ld.state_dict().get("elastic") is None for ld in final)
    nxt = [x for ld in final for x in run(ld)]
    plain = [
        x
        for r in range(world)
        for x in run(
            Loader(
                src, bs, seed=seed, epoch=1, rank=r, world_size=world, batching=Batching(window=2)
            )
        )
    ]
    assert nxt == plain


@given(
    sizes=shard_sizes(max_shards=6),
    bs=batch_sizes,
    world=st.integers(1, 4),
    new_world=st.integers(1, 4),
    seed=seeds,
    data=st.data(),
)
@settings(max_examples=25)
def test_elastic_resume_with_drop_last_has_no_duplicates_and_equal_batches(
    sizes: list[int], bs: int, world: int, new_world: int, seed: int, data: st.DataObject
) -> None:
    src = FakeSource(sizes)
    old = [
        Loader(src, bs, seed=seed, rank=r, world_size=world, batching=Batching(drop_last=True))
        for r in range(world)
    ]
    k = data.draw(st.integers(0, len(old[0])), label="stop")
    seen = [x for ld in old for x in (run(ld, k) if k else [])]
    new = [
        Loader(src, bs, seed=seed, rank=r, world_size=new_world, batching=Batching(drop_last=True))
        for r in range(new_world)
    ]
    for ld in new:
        ld.load_state_dict(old[0].state_dict())
    assert len({len(ld) for ld in new}) == 1
    rest = [run(ld) for ld in new]
    got = seen + [x for r in rest for x in r]
    assert len(got) == len(set(got))
    assert all(len(r) == len(ld_rest) for r, ld_rest in zip(rest, rest))


def test_same_world_lockstep_state_continues_each_ranks_own_plan() -> None:
    src = FakeSource([30, 20, 25])
    ranks = [Loader(src, 4, seed=1, rank=r, world_size=3) for r in range(3)]
    heads = [run(ld, 2) for ld in ranks]
    tails = [run(ld) for ld in ranks]
    for r in range(3):  # rank 0's state is enough for every rank: same plans, no re-split
        ld = Loader(src, 4, seed=1, rank=r, world_size=3)
        ld2 = Loader(src, 4, seed=1, rank=r, world_size=3)
        ld2.set_epoch(0)
        ld.load_state_dict(
            Loader(src, 4, seed=1, rank=0, world_size=3).state_dict() | {"batches_seen": 2}
        )
        assert run(ld) == tails[r] and run(ld2)[: len(heads[r])] == heads[r]


def test_service_resume_point_and_plan_for_a_server() -> None:
    svc = BatchService(
        TableSource(pa.table({"x": list(range(20))}), shard_size=5), batch_size=3, seed=4
    )
    states = [
        svc.resume_state(epoch=2, batches_seen=b, rank=r, world_size=2)
        for r, b in enumerate([2, 1])
    ]
    point = svc.resume_point(states, rank=1, world_size=4)
    assert point.epoch == 2 and point.batches_seen == 0 and point.elastic == ((2, (6, 3)),)
    consumed = [x for r, c in enumerate([6, 3]) for x in svc.plan(2, r, 2).seq[:c].tolist()]
    rest = [
        x
        for r in range(4)
        for res in svc.build(
            2,
            r,
            range(svc.num_batches(2, r, 4, elastic=point.elastic)),
            world_size=4,
            elastic=point.elastic,
        )
        for x in res.output["x"].tolist()
    ]
    assert sorted(consumed + rest) == list(range(20))
    st4 = svc.resume_state(epoch=2, batches_seen=1, rank=1, world_size=4, elastic=point.elastic)
    assert st4["elastic"] == [[2, [6, 3]]] and st4["samples_seen"] == 3


def test_elastic_errors_name_the_problem() -> None:
    src = FakeSource([10, 10])
    a = Loader(src, 2, seed=0, rank=0, world_size=3)
    b = Loader(src, 2, seed=0, rank=1, world_size=3)
    new = Loader(src, 2, seed=0, rank=0, world_size=2)
    with pytest.raises(ResumeStateError, match=r"missing rank\(s\) \[2\]"):
        new.load_state_dict([a.state_dict(), b.state_dict()])
    with pytest.raises(ResumeStateError, match="disagree on the epoch"):
        new.load_state_dict([a.state_dict(), b.state_dict() | {"epoch": 3}])
    with pytest.raises(ResumeStateError, match="seed: saved 0, now 1; batch_size: saved 2, now 3"):
        Loader(src, 3, seed=1, rank=0, world_size=2).load_state_dict(a.state_dict())
    with pytest.raises(ConfigError, match="does not fit"):
        BatchService(src, batch_size=2).plan(0, 0, 1, elastic=((1, (21,)),))
