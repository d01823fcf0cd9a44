"""IterationState's bulk changes (journal replay, rewind, rollback): vectorised, the same result as
the per-unit loops they replaced."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import DONE, PENDING


def _per_unit_done(it: Iteration, units: list[int]) -> None:
    """The former ``mark_done``: a Python step per unit."""
    for u in units:
        q = int(it.queue_of[u])
        if q >= 0:
            it.state[q][it.pos_of[u]] = DONE
    it._recount()


def _per_unit_rollback(it: Iteration, units: list[int]) -> None:
    """The former ``rollback``'s loop (its leases aside)."""
    for u in units:
        q = int(it.queue_of[u])
        if q >= 0 and it.state[q][it.pos_of[u]] == DONE:
            it.state[q][it.pos_of[u]] = PENDING
    it._recount()


def _pair(
    batches: list[int], mode: str, world: int, base: list[int], seed: int
) -> tuple[Iteration, Iteration]:
    """Two equal iterations, each position in a random state."""
    made = []
    for _ in range(2):
        it = Iteration("i", batches, mode=mode, world_size=world, base_done=base, boot="b")
        rng = np.random.default_rng(seed)
        for st_ in it.state:
            st_[:] = rng.integers(0, 4, size=len(st_))
        made.append(it)
    return made[0], made[1]


@st.composite
def _iterations(draw: st.DrawFn) -> tuple[list[int], str, int, list[int]]:
    mode = draw(st.sampled_from(["static", "dynamic"]))
    world = draw(st.integers(1, 4)) if mode == "static" else 1
    per_rank = draw(st.booleans())  # one count per rank, or one count split over the ranks
    batches = draw(st.lists(st.integers(0, 40), min_size=world if per_rank else 1, max_size=world))
    if not per_rank:
        batches = [sum(batches)]
    total = sum(batches)
    base = draw(st.lists(st.integers(0, max(0, total - 1)), max_size=12)) if total else []
    return batches, mode, world, base


@given(made=_iterations(), picks=st.lists(st.integers(0, 10**6), max_size=80), seed=st.integers())
def test_mark_done_and_rollback_equal_the_per_unit_loops(
    made: tuple[list[int], str, int, list[int]], picks: list[int], seed: int
) -> None:
    batches, mode, world, base = made
    total = sum(batches)
    # random units, duplicates included, and every unit of the resume base (in no queue: -1)
    units = [p % total for p in picks] + base if total else []
    fast, slow = _pair(batches, mode, world, base, seed % 2**32)
    assert all(int(fast.queue_of[u]) == -1 for u in base)
    fast.mark_done(np.asarray(units, dtype=np.int64))
    _per_unit_done(slow, units)
    for a, b in zip(fast.state, slow.state, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fast._done_n == slow._done_n
    back = units[::2]
    fast.rollback("s" * 32, back)
    _per_unit_rollback(slow, back)
    for a, b in zip(fast.state, slow.state, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fast._done_n == slow._done_n


def test_a_replay_marks_the_journaled_runs_done_and_a_list_or_generator_the_same() -> None:
    it = Iteration("i", [5, 5], world_size=2, boot="b")
    it.mark_done(np.asarray([1, 2, 6, 7]))
    assert [s.tolist() for s in it.state] == [[0, 2, 2, 0, 0], [0, 2, 2, 0, 0]]
    again = Iteration("i", [5, 5], world_size=2, boot="b")
    again.mark_done(u for u in [1, 2, 6, 7])
    assert [s.tolist() for s in again.state] == [s.tolist() for s in it.state]
    assert it._done_n == [2, 2]
