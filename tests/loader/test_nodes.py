"""The Loader's batch stream as composed stages (datamill.loader.nodes): one flat state, exact
resume."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import ResumeStateError
from datamill.core.source import TableSource
from datamill.loader import Batching, Loader
from datamill.loader.nodes import DropEmpty, Positions, Refilled, Stage, WeakMethod, compose
from datamill.loader.service import BatchService

SOURCE = TableSource(pa.table({"x": list(range(40))}), shard_size=7)


def _keep(t: pa.Table) -> Any:
    return t["x"].to_numpy() % 3 != 0


# States saved by the Loader before its stream was made of stages (main at 16e050a), each with the
# batches that followed it: they must still load and give the same tail.
OLD_STATES = {
    "plain": (
        {
            "batches_seen": 3,
            "config": {
                "batch_size": 5,
                "columns": None,
                "drop_last": False,
                "rank": 0,
                "shuffle": True,
                "window": 10923,
                "world_size": 1,
            },
            "config_fingerprint": "e8d028f3e409089a4fd128dfff3bbd86",
            "counts": {"failed": 0, "filtered": 3, "read": 15, "yielded": 12},
            "dataset_fingerprint": "fd6120bfcc8a8f47999fb4e084e8d9a1",
            "epoch": 0,
            "format": "datamill.loader/1",
            "samples_seen": 15,
            "seed": 11,
        },
        [[11, 26, 31], [17, 1], [10, 4, 37, 2], [16, 32, 7, 38], [29]],
    ),
    "refill": (
        {
            "batches_seen": 2,
            "config": {
                "batch_size": 5,
                "columns": None,
                "drop_last": False,
                "rank": 0,
                "refill": True,
                "shuffle": True,
                "window": 10923,
                "world_size": 1,
            },
            "config_fingerprint": "e8d028f3e409089a4fd128dfff3bbd86",
            "counts": {"failed": 0, "filtered": 2, "read": 10, "yielded": 8},
            "dataset_fingerprint": "fd6120bfcc8a8f47999fb4e084e8d9a1",
            "epoch": 0,
            "format": "datamill.loader/1",
            "samples_seen": 10,
            "seed": 11,
            "skip": 2,
        },
        [[28, 5, 11, 26, 31], [17, 1, 10, 4, 37], [2, 16, 32, 7, 38], [29]],
    ),
}


@pytest.mark.parametrize("kind", sorted(OLD_STATES))
def test_a_state_saved_before_the_stages_resumes_the_same_tail(kind: str) -> None:
    state, tail = OLD_STATES[kind]
    batching = Batching(filter=_keep, refill=kind == "refill")
    ld = Loader(SOURCE, 5, seed=11, collate="arrow", batching=batching)
    ld.load_state_dict(state)
    assert [b["x"].to_pylist() for b in ld] == tail
    again = Loader.from_state(SOURCE, state, collate="arrow", batching=Batching(filter=_keep))
    assert [b["x"].to_pylist() for b in again] == tail


def _chain(svc: BatchService, *, refill: bool) -> tuple[Positions, Stage]:
    pos = Positions(lambda r: svc.build(0, 0, r), svc.accounting)
    return pos, compose(
        pos,
        refill=refill,
        batch_size=svc.batch_size,
        drop_last=False,
        collate=lambda t: t["x"].to_pylist(),
    )


def test_each_stage_owns_its_fields_of_one_flat_state() -> None:
    svc = BatchService(
        SOURCE, batch_size=4, collate="arrow", batching=Batching(shuffle=False, filter=_keep)
    )
    total = svc.num_batches(0)
    pos, stream = _chain(svc, refill=True)
    assert isinstance(stream.source, Refilled) and stream.source.source is pos
    stream.begin(total)
    assert next(stream) == [1, 2, 4, 5]  # position batch 0 gave 1 2, batch 1 gave 4 5 (of 4 5 7)
    state = stream.state_dict()
    # batch 1 holds the rows not yet emitted; 2 of its passing rows were emitted
    assert state == {
        "batches_seen": 1,
        "skip": 2,
        "counts": {"read": 4, "filtered": 2, "failed": 0, "yielded": 2},
        "config": {"refill": True},
    }
    rest = list(stream)
    _, resumed = _chain(svc, refill=True)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    resumed.begin(total)
    assert list(resumed) == rest
    _, plain = _chain(svc, refill=False)
    assert isinstance(plain, DropEmpty)
    plain.begin(total)
    next(plain)
    assert plain.state_dict() == {
        "batches_seen": 1,
        "counts": {"read": 4, "filtered": 2, "failed": 0, "yielded": 2},
    }


def test_each_stage_checks_its_own_fields() -> None:
    svc = BatchService(SOURCE, batch_size=4, collate="arrow", batching=Batching(shuffle=False))
    _, plain = _chain(svc, refill=False)
    with pytest.raises(ResumeStateError, match="'skip' must be 0 without refill"):
        plain.load_state_dict({"batches_seen": 1, "skip": 2})
    with pytest.raises(ResumeStateError, match="refill"):
        plain.check({"config": {"refill": True}})
    _, refill = _chain(svc, refill=True)
    with pytest.raises(ResumeStateError, match="refill"):
        refill.check({"config": {}})
    with pytest.raises(ResumeStateError, match="counts"):
        refill.load_state_dict({"batches_seen": 1, "counts": [1]})


@given(
    threshold=st.integers(0, 4),
    batch_size=st.integers(1, 9),
    stop=st.integers(0, 30),
    refill=st.booleans(),
)
def test_the_composed_stream_resumes_exactly_from_any_point(
    threshold: int, batch_size: int, stop: int, refill: bool
) -> None:
    def keep(t: pa.Table) -> Any:
        return t["x"].to_numpy() % 5 >= threshold

    svc = BatchService(
        SOURCE,
        batch_size=batch_size,
        seed=3,
        collate="arrow",
        batching=Batching(filter=keep, window=2),
    )
    total = svc.num_batches(0)

    def rows(b: Any) -> list[int]:  # refill collates to lists; the built batches are tables
        return b if isinstance(b, list) else b["x"].to_pylist()

    _, full = _chain(svc, refill=refill)
    full.begin(total)
    everything = [rows(b) for b in full]
    _, head = _chain(svc, refill=refill)
    head.begin(total)
    taken = [rows(b) for _, b in zip(range(stop), head, strict=False)]
    state = json.loads(json.dumps(head.state_dict()))
    _, tail = _chain(svc, refill=refill)
    tail.load_state_dict(state)
    tail.begin(total)
    assert taken + [rows(b) for b in tail] == everything
    if refill:  # full batches but the last
        assert all(len(b) == batch_size for b in everything[:-1])
    assert sorted(x for b in everything for x in b) == [x for x in range(40) if x % 5 >= threshold]


def test_a_loader_pickles_with_its_stages_bound_to_the_copy() -> None:
    """Positions calls the Loader's build weakly (no cycle); a pickled Loader's copy builds
    through its own stages, and its batches are the original's."""
    src = TableSource(pa.table({"x": list(range(40))}), shard_size=7)
    loader = Loader(src, 6, seed=4)
    first = [b["x"].tolist() for b in loader]
    copy = pickle.loads(pickle.dumps(Loader(src, 6, seed=4)))
    assert isinstance(copy._positions._build, WeakMethod)
    assert [b["x"].tolist() for b in copy] == first
    call = copy._positions._build
    del copy
    with pytest.raises(ReferenceError):
        call(range(1))
