"""The journal's schema and its folder: every table declared once, the schema version and its
migrations, the records' checksums, the state folder's checks and lock. A journal that fails
:func:`open_checked` (corrupt, truncated, a folder where the file should be...) is a
:class:`StateError` naming the path: the server never starts on bad state.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import zlib
from pathlib import Path
from typing import Any

from datamill.core.errors import DatamillError

__all__ = [
    "DB_NAME",
    "ITERATION_TABLES",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "SEALED",
    "StateError",
    "StateLockedError",
    "check_state_dir",
    "lock_state",
    "open_checked",
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
        datamill.serve.journal.schema.StateLockedError: ...in use by a datamill server (pid ...)...
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


def check_state_dir(state_dir: Path) -> Path:
    """The journal file of a state folder, created (folder ``0700``, file ``0600``) when missing.

    Raises:
        StateError: the path is a file, a folder of other files, or the journal is empty.
    """
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
        if state_dir.stat().st_mode & 0o077:  # key digests, session hashes: the owner's alone
            state_dir.chmod(0o700)
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
        # SQLite would take an empty file for a new journal: every key and iteration gone
        if db.stat().st_size == 0:
            raise StateError(
                "the journal is empty (0 bytes): truncated?",
                path=db,
                hint="restore it from a backup (`datamill serve backup`), or delete the file to "
                "start with no keys and no iterations",
            )
        if db.stat().st_mode & 0o077:
            db.chmod(0o600)
    return db


def open_checked(db: Path) -> sqlite3.Connection:
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
