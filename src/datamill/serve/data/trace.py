"""A served iteration's run record (``GET /api/v1/iterations/{id}/trace``), for ``datamill trace``:
the in-process record of the iteration's plan (:func:`datamill.loader.record.plan_record`) plus a
``served`` section from the journal: ``mode``, ``world_size``, ``plan_world``, ``rank_batches``,
``base_done``, ``queues`` (an elastic resume's), ``acks`` (``[client, start, stop]`` in the order
each client received its leases; client ``None`` for a rewind's rows) and ``rewinds``. How it is
traced: ``docs/lineage.md`` (*Served iterations*).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from datamill.core.errors import ConfigError
from datamill.core.ragged import runs
from datamill.loader.record import plan_record
from datamill.serve.catalog import check_name
from datamill.serve.protocol.iteration import Iteration
from datamill.serve.server import NotFoundError, ServeState

__all__ = ["MAX_RUN_RECORDS", "RUN_RECORDS_FORMAT", "iteration_record", "run_records"]

MAX_RUN_RECORDS = 64
"""Most iteration records one ``GET /api/v1/runs/{name}/trace`` answers (a page)."""
RUN_RECORDS_FORMAT = "datamill.run-records/1"
_SCAN = 4096  # most iterations of one name looked at per request (epochs from ``from_epoch`` on)


def iteration_record(state: ServeState, it: Iteration) -> dict[str, Any]:
    """The run record (format ``datamill.run/1``) of a served iteration (see the module
    docstring)."""
    cfg = it.config
    svc = state.service(cfg)
    rank_batches = [int(x) for x in np.diff(it.offsets)]
    held = "SELECT lease, client, rowid FROM lease_holders WHERE iteration = ?"  # at each take
    holders = {str(a): (str(b), int(c)) for a, b, c in state.journal._exec(held, (it.id,))}
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
        "rewinds": state.journal.rewinds(it.id),
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


def run_records(
    state: ServeState,
    name: str,
    /,
    *,
    may_use: Callable[[str], bool],
    dataset: str | None = None,
    from_epoch: int = 0,
    limit: int = MAX_RUN_RECORDS,
) -> dict[str, Any]:
    """The run records of the iterations named ``name`` (one per epoch), from ``from_epoch`` on.

    Only iterations of datasets the caller may use (``may_use(dataset id)``) count; their records
    come in epoch order, at most ``limit``, with ``next_epoch`` the epoch to ask from for the
    rest (``None``: no more).

    Raises:
        NotFoundError: no iteration of that name the caller may see (of ``dataset``, if given).
        ConfigError: a bad name or limit, or iterations of the name on several datasets and no
            ``dataset`` to choose.
    """
    check_name(name, what="run name")
    if not 1 <= limit <= MAX_RUN_RECORDS:
        raise ConfigError(f"limit must be in 1..{MAX_RUN_RECORDS}, got {limit}")
    want = state.dataset(dataset)["id"] if dataset is not None else None
    rows = state.journal._exec(
        "SELECT id, epoch, config FROM iterations WHERE key = ? AND epoch >= ? "
        "ORDER BY epoch, rowid LIMIT ?",
        (name, int(from_epoch), _SCAN),
    )
    found = []
    for it_id, epoch, config in rows:
        ds = str(json.loads(config).get("dataset"))
        if may_use(ds) and want in (None, ds):
            found.append((str(it_id), int(epoch), ds))
    if not found:
        raise NotFoundError(
            f"no iteration of a run named {name!r} from epoch {from_epoch} on"
            + (f" of dataset {dataset!r}" if dataset is not None else "")
            + " on a dataset this key may use"
        )
    datasets = sorted({ds for _, _, ds in found})
    if len(datasets) > 1:
        raise ConfigError(
            f"the iterations named {name!r} read {len(datasets)} datasets ({', '.join(datasets)})",
            hint="choose one with dataset=",
        )
    page = found[:limit]
    return {
        "format": RUN_RECORDS_FORMAT,
        "run": name,
        "dataset": datasets[0],
        "iterations": [i for i, _, _ in page],
        "records": [iteration_record(state, state.iteration(i)) for i, _, _ in page],
        "next_epoch": found[limit][1] if len(found) > limit else None,
    }
