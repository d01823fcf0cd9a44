"""The server's durable state: one SQLite database (WAL) in the state folder.

Tables: ``keys`` (API key id, sha256 of the secret, role, revoked, the datasets it may use, when it
expires), ``datasets`` (id, name, resolved path), ``iterations`` (id, idempotency key, epoch, config
JSON), ``owners`` (the key that created an iteration), ``done`` (acknowledged unit runs, one row per
ack, with the lease id so a repeated ack after a restart stays idempotent), ``sessions`` (the sha256
of each UI session id, its key, expiry), ``audit`` (admin actions and each key's first use per day)
and ``key_use`` (which days a key was seen). Every write commits before the server replies.

The folder is created ``0700`` and the database ``0600``; opening runs ``PRAGMA quick_check``, so a
corrupt, truncated or empty journal, a folder where the file should be or a state path that is a
file is a :class:`StateError` naming the path, never a server that starts on bad state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.errors import DatamillError

__all__ = [
    "DB_NAME",
    "ITERATION_TABLES",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "SEALED",
    "Journal",
    "StateError",
    "StateLockedError",
    "backup",
    "bool_runs",
    "fold_done",
    "lock_state",
    "merge_runs",
    "seal",
    "sealed",
    "unlock_state",
]

DB_NAME = "datamill-serve.sqlite3"
LOCK_NAME = "datamill-serve.lock"
"""The state folder's lock file: an exclusive ``flock`` held by the server for its life (and by
``serve gc``, ``keys`` and ``backup`` while they run when no server holds it; beside a running
server their writes are SQLite transactions, serialised with the server's by SQLite's write lock);
it names its holder (``pid role``). The OS releases it when its holder dies, even by kill -9."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, hash TEXT NOT NULL, role TEXT NOT NULL,
    created REAL NOT NULL, revoked REAL, note TEXT NOT NULL DEFAULT '', crc INTEGER);
CREATE TABLE IF NOT EXISTS datasets (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL, created REAL NOT NULL, crc INTEGER);
CREATE TABLE IF NOT EXISTS iterations (id TEXT PRIMARY KEY, key TEXT NOT NULL,
    epoch INTEGER NOT NULL, config TEXT NOT NULL, created REAL NOT NULL, crc INTEGER);
CREATE TABLE IF NOT EXISTS done (iteration TEXT NOT NULL, start INTEGER NOT NULL,
    stop INTEGER NOT NULL, lease TEXT NOT NULL, at REAL NOT NULL, sign INTEGER NOT NULL DEFAULT 1,
    crc INTEGER);
CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, iteration TEXT NOT NULL,
    fence TEXT NOT NULL, session TEXT NOT NULL, client TEXT NOT NULL, queue INTEGER NOT NULL,
    start INTEGER NOT NULL, stop INTEGER NOT NULL, slot INTEGER NOT NULL, issued REAL NOT NULL,
    owner TEXT NOT NULL DEFAULT '', crc INTEGER);
CREATE INDEX IF NOT EXISTS leases_iteration ON leases(iteration);
CREATE TABLE IF NOT EXISTS lease_holders (lease TEXT PRIMARY KEY, iteration TEXT NOT NULL,
    client TEXT NOT NULL, session TEXT);
CREATE INDEX IF NOT EXISTS done_iteration ON done(iteration);
CREATE TABLE IF NOT EXISTS cancelled (iteration TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS owners (iteration TEXT PRIMARY KEY, key TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (hash TEXT PRIMARY KEY, key TEXT NOT NULL,
    created REAL NOT NULL, expires REAL NOT NULL, revoked REAL);
CREATE TABLE IF NOT EXISTS audit (at REAL NOT NULL, key TEXT, action TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS key_use (key TEXT NOT NULL, day INTEGER NOT NULL, PRIMARY KEY (key,
    day));
CREATE TABLE IF NOT EXISTS counters (iteration TEXT NOT NULL, name TEXT NOT NULL,
    value REAL NOT NULL, PRIMARY KEY (iteration, name));
CREATE TABLE IF NOT EXISTS lifecycle (iteration TEXT PRIMARY KEY, total INTEGER NOT NULL,
    base_done INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, started REAL NOT NULL, ended REAL,
    last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS lifecycle_clients (iteration TEXT NOT NULL, client TEXT NOT NULL,
    PRIMARY KEY (iteration, client));
CREATE TABLE IF NOT EXISTS ui_clients (iteration TEXT NOT NULL, client TEXT NOT NULL,
    rank INTEGER NOT NULL,
    batches INTEGER NOT NULL, stall_s REAL NOT NULL, PRIMARY KEY (iteration, client));
CREATE TABLE IF NOT EXISTS ui_acks (iteration TEXT NOT NULL, at REAL NOT NULL,
    batches INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS ui_acks_iteration ON ui_acks(iteration);
CREATE TABLE IF NOT EXISTS client_locations (dataset TEXT PRIMARY KEY, location TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS client_identities (dataset TEXT PRIMARY KEY, identity TEXT NOT NULL);
"""
"""The whole journal, declared here only (the one schema owner): the protocol's records (``done``,
``leases``, ``lease_holders``, ``cancelled``), datasets and iterations, keys, UI sessions, audit and
key use (:mod:`datamill.serve.http.auth`), metrics counters (:mod:`datamill.serve.observe.metrics`),
lifecycle (:mod:`~datamill.serve.observe.lifecycle`), the UI's ledger
(:mod:`~datamill.serve.observe.ledger`) and direct-mode client locations and content identities
(:mod:`datamill.serve.data.direct`). Those modules read and write their tables through the
:class:`Journal`'s connections; none creates a table or opens a connection of its own. Tables an
earlier release created on first use are created here when a journal opens (``IF NOT EXISTS``: no
version change)."""
ITERATION_TABLES = (
    ("done", "iteration"),
    ("cancelled", "iteration"),
    ("owners", "iteration"),
    ("leases", "iteration"),
    ("lifecycle", "iteration"),
    ("lifecycle_clients", "iteration"),
    ("counters", "iteration"),
    ("lease_holders", "iteration"),
    ("ui_clients", "iteration"),
    ("ui_acks", "iteration"),
    ("iterations", "id"),
)
"""Every table holding rows of one iteration, with its column naming it (the iteration's own row
last): what ``serve gc`` deletes of an iteration."""
SCHEMA_VERSION = 2
"""The journal's schema version (``PRAGMA user_version``): 0 is the release before it (no
checksums, rewinds rewrote the done rows); 2 adds each record's checksum and signed done rows."""
SEALED = {
    "done": ("iteration", "start", "stop", "lease", "at", "sign"),
    "leases": (
        "id",
        "iteration",
        "fence",
        "session",
        "client",
        "queue",
        "start",
        "stop",
        "slot",
        "issued",
        "owner",
    ),
    "iterations": ("id", "key", "epoch", "config", "created"),
    "datasets": ("id", "name", "path", "created"),
    "keys": ("id", "hash", "role", "created"),
}
"""The records that carry a checksum (``crc``), and the columns it covers (those never updated):
what a restart replays. A record whose bytes changed is refused at start, by table and row."""
_KEY_COLUMNS = {
    "datasets": "TEXT",
    "expires": "REAL",
}  # added after the first release: migrated on open
_FIX = (
    "restore the state folder from a backup (`datamill serve backup`), or start with a new "
    "--state folder"
)


class StateError(DatamillError, OSError):
    """The server's state folder or journal cannot be used (a file, corrupt, truncated, not
    writable)."""


class StateLockedError(StateError):
    """Another process (a server, or ``serve gc``) holds the state folder's lock.

    ``holder`` is its ``(pid, role)`` as the lock file names it (``(None, "")`` when unknown).
    """

    holder: tuple[int | None, str] = (None, "")


def _holder(fd: int) -> tuple[int | None, str]:
    """``(pid, role)`` written in an open lock file by its holder."""
    try:
        text = os.pread(fd, 200, 0).decode("ascii", "replace").split()
        return int(text[0]), (text[1] if len(text) > 1 else "")
    except (OSError, ValueError, IndexError):
        return None, ""


def lock_state(state_dir: Path, role: str) -> int:
    """Take the state folder's exclusive lock (non-blocking) for ``role``: its open descriptor
    (released by :func:`unlock_state`, or by the OS when this process dies).

    Raises:
        StateLockedError: another process holds it (its pid and role named).

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> fd = lock_state(d, "server")
        >>> lock_state(d, "gc")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        datamill.serve.journal.store.StateLockedError: ...in use by a datamill server (pid ...)...
        >>> unlock_state(fd)
    """
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateError(f"cannot open the state folder's lock: {exc.strerror}", path=path) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid, by = _holder(fd)
        os.close(fd)
        err = StateLockedError(
            f"the state folder is in use by a datamill {by or 'process'} (pid {pid})",
            path=state_dir,
            hint="stop that process first, or pass another --state folder",
        )
        err.holder = (pid, by)
        raise err from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {role}\n".encode("ascii"), 0)
    return fd


def unlock_state(fd: int | None) -> None:
    """Release a lock taken by :func:`lock_state` (``None``: nothing to release)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing the descriptor releases the flock


def _check_dir(state_dir: Path) -> Path:
    if state_dir.exists() and not state_dir.is_dir():
        raise StateError(
            "the state path is a file, expected a folder",
            path=state_dir,
            hint="pass --state a folder (it is created when missing)",
        )
    if (
        state_dir.is_dir()
        and not (state_dir / DB_NAME).exists()
        and any(p.name != LOCK_NAME for p in state_dir.iterdir())
    ):
        raise StateError(
            f"not a datamill state folder: it holds other files and no {DB_NAME}",
            path=state_dir,
            hint="pass --state a new or empty folder, or the folder of an existing server's state",
        )
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if state_dir.stat().st_mode & 0o077:
            state_dir.chmod(
                0o700
            )  # the journal holds key digests and session hashes: the owner's alone
    except OSError as exc:
        raise StateError(f"cannot create the state folder: {exc.strerror}", path=state_dir) from exc
    db = state_dir / DB_NAME
    if db.exists() and not db.is_file():
        raise StateError(
            "expected the journal file here, found a folder or special file", path=db, hint=_FIX
        )
    if not db.exists():
        try:
            os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            raise StateError(f"cannot create the journal: {exc.strerror}", path=db) from exc
    else:
        if (
            db.stat().st_size == 0
        ):  # SQLite would take it for a new journal: every key and iteration gone
            raise StateError(
                "the journal is empty (0 bytes): truncated?",
                path=db,
                hint="restore it from a backup (`datamill serve backup`), or delete the file to "
                "start with no keys and no iterations",
            )
        if db.stat().st_mode & 0o077:
            db.chmod(0o600)
    return db


def _open(db: Path) -> sqlite3.Connection:
    """A checked connection: the header, ``quick_check`` and the schema, or a
    :class:`StateError`."""
    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None, timeout=30)
    try:
        size = db.stat().st_size
        if 0 < size < 512 or (size and size % 512):
            raise StateError(
                f"the journal is truncated ({size:,} bytes, not whole pages)", path=db, hint=_FIX
            )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        result = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if result != ["ok"]:
            raise StateError(
                f"the journal is corrupt (quick_check: {'; '.join(map(str, result[:3]))})",
                path=db,
                hint=_FIX,
            )
        conn.executescript(_SCHEMA)
        have = {r[1] for r in conn.execute("PRAGMA table_info(keys)")}
        for col, kind in _KEY_COLUMNS.items():
            if col not in have:
                conn.execute(f"ALTER TABLE keys ADD COLUMN {col} {kind}")
        _migrate(conn, db)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StateError(
            f"the journal is not a usable SQLite database ({exc})", path=db, hint=_FIX
        ) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def backup(state_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Copy a (possibly running) server's journal to ``out`` with SQLite's online backup API.

    The copy is written beside ``out`` and renamed into place; an existing ``out`` is refused.
    Restore by copying the file into an empty state folder as :data:`DB_NAME`.

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


def fold_done(db: sqlite3.Connection, it_id: str) -> list[tuple[int, int]]:
    """The done set of an iteration as runs: its ``done`` rows folded in commit order (sign -1:
    pending again). Without such rows (no rewind) the rows are the set."""
    rows = db.execute(
        "SELECT start, stop, sign FROM done WHERE iteration = ? ORDER BY rowid", (it_id,)
    ).fetchall()
    if not rows:
        return []
    if all(r[2] > 0 for r in rows):
        return merge_runs([(int(a), int(b)) for a, b, _ in rows])
    done = np.zeros(max(int(r[1]) for r in rows), dtype=bool)
    for a, b, sign in rows:
        done[int(a) : int(b)] = sign > 0
    return bool_runs(done)


def merge_runs(rs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, stop)`` runs.

    Examples:
        >>> merge_runs([(5, 7), (0, 2), (2, 3), (6, 9)])
        [(0, 3), (5, 9)]
    """
    out: list[tuple[int, int]] = []
    for a, b in sorted(rs):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def bool_runs(mask: NDArray[np.bool_]) -> list[tuple[int, int]]:
    """The ``[start, stop)`` runs of ``True`` in a mask (vectorised).

    Examples:
        >>> bool_runs(np.array([1, 1, 0, 0, 1, 0, 1], dtype=bool))
        [(0, 2), (4, 5), (6, 7)]
    """
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def seal(*values: Any) -> int:
    """A record's checksum: CRC-32 of its covered values (numbers as 17 significant digits, so an
    integer stored in a REAL column reads back the same).

    Examples:
        >>> seal("it", 0, 2, "l.1", 1.5, 1) == seal("it", 0.0, 2, "l.1", 1.5, 1)
        True
    """
    text = "\x1f".join(
        v if isinstance(v, str) else "\x00" if v is None else format(float(v), ".17g")
        for v in values
    )
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def sealed(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row`` (the covered values, in :data:`SEALED`'s order) with its checksum appended."""
    return (*row, seal(*row))


def _migrate(conn: sqlite3.Connection, db: Path) -> None:
    """Bring a journal of an earlier release to :data:`SCHEMA_VERSION` (columns added, every
    existing record sealed, in one transaction), then verify every record's checksum."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StateError(
            f"the journal was written by a newer datamill (schema {version}, this one reads up "
            f"to {SCHEMA_VERSION})",
            path=db,
            hint="run the datamill release that wrote it",
        )
    if version < SCHEMA_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        if "session" not in {r[1] for r in conn.execute("PRAGMA table_info(lease_holders)")}:
            conn.execute("ALTER TABLE lease_holders ADD COLUMN session TEXT")
        for table, cols in SEALED.items():
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            if "sign" in cols and "sign" not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN sign INTEGER NOT NULL DEFAULT 1")
            if "crc" not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN crc INTEGER")
            rows = conn.execute(
                f"SELECT rowid, {', '.join(cols)} FROM {table} WHERE crc IS NULL"
            ).fetchall()
            conn.executemany(
                f"UPDATE {table} SET crc = ? WHERE rowid = ?",
                [(seal(*r[1:]), r[0]) for r in rows],
            )
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    for table, cols in SEALED.items():
        cur = conn.execute(
            f"SELECT rowid, crc, {', '.join(cols)} FROM {table} WHERE crc IS NOT NULL"
        )
        for r in cur:
            if seal(*r[2:]) != r[1]:
                raise StateError(
                    f"the journal's {table} record (rowid {r[0]}) fails its checksum: the file "
                    "was damaged",
                    path=db,
                    hint=_FIX,
                )


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
        self.path = _check_dir(self.dir)
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
            self._db = _open(self.path)
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
        rows = self._exec(
            "SELECT id, hash, role, created, revoked, note, datasets, expires FROM keys ORDER "
            "BY created"
        )
        return [
            {
                "id": r[0],
                "hash": r[1],
                "role": r[2],
                "created": r[3],
                "revoked": r[4],
                "note": r[5],
                "datasets": None if r[6] is None else json.loads(r[6]),
                "expires": r[7],
            }
            for r in rows
        ]

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
            self._db.execute(
                "DELETE FROM sessions WHERE expires < ?", (now - 86400,)
            )  # long dead: forget them
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
        rows = self._exec("SELECT at, key, action, detail FROM audit ORDER BY rowid")
        return [{"at": r[0], "key": r[1], "action": r[2], "detail": r[3]} for r in rows]

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
        rows = self._exec("SELECT id, name, path, created FROM datasets ORDER BY created")
        return [{"id": r[0], "name": r[1], "path": r[2], "created": r[3]} for r in rows]

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
        rows = self._exec("SELECT id, key, epoch, config, created FROM iterations ORDER BY created")
        return [
            {"id": r[0], "key": r[1], "epoch": r[2], "config": json.loads(r[3]), "created": r[4]}
            for r in rows
        ]

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
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO done (iteration, start, stop, lease, at, sign, crc) VALUES (?, ?, "
                    "?, ?, ?, ?, ?)",
                    [sealed((it_id, int(a), int(b), lease, now, 1)) for a, b in units],
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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

    def done_runs(self, it_id: str) -> list[tuple[int, int]]:
        """The done set of an iteration: the fold of its rows in commit order (a row of sign -1,
        appended by a rewind, sets its units pending again), as ``[start, stop)`` runs."""
        with self._lock:
            return fold_done(self._db, it_id)

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
