"""The server's journal: one SQLite database (WAL) in the state folder, its connections and the
records' reads and writes (every write commits before the server replies). The schema, its version
and migrations, the records' checksums and the folder's checks and lock are
:mod:`~datamill.serve.journal.schema`'s.
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

import numpy as np
from numpy.typing import NDArray

from datamill.core.ragged import runs
from datamill.serve.journal.schema import (
    StateError,
    StateLockedError,
    check_state_dir,
    lock_state,
    open_checked,
    sealed,
    unlock_state,
)

__all__ = ["DONE_INSERT", "Journal", "backup", "done_mask"]

DONE_INSERT = (
    "INSERT INTO done (iteration, start, stop, lease, at, sign, crc) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
"""The insert of a sealed ``done`` row (an ack's units, or a rewind's)."""


def backup(state_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Copy a (possibly running) server's journal to ``out`` with SQLite's online backup API.

    The copy is written beside ``out`` and renamed into place; an existing ``out`` is refused.
    Restore by copying the file into an empty state folder as
    :data:`~datamill.serve.journal.schema.DB_NAME`.

    Raises:
        StateError: an unusable journal, or ``out`` exists.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); Journal(d / "state").close()
        >>> backup(d / "state", d / "copy.sqlite3").name
        'copy.sqlite3'
    """
    dst = Path(out)
    if dst.exists() or dst.is_symlink():
        raise StateError(
            "the backup file exists; refusing to overwrite it",
            path=dst,
            hint="choose a new file name",
        )
    journal = Journal(state_dir, lock="backup", beside=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        target = sqlite3.connect(tmp)
        try:
            with journal._lock:
                journal._db.backup(target)
        finally:
            target.close()
        os.chmod(tmp, 0o600)
        os.replace(tmp, dst)
    except (OSError, sqlite3.Error) as exc:
        tmp.unlink(missing_ok=True)
        raise StateError(f"cannot write the backup: {exc}", path=dst) from exc
    finally:
        journal.close()
    return dst


def done_mask(db: sqlite3.Connection, it_id: str, size: int = 0) -> NDArray[np.bool_]:
    """The done set of an iteration as a mask (at least ``size`` long): its ``done`` rows folded
    in commit order (a row of sign -1 sets its units pending again)."""
    rows = db.execute(
        "SELECT start, stop, sign FROM done WHERE iteration = ? ORDER BY rowid", (it_id,)
    ).fetchall()
    done = np.zeros(max([size, *(int(r[1]) for r in rows)]), dtype=bool)
    for a, b, sign in rows:
        done[int(a) : int(b)] = sign > 0
    return done


class Journal:
    """Thread-safe access to the state database (one connection, WAL, ``synchronous=FULL``).

    Examples:
        >>> import tempfile
        >>> j = Journal(tempfile.mkdtemp())
        >>> j.add_done("it", [(0, 2)], lease="b.1"); j.done("it")
        [(0, 2, 'b.1')]
        >>> j.close()
    """

    def __init__(
        self, state_dir: str | os.PathLike[str], *, lock: str | None = None, beside: bool = False
    ) -> None:
        self.dir = Path(state_dir)
        self.path = check_state_dir(self.dir)
        self._held: int | None = None
        if lock is not None:  # the folder's lock (see LOCK_NAME), taken before the journal opens
            try:
                self._held = lock_state(self.dir, lock)
            except StateLockedError as exc:
                # a key or a backup is written beside a running server through SQLite's own
                # locking (the server reads keys from the journal); nothing else is
                if not (beside and exc.holder[1] == "server"):
                    raise
        try:
            self._db = open_checked(self.path)
        except BaseException:
            unlock_state(self._held)
            raise
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()

    def close(self) -> None:
        """Close the connections (and release the folder's lock when this journal holds it)."""
        with self._lock:
            self._db.close()
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        unlock_state(self._held)
        self._held = None

    def _exec(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)).fetchall())

    def _dicts(self, sql: str) -> list[dict[str, Any]]:
        """The rows of a query as dicts by column name."""
        with self._lock:
            cur = self._db.execute(sql)
            return [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]

    def read(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """A query on the journal's reading connection (opened on first use): it never waits
        behind a write's transaction or fsync (WAL readers see the last commit)."""
        with self._read_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None, timeout=30
                )
            return list(self._reader.execute(sql, tuple(args)).fetchall())

    # ------------------------------------------------------------------ keys
    def add_key(
        self,
        key_id: str,
        digest: str,
        role: str,
        note: str = "",
        *,
        datasets: list[str] | None = None,
        expires: float | None = None,
    ) -> None:
        """Store a new key's id, secret digest, role, the datasets it may use (``None``: all) and
        expiry."""
        self._exec(
            "INSERT INTO keys (id, hash, role, created, crc, note, datasets, expires) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *sealed((key_id, digest, role, time.time())),
                note,
                None if datasets is None else json.dumps(datasets),
                expires,
            ),
        )

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key (revoked ones too), without secrets."""
        rows = self._dicts(
            "SELECT id, hash, role, created, revoked, note, datasets, expires FROM keys ORDER "
            "BY created"
        )
        for r in rows:
            r["datasets"] = None if r["datasets"] is None else json.loads(r["datasets"])
        return rows

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key and its UI sessions; False when unknown or already revoked."""
        now = time.time()
        with self._lock:
            cur = self._db.execute(
                "UPDATE keys SET revoked = ? WHERE id = ? AND revoked IS NULL", (now, key_id)
            )
            self._db.execute(
                "UPDATE sessions SET revoked = ? WHERE key = ? AND revoked IS NULL", (now, key_id)
            )
            return cur.rowcount > 0

    # ------------------------------------------------------------------ UI sessions
    def add_session(self, digest: str, key_id: str, *, expires: float) -> None:
        """Store a UI session (the sha256 of its id, never the id)."""
        now = time.time()
        with self._lock:
            # long dead: forget them
            self._db.execute("DELETE FROM sessions WHERE expires < ?", (now - 86400,))
            self._db.execute(
                "INSERT INTO sessions (hash, key, created, expires) VALUES (?, ?, ?, ?)",
                (digest, key_id, now, expires),
            )

    def session_key(self, digest: str) -> str | None:
        """The key id of a live (unrevoked, unexpired) session."""
        rows = self._exec(
            "SELECT key FROM sessions WHERE hash = ? AND revoked IS NULL AND expires > ?",
            (digest, time.time()),
        )
        return str(rows[0][0]) if rows else None

    def end_session(self, digest: str) -> None:
        """Revoke a session (logout)."""
        self._exec(
            "UPDATE sessions SET revoked = ? WHERE hash = ? AND revoked IS NULL",
            (time.time(), digest),
        )

    # ------------------------------------------------------------------ audit
    def add_audit(self, key: str | None, action: str, detail: str = "") -> None:
        """Record an admin action (or a key's first use of a day)."""
        self._exec(
            "INSERT INTO audit (at, key, action, detail) VALUES (?, ?, ?, ?)",
            (time.time(), key, action, detail),
        )

    def note_use(self, key: str, day: int) -> None:
        """Record a key's first use of a UTC day (once; an audit row ``first use``)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO key_use (key, day) VALUES (?, ?)", (key, day)
            )
            if cur.rowcount:
                self._db.execute(
                    "INSERT INTO audit (at, key, action, detail) VALUES (?, ?, 'first use', ?)",
                    (time.time(), key, time.strftime("%Y-%m-%d", time.gmtime(day * 86400))),
                )

    def audit(self) -> list[dict[str, Any]]:
        """The audit rows, oldest first."""
        return self._dicts("SELECT at, key, action, detail FROM audit ORDER BY rowid")

    def set_owner(self, it_id: str, key: str) -> None:
        """Record the key that created an iteration (the first one to ask for it)."""
        self._exec("INSERT OR IGNORE INTO owners (iteration, key) VALUES (?, ?)", (it_id, key))

    def owner(self, it_id: str) -> str | None:
        """The key that created an iteration, if known."""
        rows = self._exec("SELECT key FROM owners WHERE iteration = ?", (it_id,))
        return str(rows[0][0]) if rows else None

    # ------------------------------------------------------------------ datasets
    def add_dataset(self, ds_id: str, name: str, path: str) -> None:
        """Register a dataset (id and name unique)."""
        self._exec(
            "INSERT INTO datasets (id, name, path, created, crc) VALUES (?, ?, ?, ?, ?)",
            sealed((ds_id, name, path, time.time())),
        )

    def datasets(self) -> list[dict[str, Any]]:
        """Every registered dataset."""
        return self._dicts("SELECT id, name, path, created FROM datasets ORDER BY created")

    # ------------------------------------------------------------------ iterations
    def add_iteration(self, it_id: str, key: str, epoch: int, config: dict[str, Any]) -> None:
        """Journal a new iteration (before the reply that names it)."""
        self._exec(
            "INSERT INTO iterations (id, key, epoch, config, created, crc) VALUES (?, ?, ?, ?, ?, "
            "?)",
            sealed((it_id, key, int(epoch), json.dumps(config, sort_keys=True), time.time())),
        )

    def iterations(self) -> list[dict[str, Any]]:
        """Every iteration with its config."""
        rows = self._dicts(
            "SELECT id, key, epoch, config, created FROM iterations ORDER BY created"
        )
        for r in rows:
            r["config"] = json.loads(r["config"])
        return rows

    def cancel(self, it_id: str) -> None:
        """Journal that an iteration was cancelled (before the reply)."""
        self._exec(
            "INSERT OR IGNORE INTO cancelled (iteration, at) VALUES (?, ?)", (it_id, time.time())
        )

    def is_cancelled(self, it_id: str) -> bool:
        """Whether an iteration was cancelled."""
        return bool(self._exec("SELECT 1 FROM cancelled WHERE iteration = ?", (it_id,)))

    def add_done(self, it_id: str, units: Iterable[tuple[int, int]], *, lease: str) -> None:
        """Journal acknowledged unit runs ``[start, stop)`` in one transaction."""
        now = time.time()
        with self._lock, self._db:  # commits, or rolls back on an error
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                DONE_INSERT, [sealed((it_id, int(a), int(b), lease, now, 1)) for a, b in units]
            )

    def done(self, it_id: str) -> list[tuple[int, int, str]]:
        """The journaled ``(start, stop, lease)`` rows that marked units of an iteration done, in
        commit order (acknowledgements, and the units a rewind set done; see :meth:`done_runs`
        for the done set itself)."""
        return [
            (int(a), int(b), str(c))
            for a, b, c in self._exec(
                "SELECT start, stop, lease FROM done WHERE iteration = ? AND sign > 0 "
                "ORDER BY rowid",
                (it_id,),
            )
        ]

    def done_units(self, it_id: str) -> NDArray[np.int64]:
        """The done set of an iteration: the fold of its rows in commit order (a row of sign -1,
        appended by a rewind, sets its units pending again), as sorted unit ids (what a restart
        replays)."""
        with self._lock:
            return np.flatnonzero(done_mask(self._db, it_id))

    def done_runs(self, it_id: str) -> list[tuple[int, int]]:
        """:meth:`done_units` as ``[start, stop)`` runs."""
        return runs(self.done_units(it_id))

    def session_acks(self, it_id: str, session: str) -> list[int] | None:
        """The units the leases of session hash ``session`` acknowledged, in journal order (the
        order its client consumed them); ``None`` when the journal has no lease of that session."""
        with self._lock:
            held = self._db.execute(
                "SELECT 1 FROM lease_holders WHERE iteration = ? AND session = ? LIMIT 1",
                (it_id, session),
            ).fetchone()
            rows = self._db.execute(
                "SELECT d.start, d.stop FROM done d JOIN lease_holders h ON h.lease = d.lease "
                "WHERE d.iteration = ? AND h.session = ? AND d.sign > 0 ORDER BY d.rowid",
                (it_id, session),
            ).fetchall()
        if held is None:
            return None
        return [u for a, b in rows for u in range(int(a), int(b))]

    def rewinds(self, it_id: str) -> int:
        """How many rewinds an iteration's journal records."""
        rows = self._exec(
            "SELECT COUNT(DISTINCT lease) FROM done WHERE iteration = ? AND lease LIKE 'rewind.%'",
            (it_id,),
        )
        return int(rows[0][0])
