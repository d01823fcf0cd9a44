"""One lease round trip without HTTP: acknowledge, take, journal, apply; the lock held only for
memory.

A ``/next`` (or ``/ack``) request runs in three steps:

1. **Decide** under the iteration's lock (in memory, microseconds): check the acks and reserve their
   positions (:meth:`~datamill.serve.protocol.iteration.Iteration.begin_acks`: ``ACKING``, so no
   expiry,
   revocation or take hands them out again), take the next lease, and queue **one** journal write
   holding both (:class:`~datamill.serve.journal.leases.GroupCommit`; queued under the lock, so the
   journal applies writes in the order memory changed).
2. **Wait** for the write's transaction to commit, *without* the lock: the writes of the requests
   that arrive meanwhile share the next transaction (one fsync for many round trips).
3. **Apply** under the lock: the acknowledged positions become done; or, when the write failed (a
   full disk: HTTP 503), **undo**: the positions are leased again and the taken lease is forgotten,
   so nothing the client was not told is kept, in the journal or in memory.

A unit is answered ``"ok"`` only once its ``done`` row is durable, and a lease is handed out only
once its row is durable (so after a server kill -9 its holder reclaims it). A second request
acknowledging positions whose first acknowledgement is still in flight waits for it, then answers
from the outcome: ``"already"`` is only ever answered for journaled acks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from datamill.serve.journal.leases import GroupCommit, Write, leases_write
from datamill.serve.protocol.iteration import Iteration, Lease

__all__ = [
    "AckItem",
    "Planned",
    "finish",
    "plan",
    "plan_async",
    "settle_async",
]

AckItem = tuple[str, str, int | None, int | None]
"""An acknowledgement ``(lease id, fence, start, stop)``: positions of the lease (``None``: all of
it)."""

_POLL_S = 0.002  # how often an event loop's planner re-checks


@dataclass
class Planned:
    """What step 1 decided for one request: ack statuses, reserved ranges, the journal rows."""

    statuses: dict[str, str] = field(default_factory=dict)
    marks: list[tuple[Lease, int, int]] = field(default_factory=list)
    units: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    finishing: list[str] = field(default_factory=list)
    issued: list[float] = field(default_factory=list)  # issue times of the leases finishing
    lease: Lease | None = None
    reissued: int = 0  # batches of the lease an earlier lease held
    dropped: list[str] = field(default_factory=list)
    write: Write | None = None


def plan(
    it: Iteration,
    writes: GroupCommit,
    items: Sequence[AckItem],
    *,
    session: str,
    take: Callable[[], Lease | None] | None = None,
) -> Planned | None:
    """Step 1 (takes the iteration's lock): plan and reserve the acks of session hash ``session``,
    take a lease with ``take`` (a call of :meth:`Iteration.take`), queue their journal write.

    ``None`` (nothing changed) when another request's acknowledgement of some of these positions is
    in flight: plan again once it settled (:func:`plan_async`).
    """
    p = Planned()
    with it.lock:
        p.statuses, p.marks = it.plan_acks(items, session=session)
        if p.marks and it.in_flight(p.marks):
            return None
        if p.marks:
            p.units = it.units_of_marks(p.marks)
            p.finishing = it.finishing(p.marks)
            p.issued = [it.leases[x].issued for x in p.finishing if x in it.leases]
            it.begin_acks(p.marks)
        if take is not None:
            before = it.redelivered
            p.lease = take()
            p.reissued = it.redelivered - before
            p.dropped = it.take_dropped()
        drop = p.finishing + p.dropped
        if p.marks or drop or p.lease is not None:
            p.write = writes.submit(
                leases_write(
                    it.id,
                    add=[p.lease] if p.lease is not None else [],
                    drop=drop,
                    done=p.units,
                )
            )
    return p


async def plan_async(
    it: Iteration,
    writes: GroupCommit,
    items: Sequence[AckItem],
    *,
    session: str,
    take: Callable[[], Lease | None] | None = None,
) -> Planned:
    """:func:`plan` in an event loop (waiting without blocking it)."""
    while True:
        p = plan(it, writes, items, session=session, take=take)
        if p is not None:
            return p
        await asyncio.sleep(_POLL_S)


async def settle_async(it: Iteration, writes: GroupCommit, p: Planned) -> list[float]:
    """Steps 2 and 3: wait for the write (in the event loop), then :func:`finish`. A request
    served in a thread runs this in a loop of its own: there is one code path, not a twin per
    caller."""
    error = None
    if p.write is not None:
        try:
            await writes.wait_async(p.write)
        except Exception as exc:  # noqa: BLE001 - undone, then raised by finish
            error = exc
    return finish(it, p, error)


def finish(it: Iteration, p: Planned, error: BaseException | None) -> list[float]:
    """Step 3: apply the committed write; or undo everything when it failed, and raise ``error``.

    Returns the finished leases' ack latencies (seconds since their issue).

    Raises:
        UnavailableError: the journal could not be written (nothing of this request was kept).
    """
    if error is not None:
        with it.lock:
            it.undo_acks(p.marks)
            it.dropped.extend(p.dropped)
            if p.lease is not None:
                it.untake(p.lease)
        raise error
    if not p.marks:
        return []
    with it.lock:
        it.apply_acks(p.marks)
    now = time.monotonic()
    return [now - t for t in p.issued]
