"""The journal's lease and acknowledgement writes (kept apart from :mod:`datamill.serve.journal`).

Table ``leases``: every live lease of every iteration (id, hashes of its fence and session, holder,
queue positions), so that after a restart the holders can reclaim them (the grace period). A take
inserts its lease; an ack writes its ``done`` rows and deletes the leases it finishes; revoked and
expired leases are deleted with the next write: each in **one transaction**, committed before the
reply. A full disk (or a file size limit) is :class:`UnavailableError` (HTTP 503), and nothing of
that write is kept, in the journal or in memory.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Mapping, Sequence

from datamill.core.errors import DatamillError
from datamill.serve.iteration import Lease
from datamill.serve.journal import Journal

__all__ = ["RETRY_AFTER_S", "UnavailableError", "ensure_tables", "journaled_leases", "write_leases"]

RETRY_AFTER_S = 5
"""Seconds a client is told to wait after a 503 (the journal could not be written)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, iteration TEXT NOT NULL,
    fence TEXT NOT NULL,
    session TEXT NOT NULL, client TEXT NOT NULL, queue INTEGER NOT NULL, start INTEGER NOT NULL,
    stop INTEGER NOT NULL, slot INTEGER NOT NULL, issued REAL NOT NULL,
    owner TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS leases_iteration ON leases(iteration);
CREATE TABLE IF NOT EXISTS lease_holders (lease TEXT PRIMARY KEY, iteration TEXT NOT NULL,
    client TEXT NOT NULL);
"""
# lease_holders: which client took each lease, kept after the lease ends (lineage:
# datamill.serve.trace)


class UnavailableError(DatamillError, OSError):
    """The journal cannot be written now (disk full, file size limit): HTTP 503 with
    ``Retry-After``."""


def ensure_tables(journal: Journal) -> None:
    """Create the ``leases`` table if missing."""
    with journal._lock:
        journal._db.executescript(_SCHEMA)


def _full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return True
    text = str(exc).lower()
    return isinstance(exc, sqlite3.Error) and (
        "full" in text or "disk i/o" in text or "too large" in text
    )


def write_leases(
    journal: Journal,
    it_id: str,
    *,
    add: Sequence[Lease] = (),
    drop: Sequence[str] = (),
    done: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> None:
    """In one transaction: forget leases ``drop``, journal ``done`` unit runs (per lease id), insert
    ``add``.

    Raises:
        UnavailableError: the disk is full or a file size limit was reached (nothing was written).
    """
    now = time.time()
    rows = [
        (it_id, int(a), int(b), lease_id, now)
        for lease_id, rs in (done or {}).items()
        for a, b in rs
    ]
    db = journal._db
    with journal._lock:
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                if drop:
                    db.executemany("DELETE FROM leases WHERE id = ?", [(x,) for x in drop])
                if rows:
                    db.executemany(
                        "INSERT INTO done (iteration, start, stop, lease, at) VALUES (?, ?, ?, "
                        "?, ?)",
                        rows,
                    )
                if add:
                    db.executemany(
                        "INSERT OR REPLACE INTO leases (id, iteration, fence, session, client, "
                        "queue, "
                        "start, stop, slot, issued, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
                        "?, ?)",
                        [
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
                            for x in add
                        ],
                    )
                    db.executemany(
                        "INSERT OR IGNORE INTO lease_holders (lease, iteration, client) VALUES "
                        "(?, ?, ?)",
                        [(x.id, it_id, x.client) for x in add],
                    )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            if _full(exc):
                raise UnavailableError(
                    f"{journal.path}: cannot write the journal ({exc})",
                    hint="free disk space on the state folder's file system; "
                    f"retry in {RETRY_AFTER_S} s",
                ) from exc
            raise


def journaled_leases(journal: Journal, it_id: str) -> list[Lease]:
    """The leases of ``it_id`` live when the journal was last written (to restore after a
    restart)."""
    with journal._lock:
        rows = journal._db.execute(
            "SELECT id, fence, session, client, queue, start, stop, slot, owner FROM leases "
            "WHERE iteration = ? "
            "ORDER BY rowid",
            (it_id,),
        ).fetchall()
    return [
        Lease(
            str(r[0]),
            "",
            int(r[4]),
            int(r[5]),
            int(r[6]),
            str(r[3]),
            0.0,
            0.0,
            fence_hash=str(r[1]),
            session=str(r[2]),
            slot=int(r[7]),
            owner=str(r[8]),
        )
        for r in rows
    ]
