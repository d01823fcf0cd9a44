"""``/api/v1/iterations/{id}/next|ack|heartbeat``: take, acknowledge and keep leases (read)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response

from datamill.serve.access import Reader, ScopedIteration, State
from datamill.serve.delivery import ack_reply, heartbeat_reply, next_reply
from datamill.serve.routes.models import ID_PATTERN, AckIn, HeartbeatIn

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/iterations")


@router.get("/{it_id}/next")
def next_lease(
    who: Reader,
    it: ScopedIteration,
    state: State,
    client: Annotated[str, Query(pattern=ID_PATTERN)],
    rank: Annotated[int, Query(ge=0, le=1 << 16)] = 0,
    slot: Annotated[int, Query(ge=0, le=1024)] = 0,
    slots: Annotated[int, Query(ge=1, le=1024)] = 1,
    ack: Annotated[list[Annotated[str, Query(max_length=200)]] | None, Query(max_length=64)] = None,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
    transport: Annotated[Literal["built", "direct"], Query()] = "built",
) -> Response:
    """Acknowledge the piggy-backed batches, then the client's next lease as an Arrow IPC stream
    (``204`` nothing left, ``409`` wait; ``transport=direct``: only the lease's runs, no body)."""
    return next_reply(
        state,
        it,
        client=client,
        rank=rank,
        slot=slot,
        slots=slots,
        ack=ack,
        session=x_datamill_session,
        owner=who.key_id or "",
        transport=transport,
    )


@router.post("/{it_id}/ack")
def ack(
    who: Reader,
    it: ScopedIteration,
    body: AckIn,
    state: State,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
) -> JSONResponse:
    """Acknowledge consumed batches (one journal transaction; ``409`` refused, ``410`` expired)."""
    return ack_reply(state, it, body, session=x_datamill_session)


@router.post("/{it_id}/heartbeat")
def heartbeat(
    who: Reader,
    it: ScopedIteration,
    body: HeartbeatIn,
    state: State,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
) -> JSONResponse:
    """Keep (after a restart: reclaim) a client's leases; answers the ones it lost."""
    return heartbeat_reply(state, it, body, session=x_datamill_session)
