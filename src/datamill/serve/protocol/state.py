"""One iteration's state in the lease protocol: its records (:class:`Lease`, :class:`ClientInfo`, a
round trip's :class:`Take`, :class:`Planned`, :class:`Records`, :class:`Settled`), the positions'
states and :class:`IterationState` (queues, leases, done set, shared bookkeeping and views); pure,
changed only by :class:`datamill.serve.protocol.iteration.Iteration`'s transitions.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import secrets
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "ACKING",
    "DONE",
    "GRACE_MAX_S",
    "LEASED",
    "PENDING",
    "RATE_WINDOW_S",
    "AckItem",
    "ClientInfo",
    "IterationState",
    "Lease",
    "Planned",
    "Records",
    "Settled",
    "Take",
    "as_units",
    "digest",
    "lease_grace",
    "session_digest",
]

PENDING, LEASED, DONE, ACKING = 0, 1, 2, 3
"""A position's state; ``ACKING``: acknowledged by its lease's holder, the journal write in flight
(neither handed out again nor done until the write commits, see :meth:`Iteration.begin_acks`)."""
RATE_WINDOW_S = 10.0
GRACE_MAX_S = 2.0
"""The longest grace after a lease's TTL before its batches are handed out again (a quarter of the
TTL when that is shorter)."""


def lease_grace(ttl: float) -> float:
    """Seconds the server waits past a lease's TTL (after its last heartbeat or ack) before it
    hands the lease's batches out again: the holder stopped yielding at the TTL by its own clock.

    Examples:
        >>> lease_grace(2.0), lease_grace(60.0)
        (0.5, 2.0)
    """
    return min(GRACE_MAX_S, 0.25 * float(ttl))


_SCAN = 1024  # positions a take first scans for a pending one (doubling up to 1 << 20)
# pending-position cursors kept (one per (queue, slots, slot)); hints, reset when over
_MAX_CURSORS = 4096


# lease ids: unique, not secret (the fence is): a random prefix per server process and a counter
_LEASE_PREFIX, _LEASE_NUMBERS = secrets.token_hex(6), itertools.count(1)


def digest(secret: str) -> str:
    """The hash of a fence or session secret kept in memory and in the journal (never the
    secret)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:32]


session_digest = functools.lru_cache(maxsize=4096)(digest)
""":func:`digest` of a client's session, remembered for the last 4,096 sessions (each round trip
hashes its session; fences are not remembered)."""


@dataclass
class Lease:
    """Positions ``[start, stop)`` of queue ``queue``, held by ``client`` (of session ``session``)
    until ``deadline``.

    ``fence`` is the secret given to the holder (empty for a lease restored from the journal);
    ``fence_hash`` and ``session`` are hashes (:func:`digest`).
    """

    id: str
    fence: str
    queue: int
    start: int
    stop: int
    client: str
    deadline: float
    issued: float
    fence_hash: str = ""
    session: str = ""
    slot: int = 0
    reclaimed: bool = True
    owner: str = ""  # the API key id that took it ("" without auth)


@dataclass
class ClientInfo:
    """What the server knows of one client (for progress)."""

    rank: int
    slot: int
    last_seen: float
    batches: int = 0
    stall_s: float = 0.0
    acked: deque[tuple[float, int]] = field(default_factory=deque)


AckItem = tuple[str, str, int | None, int | None]
"""An acknowledgement ``(lease id, fence, start, stop)``: positions of the lease (``None``: all of
it). Its status: ``"ok"``, ``"already"`` (journaled before), ``"refused"`` (another session's lease
or a wrong fence: 409), ``"expired"`` (not live: 410) or ``"outside"`` (positions not all in the
lease: 422, nothing recorded)."""


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
class Records:
    """The journal records of one round trip: leases added, lease ids dropped (finished, revoked or
    expired), unit runs done per lease id."""

    add: list[Lease] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    done: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


@dataclass
class Planned:
    """What a round trip decided (:func:`~datamill.serve.protocol.iteration.plan`): ack statuses,
    the ranges reserved, the lease taken with its units and their ``(plan rank, first, stop
    batch)`` runs, the records to append and what to undo when their write fails."""

    statuses: dict[str, str] = field(default_factory=dict)
    marks: list[tuple[Lease, int, int]] = field(default_factory=list)
    finishing: list[str] = field(default_factory=list)
    issued: list[float] = field(default_factory=list)  # issue times of the leases finishing
    lease: Lease | None = None
    lease_units: list[int] = field(default_factory=list)
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    reissued: int = 0  # batches of the lease an earlier lease held
    dropped: list[str] = field(default_factory=list)
    records: Records | None = None  # None: nothing to journal

    @property
    def units(self) -> dict[str, list[tuple[int, int]]]:
        """The unit runs each acknowledged lease newly completes."""
        return self.records.done if self.records is not None else {}


@dataclass
class Settled:
    """What applying (or undoing) a round trip did: the finished leases' ack latencies (seconds
    since their issue), the leases that timed out meanwhile, whether the iteration ended, whether
    the lease taken is still live (``False``: it expired while it was built) and its queue's done
    count to reply (the done prefix in static mode, the done batches in dynamic mode)."""

    latencies: list[float] = field(default_factory=list)
    timed_out: list[Lease] = field(default_factory=list)
    ended: bool = False
    live: bool = True
    done: int = 0


def as_units(units: Iterable[int] | NDArray[np.integer[Any]]) -> NDArray[np.int64]:
    """Unit ids as an ``int64`` array (an array as it is when it is one already).

    Examples:
        >>> as_units(u for u in range(3)).tolist(), as_units(np.arange(2, dtype=np.int32)).dtype
        ([0, 1, 2], dtype('int64'))
    """
    if isinstance(units, np.ndarray):
        return units.astype(np.int64, copy=False)
    if isinstance(units, Sequence):
        return np.asarray(units, dtype=np.int64).reshape(-1)
    return np.fromiter(units, dtype=np.int64)


def _per_s(acked: deque[tuple[float, int]], now: float) -> float:
    """Batches per second of ``(time, batches)`` acks over the :data:`RATE_WINDOW_S` before
    ``now`` (older ones are dropped)."""
    while acked and acked[0][0] < now - RATE_WINDOW_S:
        acked.popleft()
    span = min(RATE_WINDOW_S, max(1e-3, now - min((t for t, _ in acked), default=now)))
    return round(sum(n for _, n in acked) / span, 2)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return list(itertools.pairwise(bounds))


class IterationState:
    """Queues, leases and the done set of one iteration: what the transitions share and the views
    of it (see :class:`~datamill.serve.protocol.iteration.Iteration` for its arguments and its
    transitions)."""

    def __init__(
        self,
        id: str,
        rank_batches: Sequence[int],
        *,
        mode: str = "static",
        world_size: int = 1,
        base_done: Iterable[int] = (),
        lease_size: int = 16,
        lease_timeout: float = 60.0,
        boot: str = "0",
    ) -> None:
        self.id, self.mode, self.world_size = id, mode, int(world_size)
        self.lease_size, self.lease_timeout, self.boot = int(lease_size), float(lease_timeout), boot
        self.config: dict[str, Any] = {}  # the journaled config (set by the server)
        self.offsets = np.concatenate(
            [[0], np.cumsum(np.asarray(rank_batches, dtype=np.int64))]
        ).astype(np.int64)
        self.total = int(self.offsets[-1])
        self._offsets: list[int] = self.offsets.tolist()  # runs_of: bisect, no numpy call
        base = np.zeros(self.total, dtype=bool)
        base_list = list(base_done)
        if base_list:
            base[np.asarray(base_list, dtype=np.int64)] = True
        remaining = np.flatnonzero(~base).astype(np.int64)
        self.queues: list[NDArray[np.int64]]
        if mode == "dynamic":
            self.queues = [remaining]
        elif not base_list and len(rank_batches) == self.world_size:
            self.queues = [
                np.arange(self.offsets[r], self.offsets[r + 1], dtype=np.int64)
                for r in range(self.world_size)
            ]
        else:
            self.queues = [remaining[a:b] for a, b in _split(len(remaining), self.world_size)]
        self.state = [np.zeros(len(q), dtype=np.int8) for q in self.queues]
        # int32 below 2**31 units: 8 bytes a unit instead of 16 for an iteration held in memory
        index = np.int32 if self.total < 1 << 31 else np.int64
        self.pos_of: NDArray[np.signedinteger[Any]] = np.full(self.total, -1, dtype=index)
        self.queue_of: NDArray[np.signedinteger[Any]] = np.full(self.total, -1, dtype=index)
        for qi, q in enumerate(self.queues):
            self.pos_of[q] = np.arange(len(q))
            self.queue_of[q] = qi
        self.base_done = int(base.sum())
        self.leases: dict[str, Lease] = {}
        self.dropped: list[str] = []  # leases revoked or expired, still in the journal
        self.acked: set[str] = set()
        self.clients: dict[str, ClientInfo] = {}
        self.fenced = 0
        self.expired = 0  # leases that timed out (their batches went back to the queue)
        self.reissued = 0  # leases handing out batches an earlier lease held
        self.redelivered = 0  # batches handed out again (an earlier lease held them)
        # a lease's holder stops yielding at its TTL (by its own clock, from the reply); the server
        # hands its batches out again only GRACE later (a reply's transit, a clock's drift)
        self.grace = lease_grace(self.lease_timeout)
        self.cancelled = False
        self.timed_out: list[Lease] = []  # leases that timed out, for the driver's telemetry
        # session hash -> the latest deadline its leases may have: its connections were closed by
        # its client (until the session opens a new one); a request in flight then extends no more
        self.closed: dict[str, float] = {}
        self._ever = [np.zeros(len(q), dtype=bool) for q in self.queues]  # positions ever leased
        self._rate: deque[tuple[float, int]] = deque()
        # what a round trip reads without a pass over the queues (O(1) amortised, not O(positions)):
        self._low: dict[tuple[int, int, int], int] = {}  # (queue, slots, slot) -> no pending before
        self._done_n = [0] * len(self.queues)  # DONE positions per queue
        self._prefix = [0] * len(self.queues)  # every position before it is DONE
        # no live lease's deadline is before it (deadlines only grow; a new lease lowers it): a take
        # passes over the leases only from then on (expire() always does)
        self._earliest = float("inf")

    # ------------------------------------------------------------------ bookkeeping
    def mark_done(self, units: Iterable[int] | NDArray[np.integer[Any]]) -> None:
        """Mark units done (journal replay at start-up, or a rewind): one pass over the units and
        the positions, whatever their number; a unit in no queue (the resume base) is ignored."""
        for st, hit in zip(self.state, self.positions_of(units), strict=True):
            st[hit] = DONE
        self._recount()

    def positions_of(
        self, units: Iterable[int] | NDArray[np.integer[Any]]
    ) -> list[NDArray[np.bool_]]:
        """Per queue, which of its positions hold one of ``units`` (an id out of range raises
        ``IndexError``, as indexing ``queue_of`` does)."""
        marked = np.zeros(self.total, dtype=bool)
        marked[as_units(units)] = True
        return [marked[q] for q in self.queues]

    def _recount(self) -> None:
        """Recompute the done counts and forget the cursors (after a bulk change: O(positions))."""
        self._done_n = [int((st == DONE).sum()) for st in self.state]
        self._prefix = [0] * len(self.state)
        self._low.clear()

    def _pending_again(self, q: int, pos: int) -> None:
        """Position ``pos`` of queue ``q`` is pending again: no cursor of ``q`` may skip it."""
        for key, low in self._low.items():
            if key[0] == q and low > pos:
                self._low[key] = pos

    def _first_pending(self, q: int, slot: int, slots: int) -> int | None:
        """The smallest pending position of queue ``q`` in ``slot`` of ``slots``, from a cursor."""
        st, key = self.state[q], (q, slots, slot)
        if key not in self._low and len(self._low) >= _MAX_CURSORS:
            self._low.clear()
        lo, step = self._low.get(key, 0), _SCAN
        if slots == 1 and lo < len(st) and st[lo] == PENDING:
            return lo  # the cursor's position (the common case: no scan, which releases the GIL)
        while lo < len(st):
            hi = min(len(st), lo + step)
            if slots == 1:  # PENDING is the smallest state: its first position is the argmin
                i = int(st[lo:hi].argmin())
                if st[lo + i] == PENDING:
                    self._low[key] = lo + i
                    return lo + i
            else:
                idx = np.flatnonzero(st[lo:hi] == PENDING) + lo
                idx = idx[(idx // self.lease_size) % slots == slot]
                if len(idx):
                    self._low[key] = int(idx[0])
                    return int(idx[0])
            lo, step = hi, min(step * 2, 1 << 20)
        self._low[key] = len(st)
        return None

    def done_prefix(self, q: int) -> int:
        """How many positions at the head of queue ``q`` are done (amortised O(1))."""
        st, p, step = self.state[q], self._prefix[q], _SCAN
        while p < len(st):
            not_done = np.flatnonzero(st[p : p + step] != DONE)
            if len(not_done):
                p += int(not_done[0])
                break
            p, step = min(len(st), p + step), min(step * 2, 1 << 20)
        self._prefix[q] = p
        return p

    def done_count(self, q: int) -> int:
        """Done positions of queue ``q``."""
        return self._done_n[q]

    def units_of(self, lease: Lease) -> list[int]:
        """The unit ids of a lease, in order."""
        units: list[int] = self.queues[lease.queue][lease.start : lease.stop].tolist()
        return units

    def runs_of(self, units: Sequence[int] | NDArray[np.int64]) -> list[tuple[int, int, int]]:
        """Units as ``(plan rank, first batch, stop batch)`` runs of consecutive batches of one
        rank (what a lease's holder builds), vectorised (a lease request's hot path: a lease of 128
        batches took 0.1 ms per request as a loop over its units).

        Examples:
            >>> IterationState("i", [5, 5]).runs_of([4, 5, 6, 9])
            [(0, 4, 5), (1, 0, 2), (1, 4, 5)]
            >>> IterationState("i", [5, 5]).runs_of([])
            []
        """
        u = np.asarray(units, dtype=np.int64)
        if not len(u):
            return []
        first, last, offs = int(u[0]), int(u[-1]), self._offsets
        r0 = bisect.bisect_right(offs, first) - 1
        if (  # the common lease: consecutive batches of one rank, one run
            last - first == len(u) - 1
            and last < offs[r0 + 1]
            and (len(u) == 1 or bool((u[1:] - u[:-1] == 1).all()))
        ):
            return [(r0, first - offs[r0], last - offs[r0] + 1)]
        r = np.searchsorted(self.offsets, u, side="right") - 1
        b = u - self.offsets[r]
        cut = np.flatnonzero((r[1:] != r[:-1]) | (b[1:] != b[:-1] + 1)) + 1
        heads = [0, *cut.tolist()]
        tails = [*(cut - 1).tolist(), len(u) - 1]
        rl, bl = r.tolist(), b.tolist()
        return [(rl[i], bl[i], bl[j] + 1) for i, j in zip(heads, tails, strict=True)]

    def _revoke(self, lease: Lease) -> None:
        seg = self.state[lease.queue][lease.start : lease.stop]
        seg[seg == LEASED] = PENDING
        self._pending_again(lease.queue, lease.start)
        self.leases.pop(lease.id, None)
        self.dropped.append(lease.id)

    def _extend(self, lease: Lease, now: float) -> None:
        """A request of the lease's holder at ``now`` (an ack, a heartbeat, its delivery) keeps it
        a TTL + grace longer (no later than its closed session's end)."""
        until = now + self.lease_timeout + self.grace
        cap = self.closed.get(lease.session)
        if cap is not None:
            until = min(until, cap)
        lease.deadline = max(lease.deadline, until)

    # ------------------------------------------------------------------ views
    def done_units(self) -> list[int]:
        """Every done unit (including the resume base)."""
        done = self.queue_of < 0  # the resume base: in no queue
        for q, st in zip(self.queues, self.state):
            done[q[st == DONE]] = True
        return [int(u) for u in np.flatnonzero(done)]

    def finished(self, *, rank: int = 0) -> bool:
        """Whether the client's queue (static) or the whole iteration (dynamic) is done."""
        q = 0 if self.mode == "dynamic" else rank
        return self._done_n[q] == len(self.state[q])

    def finished_all(self) -> bool:
        """Whether every queue is done (the iteration can be evicted from memory)."""
        return all(n == len(st) for n, st in zip(self._done_n, self.state))

    def progress(self, *, now: float) -> dict[str, Any]:
        """Counts in batches, rates over the last 10 s before ``now``, per client stall time."""
        counts = np.zeros(4, dtype=np.int64)
        for st in self.state:
            counts += np.bincount(st, minlength=4)[:4]
        counts[LEASED] += counts[ACKING]  # acknowledged, not journaled yet: still leased
        clients = {}
        for cid, info in self.clients.items():
            clients[cid] = {
                "rank": info.rank,
                "slot": info.slot,
                "batches": info.batches,
                "stall_s": round(info.stall_s, 3),
                "idle_s": round(now - info.last_seen, 3),
                "leases": sum(1 for x in self.leases.values() if x.client == cid),
                "batches_per_s": _per_s(info.acked, now),
            }
        return {
            "id": self.id,
            "mode": self.mode,
            "total": self.total,
            "done": int(counts[DONE]) + self.base_done,
            "leased": int(counts[LEASED]),
            "pending": int(counts[PENDING]),
            "fenced_acks": self.fenced,
            "expired_leases": self.expired,
            "reissued_leases": self.reissued,
            "redelivered_batches": self.redelivered,
            "cancelled": self.cancelled,
            "batches_per_s": _per_s(self._rate, now),
            "queues": [
                {"rank": qi, "total": len(q), "done": int((self.state[qi] == DONE).sum())}
                for qi, q in enumerate(self.queues)
            ],
            "clients": clients,
        }
