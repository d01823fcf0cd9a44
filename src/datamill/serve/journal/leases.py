"""The journal's lease and acknowledgement writes: table ``leases`` (every live lease, reclaimed
after a restart), the ``done`` rows an ack or a rewind appends (:func:`rewind_write`; never
rewritten), each round trip's records as one write, group-committed (:class:`GroupCommit`), a full
disk as :class:`UnavailableError` (HTTP 503, nothing kept). See ``docs/serving-delivery.md``.
"""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from datamill.core.errors import DatamillError
from datamill.core.ragged import runs
from datamill.serve.journal.schema import sealed
from datamill.serve.journal.store import DONE_INSERT, Journal, done_mask
from datamill.serve.protocol.state import Lease

__all__ = [
    "RETRY_AFTER_S",
    "GroupCommit",
    "UnavailableError",
    "Write",
    "journaled_leases",
    "leases_write",
    "rewind_write",
]

RETRY_AFTER_S = 5
"""Seconds a client is told to wait after a 503 (the journal could not be written)."""


class UnavailableError(DatamillError, OSError):
    """The journal cannot be written now (disk full, file size limit): HTTP 503 with
    ``Retry-After``."""


def _full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return True
    text = str(exc).lower()
    return isinstance(exc, sqlite3.Error) and (
        "full" in text or "disk i/o" in text or "too large" in text
    )


@dataclass(slots=True, eq=False)
class Write:
    """One request's journal write (a function of the connection, run inside a transaction) and,
    once it is ``done``, its outcome (``error``); its waiter's future is resolved then."""

    fn: Callable[[sqlite3.Connection], None]
    done: bool = False
    error: BaseException | None = None
    future: asyncio.Future[None] | None = None


class GroupCommit:
    """The journal's lease writes, **group-committed** by one committer thread: :meth:`submit`
    queues (under the lock that ordered the in-memory change, so the journal applies writes in that
    order), :meth:`wait` awaits the transaction holding the write. A failed batch is retried one
    write per transaction, so a failure (:class:`UnavailableError`) is its request's alone.

    Examples:
        >>> import asyncio, tempfile
        >>> j = Journal(tempfile.mkdtemp()); g = GroupCommit(j)
        >>> w = g.submit(leases_write("it", done={"l.1": [(0, 2)]}))
        >>> asyncio.run(g.wait(w)); j.done("it")
        [(0, 2, 'l.1')]
        >>> g.close(); j.close()
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[Write] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.commits = 0  # transactions committed (a benchmark divides writes by it)
        self.writes = 0

    def submit(self, fn: Callable[[sqlite3.Connection], None]) -> Write:
        """Queue a write (never blocks on I/O); wait for it before replying."""
        w = Write(fn)
        with self._cv:
            if self._closed:
                raise RuntimeError("the journal's writer is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="datamill-journal-writer", daemon=True
                )
                self._thread.start()
            self._queue.append(w)
            if len(self._queue) == 1:
                self._cv.notify_all()
        return w

    def queued(self) -> int:
        """Writes waiting for the next transaction."""
        with self._cv:
            return len(self._queue)

    async def wait(self, w: Write) -> None:
        """Return once ``w`` is committed (the committer thread resolves a future).

        Raises:
            UnavailableError: the disk is full or a file size limit was reached (nothing was
            written).
        """
        with self._cv:
            if not w.done:
                w.future = asyncio.get_running_loop().create_future()
        if w.future is not None:
            await asyncio.shield(w.future)  # a cancelled request still gets its write committed
        if w.error is not None:
            raise w.error

    def close(self) -> None:
        """Commit what is queued and stop the committer thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            self._commit(batch)
            futures: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
            with self._cv:
                for w in batch:
                    w.done = True
                    if w.future is not None:
                        futures.setdefault(w.future.get_loop(), []).append(w.future)
            for loop, fs in futures.items():  # one wake-up per event loop and batch
                try:
                    loop.call_soon_threadsafe(_resolve, fs)
                except RuntimeError:  # that loop is closed: nobody waits there any more
                    pass

    def _commit(self, batch: list[Write]) -> None:
        try:
            self._transaction(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiters, raised in their task
            if len(batch) == 1:
                batch[0].error = self._wrap(exc)
                return
            for w in batch:  # one write per transaction: a failure is its own request's
                try:
                    self._transaction([w])
                except BaseException as one:  # noqa: BLE001 - as above
                    w.error = self._wrap(one)

    def _transaction(self, batch: list[Write]) -> None:
        db = self.journal._db
        with self.journal._lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                for w in batch:
                    w.fn(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        self.commits += 1
        self.writes += len(batch)

    def _wrap(self, exc: BaseException) -> BaseException:
        if isinstance(exc, (sqlite3.Error, OSError)) and _full(exc):
            err = UnavailableError(
                f"{self.journal.path}: cannot write the journal ({exc})",
                hint="free disk space on the state folder's file system; "
                f"retry in {RETRY_AFTER_S} s",
            )
            err.__cause__ = exc
            return err
        return exc


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


def leases_write(
    it_id: str,
    *,
    add: Sequence[Lease] = (),
    drop: Sequence[str] = (),
    done: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> Callable[[sqlite3.Connection], None]:
    """The write that forgets leases ``drop``, journals ``done`` unit runs (per lease id) and
    inserts ``add`` (for :meth:`GroupCommit.submit`; the rows are made now, not when it runs)."""
    now = time.time()
    rows = [
        sealed((it_id, int(a), int(b), lease_id, now, 1))
        for lease_id, rs in (done or {}).items()
        for a, b in rs
    ]
    added = [
        sealed(
            (
                x.id,
                it_id,
                x.fence_hash,
                x.session,
                x.client,
                x.queue,
                x.start,
                x.stop,
                x.slot,
                now,
                x.owner,
            )
        )
        for x in add
    ]
    holders = [(x.id, it_id, x.client, x.session) for x in add]
    dropped = [(x,) for x in drop]

    def fn(db: sqlite3.Connection) -> None:
        if dropped:
            db.executemany("DELETE FROM leases WHERE id = ?", dropped)
        if rows:
            db.executemany(DONE_INSERT, rows)
        if added:
            db.executemany(
                "INSERT OR REPLACE INTO leases (id, iteration, fence, session, client, queue, "
                "start, stop, slot, issued, owner, crc) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                added,
            )
            db.executemany(
                "INSERT OR IGNORE INTO lease_holders (lease, iteration, client, session) "
                "VALUES (?, ?, ?, ?)",
                holders,
            )

    return fn


def rewind_write(
    it_id: str,
    *,
    total: int,
    drop: NDArray[np.int64],
    keep: NDArray[np.int64],
    lease: str,
) -> Callable[[sqlite3.Connection], None]:
    """The write of a rewind: the done set becomes (done - ``drop``) | ``keep``, **appended** as
    rows of sign -1 (units pending again) and +1 (units done), computed inside the transaction from
    the journal's own done set, so the acknowledgements committed before it (other ranks' acks in
    flight) are kept: nothing is ever rewritten from a memory snapshot."""
    now = time.time()

    def fn(db: sqlite3.Connection) -> None:
        done = done_mask(db, it_id, total)
        new = done.copy()
        new[drop] = False
        new[keep] = True
        rows = [sealed((it_id, a, b, lease, now, -1)) for a, b in runs(np.flatnonzero(done & ~new))]
        rows += [sealed((it_id, a, b, lease, now, 1)) for a, b in runs(np.flatnonzero(new & ~done))]
        if not rows:  # a rewind that changes nothing is still recorded (the rewinds' count)
            rows = [sealed((it_id, 0, 0, lease, now, 1))]
        db.executemany(DONE_INSERT, rows)

    return fn


def journaled_leases(journal: Journal, it_id: str) -> list[Lease]:
    """The leases of ``it_id`` live when the journal was last written (to restore after a
    restart)."""
    with journal._lock:
        rows = journal._db.execute(
            "SELECT id, fence, session, client, queue, start, stop, slot, owner FROM leases "
            "WHERE iteration = ? ORDER BY rowid",
            (it_id,),
        ).fetchall()
    return [
        Lease(i, "", q, a, b, c, 0.0, 0.0, fence_hash=f, session=s, slot=slot, owner=o)
        for i, f, s, c, q, a, b, slot, o in rows
    ]
