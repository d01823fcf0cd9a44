"""``/api/v1/iterations``: create and join (read), inspect (read), rewind and cancel (admin) iterations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from datamill.serve.access import State, requires
from datamill.serve.routes.models import IterationIn, ItId, RewindIn

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/iterations")


@router.post("", dependencies=[requires("read")])
def create_iteration(body: IterationIn, state: State) -> dict[str, Any]:
    """Create an iteration, or join the one of the same name (or config) and epoch."""
    return state.create_iteration(body.model_dump(exclude_none=True))


@router.get("", dependencies=[requires("read")])
def iterations(state: State) -> list[dict[str, Any]]:
    """Every journaled iteration with its config."""
    return [{"id": r["id"], "key": r["key"], "epoch": r["epoch"], "config":
             {k: v for k, v in r["config"].items() if k != "base_done"}} for r in state.journal.iterations()]


@router.get("/{it_id}", dependencies=[requires("read")])
def iteration(it_id: ItId, state: State) -> dict[str, Any]:
    """An iteration's id, config and per-queue batch counts."""
    return state.describe(state.iteration(it_id))


@router.get("/{it_id}/progress", dependencies=[requires("read")])
def progress(it_id: ItId, state: State) -> dict[str, Any]:
    """Done, leased and pending batches per rank and client."""
    return state.iteration(it_id).progress()


@router.get("/{it_id}/done", dependencies=[requires("read")])
def done(it_id: ItId, state: State) -> dict[str, Any]:
    """The journaled commit record: ``(start, stop, lease)`` rows in commit order."""
    return {"rows": state.journal.done(state.iteration(it_id).id)}


@router.post("/{it_id}/cancel", dependencies=[requires("admin")])
def cancel(it_id: ItId, state: State) -> dict[str, Any]:
    """Cancel an iteration for good: ``next`` answers 410 afterwards."""
    return state.cancel(state.iteration(it_id))


@router.post("/{it_id}/rewind", dependencies=[requires("read")])
def rewind(it_id: ItId, body: RewindIn, state: State) -> dict[str, Any]:
    """Set the done set from a client checkpoint."""
    return state.rewind(state.iteration(it_id), body.model_dump(exclude_none=True))
