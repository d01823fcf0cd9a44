"""The background threads of one :class:`~datamill.serve.remote.RemoteLoader` epoch.

* **fetch**: asks for the next lease (the consumed batches' acks ride on the request) and keeps
  ``prefetch`` leases ahead of the training loop, so the round trips overlap the loop; in
  server-built mode a lease arrives with its batches (an Arrow IPC stream, read without copying;
  for a numpy or torch collate, collated here for the whole lease at once, column by column, while
  the loop consumes the previous lease), in direct mode with its runs only (the loader builds them
  as the loop asks, see :class:`~datamill.serve.data.direct.RunStream`).
* **heartbeat**: flushes the consumed batches' acks every :data:`ACK_FLUSH_S` seconds while some are
  pending, extends the leases held (reporting the stall time) and, after a server restart, reclaims
  them with their fences within the grace period.

The training loop takes :class:`HeldLease` objects from :attr:`LeaseFeed.ready` (``END`` when the
epoch is done or a thread failed: :meth:`LeaseFeed.raise_error` re-raises its error there).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from datamill.serve.client import Http, RemoteError, Response

__all__ = ["ACK_FLUSH_S", "END", "SESSION_HEADER", "HeldLease", "LeaseFeed", "ack_ranges"]

ACK_FLUSH_S = 0.05
"""Seconds between ack flushes of the heartbeat thread while acks are pending (the contract: at
most 0.1 s)."""
SESSION_HEADER = "X-Datamill-Session"
END: Any = object()
"""Put on :attr:`LeaseFeed.ready` after the last lease (or after a thread failed)."""
_MAX_ACKS = 64  # ack runs carried by one lease request (the server's bound)


class FeedOwner(Protocol):
    """What a :class:`LeaseFeed` uses of its :class:`~datamill.serve.remote.RemoteLoader` (a
    Protocol, so this module does not import the loader that imports it)."""

    url: str
    key: str | None
    verify: str | os.PathLike[str] | None
    session: str
    client_id: str
    rank: int
    slot: int
    slots: int
    prefetch: int
    reconnect_s: float
    stall_s: float
    stats: dict[str, Any]
    lease_collate: Callable[[list[pa.RecordBatch]], list[Any]] | None
    _state_lock: threading.Lock

    def _pending(self) -> list[tuple[str, str, int]]: ...

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


def ack_ranges(acks: Any) -> list[list[Any]]:
    """Consumed ``(lease, fence, position)`` as ``[lease, fence, start, stop]`` runs.

    Examples:
        >>> ack_ranges([("a", "f", 2), ("a", "f", 1), ("b", "g", 0)])
        [['a', 'f', 1, 3], ['b', 'g', 0, 1]]
    """
    out: list[list[Any]] = []
    for lid, fence, pos in sorted(set(acks), key=lambda x: (x[0], x[2])):
        if out and out[-1][0] == lid and out[-1][3] == pos:
            out[-1][3] = pos + 1
        else:
            out.append([lid, fence, pos, pos + 1])
    return out


class LeaseFeed:
    """The fetch, build (direct mode) and heartbeat threads of one epoch of ``loader``.

    Args:
        loader: the loader (its connection settings, ack bookkeeping and stats).
        it_id: the iteration.
        lease_timeout: the iteration's lease lifetime (heartbeats come at a quarter of it, 0.1-1 s).
        direct: ask for direct leases (their runs, no batches).
    """

    def __init__(
        self,
        loader: FeedOwner,
        it_id: str,
        lease_timeout: float,
        *,
        direct: bool = False,
    ) -> None:
        self.loader, self.lease_timeout, self.direct = loader, float(lease_timeout), direct
        self.path = f"/api/v1/iterations/{it_id}"
        self.ready: queue.Queue[Any] = queue.Queue(maxsize=loader.prefetch)
        self.held: dict[str, HeldLease] = {}  # received, not all consumed and flushed
        self.lost: set[str] = set()
        self.stop = threading.Event()
        self.acked = threading.Event()  # set when the loop finished a lease (wakes a waiting fetch)
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        self._deadline_503: float | None = None  # while the server answers 503 (journal unwritable)

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start the threads."""
        for name, target in (("fetch", self._fetch), ("heartbeat", self._heartbeat)):
            t = threading.Thread(target=target, name=f"datamill-serve-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop the threads; then flush the acks still pending (for up to 10 s)."""
        self.stop.set()
        self.acked.set()
        for t in self._threads:
            t.join(timeout=5)
        if self.errors or not self.loader._pending():
            return
        wait = min(self.loader.reconnect_s, 10.0)
        conn = self.http(wait)
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

    def http(self, retry_s: float) -> Http:
        """A new connection of this loader's session."""
        loader = self.loader
        h = Http(loader.url, loader.key, retry_s=retry_s, verify=loader.verify)
        h.headers[SESSION_HEADER] = loader.session
        return h

    def _put(self, q: queue.Queue[Any], item: Any) -> None:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # ------------------------------------------------------------------ threads
    def _fetch(self) -> None:
        conn = self.http(self.loader.reconnect_s)
        try:
            while not self.stop.is_set():
                res = self._next(conn)
                if res is None:
                    continue
                if res.status == 204:
                    self._put(self.ready, END)
                    return
                lease = self._lease(res)
                with self.loader._state_lock:
                    self.held[lease.id] = lease  # heartbeats keep it from now on
                self._put(self.ready, lease)
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
            self.errors.append(exc)
            self._put(self.ready, END)
        finally:
            conn.close()

    def _next(self, conn: Http) -> Response | None:
        """One lease request carrying the pending acks: the reply, or ``None`` to ask again."""
        loader = self.loader
        query: list[tuple[str, Any]] = [
            ("client", loader.client_id),
            ("rank", loader.rank),
            ("slot", loader.slot),
            ("slots", loader.slots),
        ]
        if self.direct:
            query.append(("transport", "direct"))
        sent = loader._pending()[:_MAX_ACKS]
        query += [("ack", f"{lid}:{f}:{a}-{b}") for lid, f, a, b in ack_ranges(sent)][:_MAX_ACKS]
        try:
            res = conn.request("GET", f"{self.path}/next", ok=(200, 204, 409), query=query)
        except RemoteError as exc:
            now = time.monotonic()
            if self._deadline_503 is None:
                self._deadline_503 = now + loader.reconnect_s
            if exc.status != 503 or now > self._deadline_503:
                raise
            self.stop.wait(1.0)  # the journal cannot be written now (a full disk): wait and retry
            return None
        self._deadline_503 = None
        loader._record_acks(res.headers.get("x-datamill-acks", ""), sent, self.held, self.lost)
        if res.status == 409:  # others hold the rest: ask again in 20 ms, or when the loop acks
            self.acked.wait(0.02)  # (the epoch's last lease done: its acks end the epoch now)
            self.acked.clear()
            return None
        return res

    def _lease(self, res: Response) -> HeldLease:
        h = res.headers
        batches: list[Any] = []
        collate = self.loader.lease_collate
        if not self.direct:
            records = list(pa.ipc.open_stream(res.body))
            if collate is None:
                batches = [pa.Table.from_batches([b]) for b in records]
            else:
                batches = collate(records)
        q, _, span = h["x-datamill-positions"].partition(":")
        return HeldLease(
            h["x-datamill-lease"],
            h["x-datamill-fence"],
            int(q),
            int(span.split("-")[0]),
            [int(u) for u in h["x-datamill-units"].split(",")],
            batches,
            int(h.get("x-datamill-done", "0")),
            h.get("x-datamill-runs", ""),
            collated=not self.direct and collate is not None,
        )

    def _heartbeat(self) -> None:
        conn = self.http(0.0)
        every = max(0.1, min(1.0, self.lease_timeout / 4))
        last = time.monotonic()
        try:
            while not self.stop.wait(ACK_FLUSH_S):
                try:
                    self.flush(conn)
                    if time.monotonic() - last >= every:
                        last = time.monotonic()
                        self._beat(conn)
                except RemoteError:
                    continue  # the server may be restarting (or out of disk): try again next round
        finally:
            conn.close()

    def _beat(self, conn: Http) -> None:
        loader = self.loader
        with loader._state_lock:
            ids = [[x.id, x.fence] for x in self.held.values()]
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
        with loader._state_lock:
            self.lost.update(answer.get("lost", []))
            self.lost.update(answer.get("refused", []))

    def flush_all(self) -> bool:
        """Send every pending ack now, in one request on a new connection, without retrying: whether
        all of them were journaled (``False``: the caller waits for the epoch's end as usual, while
        the threads retry and, after a server restart, reclaim the leases)."""
        loader = self.loader
        sent = loader._pending()
        if not sent:
            return True
        conn = self.http(0.0)
        try:
            res = conn.request(
                "POST",
                f"{self.path}/ack",
                ok=(200, 409, 410),
                body={"client": loader.client_id, "acks": ack_ranges(sent)},
            )
        except RemoteError:
            return False
        finally:
            conn.close()
        acks = res.json().get("acks", {})
        loader._record_acks(
            ",".join(f"{k}={v}" for k, v in acks.items()), sent, self.held, self.lost
        )
        return res.status == 200 and not loader._pending()

    def flush(self, conn: Http) -> None:
        """Send the consumed batches not yet journaled (one request, one journal transaction)."""
        loader = self.loader
        sent = loader._pending()
        if not sent:
            return
        res = conn.request(
            "POST",
            f"{self.path}/ack",
            ok=(200, 409, 410),
            body={"client": loader.client_id, "acks": ack_ranges(sent)},
        )
        acks = res.json().get("acks", {})
        loader._record_acks(
            ",".join(f"{k}={v}" for k, v in acks.items()), sent, self.held, self.lost
        )
