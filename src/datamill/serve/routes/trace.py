"""``GET /api/v1/iterations/{id}/trace`` (read): the iteration's run record, for ``datamill
trace``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from datamill.serve.access import Reader, ScopedIteration, State

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/iterations")


@router.get("/{it_id}/trace")
def trace(who: Reader, it: ScopedIteration, state: State) -> dict[str, Any]:
    """The run record of the iteration (:func:`datamill.serve.trace.iteration_record`)."""
    from datamill.serve.trace import iteration_record

    return iteration_record(state, it)
