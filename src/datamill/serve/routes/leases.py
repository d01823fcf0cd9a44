"""``/api/v1/iterations/{id}/next|ack|heartbeat``: take, acknowledge and keep leases (read).

The routes are ``async``: the lease round trip runs in the event loop and awaits the journal's group
commit (:mod:`datamill.serve.round_trip`) instead of holding a worker thread per request; only a
server-built lease's build goes to a worker thread (:func:`datamill.serve.delivery.next_reply`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamill.serve.access import Reader, ScopedIteration, State, scoped_iteration, serve_state
from datamill.serve.delivery import ack_reply, heartbeat_reply, next_reply
from datamill.serve.routes.models import ID_PATTERN, AckIn, HeartbeatIn

__all__ = ["NextQuery", "router"]

router = APIRouter(prefix="/api/v1/iterations")


class NextQuery(BaseModel):
    """The query of ``GET .../next``, bounded (validated in one pydantic call, see
    :func:`next_lease`)."""

    model_config = ConfigDict(frozen=True)

    client: str = Field(pattern=ID_PATTERN)
    rank: int = Field(0, ge=0, le=1 << 16)
    slot: int = Field(0, ge=0, le=1024)
    slots: int = Field(1, ge=1, le=1024)
    ack: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=64)
    transport: Literal["built", "direct"] = "built"


_ID_RE = re.compile(ID_PATTERN)


def _parameters() -> list[dict[str, Any]]:
    """The OpenAPI parameters of ``next`` (its handler reads them itself)."""
    schema = NextQuery.model_json_schema()
    out: list[dict[str, Any]] = [
        {"name": "it_id", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "X-Datamill-Session", "in": "header", "schema": {"type": "string"}},
    ]
    for name, prop in schema["properties"].items():
        required = name in schema.get("required", [])
        out.append({"name": name, "in": "query", "required": required, "schema": prop})
    return out


def _query(request: Request) -> tuple[str, NextQuery, str | None]:
    """The path's iteration id, the query and the session header, or a 422 like FastAPI's."""
    it_id = request.path_params["it_id"]
    errors: list[dict[str, Any]] = []
    if not _ID_RE.match(it_id):
        errors.append({"loc": ("path", "it_id"), "msg": f"expected {ID_PATTERN}", "input": it_id})
    params = request.query_params
    raw: dict[str, Any] = {k: params[k] for k in NextQuery.model_fields if k in params}
    if "ack" in raw:
        raw["ack"] = params.getlist("ack")
    q = None
    try:
        q = NextQuery.model_validate(raw)
    except ValidationError as exc:
        errors += [{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]
    session = request.headers.get("x-datamill-session")
    if session is not None and len(session) > 128:
        loc = ("header", "x-datamill-session")
        errors.append({"loc": loc, "msg": "expected at most 128 characters", "input": session})
    if errors or q is None:
        raise RequestValidationError(errors)
    return it_id, q, session


@router.get("/{it_id}/next", openapi_extra={"parameters": _parameters()})
async def next_lease(request: Request, who: Reader) -> Response:
    """Acknowledge the piggy-backed batches, then the client's next lease as an Arrow IPC stream
    (``204`` nothing left, ``409`` wait; ``transport=direct``: only the lease's runs, no body).

    The query (:class:`NextQuery`) is read here, not declared parameter by parameter: FastAPI's
    per-parameter resolution cost more than the whole round trip of a direct-mode client.
    """
    it_id, q, session = _query(request)
    state = serve_state(request)
    it = await scoped_iteration(it_id, state, who)
    return await next_reply(
        state,
        it,
        client=q.client,
        rank=q.rank,
        slot=q.slot,
        slots=q.slots,
        ack=q.ack,
        session=session,
        owner=who.key_id or "",
        transport=q.transport,
    )


@router.post("/{it_id}/ack")
async def ack(
    who: Reader,
    it: ScopedIteration,
    body: AckIn,
    state: State,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
) -> JSONResponse:
    """Acknowledge consumed batches (one journal transaction; ``409`` refused, ``410`` expired)."""
    return await ack_reply(state, it, body, session=x_datamill_session)


@router.post("/{it_id}/heartbeat")
async def heartbeat(
    who: Reader,
    it: ScopedIteration,
    body: HeartbeatIn,
    state: State,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
) -> JSONResponse:
    """Keep (after a restart: reclaim) a client's leases; answers the ones it lost."""
    return heartbeat_reply(state, it, body, session=x_datamill_session)
