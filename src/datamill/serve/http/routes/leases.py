"""``/api/v1/iterations/{id}/next|ack|heartbeat``: take, acknowledge and keep leases (read).

Their contract (the headers of a lease, the statuses of an ack and their codes) is
``docs/serving-delivery.md``. The routes are ``async``: the round trip
(:meth:`~datamill.serve.server.ServeState.round_trip`) awaits the journal's group commit in the
event loop; only a server-built lease's build goes to a worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal
from urllib.parse import unquote_plus

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from datamill.core.wire import FENCE_PATTERN, SESSION_PATTERN, format_runs
from datamill.serve.http.access import (
    Reader,
    ScopedIteration,
    State,
    role_check,
    route_roles,
    scoped_iteration,
    serve_state,
)
from datamill.serve.http.routes.models import ID_PATTERN, AckIn, HeartbeatIn
from datamill.serve.protocol.state import AckItem
from datamill.serve.server import ARROW_STREAM

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
_ACK_RE = re.compile(  # an id, a fence, positions of at most 12 digits (below MAX_UNITS, 2**40)
    rf"^({ID_PATTERN[1:-1]}):({FENCE_PATTERN[1:-1]})(?::(\d{{1,12}})-(\d{{1,12}}))?$"
)
_CODES = {"outside": 422, "refused": 409, "expired": 410}  # an ack's answer: the first found
_ERRORS = {
    409: "refused: a lease of another session, or a wrong fence",
    410: "expired: a lease that is no longer live (its batches go to another lease)",
    422: "outside: positions [start, stop) not within the lease's X-Datamill-Positions",
}


def _session(session: str | None, client: str) -> str:
    if session is not None and not re.fullmatch(SESSION_PATTERN, session):
        raise HTTPException(422, "X-Datamill-Session must be 16-128 letters, digits, '_' or '-'")
    return client if session is None else session


def _check_items(items: Sequence[AckItem]) -> None:
    """Refuse (422) an empty or reversed range of positions (the ids, fences and bounds are checked
    before: by :data:`_ACK_RE` on ``/next``, by the body's model on ``/ack``)."""
    bad = next(((a, b) for *_, a, b in items if a is not None and b is not None and a >= b), None)
    if bad is not None:
        raise HTTPException(422, f"an ack's positions need start < stop, got {list(bad)}")


def _reply(out: dict[str, Any], code: int) -> JSONResponse:
    """An ack's or heartbeat's answer, with what its status code means."""
    if code != 200:
        out["error"] = _ERRORS[code]
    return JSONResponse(out, status_code=code)


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
    secret = _session(session, q.client)
    items: list[AckItem] = []
    for raw in q.ack or ():
        m = _ACK_RE.match(raw)
        if m is None:
            raise HTTPException(
                422, f"ack must be <lease>:<fence>[:<start>-<stop>], got {raw[:80]!r}"
            )
        items.append(
            (m[1], m[2], None if m[3] is None else int(m[3]), None if m[4] is None else int(m[4]))
        )
    _check_items(items)
    statuses, payload = await state.round_trip(
        it,
        q.client,
        items,
        rank=q.rank,
        slot=q.slot,
        slots=q.slots,
        session=secret,
        owner=who.key_id or "",
        transport=q.transport,
    )
    acks = {"X-Datamill-Acks": ",".join(f"{k}={v}" for k, v in statuses.items())}
    if payload is None:
        if it.finished(rank=q.rank):
            return Response(status_code=204, headers=acks)
        return JSONResponse(
            {"error": "wait: other leases are in flight"},
            status_code=409,
            headers={**acks, "Retry-After": "0.05"},
        )
    lease = payload.lease
    return _InPieces(
        memoryview(payload.body).cast("B"),
        media_type=ARROW_STREAM,
        headers={
            **acks,
            "X-Datamill-Lease": lease.id,
            "X-Datamill-Fence": lease.fence,
            "X-Datamill-Positions": f"{lease.queue}:{lease.start}-{lease.stop}",
            "X-Datamill-Units": ",".join(map(str, payload.units)),
            "X-Datamill-Epoch": str(payload.epoch),
            "X-Datamill-Done": str(payload.done),
            "X-Datamill-Runs": format_runs(payload.runs or []),
            "X-Datamill-Lease-TTL": f"{it.lease_timeout:g}",
        },
    )


class _InPieces(Response):
    """A body sent in pieces of :attr:`PIECE` bytes: the server waits for the socket between them,
    so a lease is never copied whole into the connection's buffer (fresh pages for each lease)."""

    PIECE = 1 << 20

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        body, n, step = self.body, len(self.body), self.PIECE
        for at in range(0, n, step) or [0]:
            piece = body[at : at + step]
            await send({"type": "http.response.body", "body": piece, "more_body": at + step < n})


@router.post("/{it_id}/ack")
async def ack(
    who: Reader,
    it: ScopedIteration,
    body: AckIn,
    state: State,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
) -> JSONResponse:
    """Acknowledge consumed batches (one journal transaction; ``409`` refused, ``410`` expired,
    ``422`` outside its lease)."""
    items: list[AckItem] = [(a, f, None, None) for a, f in body.leases]
    items += [(a, f, s, e) for a, f, s, e in body.acks]
    _check_items(items)
    session = _session(x_datamill_session, body.client)
    statuses, _ = await state.ack_batches(it, items, session=session)
    codes = set(statuses.values())
    code = next((c for st, c in _CODES.items() if st in codes), 200)
    return _reply({"acks": statuses}, code)


@router.post("/{it_id}/heartbeat")
async def heartbeat(
    who: Reader,
    it: ScopedIteration,
    body: HeartbeatIn,
    state: State,
    x_datamill_session: Annotated[str | None, Header(max_length=128)] = None,
) -> JSONResponse:
    """Keep (after a restart: reclaim) a client's leases; answers the ones it lost."""
    res = state.heartbeat(
        it,
        body.client,
        leases=body.leases,
        session=_session(x_datamill_session, body.client),
        stall_s=body.stall_s,
        batches=body.batches,
    )
    return _reply(dict(res), 409 if res["refused"] else 410 if res["lost"] else 200)


_NEXT_PATH = re.compile(r"^/api/v1/iterations/([^/]+)/next$")


class NextLane:
    """ASGI middleware: ``GET /api/v1/iterations/{it_id}/next`` straight to :func:`next_lease`,
    without FastAPI's router and dependency resolution (they cost about as much CPU as the rest of
    a direct client's round trip: ``benchmarks/bench_coord.py``). The route stays declared in
    :data:`router`; this runs its role check, its handler and the app's exception handlers, so the
    answers are the router's. Innermost: the other middleware apply as to any route.
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
