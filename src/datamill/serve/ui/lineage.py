"""Lineage pages of the web UI (``docs/lineage.md``): where a sample was read in every served
iteration of its dataset, and the samples of one step; both answer from the iteration's run record
(:mod:`datamill.serve.data.trace`) through :class:`datamill.lineage.trace.Tracer`.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from datamill.core.errors import ConfigError
from datamill.core.source import uid_from_text
from datamill.lineage.trace import Tracer
from datamill.serve.data.trace import iteration_record
from datamill.serve.http.access import Reader, ScopedIteration, State, check_dataset
from datamill.serve.protocol.iteration import Iteration
from datamill.serve.server import NotFoundError, ServeState
from datamill.serve.ui.render import page, render

__all__ = ["router"]

MAX_SHOWN_COLUMNS = 6
MAX_CELL = 80
_CACHE_SIZE = 16

router = APIRouter(prefix="/ui", include_in_schema=False)
_tracers: dict[tuple[str, int], Tracer] = {}
_lock = threading.Lock()


def _tracer(state: ServeState, it: Iteration) -> Tracer:
    """The iteration's tracer (rebuilt when more batches were acknowledged)."""
    done = len(state.journal.done(it.id))
    key = (it.id, done)
    with _lock:
        hit = _tracers.get(key)
    if hit is not None:
        return hit
    tracer = Tracer(iteration_record(state, it), source=state.source(str(it.config["dataset"])))
    with _lock:
        for k in [k for k in _tracers if k[0] == it.id]:
            del _tracers[k]
        while len(_tracers) >= _CACHE_SIZE:
            del _tracers[next(iter(_tracers))]
        _tracers[key] = tracer
    return tracer


def _cell(v: Any) -> str:
    text = v.hex() if isinstance(v, bytes) else str(v)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


@router.get("/iterations/{it_id}/steps")
@page
def step_page(
    request: Request,
    who: Reader,
    it: ScopedIteration,
    state: State,
    step: Annotated[int | None, Query(ge=0)] = None,
    rank: Annotated[int, Query(ge=0)] = 0,
    client: str | None = None,
) -> HTMLResponse:
    """A step of a served iteration: its samples (a form asks for the step)."""
    tracer = _tracer(state, it)
    dynamic = it.mode == "dynamic"
    clients = list(tracer.unit_map().units) if tracer.remapped and dynamic else []
    batch, rows, columns = None, [], []
    if step is not None:
        if dynamic and not client:
            raise ConfigError("a dynamic iteration's steps are per client: choose a client")
        batch = tracer.batch(
            rank=rank,
            step=step,
            epoch=None if tracer.remapped else int(it.config["epoch"]),
            client=client if dynamic else None,
        )
        table = tracer.rows(batch.samples)
        columns = table.column_names[:MAX_SHOWN_COLUMNS]
        values = table.select(columns).to_pylist()
        rows = [
            {"sample": s, "uid": u, "cells": [_cell(r[c]) for c in columns]}
            for s, u, r in zip(batch.samples, batch.uids, values)
        ]
    return render(
        request,
        "lineage_step.html",
        who,
        it=it,
        mode=it.mode,
        clients=clients,
        step=step,
        rank=rank,
        client=client,
        batch=batch,
        rows=rows,
        columns=columns,
        dataset=str(it.config["dataset"]),
        ranks=it.world_size,
    )


@router.get("/datasets/{ref}/lineage")
@page
def sample_page(
    request: Request,
    who: Reader,
    ref: str,
    state: State,
    uid: str | None = None,
    sample: Annotated[int | None, Query(ge=0)] = None,
) -> HTMLResponse:
    """The served iterations and steps that read one sample of a dataset."""
    ds = check_dataset(who, state, ref)
    found: list[dict[str, Any]] = []
    label = None
    if uid is not None or sample is not None:
        for row in state.journal.iterations():
            if row["config"]["dataset"] != ds["id"]:
                continue
            it = state.iteration(row["id"])
            tracer = _tracer(state, it)
            if sample is None:
                values = tracer.uid_values()
                key = uid_from_text(str(uid), None if values is None else values.type)
                if key is None:
                    raise ConfigError(f"this dataset's UIDs are integers, got {uid!r}")
                s = int(tracer.samples_of([key])[0])
                if s < 0:
                    raise NotFoundError(f"no sample with UID {uid!r} in dataset {ds['name']!r}")
                sample = s
            if not 0 <= sample < tracer.n:
                raise ConfigError(f"sample {sample} is outside the dataset's [0, {tracer.n})")
            label = tracer.uids_of(np.asarray([sample], dtype=np.int64))[0]
            for h in tracer.find([sample]):
                found.append(  # the hit's own `iteration` names a record of several: None here
                    {**h.as_dict(), "iteration": it.id, "name": row["key"], "mode": it.mode}
                )
    return render(
        request, "lineage_sample.html", who, d=ds, uid=uid, sample=sample, label=label, hits=found
    )
