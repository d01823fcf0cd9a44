"""One iteration's work and its leases: pure bookkeeping, no HTTP, no SQLite (see :mod:`datamill.serve.app`).

The work of an epoch is a list of **units**: unit ``u`` is batch ``b`` of plan rank ``r`` of the order
with ``plan_world`` ranks (``u = offsets[r] + b``), so a unit's content is a pure function of the
iteration's config. Units are dealt into **queues**:

* static mode: queue ``q`` serves rank ``q``. Without a resume base (``plan_world == world_size`` and
  nothing done) queue ``q`` is exactly plan rank ``q``'s batches, in the Loader's order. Resumed with
  a different world size (elastic), the units not done are split contiguously over the new ranks.
* dynamic mode: one queue of every unit; any client takes the next lease.

A **lease** is a run of pending positions of one queue, never crossing a ``lease_size`` boundary. It
carries a fence: an ack is accepted only for the live lease with its fence, and acks are idempotent.
An expired or revoked lease returns its positions to the pending set; a queue hands out its
smallest pending position first, so re-issued work comes back at the head of the queue.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["PENDING", "AckResult", "Iteration", "Lease", "runs"]

PENDING, LEASED, DONE = 0, 1, 2
RATE_WINDOW_S = 10.0


@dataclass
class Lease:
    """Positions ``[start, stop)`` of queue ``queue``, held by ``client`` until ``deadline``."""

    id: str
    fence: int
    queue: int
    start: int
    stop: int
    client: str
    deadline: float
    issued: float


@dataclass
class AckResult:
    """``status`` is ``"ok"``, ``"already"`` (acked before), ``"fenced"`` (a re-issued lease) or ``"gone"``."""

    status: str
    units: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class ClientInfo:
    """What the server knows of one client (for progress)."""

    rank: int
    slot: int
    last_seen: float
    batches: int = 0
    stall_s: float = 0.0
    acked: deque[tuple[float, int]] = field(default_factory=deque)


def runs(units: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted unit ids as ``[start, stop)`` runs.

    Examples:
        >>> runs([0, 1, 2, 5, 6, 9])
        [(0, 3), (5, 7), (9, 10)]
    """
    out: list[tuple[int, int]] = []
    for u in sorted(int(x) for x in units):
        if out and out[-1][1] == u:
            out[-1] = (out[-1][0], u + 1)
        else:
            out.append((u, u + 1))
    return out


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return list(itertools.pairwise(bounds))


class Iteration:
    """Queues, leases and the done set of one iteration (thread-safe).

    Args:
        id: the iteration id.
        rank_batches: batches of each plan rank (``len`` is the plan's world size).
        mode: ``"static"`` or ``"dynamic"``.
        world_size: ranks served (static mode).
        base_done: units already done when the iteration was created (elastic resumption).
        lease_size: batches per lease.
        lease_timeout: seconds a lease lives without a heartbeat.
        boot: this server run's id (lease ids of an earlier run are unknown: ``"gone"``).

    Examples:
        >>> it = Iteration("i", [3, 3], mode="static", world_size=2, lease_size=2, boot="b")
        >>> lease = it.take("c0", rank=0)
        >>> (lease.start, lease.stop), it.units_of(lease)
        ((0, 2), [0, 1])
        >>> it.ack(lease.id, lease.fence).status, it.ack(lease.id, lease.fence).status
        ('ok', 'already')
    """

    def __init__(self, id: str, rank_batches: Sequence[int], *, mode: str = "static", world_size: int = 1,
                 base_done: Iterable[int] = (), lease_size: int = 16, lease_timeout: float = 60.0,
                 boot: str = "0") -> None:
        self.id, self.mode, self.world_size = id, mode, int(world_size)
        self.lease_size, self.lease_timeout, self.boot = int(lease_size), float(lease_timeout), boot
        self.config: dict[str, Any] = {}  # the journaled config (set by the server)
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(rank_batches, dtype=np.int64))]).astype(np.int64)
        self.total = int(self.offsets[-1])
        base = np.zeros(self.total, dtype=bool)
        base_list = list(base_done)
        if base_list:
            base[np.asarray(base_list, dtype=np.int64)] = True
        remaining = np.flatnonzero(~base).astype(np.int64)
        self.queues: list[NDArray[np.int64]]
        if mode == "dynamic":
            self.queues = [remaining]
        elif not base_list and len(rank_batches) == self.world_size:
            self.queues = [np.arange(self.offsets[r], self.offsets[r + 1], dtype=np.int64)
                           for r in range(self.world_size)]
        else:
            self.queues = [remaining[a:b] for a, b in _split(len(remaining), self.world_size)]
        self.state = [np.zeros(len(q), dtype=np.int8) for q in self.queues]
        self.pos_of = np.full(self.total, -1, dtype=np.int64)
        self.queue_of = np.full(self.total, -1, dtype=np.int64)
        for qi, q in enumerate(self.queues):
            self.pos_of[q] = np.arange(len(q))
            self.queue_of[q] = qi
        self.base_done = int(base.sum())
        self.leases: dict[str, Lease] = {}
        self.acked: set[str] = set()
        self.clients: dict[str, ClientInfo] = {}
        self.fenced = 0
        self.expired = 0  # leases that timed out (their batches went back to the queue)
        self.reissued = 0  # leases handing out batches an earlier lease held
        self.cancelled = False
        self._ever = [np.zeros(len(q), dtype=bool) for q in self.queues]  # positions ever leased
        self._counter = itertools.count(1)
        self._rate: deque[tuple[float, int]] = deque()
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ bookkeeping
    def mark_done(self, units: Iterable[int]) -> None:
        """Mark units done (journal replay at start-up, or a rewind)."""
        with self.lock:
            for u in units:
                q = int(self.queue_of[u])
                if q >= 0:
                    self.state[q][self.pos_of[u]] = DONE

    def units_of(self, lease: Lease) -> list[int]:
        """The unit ids of a lease, in order."""
        return [int(u) for u in self.queues[lease.queue][lease.start:lease.stop]]

    def unit_location(self, unit: int) -> tuple[int, int]:
        """``(plan rank, batch)`` of a unit."""
        r = int(np.searchsorted(self.offsets, unit, side="right") - 1)
        return r, int(unit - self.offsets[r])

    def _revoke(self, lease: Lease) -> None:
        st = self.state[lease.queue]
        seg = st[lease.start:lease.stop]
        seg[seg == LEASED] = PENDING
        self.leases.pop(lease.id, None)

    def expire(self, now: float | None = None) -> int:
        """Return expired leases' positions to their queue; the number of leases expired."""
        now = time.monotonic() if now is None else now
        with self.lock:
            dead = [lease for lease in self.leases.values() if lease.deadline < now]
            for lease in dead:
                self._revoke(lease)
            self.expired += len(dead)
            return len(dead)

    def cancel(self) -> None:
        """Stop handing out leases (live ones are revoked; their acks are refused as fenced)."""
        with self.lock:
            self.cancelled = True
            for lease in list(self.leases.values()):
                self._revoke(lease)

    def touch(self, client: str, *, rank: int, slot: int = 0) -> ClientInfo:
        """Register or refresh a client."""
        info = self.clients.get(client)
        if info is None:
            info = self.clients[client] = ClientInfo(rank=rank, slot=slot, last_seen=time.monotonic())
        info.last_seen, info.rank, info.slot = time.monotonic(), rank, slot
        return info

    # ------------------------------------------------------------------ leases
    def take(self, client: str, *, rank: int = 0, slot: int = 0, slots: int = 1) -> Lease | None:
        """The next lease for ``client``, or ``None`` when nothing is pending (see :meth:`finished`).

        In static mode a client that is new for ``(rank, slot)`` takes over the leases other clients
        hold there: a replacement process first gets the dead one's unacknowledged leases again.
        """
        with self.lock:
            if self.cancelled:
                return None
            now = time.monotonic()
            self.expire(now)
            q = 0 if self.mode == "dynamic" else rank
            info = self.touch(client, rank=rank, slot=slot)
            if self.mode == "static":
                for lease in list(self.leases.values()):
                    holder = self.clients.get(lease.client)
                    if lease.queue == q and lease.client != client and holder is not None and holder.slot == slot:
                        self._revoke(lease)
            st = self.state[q]
            pending = np.flatnonzero(st == PENDING)
            if slots > 1 and len(pending):
                pending = pending[(pending // self.lease_size) % slots == slot]
            if not len(pending):
                return None
            start = int(pending[0])
            limit = min((start // self.lease_size + 1) * self.lease_size, len(st))
            stop = start + 1
            while stop < limit and st[stop] == PENDING:
                stop += 1
            st[start:stop] = LEASED
            if self._ever[q][start:stop].any():
                self.reissued += 1
            self._ever[q][start:stop] = True
            n = next(self._counter)
            lease = Lease(f"{self.boot}.{n}", n, q, start, stop, client, now + self.lease_timeout, now)
            self.leases[lease.id] = lease
            info.last_seen = now
            return lease

    def ack(self, lease_id: str, fence: int) -> AckResult:
        """Acknowledge a lease: its units become done (the caller journals ``units`` before replying)."""
        with self.lock:
            if lease_id in self.acked:
                return AckResult("already")
            lease = self.leases.get(lease_id)
            if lease is None:
                if lease_id.split(".", 1)[0] == self.boot:
                    self.fenced += 1
                    return AckResult("fenced")  # expired or revoked, maybe re-issued
                return AckResult("gone")
            if lease.fence != int(fence):
                self.fenced += 1
                return AckResult("fenced")
            self.state[lease.queue][lease.start:lease.stop] = DONE
            self.leases.pop(lease_id)
            self.acked.add(lease_id)
            now = time.monotonic()
            n = lease.stop - lease.start
            self._rate.append((now, n))
            info = self.clients.get(lease.client)
            if info is not None:
                info.acked.append((now, n))
            return AckResult("ok", runs(self.units_of(lease)))

    def heartbeat(self, client: str, *, leases: Sequence[str] = (), stall_s: float | None = None,
                  batches: int | None = None) -> list[str]:
        """Extend ``client``'s leases; returns the ids among ``leases`` that are no longer live."""
        with self.lock:
            now = time.monotonic()
            info = self.clients.get(client)
            if info is not None:
                info.last_seen = now
                if stall_s is not None:
                    info.stall_s = float(stall_s)
                if batches is not None:
                    info.batches = int(batches)
            lost = []
            for lid in leases:
                lease = self.leases.get(lid)
                if lease is None or lease.client != client:
                    if lid not in self.acked:
                        lost.append(lid)
                    continue
                lease.deadline = now + self.lease_timeout
            return lost

    def rewind(self, *, rank: int | None = None, consumed: int | None = None,
               done: Iterable[int] | None = None) -> None:
        """Set the done set from a client checkpoint; every live lease of the affected queues is revoked.

        ``rank`` + ``consumed``: queue ``rank``'s first ``consumed`` positions are done, the rest pending.
        ``done``: the whole iteration's done units.
        """
        with self.lock:
            if done is not None:
                for lease in list(self.leases.values()):
                    self._revoke(lease)
                for st in self.state:
                    st[:] = PENDING
                self.mark_done(done)
                return
            assert rank is not None and consumed is not None
            for lease in [x for x in self.leases.values() if x.queue == rank]:
                self._revoke(lease)
            st = self.state[rank]
            st[:] = PENDING
            st[:consumed] = DONE

    # ------------------------------------------------------------------ views
    def done_units(self) -> list[int]:
        """Every done unit (including the resume base)."""
        with self.lock:
            out = [int(u) for qi, q in enumerate(self.queues) for u in q[self.state[qi] == DONE]]
        in_queue = np.zeros(self.total, dtype=bool)
        for q in self.queues:
            in_queue[q] = True
        return sorted(out + [int(u) for u in np.flatnonzero(~in_queue)])

    def finished(self, *, rank: int = 0) -> bool:
        """Whether the client's queue (static) or the whole iteration (dynamic) is done."""
        with self.lock:
            q = 0 if self.mode == "dynamic" else rank
            return bool((self.state[q] == DONE).all())

    def progress(self) -> dict[str, Any]:
        """Counts in batches, rates over the last 10 s, per client stall time."""
        with self.lock:
            now = time.monotonic()
            self.expire(now)
            while self._rate and self._rate[0][0] < now - RATE_WINDOW_S:
                self._rate.popleft()
            counts = np.zeros(3, dtype=np.int64)
            for st in self.state:
                counts += np.bincount(st, minlength=3)[:3]
            span = min(RATE_WINDOW_S, max(1e-3, now - min((t for t, _ in self._rate), default=now)))
            clients = {}
            for cid, info in self.clients.items():
                while info.acked and info.acked[0][0] < now - RATE_WINDOW_S:
                    info.acked.popleft()
                cspan = min(RATE_WINDOW_S, max(1e-3, now - min((t for t, _ in info.acked), default=now)))
                clients[cid] = {"rank": info.rank, "slot": info.slot, "batches": info.batches,
                                "stall_s": round(info.stall_s, 3), "idle_s": round(now - info.last_seen, 3),
                                "leases": sum(1 for x in self.leases.values() if x.client == cid),
                                "batches_per_s": round(sum(n for _, n in info.acked) / cspan, 2)}
            return {"id": self.id, "mode": self.mode, "total": self.total,
                    "done": int(counts[DONE]) + self.base_done, "leased": int(counts[LEASED]),
                    "pending": int(counts[PENDING]), "fenced_acks": self.fenced,
                    "expired_leases": self.expired, "reissued_leases": self.reissued, "cancelled": self.cancelled,
                    "batches_per_s": round(sum(n for _, n in self._rate) / span, 2),
                    "queues": [{"rank": qi, "total": len(q), "done": int((self.state[qi] == DONE).sum())}
                               for qi, q in enumerate(self.queues)],
                    "clients": clients}
