"""Replication groups: the ranks of a group get the same batches; groups split the data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError
from datamill.loader import Batching, BatchService, Loader
from tests.strategies import FakeSource, batch_sizes, seeds, shard_sizes


def xs(loader: Loader) -> list[list[int]]:
    return [b["x"].tolist() for b in loader]


@given(
    sizes=shard_sizes(max_shards=8),
    bs=batch_sizes,
    groups=st.integers(1, 3),
    k=st.integers(1, 3),
    seed=seeds,
    drop_last=st.booleans(),
)
@settings(max_examples=30)
def test_group_members_get_identical_batches_and_groups_partition(
    sizes: list[int], bs: int, groups: int, k: int, seed: int, drop_last: bool
) -> None:
    src = FakeSource(sizes)
    world = groups * k
    per_rank = [
        xs(
            Loader(
                src,
                bs,
                seed=seed,
                rank=r,
                world_size=world,
                batching=Batching(replication=k, drop_last=drop_last),
            )
        )
        for r in range(world)
    ]
    for g in range(groups):
        members = per_rank[g * k : (g + 1) * k]
        assert all(m == members[0] for m in members)
        # a group sees exactly what rank g of a run with `groups` ranks and no replication sees
        assert members[0] == xs(
            Loader(
                src,
                bs,
                seed=seed,
                rank=g,
                world_size=groups,
                batching=Batching(drop_last=drop_last),
            )
        )
    got = [x for g in range(groups) for b in per_rank[g * k] for x in b]
    assert len(got) == len(set(got))
    if not drop_last:
        assert sorted(got) == list(range(sum(sizes)))


def test_service_and_state_carry_replication() -> None:
    src = FakeSource([20, 15, 9])
    svc = BatchService(src, batch_size=4, seed=2)
    assert (
        svc.plan(0, 2, 4, replication=2).seq.tolist()
        == svc.plan(0, 3, 4, replication=2).seq.tolist()
        == svc.plan(0, 1, 2).seq.tolist()
    )
    a = Loader(src, 4, seed=2, rank=3, world_size=4, batching=Batching(replication=2))
    it = iter(a)
    next(it)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["config"]["replication"] == 2
    assert "replication" not in Loader(src, 4).state_dict()["config"]  # the default is left out
    b = Loader.from_state(src, state)
    assert b.replication == 2 and xs(b) == [x["x"].tolist() for x in it]
    # elastic: 4 ranks in groups of 2 -> 3 ranks without replication, still exactly once
    ranks = [
        Loader(src, 4, seed=2, rank=r, world_size=4, batching=Batching(replication=2))
        for r in range(4)
    ]
    seen = [next(iter(ld))["x"].tolist() for ld in ranks[::2]]
    for r in (1, 3):
        next(iter(ranks[r]))
    new = [Loader(src, 4, seed=2, rank=r, world_size=3) for r in range(3)]
    for ld in new:
        ld.load_state_dict([x.state_dict() for x in ranks])
    rest = [x for ld in new for b in xs(ld) for x in b]
    assert sorted([x for s in seen for x in s] + rest) == list(range(44))


def test_replication_must_divide_world_size() -> None:
    with pytest.raises(ConfigError, match="replication"):
        Loader(FakeSource([4]), 2, rank=0, world_size=3, batching=Batching(replication=2))
    with pytest.raises(ConfigError, match="divide"):
        BatchService(FakeSource([4]), batch_size=2).plan(0, 0, 3, replication=2)
