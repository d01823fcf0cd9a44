"""Per-client counters of every iteration, journaled so the UI shows them after a restart.

Table ``ui_clients`` holds, per ``(iteration, client)``, the client's rank, the batches it acknowledged
and the seconds it stalled waiting for data. :func:`record` adds what changed in memory since its last
call (it runs in the server's upkeep tick, once a second), so a restart loses at most the last second;
:func:`clients` reads the journaled rows plus what is not journaled yet.

Examples:
    >>> import tempfile
    >>> from types import SimpleNamespace
    >>> from datamill.serve.journal import Journal
    >>> j = Journal(tempfile.mkdtemp()); memo: dict = {}
    >>> info = SimpleNamespace(rank=0, batches=3, stall_s=0.5)
    >>> it = SimpleNamespace(id="it-1", clients={"c1": info})
    >>> record(j, [it], memo); info.batches = 5; record(j, [it], memo)
    >>> clients(j, "it-1")
    {'c1': {'rank': 0, 'batches': 5, 'stall_s': 0.5}}
    >>> clients(j, "it-1", live=it, memo={})["c1"]["batches"]  # a restarted server: journal + all in memory
    10
    >>> j.close()
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from datamill.serve.journal import Journal

__all__ = ["clients", "ensure_tables", "record", "runs_of", "runs_of_dataset"]

_SCHEMA = ("CREATE TABLE IF NOT EXISTS ui_clients (iteration TEXT NOT NULL, client TEXT NOT NULL, "
           "rank INTEGER NOT NULL, batches INTEGER NOT NULL, stall_s REAL NOT NULL, "
           "PRIMARY KEY (iteration, client))")

Memo = MutableMapping[tuple[str, str], tuple[int, int, float]]
"""``(iteration, client) -> (id of the in-memory record, batches, stall seconds)`` last journaled."""


def ensure_tables(journal: Journal) -> None:
    """Create the ``ui_clients`` table if missing."""
    with journal._lock:
        journal._db.execute(_SCHEMA)


def _deltas(it: Any, memo: Memo) -> list[tuple[str, str, int, int, float]]:
    out = []
    for cid, info in list(it.clients.items()):
        ref, b0, s0 = memo.get((it.id, cid), (id(info), 0, 0.0))
        if ref != id(info):  # a new record for the same client (an iteration rebuilt): count it from zero
            b0, s0 = 0, 0.0
        db, ds = int(info.batches) - b0, float(info.stall_s) - s0
        if db or ds:
            out.append((it.id, cid, int(info.rank), db, ds))
    return out


def record(journal: Journal, iterations: Iterable[Any], memo: Memo) -> None:
    """Journal what each live client did since the last call (one transaction)."""
    ensure_tables(journal)
    rows = []
    for it in iterations:
        for it_id, cid, rank, db, ds in _deltas(it, memo):
            rows.append((it_id, cid, rank, db, ds))
            info = it.clients[cid]
            memo[(it_id, cid)] = (id(info), int(info.batches), float(info.stall_s))
    if not rows:
        return
    with journal._lock:
        db = journal._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT INTO ui_clients (iteration, client, rank, batches, stall_s) VALUES (?, ?, ?, ?, ?) "
                           "ON CONFLICT (iteration, client) DO UPDATE SET rank = excluded.rank, "
                           "batches = batches + excluded.batches, stall_s = stall_s + excluded.stall_s", rows)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def clients(journal: Journal, it_id: str, *, live: Any = None, memo: Memo | None = None) -> dict[str, dict[str, Any]]:
    """``client -> {rank, batches, stall_s}``: the journaled counts plus what ``live`` did since."""
    ensure_tables(journal)
    out = {str(c): {"rank": int(r), "batches": int(b), "stall_s": round(float(s), 3)} for c, r, b, s in journal._exec(
        "SELECT client, rank, batches, stall_s FROM ui_clients WHERE iteration = ? ORDER BY client", (it_id,))}
    if live is not None:
        for _, cid, rank, db, ds in _deltas(live, memo if memo is not None else {}):
            row = out.setdefault(cid, {"rank": rank, "batches": 0, "stall_s": 0.0})
            row["batches"] += db
            row["stall_s"] = round(row["stall_s"] + ds, 3)
    return out


def runs_of(journal: Journal, it_ids: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`clients` of several iterations (journaled counts only)."""
    return {i: clients(journal, i) for i in it_ids}


def runs_of_dataset(journal: Journal, ds_id: str) -> list[dict[str, Any]]:
    """The runs (iteration names) that read a dataset: name, epochs, last status."""
    rows = journal._exec(
        "SELECT key, COUNT(*), MIN(epoch), MAX(epoch), MAX(rowid) FROM iterations "
        "WHERE json_extract(config, '$.dataset') = ? GROUP BY key ORDER BY MAX(rowid) DESC LIMIT 50", (ds_id,))
    return [{"name": r[0], "iterations": int(r[1]), "first": int(r[2]), "last": int(r[3])} for r in rows]
