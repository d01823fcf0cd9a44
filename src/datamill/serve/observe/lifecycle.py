"""Iteration lifecycle in the journal (table ``lifecycle``, and ``lifecycle_clients``): status
(``running``, ``stale`` after :data:`STALE_AFTER` lease timeouts without a client, ``finished``,
``cancelled``), start, end, clients seen; paging; garbage collection (``docs/running.md``).

Examples:
    >>> import tempfile
    >>> from datamill.serve.journal.store import Journal
    >>> j = Journal(tempfile.mkdtemp())
    >>> j.add_iteration(
    ...     "it-1", "k", 0, {"dataset": "ds-1", "lease_timeout": 60.0, "mode": "static"}
    ... )
    >>> started(j, "it-1", total=10, base_done=0); ended(j, "it-1", "finished")
    True
    >>> [(r["id"], r["status"], r["done"]) for r in page(j)[0]]
    [('it-1', 'finished', 0)]
    >>> j.close()
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from datamill.core.errors import ConfigError
from datamill.serve.journal.schema import ITERATION_TABLES
from datamill.serve.journal.store import Journal

__all__ = [
    "MAX_PAGE",
    "STALE_AFTER",
    "STATUSES",
    "counts",
    "ended",
    "gc",
    "one",
    "page",
    "seen",
    "started",
]

STATUSES = ("running", "finished", "cancelled", "stale")
"""Every status an iteration can have."""
STALE_AFTER = 3.0
"""Lease timeouts without any client after which a running iteration reads as ``stale``."""
MAX_PAGE = 500
"""The largest ``limit`` of one page of iterations."""

# status as read: cancelled (journaled) > finished > stale (no client for N lease timeouts) >
# running
_STATUS_SQL = """CASE
    WHEN EXISTS (SELECT 1 FROM cancelled c WHERE c.iteration = i.id) THEN 'cancelled'
    WHEN l.status = 'finished' THEN 'finished'
    WHEN COALESCE(l.last_seen, i.created)
        < :now - :stale * json_extract(i.config, '$.lease_timeout') THEN 'stale'
    ELSE 'running' END"""


def started(journal: Journal, it_id: str, *, total: int, base_done: int) -> None:
    """Record a new iteration as ``running`` (once; a later call keeps the first row)."""
    now = time.time()
    journal._exec(
        "INSERT OR IGNORE INTO lifecycle (iteration, total, base_done, status, started, last_seen) "
        "VALUES (?, ?, ?, 'running', ?, ?)",
        (it_id, int(total), int(base_done), now, now),
    )


def ended(journal: Journal, it_id: str, status: str) -> bool:
    """Record that a running iteration finished or was cancelled; whether this call ended it (the
    first end is kept)."""
    if status not in ("finished", "cancelled"):
        raise ValueError(f"an iteration ends finished or cancelled, not {status!r}")
    with journal._lock:
        cur = journal._db.execute(
            "UPDATE lifecycle SET status = ?, ended = ? WHERE iteration = ? AND ended IS NULL",
            (status, time.time(), it_id),
        )
        return cur.rowcount > 0


def seen(journal: Journal, activity: Iterable[tuple[str, float, Collection[str]]]) -> None:
    """Record ``(iteration, last time a client was seen, client ids)`` in one transaction."""
    rows = list(activity)
    if not rows:
        return
    with journal._lock, journal._db as db:  # one transaction: committed, or rolled back
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "UPDATE lifecycle SET last_seen = MAX(last_seen, ?) WHERE iteration = ?",
            [(t, it) for it, t, _ in rows],
        )
        db.executemany(
            "INSERT OR IGNORE INTO lifecycle_clients (iteration, client) VALUES (?, ?)",
            [(it, c) for it, _, clients in rows for c in clients],
        )


def counts(journal: Journal) -> dict[str, int]:
    """Iterations by status, every status of :data:`STATUSES` (0 when none)."""
    by = dict(
        journal._exec(
            f"SELECT st, COUNT(*) FROM (SELECT ({_STATUS_SQL}) AS st FROM iterations i "
            "LEFT JOIN lifecycle l ON l.iteration = i.id) GROUP BY st",
            {"now": time.time(), "stale": STALE_AFTER},
        )
    )
    return {s: int(by.get(s, 0)) for s in STATUSES}


def one(journal: Journal, it_id: str) -> dict[str, Any] | None:
    """The lifecycle row of one iteration (as :func:`page` gives it), or ``None``."""
    rows, _ = page(journal, _only=it_id)
    return rows[0] if rows else None


def page(
    journal: Journal,
    *,
    status: str | None = None,
    datasets: Collection[str] | None = None,
    name: str | None = None,
    limit: int = 100,
    after: str | None = None,
    newest_first: bool = False,
    _only: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of iterations, oldest first (``newest_first``: newest first): ``(rows, the id to
    pass as after= for the next page or None)``.

    Args:
        journal: the server's journal.
        status: only iterations of this status (one of :data:`STATUSES`). Defaults to all.
        datasets: only iterations of these dataset ids. Defaults to all.
        name: only iterations whose name contains this text (any case). Defaults to all.
        limit: rows per page, 1..:data:`MAX_PAGE`. Defaults to ``100``.
        after: the id of the last iteration of the previous page. Defaults to the first page.
        newest_first: the newest iteration first (the UI's order). Defaults to ``False``.

    Raises:
        ConfigError: an unknown status, a limit out of range, or an unknown ``after`` id.
    """
    if status is not None and status not in STATUSES:
        raise ConfigError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
    if not 1 <= int(limit) <= MAX_PAGE:
        raise ConfigError(f"limit must be in 1..{MAX_PAGE}, got {limit}")
    start = _page_start(journal, after, newest_first=newest_first)
    where = ["i.rowid < :start" if newest_first else "i.rowid > :start"]
    args: dict[str, Any] = {
        "start": start,
        "now": time.time(),
        "stale": STALE_AFTER,
        "limit": int(limit) + 1,
    }
    if _only is not None:
        where.append("i.id = :only")
        args["only"] = _only
    if datasets is not None:
        names = sorted(datasets)
        where.append(
            "json_extract(i.config, '$.dataset') IN "
            f"({', '.join(f':d{k}' for k in range(len(names)))})"
        )
        args.update({f"d{k}": d for k, d in enumerate(names)})
    if name is not None:
        where.append("instr(lower(i.key), :name) > 0")
        args["name"] = name.lower()
    if status is not None:
        where.append(f"({_STATUS_SQL}) = :status")
        args["status"] = status
    sql = (
        "SELECT i.id, i.key, i.epoch, i.config, i.created, l.total, l.base_done, "
        f"({_STATUS_SQL}), l.started, l.ended, l.last_seen, "
        "(SELECT COUNT(*) FROM lifecycle_clients c WHERE c.iteration = i.id), "
        "(SELECT COALESCE(SUM((d.stop - d.start) * d.sign), 0) FROM done d "
        "WHERE d.iteration = i.id), "
        "(SELECT at FROM cancelled c WHERE c.iteration = i.id) "
        "FROM iterations i LEFT JOIN lifecycle l ON l.iteration = i.id WHERE "
        f"{' AND '.join(where)} "
        f"ORDER BY i.rowid{' DESC' if newest_first else ''} LIMIT :limit"
    )
    with journal._lock:
        raw = journal._db.execute(sql, args).fetchall()
    rows = [_page_row(r) for r in raw[:limit]]
    return rows, (rows[-1]["id"] if len(raw) > limit else None)


def _page_start(journal: Journal, after: str | None, *, newest_first: bool) -> int:
    """The rowid a page starts past: ``after``'s, else before the first (or after the last)."""
    if after is None:
        return (1 << 62) if newest_first else 0
    found = journal._exec("SELECT rowid FROM iterations WHERE id = ?", (after,))
    if not found:
        raise ConfigError(
            f"after={after!r} is not an iteration id",
            hint="pass the `next` of the previous page",
        )
    return int(found[0][0])


def _page_row(r: Sequence[Any]) -> dict[str, Any]:
    """One row of :func:`page`'s query as the iteration's dict."""
    cfg = json.loads(r[3])
    begin = r[8] if r[8] is not None else r[4]
    end = r[9] if r[9] is not None else r[13]
    return {
        "id": r[0],
        "key": r[1],
        "epoch": r[2],
        "dataset": cfg["dataset"],
        "mode": cfg.get("mode"),
        "status": r[7],
        "started": begin,
        "ended": end,
        "duration_s": None if end is None else round(end - begin, 3),
        "last_seen": r[10] if r[10] is not None else r[4],
        "clients_seen": int(r[11]),
        "total": r[5],
        "done": int(r[12]) + int(r[6] or 0),
        "base_done": int(r[6] or 0),
        "config": {k: v for k, v in cfg.items() if k != "base_done"},
    }


def gc(journal: Journal, *, older_than: float) -> list[str]:
    """Delete the iterations that ended (finished or cancelled) more than ``older_than`` seconds
    ago, with their rows in every table of :data:`~datamill.serve.journal.schema.ITERATION_TABLES`
    (acks, leases, lifecycle, counters, the UI's ledger); the ids removed.

    Stale and running iterations are kept: cancel a stale one first to let it be collected.
    """
    cutoff = time.time() - float(older_than)
    with journal._lock:
        db = journal._db
        ids = [
            str(r[0])
            for r in db.execute(
                "SELECT i.id FROM iterations i LEFT JOIN lifecycle l ON l.iteration = i.id "
                "LEFT JOIN cancelled c ON c.iteration = i.id "
                "WHERE COALESCE(l.ended, c.at) IS NOT NULL AND COALESCE(l.ended, c.at) < ?",
                (cutoff,),
            ).fetchall()
        ]
        if not ids:
            return []
        with db:  # one transaction: committed, or rolled back
            db.execute("BEGIN IMMEDIATE")
            for table, col in ITERATION_TABLES:
                db.executemany(f"DELETE FROM {table} WHERE {col} = ?", [(x,) for x in ids])
    return ids
