"""Issue #37's rewind race, deterministic: a ``{rank, consumed}`` resume of one rank must not erase
another rank's acknowledgement that is journaled but not yet applied in memory.

On 4f4bf47 (the main of the time) this test fails: ``Server.rewind`` rewrote the iteration's whole
done record from a memory snapshot (``DELETE FROM done WHERE iteration=?`` and a re-insert), so rank
1's acknowledgement, committed in the same transaction just before the rewind, was deleted; memory
hid it until the restart, after which rank 1's batches were served again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from datamill.serve.server import ServeState
from tests.serve._trips import ack_batches, next_lease

pytestmark = pytest.mark.server


def _until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _acking(it: Any) -> bool:
    """Whether an acknowledgement of some position awaits its journal write."""
    return any(bool((st == 3).any()) for st in it.state)


def test_a_rank_resume_keeps_other_ranks_acks_in_flight_across_a_restart(
    server: dict[str, Any], tmp_path: Path
) -> None:
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        state.register("ds", name="ds")
        req = {"dataset": "ds", "batch_size": 100, "world_size": 2, "lease_size": 2, "name": "r"}
        it = state.iteration(state.create_iteration(req)["id"])
        p0 = next_lease(state, it, "c0", rank=0)
        p1 = next_lease(state, it, "c1", rank=1)
        assert p0 is not None and p1 is not None
        ack_batches(state, it, [(p0.lease.id, p0.lease.fence, None, None)], client="c0")
        answers: list[Any] = []
        with state.journal._lock:  # the disk is busy: both writes queue, the ack's first
            ack = threading.Thread(
                target=lambda: answers.append(
                    ack_batches(state, it, [(p1.lease.id, p1.lease.fence, None, None)], client="c1")
                )
            )
            ack.start()
            _until(
                lambda: (
                    state.progress(it)["leased"] == len(p1.units)
                    and not it.leases.get(p1.lease.id) is None
                    and _acking(it)
                ),
                "rank 1's ack was never planned",
            )
            rewind = threading.Thread(
                target=lambda: answers.append(
                    asyncio.run(state.rewind(it, {"rank": 0, "consumed": 1}))
                )
            )
            rewind.start()
            # the rewind's write is queued under the iteration's lock, right after its memory change
            _until(lambda: state.progress(it)["done"] == 1, "the rewind never ran")
            with state.lock(it):
                pass
        ack.join(timeout=60)
        rewind.join(timeout=60)
        assert len(answers) == 2
        rank1 = set(p1.units)
        journaled = {u for a, b, _ in state.journal.done(it.id) for u in range(a, b)}
        assert rank1 <= journaled, "the rewind erased rank 1's acknowledgement from the journal"
        before = state.progress(it)
    finally:
        state.close()
    again = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)  # a restart
    try:
        replayed = again.iteration("r")
        after = again.progress(replayed)
        assert after["done"] == before["done"] == 1 + len(rank1)
        assert [q["done"] for q in after["queues"]] == [q["done"] for q in before["queues"]]
        nxt = next_lease(again, replayed, "c1b", rank=1)  # rank 1 resumes after its ack
        assert nxt is not None and not set(nxt.units) & rank1
    finally:
        again.close()
