"""A served iteration's run record (``GET /api/v1/iterations/{id}/trace``), for ``datamill trace``.

A unit of an iteration is batch ``b`` of plan rank ``r`` of the order with ``plan_world`` ranks
(:mod:`datamill.serve.iteration`), so the record is the in-process one of that plan
(:func:`datamill.loader.trace.plan_record`) plus a ``served`` section from the journal:

* ``mode``, ``world_size``, ``plan_world``, ``rank_batches`` (batches per plan rank) and
  ``base_done`` (units done before this iteration: a resume);
* static mode resumed over another world size: ``queues``, the units each served rank reads, in
  order (without a resume base, queue ``r`` is plan rank ``r``: the record traces exactly like the
  in-process loader's and has no ``queues``);
* ``acks``: ``[client, start, stop]`` acknowledged unit runs with the client that took their lease
  (``None`` for a rewind's rows), in the order each client received its leases (journaled when a
  lease is handed out), then by unit: a client consumes its leases in that order, so in dynamic mode
  a client's ``k``-th acknowledged batch is its step ``k``;
* ``rewinds``: how many times an admin or a resume reset the done set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from datamill.loader.trace import plan_record
from datamill.serve.iteration import Iteration, runs
from datamill.serve.server import ServeState

__all__ = ["iteration_record", "lease_clients"]


def lease_clients(state: ServeState, it_id: str) -> dict[str, tuple[str, int]]:
    """Lease id -> (the client that took it, issue order): journaled with each lease when it is
    handed out."""
    j = state.journal
    with j._lock:
        rows = j._db.execute(
            "SELECT lease, client, rowid FROM lease_holders WHERE iteration = ?", (it_id,)
        ).fetchall()
    return {str(a): (str(b), int(c)) for a, b, c in rows}


def iteration_record(state: ServeState, it: Iteration) -> dict[str, Any]:
    """The run record (format ``datamill.run/1``) of a served iteration (see the module
    docstring)."""
    cfg = it.config
    svc = state.service(cfg)
    rank_batches = [int(x) for x in np.diff(it.offsets)]
    holders = lease_clients(state, it.id)
    done = state.journal.done(it.id)
    # a client consumes its leases in the order it received them, each in position (= unit) order,
    # so its k-th batch is the k-th unit in (lease issue order, unit) order, whenever the acks were
    # committed
    rows = sorted(done, key=lambda r: (holders[r[2]][1] if r[2] in holders else 1 << 62, r[0]))
    acks = [
        [None if lease.startswith("rewind.") else holders.get(lease, (lease, 0))[0], a, b]
        for a, b, lease in rows
    ]
    served: dict[str, Any] = {
        "iteration": it.id,
        "mode": it.mode,
        "world_size": it.world_size,
        "plan_world": int(cfg["plan_world"]),
        "rank_batches": rank_batches,
        "base_done": [list(r) for r in cfg.get("base_done", [])],
        "acks": acks,
        "rewinds": len({lease for _, _, lease in done if lease.startswith("rewind.")}),
    }
    plain = it.mode == "static" and not it.base_done and int(cfg["plan_world"]) == it.world_size
    if it.mode == "static" and not plain:
        served["queues"] = [[list(r) for r in runs(q.tolist())] for q in it.queues]
    return plan_record(
        svc,
        epoch=int(cfg["epoch"]),
        world_size=int(cfg["plan_world"]),
        batches_seen=max(rank_batches, default=0),
        served=served,
    )
