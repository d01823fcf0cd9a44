"""The background threads of one :class:`~datamill.client.RemoteLoader` epoch.

* **fetch**: asks for the next lease and keeps
  ``prefetch`` leases ahead of the training loop, so the round trips overlap the loop; in
  server-built mode a lease arrives with its batches (an Arrow IPC stream), in direct mode with its
  runs only (the loader builds them as the loop asks, see :class:`~datamill.loader.runs.RunStream`).
  Server-built with short leases, a second fetch thread sends a request beside the first one's
  while the replies hold the loop up (:data:`FETCHERS`); their leases go on in the order the server
  granted them (:class:`Arrivals`).
* **decode** (server-built mode): reads each lease's stream without copying (for a numpy or torch
  collate, collates the whole lease at once, column by column), in order, while the fetch thread
  asks for the next lease. In static mode with an
  ``ack_window`` > 1 the batches consumed since the last request ride on the lease request
  (``?ack=``: one request and one journal transaction for both, see :attr:`LeaseFeed.piggyback`).
* **ack**: sends each batch's acknowledgement as soon as the loop is handed the batch (one request,
  one journal transaction, for whatever is pending), so that it is in flight while the loop trains
  on the batch; retried every :data:`ACK_FLUSH_S` seconds until the server answers.
* **heartbeat**: extends the leases held (reporting the stall time) and, after a server restart,
  reclaims them with their fences within the grace period.

The training loop takes :class:`HeldLease` objects with :meth:`LeaseFeed.take` (``END`` when the
epoch is done or a thread failed: :meth:`LeaseFeed.raise_error` re-raises its error there) and
calls :meth:`LeaseFeed.wait_yieldable` before it hands out each batch: it returns once fewer than
``ack_window`` acknowledgements are unanswered and the lease's **deadline** (by this process's
monotonic clock: the send time of the last request the server answered for the lease, plus the
lease's TTL) has not passed, so a client cut off from the server stops yielding after one batch
(see ``docs/serving-delivery.md``).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from datamill.client.http import Head, Http, RemoteError, Response
from datamill.client.options import Transport
from datamill.core.ragged import runs
from datamill.core.wire import SESSION_HEADER, TTL_HEADER

__all__ = [
    "ACK_FLUSH_S",
    "ACK_IDLE_S",
    "ACK_SENDERS",
    "END",
    "FETCHERS",
    "MAX_QUERY_ACKS",
    "OVERLAP_BATCHES",
    "Arrivals",
    "HeldLease",
    "LeaseFeed",
    "ack_ranges",
]

FETCHERS = 2
"""Fetch threads of a server-built client whose leases hold at most :data:`OVERLAP_BATCHES`
batches, each with its own connection. The second one sends a request while the first one's is on
its way only when the replies hold the loop up (it waits for a lease and the decode thread for a
reply): then the server journals, builds and copies one lease while the other's bytes are on their
way. One request at a time, a 16-batch lease of 3 KB samples (12.7 MB) took ~10 ms, of which the
server spent ~4.7 ms journaling, building and copying it before it sent the first byte; with the
second request such epochs served 8-15% more samples a second (``benchmarks/RESULTS.md``). The
leases reach the loop in the order the server granted them (:class:`Arrivals`). A direct client has
one fetch thread: its replies carry no bytes."""
OVERLAP_BATCHES = 32
"""Leases of at most this many batches get a second fetch thread (:data:`FETCHERS`): the server
sizes leases of samples of a few KB at 16 batches, whose replies are what the loop waits for. With
leases of small rows (256 batches, epochs of 3-4M samples a second) a second request in flight made
the epochs no faster, and 10-20% slower in some runs."""
ACK_SENDERS = 2
"""Acknowledgement requests in flight at once when ``ack_window`` > 1 (one ack thread each): the
acks consumed while one request waits for the journal go out at once in the next, so a batch's
acknowledgement waits about one round trip, not up to two (the server group-commits requests that
arrive together into one transaction)."""
ACK_FLUSH_S = 0.05
"""Seconds between two tries of the ack thread while acknowledgements are pending and unanswered
(each is sent at once when the loop is handed its batch)."""
ACK_IDLE_S = 0.25
"""With :attr:`LeaseFeed.piggyback`: seconds without a lease request carrying acknowledgements after
which the ack thread sends the pending ones itself (it also sends them at once when the loop waits
for an answer, or when three quarters of the window are pending)."""
MAX_QUERY_ACKS = 64
"""Ack ranges a lease request carries at most (the server's bound on ``?ack=``)."""
_TTL = TTL_HEADER.lower()  # a reply's headers are read lower-cased
_BODY = pa.allocate_buffer
"""What a lease's body is read into: a buffer of Arrow's default pool, which reuses the memory of
the leases the loop is done with (a ``bytes`` body over 32 MiB landed on fresh pages each time:
``core.arrow.joined``)."""
END: Any = object()
"""Put on :attr:`LeaseFeed.ready` after the last lease (or after a thread failed)."""


class FeedOwner(Protocol):
    """What a :class:`LeaseFeed` uses of its :class:`~datamill.client.RemoteLoader` (a
    Protocol, so this module does not import the loader that imports it)."""

    url: str
    key: str | None
    session: str
    client_id: str
    rank: int
    mode: str  # "static" or "dynamic"
    transport: Transport  # prefetch, reconnect_s, verify, slot, slots
    stall_s: float
    stats: dict[str, Any]
    _queue_total: int | None  # the rank's (static) or the iteration's (dynamic) batches
    _unflushed: list[tuple[str, str, int]]
    lease_collate: Callable[[list[pa.RecordBatch]], list[Any]] | None
    _state_lock: threading.Lock

    def _pending(self) -> list[tuple[str, str, int]]: ...

    def _unanswered(self) -> int: ...

    def _record_acks(
        self,
        header: str,
        sent: Sequence[tuple[str, str, int]],
        held: dict[str, HeldLease],
        lost: set[str],
    ) -> None: ...


@dataclass
class HeldLease:
    """A lease received: its positions in its queue, its units and (server-built) its batches."""

    id: str
    fence: str
    queue: int
    start: int
    units: list[int]
    # server-built mode: a pa.Table per batch, or (``collated``) what the loader's lease_collate
    # made of them; direct mode: empty, the loader builds ``runs``
    batches: list[Any]
    done_before: int = 0  # the queue's done prefix (static) or done batches (dynamic) at take time
    runs: str = ""  # direct mode: the X-Datamill-Runs header
    collated: bool = False
    ttl: float | None = None  # the reply's X-Datamill-Lease-TTL, when the server sends one


def ack_ranges(acks: Any) -> list[list[Any]]:
    """Consumed ``(lease, fence, position)`` as ``[lease, fence, start, stop]`` runs.

    Examples:
        >>> ack_ranges([("a", "f", 2), ("a", "f", 1), ("b", "g", 0)])
        [['a', 'f', 1, 3], ['b', 'g', 0, 1]]
    """
    by_lease: dict[str, tuple[str, list[int]]] = {}  # a lease's fence and positions
    for lid, fence, pos in acks:
        held = by_lease.get(lid)
        if held is None:
            by_lease[lid] = (fence, [pos])
        else:
            held[1].append(pos)
    return [
        [lid, by_lease[lid][0], a, b] for lid in sorted(by_lease) for a, b in runs(by_lease[lid][1])
    ]


class LeaseFeed:
    """The fetch, ack and heartbeat threads of one epoch of ``loader``.

    Args:
        loader: the loader (its connection settings, ack bookkeeping and stats).
        it_id: the iteration.
        lease_timeout: the iteration's lease lifetime (heartbeats come at a quarter of it, 0.1-1 s),
            the TTL of a lease whose reply carries none.
        direct: ask for direct leases (their runs, no batches).
        ack_window: batches the loop may hold whose acknowledgements are unanswered (``1``: the
            next batch is yielded only once the previous one's acknowledgement is journaled).
        lease_size: batches a lease holds, as the server sized them: a server-built client with
            leases of at most :data:`OVERLAP_BATCHES` has :data:`FETCHERS` fetch threads, else
            one.
    """

    def __init__(
        self,
        loader: FeedOwner,
        it_id: str,
        lease_timeout: float,
        *,
        direct: bool = False,
        ack_window: int = 1,
        lease_size: int | None = None,
    ) -> None:
        self.loader, self.lease_timeout, self.direct = loader, float(lease_timeout), direct
        short = lease_size is not None and int(lease_size) <= OVERLAP_BATCHES
        self.fetchers = FETCHERS if short and not direct else 1
        self.ack_window = int(ack_window)
        self.path = f"/api/v1/iterations/{it_id}"
        self.ready: queue.Queue[Any] = queue.Queue(maxsize=loader.transport.prefetch)
        self.received: queue.Queue[Any] = queue.Queue()  # server-built: to decode
        # server-built: leases asked for and not taken by the loop, at most ``prefetch`` + 1 (those
        # in ``ready`` and the one the fetch thread holds, as without a decode thread)
        self.room = threading.Semaphore(loader.transport.prefetch + 1)
        self.held: dict[str, HeldLease] = {}  # received, not all consumed and flushed
        self.lost: set[str] = set()
        # lease id -> monotonic time until which the server keeps it for this client at least
        self.deadlines: dict[str, float] = {}
        self.ttls: dict[str, float] = {}
        self.answered = threading.Condition(loader._state_lock)  # acks answered, deadlines moved
        self.stop = threading.Event()
        self.acked = threading.Event()  # set when the loop finished a lease (wakes a waiting fetch)
        # leases handed to the loop and finished by it, and the end of the positions leased so far
        # in the rank's queue (static, one slot): once every position is leased the fetch thread
        # sleeps until the loop has finished every lease it holds (see :meth:`_idle`)
        self.fetched = self.finished = self.leased_to = 0
        self.loop_starves = False  # the loop waits for a lease (in take)
        # server-built: leases handed on to the decode thread, and decoded (each has one writer)
        self.handed_on = self.decoded = 0
        # the fetch threads' leases, handed on in the order the server granted them
        self.arrivals = Arrivals(self._hand, self._starving)
        self.to_ack = (
            threading.Event()
        )  # set when the loop was handed a batch (wakes the ack thread)
        self.errors: list[BaseException] = []
        # acks sent in a request not answered yet (``ack_window`` > 1: up to ACK_SENDERS requests
        # are in flight at once, each with the acks consumed since the others were sent)
        self.in_flight: set[tuple[str, str, int]] = set()
        # static mode, a window > 1: the acks consumed ride on the lease requests (one request
        # and one journal transaction a lease instead of an ack request every few batches); the
        # ack threads send what waits longer than ACK_IDLE_S, half a window, or what the loop
        # waits for. Dynamic mode does not: there an ``already`` answer reads as a lease finished
        # by another client, so a batch's acknowledgement has one sender at a time.
        self.piggyback = self.ack_window > 1 and loader.mode == "static"
        # a woken ack thread sends once this many acks are pending (a quarter of the window: fewer
        # requests, each a journal transaction on the server; three quarters with piggyback, where
        # a lease of half the window carries them, so the ack thread does not race the lease
        # request for them), or when the loop waits for one
        self.send_at = max(1, self.ack_window * 3 // 4 if self.piggyback else self.ack_window // 4)
        self.loop_waits = False
        self.carried_at = 0.0  # monotonic time of the last lease request that carried acks
        self._threads: list[threading.Thread] = []
        self._deadline_503: float | None = None  # while the server answers 503 (journal unwritable)
        self._last_error: BaseException | None = None  # of the ack or heartbeat thread

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start the threads."""
        senders = ACK_SENDERS if self.ack_window > 1 else 1
        for name, target in (
            *((f"fetch{i or ''}", self._fetch) for i in range(self.fetchers)),
            *((("decode", self._decode),) if not self.direct else ()),
            *((f"ack{i or ''}", self._acker) for i in range(senders)),
            ("heartbeat", self._heartbeat),
        ):
            t = threading.Thread(target=target, name=f"datamill-serve-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop the threads; then flush the acks still pending (for up to 10 s)."""
        self.stop.set()
        self.acked.set()
        self.to_ack.set()
        joined = time.monotonic() + 5  # a thread stuck on a dead connection is a daemon
        for t in self._threads:
            t.join(timeout=max(0.0, joined - time.monotonic()))
        with self.answered:  # a thread stuck on a dead connection: its acks are sent again below
            self.in_flight.clear()
        if self.errors or not self.loader._pending():
            return
        wait = min(self.loader.transport.reconnect_s, 10.0)
        conn = self.http(0.0, timeout=min(wait, self._short_timeout()))
        try:
            deadline = time.monotonic() + wait
            while self.loader._pending() and time.monotonic() < deadline:
                try:
                    self.flush(conn)
                except RemoteError:
                    time.sleep(0.2)  # unflushed batches are re-issued: at-least-once, never lost
        finally:
            conn.close()

    def raise_error(self) -> None:
        """Re-raise the first error of a thread, if any."""
        if self.errors:
            raise self.errors[0]

    def http(self, retry_s: float, *, timeout: float = 60.0) -> Http:
        """A new connection of this loader's session."""
        loader = self.loader
        h = Http(
            loader.url, loader.key, retry_s=retry_s, verify=loader.transport.verify, timeout=timeout
        )
        h.headers[SESSION_HEADER] = loader.session
        return h

    def _put(self, q: queue.Queue[Any], item: Any) -> None:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # ------------------------------------------------------------------ the delivery window
    def ttl(self, lease_id: str) -> float:
        """The lease's lifetime after a request the server answered (its reply's, else the
        iteration's ``lease_timeout``)."""
        return self.ttls.get(lease_id, self.lease_timeout)

    def _extend(self, lease_ids: Any, sent_at: float) -> None:
        """The server answered, for these leases, a request sent at ``sent_at``: each lives at least
        until ``sent_at`` + its TTL (call under the loader's lock)."""
        for lid in lease_ids:
            if lid not in self.lost:
                when = sent_at + self.ttl(lid)
                self.deadlines[lid] = max(self.deadlines.get(lid, 0.0), when)
        self.answered.notify_all()

    def wait_yieldable(self, lease: HeldLease) -> float:
        """Block until a batch of ``lease`` may be handed to the loop: fewer than ``ack_window``
        acknowledgements are unanswered, and the lease is lost (the caller drops it) or its deadline
        is ahead. Returns the seconds waited.

        Raises:
            RemoteError: the server answered nothing for ``reconnect_s`` seconds.
        """
        loader = self.loader
        t0 = time.monotonic()
        if (  # the common case, read without the lock (each read is atomic); else the locked loop
            not self.loop_waits
            and loader._unanswered() < self.ack_window
            and t0 < self.deadlines.get(lease.id, 0.0)
        ):
            return 0.0
        give_up = t0 + loader.transport.reconnect_s
        with self.answered:
            while True:
                now = time.monotonic()
                live = lease.id in self.lost or now < self.deadlines.get(lease.id, 0.0)
                if live and loader._unanswered() < self.ack_window:
                    self.loop_waits = False
                    return now - t0
                if not self.loop_waits:  # the acks held back for a fuller request go out now
                    self.loop_waits = True
                    self.to_ack.set()
                if self.errors:
                    raise self.errors[0]
                if now >= give_up:
                    raise self._cut_off(lease, live=live)
                self.answered.wait(0.05)

    def _cut_off(self, lease: HeldLease, *, live: bool) -> RemoteError:
        what = (
            "acknowledgement of the batch yielded last"
            if live
            else f"extension of lease {lease.id} (its deadline passed)"
        )
        cause = f": {self._last_error}" if self._last_error is not None else ""
        return RemoteError(
            f"no answer from {self.loader.url} for {self.loader.transport.reconnect_s:g} s to the "
            f"{what}"
            f"{cause}",
            hint="the batch yielded last may be delivered again (to another client, or after a "
            "resume); raise reconnect_s to wait longer for the server",
        )

    # ------------------------------------------------------------------ threads
    def _fetch(self) -> None:
        conn = self.http(
            self.loader.transport.reconnect_s, timeout=max(10.0, min(60.0, 4 * self.lease_timeout))
        )
        holding = False  # a room for the next lease
        cut_since: float | None = None  # when the replies' bodies began to be cut off
        arrivals = self.arrivals
        try:
            while not (self.stop.is_set() or arrivals.ended):
                self.acked.clear()
                if self._idle():  # nothing left to lease: woken when the loop finishes a lease
                    self.acked.wait(ACK_IDLE_S)
                    continue
                if not (self.direct or holding):
                    holding = self.room.acquire(timeout=0.1)
                    continue
                number = arrivals.sent()  # may wait for the other request (up to 0.1 s)
                if number is None:
                    continue
                sent_at = time.monotonic()  # after the wait: the lease's deadline counts from here
                try:
                    head = self._next(conn)
                except BaseException:
                    arrivals.dropped(number)
                    raise
                if not isinstance(head, Head):  # asked again (None) or the end (a 204)
                    arrivals.dropped(number, end=head is not None)
                    continue
                arrivals.answered(number, self._start(head))
                try:
                    res = conn.body(head, ok=(200,), into=_BODY)
                except RemoteError as exc:  # cut off mid-body: the lease expires and is re-issued
                    arrivals.arrived(number, None)
                    cut_since = self._cut(exc, cut_since)
                    continue
                cut_since = None
                arrivals.arrived(number, self._received(res, sent_at))
                holding = False
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
            self._fail(exc)
        finally:
            conn.close()

    def _starving(self) -> bool:
        """The loop waits for a lease (in :meth:`take`) and the decode thread for a reply: the
        replies, not the decoding, hold the loop up."""
        return self.loop_starves and self.handed_on == self.decoded

    def _hand(self, item: Any) -> None:
        """A lease (or ``END``) on to the loop (direct) or to the decode thread (server-built)."""
        if self.direct:
            self._put(self.ready, item)
        else:
            self.handed_on += 1
            self._put(self.received, item)

    def _start(self, head: Head) -> tuple[int, int]:
        """Where a reply's lease starts (its queue and position); notes the positions leased
        (:meth:`_idle`) before its body is read."""
        queue, _, span = head.response.headers["x-datamill-positions"].partition(":")
        start, _, stop = span.partition("-")
        with self.loader._state_lock:
            self.leased_to = max(self.leased_to, int(stop))
        return int(queue), int(start)

    def _cut(self, exc: RemoteError, since: float | None) -> float:
        """A lease's body was cut off (``exc``): asked again, as a request the connection failed,
        until bodies have been cut off for ``reconnect_s`` (then ``exc`` is raised). Returns when
        they began to be."""
        now = time.monotonic()
        since = now if since is None else since
        if now - since >= self.loader.transport.reconnect_s:
            raise exc
        self._last_error = exc
        return since

    def _received(self, res: Response, sent_at: float) -> Any:
        """The lease of reply ``res`` (to a request sent at ``sent_at``), held from now on: what
        is handed on (server-built: with its body, to decode)."""
        lease = self._lease(res)
        with self.loader._state_lock:
            self.fetched += 1
            self.held[lease.id] = lease  # heartbeats keep it from now on
            if lease.ttl is not None:
                self.ttls[lease.id] = lease.ttl
            self._extend([lease.id], sent_at)
        return lease if self.direct else (lease, res.body)

    def _idle(self) -> bool:
        """Static mode, one slot: every position of the rank's queue is leased to this client and
        the loop still holds leases it has not finished. A request now would only be answered
        ``409`` (the rest is held, by this client); the acknowledgements of those leases go with
        the ack threads (at three quarters of the window, when the loop waits, within
        :data:`ACK_IDLE_S`) and with the request the fetch thread sends once the loop finished every
        lease (answered ``204``, or a lease re-issued after an expiry)."""
        loader = self.loader
        total = loader._queue_total
        return (
            loader.mode == "static"
            and loader.transport.slots == 1
            and total is not None
            and self.leased_to >= total
            and self.finished < self.fetched
        )

    def lease_done(self) -> None:
        """The loop finished a lease (wakes a fetch thread waiting for it, or for the others'
        leases after a ``409``)."""
        self.finished += 1
        self.acked.set()

    def take(self) -> Any:
        """The loop's next lease (``END`` after the last or a failure), from :attr:`ready`."""
        if self.fetchers > 1 and self.ready.empty():  # a second request may go out (FETCHERS)
            self.loop_starves = True
            self.arrivals.poke()
        lease = self.ready.get()
        self.loop_starves = False
        if lease is not END and not self.direct:
            self.room.release()
        return lease

    def _decode(self) -> None:
        """Server-built mode: each lease's batches from its body, handed to the loop in order."""
        collate = self.loader.lease_collate
        try:
            while not self.stop.is_set():
                try:
                    item = self.received.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is END:
                    self._put(self.ready, END)
                    return
                lease, body = item
                records = list(pa.ipc.open_stream(body))
                if collate is None:
                    lease.batches = [pa.Table.from_batches([b]) for b in records]
                else:
                    lease.batches = collate(records)
                self._put(self.ready, lease)
                self.decoded += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
            self._fail(exc)

    def _next(self, conn: Http) -> Head | Response | None:
        """One lease request: a lease's reply (its body not read yet), the end's (``204``), or
        ``None`` to ask again. With :attr:`piggyback` it carries the acks pending and not in flight
        (their answer, ``X-Datamill-Acks``, is recorded as an ack request's); otherwise
        acknowledgements go by the ack threads alone."""
        loader = self.loader
        query: list[tuple[str, Any]] = [
            ("client", loader.client_id),
            ("rank", loader.rank),
            ("slot", loader.transport.slot),
            ("slots", loader.transport.slots),
        ]
        if self.direct:
            query.append(("transport", "direct"))
        sent, ranges = self._carried()
        query += [("ack", f"{lid}:{fence}:{a}-{b}") for lid, fence, a, b in ranges]
        try:
            sent_at = time.monotonic()
            head = conn.head("GET", f"{self.path}/next", query=query)
            status = head.response.status
            res = head if status == 200 else conn.body(head, ok=(204, 409))
            if sent:
                self.carried_at = sent_at
                self._answered(head.response.headers.get("x-datamill-acks", ""), sent, sent_at)
        except RemoteError as exc:
            now = time.monotonic()
            if self._deadline_503 is None:
                self._deadline_503 = now + loader.transport.reconnect_s
            if exc.status != 503 or now > self._deadline_503:
                raise
            self.stop.wait(1.0)  # the journal cannot be written now (a full disk): wait and retry
            return None
        finally:
            self._landed(sent)
        self._deadline_503 = None
        if status == 409:  # others hold the rest: ask again in 20 ms, or when the loop acks
            self.acked.wait(0.02)  # (the epoch's last lease done: its acks end the epoch now)
            self.acked.clear()
            return None
        return res

    def _carried(self) -> tuple[list[tuple[str, str, int]], list[list[Any]]]:
        """With :attr:`piggyback`: the acks a lease request carries (pending, not in another request
        in flight; none when they would make more than :data:`MAX_QUERY_ACKS` ranges), marked in
        flight, and their ranges."""
        if not self.piggyback:
            return [], []
        with self.loader._state_lock:  # the loop waits for it at its next batch: kept short
            pending, busy = self.loader._unflushed, self.in_flight
            sent = [x for x in pending if x not in busy] if busy else list(pending)
            ranges = ack_ranges(sent) if sent else []
            if not sent or len(ranges) > MAX_QUERY_ACKS:
                return [], []
            busy.update(sent)
        return sent, ranges

    def _landed(self, sent: Sequence[tuple[str, str, int]]) -> None:
        """A request carrying ``sent`` was answered (or failed: they are sent again)."""
        if sent:
            with self.answered:
                self.in_flight.difference_update(sent)
                self.answered.notify_all()

    def _answered(self, header: str, sent: Sequence[tuple[str, str, int]], sent_at: float) -> None:
        """Record the server's answer to acks ``sent`` (a request sent at ``sent_at``): forget them,
        note lost leases, move the deadlines of the live ones."""
        self.loader._record_acks(header, sent, self.held, self.lost)
        statuses = dict(item.rpartition("=")[::2] for item in filter(None, header.split(",")))
        with self.answered:
            self._extend([lid for lid, st in statuses.items() if st == "ok"], sent_at)

    def _lease(self, res: Response) -> HeldLease:
        h = res.headers
        q, _, span = h["x-datamill-positions"].partition(":")
        return HeldLease(
            h["x-datamill-lease"],
            h["x-datamill-fence"],
            int(q),
            int(span.split("-")[0]),
            [int(u) for u in h["x-datamill-units"].split(",")],
            [],  # server-built: decoded by the decode thread
            int(h.get("x-datamill-done", "0")),
            h.get("x-datamill-runs", ""),
            collated=not self.direct and self.loader.lease_collate is not None,
            ttl=float(h[_TTL]) if _TTL in h else None,
        )

    def _short_timeout(self) -> float:
        """The socket timeout of the ack and heartbeat connections: a request the server (or the
        network) does not answer within it is sent again on a new connection."""
        return max(2.0, min(30.0, self.lease_timeout))

    def _acker(self) -> None:
        conn = self.http(0.0, timeout=self._short_timeout())
        try:
            while not self.stop.is_set():
                # piggy-backing, acks wait for the next lease request unless the loop waits for one
                every = ACK_IDLE_S if self.piggyback and not self.loop_waits else ACK_FLUSH_S
                woken = self.to_ack.wait(every)
                self.to_ack.clear()
                if woken and not self._due():
                    continue  # sent at the next batch, when the loop waits, or within `every`
                if not woken and time.monotonic() - self.carried_at < every:
                    continue  # the lease requests carry them (one did within `every`)
                try:
                    self.flush(conn)
                except RemoteError as exc:
                    self._last_error = exc
                    self.stop.wait(ACK_FLUSH_S)  # the server is unreachable or restarting: again
        except BaseException as exc:  # noqa: BLE001 - a bug here: the waiting loop raises it
            self._fail(exc)
        finally:
            conn.close()

    def taken(self) -> None:
        """The loop was handed a batch (its ack is pending): wake an ack thread when a request is
        due (:meth:`_due`), not on every batch (each wake-up is a thread switch)."""
        if self.send_at <= 1 or self.loop_waits:
            self.to_ack.set()
            return
        pending = len(self.loader._unflushed) - len(self.in_flight)  # a hint: ACK_FLUSH_S bounds
        if pending >= self.send_at:
            self.to_ack.set()

    def _due(self) -> bool:
        """Whether a woken ack thread sends now: :attr:`send_at` acks are pending and not in
        flight, or the loop waits for an answer (or the feed stops). With :attr:`piggyback`, a loop
        that the answer to the acks in flight lets go on does not make a second request (it would
        wait behind the first on the server, and add to its load when it is slow): the ack thread
        sends those pending after :data:`ACK_FLUSH_S` if no answer came (:meth:`_acker`)."""
        if self.stop.is_set() or self.send_at <= 1:
            return True
        with self.loader._state_lock:
            in_flight = len(self.in_flight)
            pending = len(self.loader._unflushed) - in_flight
        if self.loop_waits:
            return not (self.piggyback and in_flight and pending < self.ack_window)
        return pending >= self.send_at

    def _fail(self, exc: BaseException) -> None:
        """A thread failed: the loop raises ``exc`` (waiting for a batch or an answer)."""
        self.errors.append(exc)
        with self.answered:
            self.answered.notify_all()
        self._put(self.ready, END)

    def _heartbeat(self) -> None:
        conn = self.http(0.0, timeout=self._short_timeout())
        every = max(0.1, min(1.0, self.lease_timeout / 4))
        try:
            while not self.stop.wait(every):
                try:
                    self._beat(conn)
                except RemoteError as exc:
                    self._last_error = exc  # the server may be restarting (or out of disk): again
        except BaseException as exc:  # noqa: BLE001 - a bug here: the waiting loop raises it
            self._fail(exc)
        finally:
            conn.close()

    def _beat(self, conn: Http) -> None:
        loader = self.loader
        with loader._state_lock:
            ids = [[x.id, x.fence] for x in self.held.values()]
        sent_at = time.monotonic()
        res = conn.request(
            "POST",
            f"{self.path}/heartbeat",
            ok=(200, 409, 410),
            body={
                "client": loader.client_id,
                "leases": ids,
                "stall_s": loader.stall_s,
                "batches": loader.stats["batches"],
            },
        )
        answer = res.json()
        with self.answered:
            self.lost.update(answer.get("lost", []))
            self.lost.update(answer.get("refused", []))
            self._extend([lid for lid, _ in ids], sent_at)

    def flush_all(self) -> bool:
        """Send every pending ack now, in one request on a new connection, without retrying: whether
        all of them were journaled (``False``: the caller waits for the epoch's end as usual, while
        the threads retry and, after a server restart, reclaim the leases)."""
        if not self.loader._pending():
            return True
        with self.answered:  # the ack threads' requests in flight answered first (or given up)
            self.answered.wait_for(lambda: not self.in_flight, timeout=self._short_timeout())
        conn = self.http(0.0, timeout=self._short_timeout())
        try:
            ok = self.flush(conn)
        except RemoteError:
            return False
        finally:
            conn.close()
        return ok and not self.loader._pending()

    def flush(self, conn: Http) -> bool:
        """Send the consumed batches not yet journaled (one request, one journal transaction):
        whether the server answered 200."""
        loader = self.loader
        with loader._state_lock:  # those not in another request in flight
            sent = [x for x in loader._unflushed if x not in self.in_flight]
            self.in_flight.update(sent)
        if not sent:
            return True
        try:
            sent_at = time.monotonic()
            res = conn.request(
                "POST",
                f"{self.path}/ack",
                ok=(200, 409, 410),
                body={"client": loader.client_id, "acks": ack_ranges(sent)},
            )
            acks = res.json().get("acks", {})
            self._answered(",".join(f"{k}={v}" for k, v in acks.items()), sent, sent_at)
        finally:
            self._landed(sent)
        return res.status == 200


class Arrivals:
    """The leases of requests in flight at once, handed on in the order the server granted them.

    The server grants a client's leases in ascending positions of their queue (a lease expired and
    granted again aside), and grants a request's lease before it sends the reply's headers. So a
    lease goes on once every request that was in flight when its headers arrived has its answer,
    and no lease received and not handed on starts before it; the end of the epoch (a ``204``)
    once nothing else is in flight or waiting. ``hand(x)`` is called under a lock, in that order.

    A request goes out beside another one on its way only while ``starving()`` (the loop waits for
    the replies: a loop that has a lease, or one being decoded, is not helped by a second request,
    whose work then takes CPU from it), and not beside the epoch's first one, so that its lease (the
    loop's first batch) waits for no other.

    Examples:
        >>> out = []
        >>> a = Arrivals(out.append)
        >>> a.dropped(a.sent())  # the epoch's first request, answered 409: the others may go
        >>> one, two = a.sent(), a.sent()
        >>> a.answered(two, (0, 16))
        >>> a.arrived(two, "lease 16-32")
        >>> a.answered(one, (0, 0))
        >>> out
        []
        >>> a.arrived(one, "lease 0-16")
        >>> out
        ['lease 0-16', 'lease 16-32']
    """

    def __init__(
        self, hand: Callable[[Any], None], starving: Callable[[], bool] = lambda: True
    ) -> None:
        self._hand, self._starving = hand, starving
        self._lock = threading.Condition()
        self._heard = False  # a request was answered
        self._numbers = itertools.count()
        self._flying: set[int] = set()  # requests sent, not answered
        # answered with a lease: number -> its (queue, start), the requests in flight then
        self._heads: dict[int, tuple[tuple[int, int], set[int]]] = {}
        self._bodies: dict[int, Any] = {}  # of those, read: what to hand on (None: cut off)
        self.ended = False  # a reply said the epoch is over (204): no more requests
        self._end_handed = False

    def sent(self, wait: float = 0.1) -> int | None:
        """A request goes out: its number (``None``: not yet, after ``wait`` seconds)."""
        with self._lock:
            if not self._lock.wait_for(self._may_send, timeout=wait):
                return None
            n = next(self._numbers)
            self._flying.add(n)
            return n

    def _may_send(self) -> bool:
        if not self._flying and len(self._heads) == len(self._bodies):  # none on its way
            return True
        return self._heard and self._starving()

    def poke(self) -> None:
        """``starving()`` may have changed: a request waiting to go out looks again."""
        with self._lock:
            self._lock.notify_all()

    def answered(self, number: int, start: tuple[int, int]) -> None:
        """Request ``number``'s reply has its headers: a lease starting at ``start`` (its queue
        and position)."""
        with self._lock:
            self._flying.discard(number)
            self._heads[number] = (start, set(self._flying))
            self._heard = True
            self._lock.notify_all()
            self._flush()

    def dropped(self, number: int, *, end: bool = False) -> None:
        """Request ``number`` has no lease: asked again or failed, or (``end``) the epoch is
        over."""
        with self._lock:
            self._flying.discard(number)
            self.ended = self.ended or end
            self._heard = True
            self._lock.notify_all()
            self._flush()

    def arrived(self, number: int, item: Any) -> None:
        """Request ``number``'s lease has its body: ``item`` to hand on (``None``: cut off)."""
        with self._lock:
            self._bodies[number] = item
            self._lock.notify_all()
            self._flush()

    def _flush(self) -> None:
        while self._heads:
            number = min(self._heads, key=lambda n: self._heads[n][0])
            if number not in self._bodies or self._heads[number][1] & self._flying:
                return
            del self._heads[number]
            item = self._bodies.pop(number)
            if item is not None:
                self._hand(item)
        if self.ended and not self._flying and not self._end_handed:
            self._end_handed = True
            self._hand(END)
