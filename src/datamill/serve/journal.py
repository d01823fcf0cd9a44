"""The server's durable state: one SQLite database (WAL) in the state folder.

Tables: ``keys`` (API key id, sha256 of the secret, role, revoked), ``datasets`` (id, name, resolved
path), ``iterations`` (id, idempotency key, epoch, config JSON) and ``done`` (acknowledged unit runs,
one row per ack, with the lease id so a repeated ack after a restart stays idempotent). Leases are
never stored: after a restart, pending = all - done and the leases in flight are unknown (410).
Every write commits before the server replies.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["DB_NAME", "Journal"]

DB_NAME = "datamill-serve.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, hash TEXT NOT NULL, role TEXT NOT NULL,
    created REAL NOT NULL, revoked REAL, note TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS datasets (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, path TEXT NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS iterations (id TEXT PRIMARY KEY, key TEXT NOT NULL, epoch INTEGER NOT NULL,
    config TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS done (iteration TEXT NOT NULL, start INTEGER NOT NULL, stop INTEGER NOT NULL,
    lease TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS done_iteration ON done(iteration);
CREATE TABLE IF NOT EXISTS cancelled (iteration TEXT PRIMARY KEY, at REAL NOT NULL);
"""


class Journal:
    """Thread-safe access to the state database (one connection, WAL, ``synchronous=FULL``).

    Examples:
        >>> import tempfile
        >>> j = Journal(tempfile.mkdtemp())
        >>> j.add_done("it", [(0, 2)], lease="b.1"); j.done("it")
        [(0, 2, 'b.1')]
        >>> j.close()
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / DB_NAME
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    def _exec(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)).fetchall())

    # ------------------------------------------------------------------ keys
    def add_key(self, key_id: str, digest: str, role: str, note: str = "") -> None:
        """Store a new key's id, secret digest and role."""
        self._exec("INSERT INTO keys (id, hash, role, created, note) VALUES (?, ?, ?, ?, ?)",
                   (key_id, digest, role, time.time(), note))

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key (revoked ones too), without secrets."""
        rows = self._exec("SELECT id, hash, role, created, revoked, note FROM keys ORDER BY created")
        return [{"id": r[0], "hash": r[1], "role": r[2], "created": r[3], "revoked": r[4], "note": r[5]}
                for r in rows]

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; False when unknown or already revoked."""
        with self._lock:
            cur = self._db.execute("UPDATE keys SET revoked = ? WHERE id = ? AND revoked IS NULL",
                                   (time.time(), key_id))
            return cur.rowcount > 0

    # ------------------------------------------------------------------ datasets
    def add_dataset(self, ds_id: str, name: str, path: str) -> None:
        """Register a dataset (id and name unique)."""
        self._exec("INSERT INTO datasets (id, name, path, created) VALUES (?, ?, ?, ?)",
                   (ds_id, name, path, time.time()))

    def datasets(self) -> list[dict[str, Any]]:
        """Every registered dataset."""
        rows = self._exec("SELECT id, name, path, created FROM datasets ORDER BY created")
        return [{"id": r[0], "name": r[1], "path": r[2], "created": r[3]} for r in rows]

    # ------------------------------------------------------------------ iterations
    def add_iteration(self, it_id: str, key: str, epoch: int, config: dict[str, Any]) -> None:
        """Journal a new iteration (before the reply that names it)."""
        self._exec("INSERT INTO iterations (id, key, epoch, config, created) VALUES (?, ?, ?, ?, ?)",
                   (it_id, key, epoch, json.dumps(config, sort_keys=True), time.time()))

    def iterations(self) -> list[dict[str, Any]]:
        """Every iteration with its config."""
        rows = self._exec("SELECT id, key, epoch, config, created FROM iterations ORDER BY created")
        return [{"id": r[0], "key": r[1], "epoch": r[2], "config": json.loads(r[3]), "created": r[4]}
                for r in rows]

    def cancel(self, it_id: str) -> None:
        """Journal that an iteration was cancelled (before the reply)."""
        self._exec("INSERT OR IGNORE INTO cancelled (iteration, at) VALUES (?, ?)", (it_id, time.time()))

    def is_cancelled(self, it_id: str) -> bool:
        """Whether an iteration was cancelled."""
        return bool(self._exec("SELECT 1 FROM cancelled WHERE iteration = ?", (it_id,)))

    def add_done(self, it_id: str, units: Iterable[tuple[int, int]], *, lease: str) -> None:
        """Journal acknowledged unit runs ``[start, stop)`` in one transaction."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT INTO done (iteration, start, stop, lease, at) VALUES (?, ?, ?, ?, ?)",
                                     [(it_id, int(a), int(b), lease, now) for a, b in units])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def set_done(self, it_id: str, units: Iterable[tuple[int, int]], *, lease: str) -> None:
        """Replace an iteration's done record (a rewind) in one transaction."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM done WHERE iteration = ?", (it_id,))
                self._db.executemany("INSERT INTO done (iteration, start, stop, lease, at) VALUES (?, ?, ?, ?, ?)",
                                     [(it_id, int(a), int(b), lease, now) for a, b in units])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def done(self, it_id: str) -> list[tuple[int, int, str]]:
        """The journaled ``(start, stop, lease)`` rows of an iteration, in commit order."""
        return [(int(a), int(b), str(c)) for a, b, c in
                self._exec("SELECT start, stop, lease FROM done WHERE iteration = ? ORDER BY rowid", (it_id,))]
