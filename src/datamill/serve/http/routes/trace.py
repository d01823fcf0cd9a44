"""The lineage routes (read), for ``datamill trace``: an iteration's run record, and the records of
a named run's iterations (a page, limited to the datasets the caller's key may use).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from datamill.serve.http.access import Reader, ScopedIteration, State, may_use
from datamill.serve.http.routes.models import ID_PATTERN

__all__ = ["router", "runs_router"]

router = APIRouter(prefix="/api/v1/iterations")
runs_router = APIRouter(prefix="/api/v1/runs")


@router.get("/{it_id}/trace")
def trace(who: Reader, it: ScopedIteration, state: State) -> dict[str, Any]:
    """The run record of the iteration (:func:`datamill.serve.data.trace.iteration_record`)."""
    from datamill.serve.data.trace import iteration_record

    return iteration_record(state, it)


@runs_router.get("/{name}/trace")
def run_trace(
    who: Reader,
    state: State,
    name: str,
    dataset: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    from_epoch: Annotated[int, Query(ge=0, le=1 << 30)] = 0,
    limit: Annotated[int, Query(ge=1, le=64)] = 64,
) -> dict[str, Any]:
    """The run records of the iterations named ``name`` (one per epoch; at most 64, the
    :data:`~datamill.serve.data.trace.MAX_RUN_RECORDS`;
    :func:`datamill.serve.data.trace.run_records`)."""
    from datamill.serve.data.trace import run_records

    names = {d["id"]: d["name"] for d in state.journal.datasets()}
    return run_records(
        state,
        name,
        may_use=lambda ds: may_use(who, {"id": ds, "name": names.get(ds, "")}),
        dataset=dataset,
        from_epoch=from_epoch,
        limit=limit,
    )
