"""Per-client counters of every iteration, journaled so the UI shows them after a restart: table
``ui_clients`` holds a client's rank and stall seconds, written by :func:`record` in the upkeep tick
(once a second); a client's acknowledged batches are a fold of the journal's ack records
(:func:`clients`).

Examples:
    >>> import tempfile
    >>> from types import SimpleNamespace
    >>> from datamill.serve.journal.store import Journal
    >>> j = Journal(tempfile.mkdtemp()); memo: dict = {}
    >>> info = SimpleNamespace(
    ...     rank=0, acked=[(1.0, 2), (2.0, 1)], stall_s=0.5
    ... )  # acks: (monotonic time, batches)
    >>> it = SimpleNamespace(id="it-1", clients={"c1": info})
    >>> record(j, [it], memo); info.acked.append((3.0, 2)); record(j, [it], memo)
    >>> _ = j._exec("INSERT INTO lease_holders VALUES ('l.1', 'it-1', 'c1', NULL)")
    >>> j.add_done("it-1", [(0, 5)], lease="l.1")  # what lease l.1 (taken by c1) acknowledged
    >>> clients(j, "it-1")
    {'c1': {'rank': 0, 'batches': 5, 'stall_s': 0.5}}
    >>> j.close()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, MutableMapping
from typing import Any

from datamill.serve.journal.store import Journal

__all__ = ["clients", "record", "runs_of_dataset"]

Memo = MutableMapping[tuple[str, str], tuple[int, float, float]]
"""``(iteration, client) -> (id of the in-memory record, newest ack time, stall seconds)`` last
journaled."""


def _deltas(it: Any, memo: Memo) -> list[tuple[str, str, int, int, float, float]]:
    """``(iteration, client, rank, batches, stall seconds, newest ack time)`` added since
    ``memo``."""
    out = []
    with getattr(it, "lock", contextlib.nullcontext()):
        infos = [(cid, info, list(info.acked)) for cid, info in it.clients.items()]
    for cid, info, acked in infos:
        ref, t0, s0 = memo.get((it.id, cid), (id(info), float("-inf"), 0.0))
        if ref != id(info):  # a new record of the same client (an iteration rebuilt): from zero
            t0, s0 = float("-inf"), 0.0
        new = [(t, n) for t, n in acked if t > t0]
        db, ds = sum(int(n) for _, n in new), float(info.stall_s) - s0
        if db or ds:
            out.append((it.id, cid, int(info.rank), db, ds, max((t for t, _ in new), default=t0)))
    return out


def record(journal: Journal, iterations: Iterable[Any], memo: Memo) -> None:
    """Journal what each live client did since the last call (one transaction)."""
    rows = []
    for it in iterations:
        for it_id, cid, rank, nb, ds, newest in _deltas(it, memo):
            rows.append((it_id, cid, rank, nb, ds))
            info = it.clients[cid]
            memo[(it_id, cid)] = (id(info), newest, float(info.stall_s))
    if not rows:
        return
    with journal._lock, journal._db as db:  # one transaction: committed, or rolled back
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO ui_clients (iteration, client, rank, batches, stall_s) VALUES "
            "(?, ?, ?, ?, ?) ON CONFLICT (iteration, client) DO UPDATE SET rank = excluded.rank, "
            "batches = batches + excluded.batches, stall_s = stall_s + excluded.stall_s",
            rows,
        )


def clients(
    journal: Journal, it_id: str, *, live: Any = None, memo: Memo | None = None
) -> dict[str, dict[str, Any]]:
    """``client -> {rank, batches, stall_s}``: ``batches`` is a fold of the journal's ack records
    (each ``done`` row's lease and the client that took it: exact after any restart); rank and
    stall seconds are the journaled ones plus what ``live`` did since."""
    out = {
        str(c): {"rank": int(r), "batches": 0, "stall_s": round(float(s), 3)}
        for c, r, s in journal._exec(
            "SELECT client, rank, stall_s FROM ui_clients WHERE iteration = ? ORDER BY client",
            (it_id,),
        )
    }
    if live is not None:
        for _, cid, rank, _, ds, _ in _deltas(live, memo if memo is not None else {}):
            row = out.setdefault(cid, {"rank": rank, "batches": 0, "stall_s": 0.0})
            row["stall_s"] = round(row["stall_s"] + ds, 3)
    acked = journal._exec(
        "SELECT h.client, SUM(d.stop - d.start) FROM done d JOIN lease_holders h ON h.lease = "
        "d.lease WHERE d.iteration = ? AND d.sign > 0 GROUP BY h.client",
        (it_id,),
    )
    infos = getattr(live, "clients", {})
    for cid, n in acked:
        info = infos.get(cid)
        row = out.setdefault(
            str(cid), {"rank": -1 if info is None else int(info.rank), "batches": 0, "stall_s": 0.0}
        )
        row["batches"] = int(n)
    return dict(sorted(out.items()))


def runs_of_dataset(journal: Journal, ds_id: str) -> list[dict[str, Any]]:
    """The runs (iteration names) that read a dataset: name, epochs, last status."""
    rows = journal._exec(
        "SELECT key, COUNT(*), MIN(epoch), MAX(epoch), MAX(rowid) FROM iterations "
        "WHERE json_extract(config, '$.dataset') = ? GROUP BY key ORDER BY MAX(rowid) DESC "
        "LIMIT 50",
        (ds_id,),
    )
    return [
        {"name": r[0], "iterations": int(r[1]), "first": int(r[2]), "last": int(r[3])} for r in rows
    ]
