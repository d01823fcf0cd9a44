"""One lease round trip as transitions of the pure state machine
(:mod:`~datamill.serve.protocol.iteration`): decide, then apply or undo; the journal records
returned as data.

The driver (:class:`datamill.serve.server.ServeState`) runs a ``/next`` (or ``/ack``) in three
steps:

1. **Decide** (:func:`plan`, under the driver's lock, microseconds): check the acks and reserve
   their positions (``ACKING``: no expiry, revocation or take hands them out again), take the next
   lease, and return the **records** to append (:class:`Records`: leases added and dropped, unit
   runs done). The driver queues them as **one** journal write while it still holds the lock, so the
   journal applies writes in the order the state changed.
2. **Wait** for the write's transaction to commit, without the lock: the writes of the requests that
   arrive meanwhile share the next transaction (one fsync for many round trips).
3. **Apply** (:func:`finish`, under the lock): the acknowledged positions become done; or, when the
   write failed (a full disk: HTTP 503), **undo**: the positions are leased again and the taken
   lease is forgotten, so nothing the client was not told is kept, in the journal or in memory.

A unit is answered ``"ok"`` only once its ``done`` row is durable, and a lease is handed out only
once its row is durable (so after a server kill -9 its holder reclaims it). A second request
acknowledging positions whose first acknowledgement is still in flight gets ``None`` from
:func:`plan` and plans again once that one settled: ``"already"`` is only ever answered for
journaled acks.

Examples:
    >>> from datamill.serve.protocol.iteration import Iteration
    >>> it = Iteration("i", [4], lease_size=2, boot="b")
    >>> p = plan(it, [], session="s", take=Take("c", session="s"), now=0.0)
    >>> p.records.add[0].id == p.lease.id, p.records.done
    (True, {})
    >>> finish(it, p, ok=True, now=0.1).latencies  # its write committed: the lease is handed out
    []
    >>> q = plan(it, [(p.lease.id, p.lease.fence, None, None)], session=p.lease.session, now=1.0)
    >>> s = finish(it, q, ok=True, now=1.5)
    >>> q.statuses, q.records.done, s.latencies, s.ended
    ({...: 'ok'}, {...: [(0, 2)]}, [1.5], False)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import Lease

__all__ = ["AckItem", "Planned", "Records", "Settled", "Take", "finish", "plan"]

AckItem = tuple[str, str, int | None, int | None]
"""An acknowledgement ``(lease id, fence, start, stop)``: positions of the lease (``None``: all of
it)."""


@dataclass
class Records:
    """The journal records of one transition: leases added, lease ids dropped (finished, revoked or
    expired), unit runs done per lease id."""

    add: list[Lease] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    done: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


@dataclass
class Take:
    """A take of the next lease (:meth:`Iteration.take`'s arguments, as data)."""

    client: str
    rank: int = 0
    slot: int = 0
    slots: int = 1
    session: str | None = None
    owner: str = ""
    drain_s: float | None = None


@dataclass
class Settled:
    """What applying (or undoing) a round trip did: the finished leases' ack latencies (seconds
    since their issue), the leases that timed out meanwhile, whether the iteration ended."""

    latencies: list[float] = field(default_factory=list)
    timed_out: list[Lease] = field(default_factory=list)
    ended: bool = False


@dataclass
class Planned:
    """What step 1 decided for one request: ack statuses, reserved ranges, the records to append."""

    statuses: dict[str, str] = field(default_factory=dict)
    marks: list[tuple[Lease, int, int]] = field(default_factory=list)
    finishing: list[str] = field(default_factory=list)
    issued: list[float] = field(default_factory=list)  # issue times of the leases finishing
    lease: Lease | None = None
    reissued: int = 0  # batches of the lease an earlier lease held
    dropped: list[str] = field(default_factory=list)
    records: Records | None = None  # None: nothing to journal

    @property
    def units(self) -> dict[str, list[tuple[int, int]]]:
        """The unit runs each acknowledged lease newly completes."""
        return self.records.done if self.records is not None else {}


def plan(
    it: Iteration,
    items: Sequence[AckItem],
    *,
    session: str,
    take: Take | None = None,
    now: float,
) -> Planned | None:
    """Step 1 at time ``now``: plan and reserve the acks of session hash ``session``, take a lease
    (``take``); the records to journal.

    ``None`` (nothing changed) when another request's acknowledgement of some of these positions is
    in flight: plan again once it settled.
    """
    p = Planned()
    p.statuses, p.marks = it.plan_acks(items, session=session, now=now)
    if p.marks and it.in_flight(p.marks):
        return None
    done: dict[str, list[tuple[int, int]]] = {}
    if p.marks:
        done = it.units_of_marks(p.marks)
        p.finishing = it.finishing(p.marks)
        p.issued = [it.leases[x].issued for x in p.finishing if x in it.leases]
        it.begin_acks(p.marks, now=now)
    if take is not None:
        before = it.redelivered
        p.lease = it.take(**vars(take), now=now)  # its fields are take's keyword arguments
        p.reissued = it.redelivered - before
        p.dropped = it.take_dropped()
    drop = p.finishing + p.dropped
    if p.marks or drop or p.lease is not None:
        p.records = Records([p.lease] if p.lease is not None else [], drop, done)
    return p


def finish(it: Iteration, p: Planned, *, ok: bool, now: float) -> Settled:
    """Step 3 at time ``now``: apply the committed records (``ok``), or undo everything the plan
    changed (the write failed); what it did, for the driver's telemetry."""
    s = Settled()
    if not ok:
        it.undo_acks(p.marks)
        it.dropped.extend(p.dropped)
        if p.lease is not None:
            it.untake(p.lease)
    elif p.marks:
        it.apply_acks(p.marks, now=now)
        s.latencies = [now - t for t in p.issued]
        s.ended = it.finished_all()
    s.timed_out = it.take_timed_out()
    return s
