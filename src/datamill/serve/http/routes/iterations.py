"""``/api/v1/iterations``: create and join (read), inspect (read), resume (read, the creating key),
rewind and cancel (admin) iterations."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from datamill.serve.http.access import (
    Admin,
    Reader,
    ScopedIteration,
    State,
    audit,
    check_dataset,
    may_use,
)
from datamill.serve.http.routes.models import ID_PATTERN, IterationIn, ResumeIn, RewindIn
from datamill.serve.observe import lifecycle
from datamill.serve.observe.lifecycle import MAX_PAGE
from datamill.serve.observe.logs import event

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/iterations")


@router.post("")
def create_iteration(who: Reader, body: IterationIn, state: State) -> dict[str, Any]:
    """Create an iteration, or join the one of the same name (or config) and epoch (its shape is
    checked against its dataset by :meth:`~datamill.serve.catalog.Catalog.create_iteration`)."""
    check_dataset(who, state, body.dataset)
    desc = state.create_iteration(body.model_dump(exclude_none=True))
    state.journal.set_owner(desc["id"], who.key_id or "")
    return desc


@router.get("")
def iterations(
    who: Reader,
    state: State,
    status: Annotated[Literal["running", "finished", "cancelled", "stale"] | None, Query()] = None,
    dataset: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
) -> dict[str, Any]:
    """A page of journaled iterations (of the datasets the caller's key may use), oldest first, with
    status, start, end, duration and clients seen: ``{"iterations": [...], "next": id or null}``."""
    allowed = [ds["id"] for ds in state.journal.datasets() if may_use(who, ds)]
    if dataset is not None:
        allowed = [check_dataset(who, state, dataset)["id"]]
    rows, nxt = lifecycle.page(
        state.journal, status=status, datasets=allowed, limit=limit, after=after
    )
    return {"iterations": rows, "next": nxt}


@router.get("/{it_id}")
def iteration(who: Reader, it: ScopedIteration, state: State) -> dict[str, Any]:
    """An iteration's id, config and per-queue batch counts."""
    return state.describe(it)


@router.get("/{it_id}/progress")
def progress(who: Reader, it: ScopedIteration, state: State) -> dict[str, Any]:
    """Done, leased and pending batches per rank and client."""
    return state.progress(it)


@router.get("/{it_id}/done")
def done(who: Reader, it: ScopedIteration, state: State) -> dict[str, Any]:
    """The journaled commit record: ``(start, stop, lease)`` rows in commit order."""
    return {"rows": state.journal.done(it.id)}


@router.post("/{it_id}/cancel")
def cancel(who: Admin, it: ScopedIteration, state: State) -> dict[str, Any]:
    """Cancel an iteration for good: ``next`` answers 410 afterwards."""
    out = state.cancel(it)
    audit(state, who, "cancel iteration", it.id)
    return out


@router.post("/{it_id}/rewind")
async def rewind(who: Admin, it: ScopedIteration, body: RewindIn, state: State) -> dict[str, Any]:
    """Set the done set: ``{rank, consumed}`` (static mode) or ``{done: [[start, stop], ...]}``
    (admin)."""
    out = await state.rewind(it, body.model_dump(exclude_none=True))
    audit(state, who, "rewind iteration", f"{it.id} {body.model_dump(exclude_none=True)}"[:500])
    return out


@router.post("/{it_id}/resume")
async def resume(who: Reader, it: ScopedIteration, body: ResumeIn, state: State) -> dict[str, Any]:
    """Resume one rank of a static iteration from a checkpoint (``RemoteLoader.load_state_dict``).

    Only the key that created the iteration (or an admin key) may: another job's key cannot reset
    it.
    """
    owner = state.journal.owner(it.id)
    if not who.admin and owner is not None and owner != (who.key_id or ""):
        raise HTTPException(
            403, "only the key that created this iteration (or an admin key) may resume it"
        )
    event(
        "resume iteration", iteration=it.id, key=who.key_id, rank=body.rank, consumed=body.consumed
    )
    if body.session is not None:
        return await state.rollback(it, session=body.session, consumed=body.consumed)
    return await state.rewind(it, {"rank": body.rank, "consumed": body.consumed})
