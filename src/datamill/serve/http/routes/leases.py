"""``/api/v1/iterations/{id}/next|ack|heartbeat``: take, acknowledge and keep leases (read).

The routes are ``async``: the lease round trip runs in the event loop and awaits the journal's group
commit (:mod:`datamill.serve.protocol.iteration`) instead of holding a worker thread per request;
only a server-built lease's build goes to a worker thread
(:func:`datamill.serve.http.delivery.next_reply`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal
from urllib.parse import unquote_plus

from fastapi import APIRouter, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamill.serve.http.access import (
    Reader,
    ScopedIteration,
    State,
    role_check,
    route_roles,
    scoped_iteration,
    serve_state,
)
from datamill.serve.http.delivery import ack_reply, heartbeat_reply, next_reply
from datamill.serve.http.routes.models import ID_PATTERN, AckIn, HeartbeatIn

__all__ = ["NextLane", "NextQuery", "router"]

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


def _params(query: bytes) -> dict[str, list[str]]:
    """A query string's fields as Starlette's ``QueryParams`` reads them (``parse_qsl`` with blank
    values kept), without building one (the lease route is the server's hottest path)."""
    out: dict[str, list[str]] = {}
    for part in query.decode("latin-1").split("&"):
        if part:
            name, _, value = part.partition("=")
            out.setdefault(unquote_plus(name), []).append(unquote_plus(value))
    return out


def _query(request: Request) -> tuple[str, NextQuery, str | None]:
    """The path's iteration id, the query and the session header, or a 422 like FastAPI's."""
    it_id = request.path_params["it_id"]
    errors: list[dict[str, Any]] = []
    if not _ID_RE.match(it_id):
        errors.append({"loc": ("path", "it_id"), "msg": f"expected {ID_PATTERN}", "input": it_id})
    raw: dict[str, Any] = {}
    for field, values in _params(request.scope["query_string"]).items():
        if field in NextQuery.model_fields:
            raw[field] = values if field == "ack" else values[-1]
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


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_NEXT_PATH = re.compile(r"^/api/v1/iterations/([^/]+)/next$")


class NextLane:
    """ASGI middleware: ``GET /api/v1/iterations/{it_id}/next`` straight to :func:`next_lease`.

    The route is declared in :data:`router` like every other (its role, its query in the OpenAPI
    schema); this layer only dispatches it without FastAPI's router and dependency resolution, which
    cost about as much CPU as the rest of a direct-mode client's round trip (the coordination
    benchmark, ``benchmarks/bench_coord.py``). It runs the role check the route declares, then the
    handler; an exception goes to the app's own handler for its type (one without a handler of its
    own propagates, as from the router), so the answers are the router's. It is the innermost
    middleware: the body limit, the ``Host``/``Origin`` guard and the request metrics apply as to
    any route, and ``scope["route"]`` is the declared route (the metrics' label).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.route = next(r for r in router.routes if getattr(r, "endpoint", None) is next_lease)
        (role,) = route_roles(self.route)
        self.check = role_check(role)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        m = _NEXT_PATH.match(scope["path"]) if scope["type"] == "http" else None
        if m is None or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        scope.update(path_params={"it_id": m[1]}, route=self.route, endpoint=next_lease)
        request = Request(scope, receive)
        try:
            who = await self.check(request)
            assert who is not None
            response = await next_lease(request, who)
        except Exception as exc:
            handler = _handler(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)


def _handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The app's handler of ``exc``'s type (or of a base class other than ``Exception``)."""
    for cls in type(exc).__mro__[:-2]:  # without Exception and BaseException
        if cls in handlers:
            return handlers[cls]
    return None
