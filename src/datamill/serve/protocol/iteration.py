"""One iteration's work and its leases: the lease protocol's **pure state machine** (a reducer).

Every transition takes its event's time as data (``now``, the driver's monotonic clock), changes
the state in place and returns the journal records it implies (:func:`plan`) or leaves them in
:attr:`Iteration.dropped` / :attr:`Iteration.timed_out`. Nothing here reads a clock, takes a lock,
starts a thread, touches SQLite or knows HTTP (the one input not passed in is a new lease's random
fence): the driver, :class:`datamill.serve.server.ServeState`, does.

The contract these transitions keep (units and queues, leases bound to a session and a fence, the
grace after a restart, acks answered only once journaled) is ``docs/serving-delivery.md``. A round
trip (a ``/next`` or ``/ack``) is :func:`plan` under the driver's lock (check and reserve the acks,
take a lease: the reply and the **records** to append as one journal write), the write awaited
without the lock, then :func:`finish` with its outcome (applied, or everything the plan changed
undone). :func:`plan` returns ``None`` while another request's acknowledgement of the same
positions is in flight: plan again once it settled.

Examples:
    >>> it = Iteration("i", [4], lease_size=2, boot="b")
    >>> p = plan(it, [], session="s", take=Take("c", session="s"), now=0.0)
    >>> p.records.add[0].id == p.lease.id, p.records.done, p.runs
    (True, {}, [(0, 0, 2)])
    >>> finish(it, p, ok=True, now=0.1).latencies  # its write committed: the lease is handed out
    []
    >>> q = plan(it, [(p.lease.id, p.lease.fence, None, None)], session=p.lease.session, now=1.0)
    >>> s = finish(it, q, ok=True, now=1.5)
    >>> q.statuses, q.records.done, s.latencies, s.ended
    ({...: 'ok'}, {...: [(0, 2)]}, [1.5], False)
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from datamill.core.ragged import runs
from datamill.serve.protocol.state import (
    _LEASE_NUMBERS,
    _LEASE_PREFIX,
    ACKING,
    DONE,
    LEASED,
    PENDING,
    RATE_WINDOW_S,
    AckItem,
    ClientInfo,
    IterationState,
    Lease,
    Planned,
    Records,
    Settled,
    Take,
    as_units,
    digest,
    session_digest,
)

__all__ = ["DRAIN_FIRST_LEASE", "Iteration", "drain_cap", "finish", "plan"]

_BYTE = {v: bytes([v]) for v in (PENDING, LEASED, DONE, ACKING)}


def _has(seg: NDArray[np.int8], value: int) -> bool:
    """Whether a lease's few positions hold ``value`` (bytes: no numpy call on the lease path)."""
    return _BYTE[value] in seg.tobytes()


def _every(seg: NDArray[np.int8], value: int) -> bool:
    """Whether every position of a lease's few holds ``value``."""
    raw = seg.tobytes()
    return raw.count(_BYTE[value]) == len(raw)


DRAIN_FIRST_LEASE = 16
"""Batches of a client's leases until its acks give a rate (see :func:`drain_cap`)."""


def drain_cap(
    acked: Sequence[tuple[float, int]], now: float, drain_s: float, need: int = 1 << 62
) -> int:
    """Batches a client consumes in a third of ``drain_s`` at its rate over the last
    :data:`RATE_WINDOW_S` (its ``(time, batches)`` acks, oldest first); :data:`DRAIN_FIRST_LEASE`
    before any ack; ``need`` as soon as the newest acks show the cap would not bind (a fast client
    costs a few steps, not a pass over its window). A third: a client may hold a lease per worker
    slot and one more in prefetch.

    Examples:
        >>> drain_cap([], 100.0, 30.0)
        16
        >>> drain_cap([(91.0, 5), (95.0, 20), (99.0, 20)], 100.0, 30.0)  # 4.5 batches/s
        45
    """
    enough = need * 3 * (RATE_WINDOW_S + 1.0) / max(drain_s, 1e-9)
    total, first = 0, None
    for t, n in reversed(acked):  # newest first
        if t < now - RATE_WINDOW_S:
            break
        total, first = total + n, t
        if total >= enough:
            return need
    if first is None:
        return DRAIN_FIRST_LEASE
    rate = total / max(1.0, min(RATE_WINDOW_S, now - first) + 1.0)
    return max(1, min(need, int(rate * drain_s / 3)))


class Iteration(IterationState):
    """Queues, leases and the done set of one iteration: the state the transitions change (not
    thread-safe: the driver serialises them).

    Args:
        id: the iteration id.
        rank_batches: batches of each plan rank (``len`` is the plan's world size).
        mode: ``"static"`` or ``"dynamic"``.
        world_size: ranks served (static mode).
        base_done: units already done when the iteration was created (elastic resumption).
        lease_size: batches per lease.
        lease_timeout: seconds a lease lives without a heartbeat.
        boot: this server run's id.

    Examples:
        >>> it = Iteration("i", [3, 3], mode="static", world_size=2, lease_size=2, boot="b")
        >>> lease = it.take("c0", rank=0, now=0.0)
        >>> (lease.start, lease.stop), it.units_of(lease)
        ((0, 2), [0, 1])
        >>> def ack(fence, session):  # checked, then applied (no journal here)
        ...     item = [(lease.id, fence, None, None)]
        ...     statuses, marks = it.plan_acks(item, session=session, now=1.0)
        ...     it.begin_acks(marks, now=1.0); it.apply_acks(marks, now=1.0)
        ...     return statuses[lease.id]
        >>> held = lease.session
        >>> ack("forged", held), ack(lease.fence, digest("c1")), ack(lease.fence, held)
        ('refused', 'refused', 'ok')
        >>> ack(lease.fence, held)  # idempotent
        'already'
    """

    def untake(self, lease: Lease) -> None:
        """Undo :meth:`take` of a lease whose journal write failed (its positions pending again;
        the journal never had it, so it is not :attr:`dropped`)."""
        if lease.id in self.leases:
            self._revoke(lease)
            self.dropped.pop()

    def expire(self, now: float) -> int:
        """Return expired leases' positions to their queue (they join :attr:`timed_out`); the
        number of leases expired."""
        dead = [lease for lease in self.leases.values() if lease.deadline < now]
        for lease in dead:
            self._revoke(lease)
        live = [lease.deadline for lease in self.leases.values()]
        self._earliest = min(live, default=float("inf"))
        self.expired += len(dead)
        self.timed_out.extend(dead)
        return len(dead)

    def session_closed(self, session: str, *, now: float, within: float) -> int:
        """Every connection of session hash ``session`` was closed by its peer (a process that
        exits or is killed closes them): its leases end ``within`` seconds from ``now``, and no
        request already in flight extends them past that, unless the session opens a connection
        again meanwhile (:meth:`session_opened`: it is alive). The number of leases shortened.

        Safe for delivery: the holder yields a batch only once the previous one's acknowledgement
        was answered, so a live holder wrongly thought dead repeats at most the batch in doubt.
        """
        self.closed[session] = now + within
        n = 0
        for lease in self.leases.values():
            if lease.session == session and lease.deadline > now + within:
                lease.deadline = now + within
                self._earliest = min(self._earliest, lease.deadline)
                n += 1
        return n

    def session_opened(self, session: str) -> None:
        """Session hash ``session`` opened a connection after :meth:`session_closed`: its requests
        extend its leases again."""
        self.closed.pop(session, None)

    def take_dropped(self) -> list[str]:
        """Ids of the leases revoked or expired since the last call (the journal forgets them)."""
        out, self.dropped = self.dropped, []
        return out

    def take_timed_out(self) -> list[Lease]:
        """The leases that timed out since the last call (the driver's telemetry logs them)."""
        out, self.timed_out = self.timed_out, []
        return out

    def cancel(self) -> None:
        """Stop handing out leases (live ones are revoked; their acks are refused as expired)."""
        self.cancelled = True
        for lease in list(self.leases.values()):
            self._revoke(lease)

    def touch(self, client: str, *, rank: int, slot: int = 0, now: float) -> ClientInfo:
        """Register or refresh a client."""
        info = self.clients.get(client)
        if info is None:
            info = self.clients[client] = ClientInfo(rank=rank, slot=slot, last_seen=now)
        info.last_seen, info.rank, info.slot = now, rank, slot
        return info

    def delivered(self, lease: Lease, *, now: float) -> bool:
        """A lease built for its holder was handed over at ``now``: its clock starts then, not
        before a (slow) build. ``False`` when it expired meanwhile (its batches are back in the
        queue)."""
        live = self.leases.get(lease.id) is lease
        if live:
            self._extend(lease, now)
        return live

    # ------------------------------------------------------------------ leases
    def take(
        self,
        client: str,
        *,
        rank: int = 0,
        slot: int = 0,
        slots: int = 1,
        session: str | None = None,
        owner: str = "",
        drain_s: float | None = None,
        now: float,
    ) -> Lease | None:
        """The next lease for ``client`` of session ``session`` (a secret; defaults to ``client``),
        or ``None`` when nothing is pending (see :meth:`finished`).

        ``drain_s``: size the lease for a drain of that many seconds (:func:`drain_cap`: at most
        what the client consumes in a third of it at its recent rate), so that a SIGTERM's drain
        ends with every lease acknowledged rather than in a timeout.

        In static mode a client that is new for ``(rank, slot)`` takes over the leases other clients
        of the same ``owner`` (API key) hold there (not those restored after a restart and not yet
        reclaimed): a replacement process first gets the dead one's batches not yet acknowledged.
        """
        if self.cancelled:
            return None
        if now >= self._earliest:  # else no deadline can have passed: no pass over the leases
            self.expire(now)
        q = 0 if self.mode == "dynamic" else rank
        info = self.touch(client, rank=rank, slot=slot, now=now)
        if self.mode == "static":
            self._take_over(q, client, slot, owner)
        st = self.state[q]
        first = self._first_pending(q, slot, slots)
        if first is None:
            return None
        start = first
        limit = min((start // self.lease_size + 1) * self.lease_size, len(st))
        if drain_s is not None:
            limit = min(limit, start + drain_cap(info.acked, now, drain_s, limit - start))
        raw = st[start:limit].tobytes()  # PENDING is 0: the lease stops at the first other
        stop = start + len(raw) - len(raw.lstrip(_BYTE[PENDING]))
        st[start:stop] = LEASED
        self._low[(q, slots, slot)] = stop
        if _has(self._ever[q][start:stop].view(np.int8), 1):
            self.reissued += 1
            self.redelivered += int(self._ever[q][start:stop].sum())
        self._ever[q][start:stop] = True
        fence = secrets.token_hex(16)
        lease = Lease(
            f"{_LEASE_PREFIX}{next(_LEASE_NUMBERS):x}",
            fence,
            q,
            start,
            stop,
            client,
            now + self.lease_timeout + self.grace,
            now,
            fence_hash=digest(fence),
            session=session_digest(client if session is None else session),
            slot=slot,
            owner=owner,
        )
        cap = self.closed.get(lease.session)  # a take in flight when its session closed
        if cap is not None:
            lease.deadline = min(lease.deadline, cap)
        self.leases[lease.id] = lease
        self._earliest = min(self._earliest, lease.deadline)
        return lease

    def _take_over(self, q: int, client: str, slot: int, owner: str) -> None:
        """A static client new for ``(queue q, slot)``: revoke the leases other clients of the same
        ``owner`` hold there (reclaimed ones: not those restored and awaiting their holder)."""
        for lease in list(self.leases.values()):
            if (
                lease.queue == q
                and lease.client != client
                and lease.slot == slot
                and lease.reclaimed
                and lease.owner == owner
            ):
                self._revoke(lease)

    def restore(self, lease: Lease, *, now: float, grace: float | None = None) -> None:
        """Hold a journaled lease of an earlier server run for ``grace`` seconds (the lease timeout)
        from ``now`` until its holder reclaims it; its positions already done stay done."""
        st = self.state[lease.queue]
        seg = st[lease.start : lease.stop]
        if not (seg == PENDING).any():
            self.dropped.append(lease.id)  # nothing left to hold: forget it
            return
        seg[seg == PENDING] = LEASED
        self._ever[lease.queue][lease.start : lease.stop] = True
        hold = self.lease_timeout + self.grace if grace is None else grace
        lease.deadline = now + hold
        lease.reclaimed = False
        self.leases[lease.id] = lease
        self._earliest = min(self._earliest, lease.deadline)

    def _check(
        self, lease_id: str, fence: str, session: str, now: float
    ) -> tuple[str, Lease | None]:
        lease = self.leases.get(lease_id)
        if lease is None or lease.deadline < now:
            return ("already" if lease_id in self.acked else "expired"), None
        if not (
            hmac.compare_digest(lease.session, session)
            and hmac.compare_digest(lease.fence_hash, digest(str(fence)))
        ):
            self.fenced += 1
            return "refused", None
        return "ok", lease

    def plan_acks(
        self, items: Sequence[tuple[str, str, int | None, int | None]], *, session: str, now: float
    ) -> tuple[dict[str, str], list[tuple[Lease, int, int]]]:
        """Check acks ``(lease, fence, start, stop)`` (positions of the lease; ``None``: all of it)
        of session ``session`` (a hash) without changing anything: ``(status per lease, ranges to
        mark)``.

        Unless :meth:`in_flight` (then the driver plans again once the other request settled),
        :meth:`begin_acks`, journal the units of the ranges, then :meth:`apply_acks` (or
        :meth:`undo_acks` when the journal write failed).
        """
        statuses: dict[str, str] = {}
        marks: list[tuple[Lease, int, int]] = []
        for lease_id, fence, a, b in items:
            status, lease = self._check(lease_id, fence, session, now)
            if lease is not None and not (
                (a is None or lease.start <= a) and (b is None or b <= lease.stop)
            ):
                status, lease = "outside", None  # positions of another lease: nothing recorded
            if lease is not None:
                lo = lease.start if a is None else max(lease.start, int(a))
                hi = lease.stop if b is None else min(lease.stop, int(b))
                if hi > lo and not _every(self.state[lease.queue][lo:hi], DONE):
                    marks.append((lease, lo, hi))
                else:
                    status = "already"
            prev = statuses.get(lease_id)
            statuses[lease_id] = (
                status
                if prev in (None, "already") or status in ("refused", "expired", "outside")
                else prev
            )
        return statuses, marks

    def units_of_marks(
        self, marks: Sequence[tuple[Lease, int, int]]
    ) -> dict[str, list[tuple[int, int]]]:
        """The unit runs each lease's ranges newly complete (what the journal records)."""
        out: dict[str, list[NDArray[np.int64]]] = {}
        for lease, lo, hi in marks:
            q, seg = self.queues[lease.queue][lo:hi], self.state[lease.queue][lo:hi]
            out.setdefault(lease.id, []).append(q[seg != DONE] if _has(seg, DONE) else q)
        return {k: runs(v[0] if len(v) == 1 else np.concatenate(v)) for k, v in out.items()}

    def finishing(self, marks: Sequence[tuple[Lease, int, int]]) -> list[str]:
        """Ids of the leases whose every position is done once ``marks`` are applied."""
        hit: dict[str, Lease] = {lease.id: lease for lease, _, _ in marks}
        out = []
        for lease in hit.values():
            seg = self.state[lease.queue][lease.start : lease.stop].copy()
            for x, lo, hi in marks:
                if x.id == lease.id:
                    seg[lo - lease.start : hi - lease.start] = DONE
            if _every(seg, DONE):
                out.append(lease.id)
        return out

    def in_flight(self, marks: Sequence[tuple[Lease, int, int]]) -> bool:
        """Whether another request's acknowledgement of some of these ranges awaits its journal
        write."""
        return any(_has(self.state[x.queue][lo:hi], ACKING) for x, lo, hi in marks)

    def begin_acks(self, marks: Sequence[tuple[Lease, int, int]], *, now: float) -> None:
        """Reserve the planned ranges while their journal write is in flight (``ACKING``: no expiry,
        revocation or take hands them out again); the holder's ack keeps its leases alive."""
        for lease, lo, hi in marks:
            seg = self.state[lease.queue][lo:hi]
            seg[seg == LEASED] = ACKING
            self._extend(lease, now)

    def undo_acks(self, marks: Sequence[tuple[Lease, int, int]]) -> None:
        """The journal write of :meth:`begin_acks`'s ranges failed: leased again (pending when their
        lease was revoked meanwhile)."""
        for lease, lo, hi in marks:
            seg = self.state[lease.queue][lo:hi]
            live = self.leases.get(lease.id) is lease
            seg[seg == ACKING] = LEASED if live else PENDING
            if not live:
                self._pending_again(lease.queue, lo)

    def apply_acks(self, marks: Sequence[tuple[Lease, int, int]], *, now: float) -> None:
        """Mark journaled ranges (reserved by :meth:`begin_acks`) done; a lease with every position
        done is finished. A range a rewind changed meanwhile keeps the rewind's state."""
        for lease, lo, hi in marks:
            st = self.state[lease.queue]
            seg = st[lo:hi]
            hit = seg == ACKING
            n = int(hit.sum())
            seg[hit] = DONE
            self._done_n[lease.queue] += n
            self._extend(lease, now)
            lease.reclaimed = True
            self._rate.append((now, n))
            info = self.clients.get(lease.client)
            if info is not None:
                info.acked.append((now, n))
            if _every(st[lease.start : lease.stop], DONE):
                self.leases.pop(lease.id, None)
                self.acked.add(lease.id)

    def heartbeat(
        self,
        client: str,
        *,
        leases: Sequence[tuple[str, str]] = (),
        session: str | None = None,
        stall_s: float | None = None,
        batches: int | None = None,
        now: float,
    ) -> dict[str, list[str]]:
        """Extend (and reclaim, after a restart) ``client``'s leases ``(id, fence)``.

        Returns ``{"lost": ids no longer live, "refused": ids of another session or with a wrong
        fence}``.
        """
        info = self.clients.get(client)
        if info is not None:
            info.last_seen = now
            if stall_s is not None:
                info.stall_s = float(stall_s)
            if batches is not None:
                info.batches = int(batches)
        sess = digest(client if session is None else session)
        out: dict[str, list[str]] = {"lost": [], "refused": []}
        for lid, fence in leases:
            status, lease = self._check(lid, fence, sess, now)
            if lease is not None:
                self._extend(lease, now)
                lease.reclaimed = True
            elif status == "refused":
                out["refused"].append(lid)
            elif status == "expired":
                out["lost"].append(lid)
        return out

    def rewind(
        self,
        *,
        rank: int | None = None,
        consumed: int | None = None,
        done: Iterable[int] | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Set the done set from a client checkpoint; every live lease of the affected queues is
        revoked. Returns the rewind's record ``(drop, keep)``: the units set pending, then the
        units set done (the resume base is the config's, not the journal's: never in ``keep``).

        ``rank`` + ``consumed``: queue ``rank``'s first ``consumed`` positions are done, the rest
        pending. ``done``: the whole iteration's done units (those out of range ignored).
        """
        if done is not None:
            given = as_units(done)
            keep = given[(given >= 0) & (given < self.total)]
            for lease in list(self.leases.values()):
                self._revoke(lease)
            for st in self.state:
                st[:] = PENDING
            self.mark_done(keep)
            return np.arange(self.total, dtype=np.int64), keep[self.queue_of[keep] >= 0]
        assert rank is not None and consumed is not None
        for lease in [x for x in self.leases.values() if x.queue == rank]:
            self._revoke(lease)
        st = self.state[rank]
        st[:] = PENDING
        st[:consumed] = DONE
        self._recount()  # an ack in flight over these keeps the rewind's state
        return self.queues[rank], self.queues[rank][:consumed]

    def rollback(self, session: str, units: Sequence[int]) -> None:
        """A client of session hash ``session`` restored a checkpoint: ``units`` (done after it) are
        pending again and the session's live leases are revoked; nobody else's lease changes."""
        for lease in [x for x in self.leases.values() if x.session == session]:
            self._revoke(lease)
        for st, hit in zip(self.state, self.positions_of(units), strict=True):
            st[hit & (st == DONE)] = PENDING
        self._recount()


def plan(
    it: Iteration,
    items: Sequence[AckItem],
    *,
    session: str,
    take: Take | None = None,
    now: float,
) -> Planned | None:
    """Step 1 of a round trip at time ``now``: check and reserve the acks of session hash
    ``session``, take a lease (``take``); the reply, the records to journal and what to undo.

    ``None`` (nothing changed) when another request's acknowledgement of some of these positions is
    in flight: plan again once it settled.
    """
    p = Planned()
    p.statuses, p.marks = it.plan_acks(items, session=session, now=now)
    if p.marks and it.in_flight(p.marks):
        return None
    if p.marks:
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
        add = [p.lease] if p.lease is not None else []
        p.records = Records(add, drop, it.units_of_marks(p.marks))
    if p.lease is not None:
        p.lease_units = it.units_of(p.lease)
        p.runs = it.runs_of(p.lease_units)
    return p


def finish(it: Iteration, p: Planned, *, ok: bool, now: float, built: bool = False) -> Settled:
    """Step 3 at time ``now``: apply the committed records (``ok``) or undo everything the plan
    changed (the write failed); what it did, for the driver's telemetry.

    ``built``: the lease was built for its holder meanwhile and is handed over at ``now``: its clock
    starts then, not before a (slow) build (:attr:`Settled.live` is ``False`` when it expired
    meanwhile: its batches are back in the queue).
    """
    s = Settled()
    if not ok:
        it.undo_acks(p.marks)
        it.dropped.extend(p.dropped)
        if p.lease is not None:
            it.untake(p.lease)
    else:
        if p.marks:
            it.apply_acks(p.marks, now=now)
            s.latencies = [now - t for t in p.issued]
            s.ended = it.finished_all()
        if p.lease is not None and built:
            s.live = it.delivered(p.lease, now=now)
        if p.lease is not None:  # the reply's done count
            q = p.lease.queue
            s.done = it.done_prefix(q) if it.mode == "static" else it.done_count(q) + it.base_done
    s.timed_out = it.take_timed_out()
    return s
