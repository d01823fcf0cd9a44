"""The HTTP layer: a FastAPI app over :class:`~datamill.serve.server.ServeState` (imports fastapi).

Routes (under ``/api/v1``; ``read`` keys iterate and view, ``admin`` keys also register and manage keys):

* ``GET /health`` (no key) | ``GET/POST /datasets`` | ``GET/POST /keys``, ``DELETE /keys/{id}``
* ``POST /iterations`` (idempotent by name or config) | ``GET /iterations/{id}`` | ``.../progress`` | ``.../done``
* ``GET /iterations/{id}/next?client=&rank=&slot=&slots=&ack=<lease>:<fence>`` -> ``200`` Arrow IPC stream
  (one record batch per batch; headers ``X-Datamill-Lease``, ``-Fence``, ``-Units``, ``-Positions``,
  ``-Epoch``, ``-Acks``), ``204`` nothing left for this client, ``409`` wait (others hold the rest)
* ``POST /iterations/{id}/ack`` (``410`` for a lease of an earlier server run, ``409`` when fenced)
* ``POST /iterations/{id}/heartbeat`` | ``POST /iterations/{id}/rewind`` | ``POST /iterations/{id}/cancel``
  (admin; afterwards ``next`` answers ``410``)

Every error is a JSON body ``{"error": ...}`` with a 4xx status; oversized bodies get 413.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from datamill.core.errors import DataFileNotFoundError, DatamillError
from datamill.serve.auth import create_key
from datamill.serve.delivery import (
    AckIn,
    HeartbeatIn,
    ack_reply,
    heartbeat_reply,
    next_reply,
    unavailable_reply,
)
from datamill.serve.lease_journal import UnavailableError
from datamill.serve.server import (
    CancelledError,
    ConflictError,
    NotFoundError,
    ServeState,
)

__all__ = ["MAX_BODY", "create_app"]

MAX_BODY = 1 << 20
"""Largest request body accepted (bytes); larger ones get 413."""

_OPEN = frozenset({"/api/v1/health", "/api/v1/openapi.json"})
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ItId = Annotated[str, Path(pattern=_ID)]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetIn(_Body):
    path: str = Field(min_length=1, max_length=4096)
    name: str = Field(pattern=_ID)


class KeyIn(_Body):
    role: Literal["read", "admin"] = "read"
    note: str = Field("", max_length=200)


class IterationIn(_Body):
    dataset: str = Field(pattern=_ID)
    batch_size: int = Field(ge=1, le=1 << 20)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    epoch: int = Field(0, ge=0, le=1 << 30)
    shuffle: bool = True
    columns: list[str] | None = Field(None, max_length=10_000)
    drop_last: bool = False
    window: int | None = Field(None, ge=1)
    mode: Literal["static", "dynamic"] = "static"
    world_size: int = Field(1, ge=1, le=1 << 16)
    name: str | None = Field(None, pattern=_ID)
    lease_size: int = Field(16, ge=1, le=4096)
    lease_timeout: float | None = Field(None, gt=0, le=86_400)
    resume_from: str | None = Field(None, pattern=_ID)
    loader_states: list[dict[str, Any]] | None = Field(None, max_length=1 << 16)


class RewindIn(_Body):
    rank: int | None = Field(None, ge=0)
    consumed: int | None = Field(None, ge=0)
    done: list[tuple[int, int]] | None = None


class _TooLargeError(Exception):
    pass


def _limit_body(app: ASGIApp, limit: int) -> ASGIApp:
    """Refuse bodies over ``limit`` bytes with a 413 JSON error (by header, or while streaming)."""

    async def send_413(send: Callable[[Message], Awaitable[None]]) -> None:
        body = json.dumps({"error": f"request body larger than {limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def middleware(scope: Scope, receive: Callable[[], Awaitable[Message]],
                         send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and (not value.isdigit() or int(value) > limit):
                await send_413(send)
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise _TooLargeError
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await app(scope, limited_receive, tracking_send)
        except _TooLargeError:
            if not started:
                await send_413(send)

    return middleware


def _guard(app: ASGIApp, state: ServeState) -> ASGIApp:
    """Answer requests without a valid key with 401 before routing (cheap under a flood of bad requests)."""
    body = json.dumps({"error": "missing, invalid or revoked API key: send `Authorization: Bearer dmk_...`"}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def middleware(scope: Scope, receive: Callable[[], Awaitable[Message]],
                         send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] == "http" and state.auth and scope["path"].startswith("/api/") and \
                scope["path"] not in _OPEN:
            auth = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
            key = auth[7:].decode("latin-1").strip() if auth.startswith(b"Bearer ") else ""
            if state.keys.check(key) is None:
                await send({"type": "http.response.start", "status": 401, "headers": head})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return middleware


def _status(exc: DatamillError) -> int:
    if isinstance(exc, (NotFoundError, DataFileNotFoundError)):
        return 404
    if isinstance(exc, CancelledError):
        return 410
    return 409 if isinstance(exc, ConflictError) else 400


def create_app(state_dir: str | os.PathLike[str], *, roots: Sequence[str | os.PathLike[str]] = (),
               auth: bool = True, lease_timeout: float = 60.0, cache_shards: int | None = None,
               max_body: int = MAX_BODY) -> Any:
    """The FastAPI application of a server with its state in ``state_dir``.

    Args:
        state_dir: folder of the SQLite journal (created).
        roots: folders datasets may be registered from. Defaults to ``()``.
        auth: require API keys (``Authorization: Bearer dmk_...``). Defaults to ``True``.
        lease_timeout: default lease lifetime without heartbeats, seconds. Defaults to ``60.0``.
        cache_shards: released shards each batch service keeps for later leases. Defaults to ``None``
            (two shuffle windows per rank: a lease built after another reuses its shards instead of rereading them).
        max_body: largest request body in bytes. Defaults to :data:`MAX_BODY`.

    Returns:
        The ASGI app (``app.state.serve`` is the :class:`ServeState`; ``app.state.initial_admin_key`` is
        the one-time admin key created on a first start with auth and no key, else ``None``).

    Examples:
        >>> import tempfile
        >>> app = create_app(tempfile.mkdtemp(), auth=False)
        >>> app.state.serve.datasets()
        []
    """
    state = ServeState(state_dir, roots=roots, auth=auth, lease_timeout=lease_timeout, cache_shards=cache_shards)
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        state.close()

    api = FastAPI(title="datamill serve", docs_url=None, redoc_url=None, openapi_url="/api/v1/openapi.json",
                  lifespan=lifespan)
    api.state.serve = state
    api.state.initial_admin_key = None
    if auth and state.keys.count() == 0:
        _, api.state.initial_admin_key = create_key(state.journal, role="admin", note="first start")
        state.keys.reload()

    def role(needed: str) -> Callable[..., str]:
        def check(authorization: Annotated[str | None, Header()] = None) -> str:
            if not state.auth:
                return "admin"
            if not authorization or not authorization.startswith("Bearer "):
                raise HTTPException(401, "missing API key: send `Authorization: Bearer dmk_...`")
            got = state.keys.check(authorization[len("Bearer "):].strip())
            if got is None:
                raise HTTPException(401, "invalid or revoked API key")
            if needed == "admin" and got != "admin":
                raise HTTPException(403, "this route needs an admin key")
            return got

        return check

    read, admin = Depends(role("read")), Depends(role("admin"))

    @api.exception_handler(DatamillError)
    async def on_datamill_error(request: Request, exc: DatamillError) -> JSONResponse:
        return JSONResponse({"error": exc.one_line(), "type": type(exc).__name__}, status_code=_status(exc))

    @api.exception_handler(UnavailableError)
    async def on_unavailable(request: Request, exc: UnavailableError) -> JSONResponse:
        return unavailable_reply(exc)

    @api.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)

    @api.get("/api/v1/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "boot": state.boot, "auth": state.auth}

    @api.get("/api/v1/datasets", dependencies=[read])
    def datasets() -> list[dict[str, Any]]:
        return state.datasets()

    @api.post("/api/v1/datasets", dependencies=[admin])
    def register(body: DatasetIn) -> dict[str, Any]:
        return state.register(body.path, name=body.name)

    @api.get("/api/v1/keys", dependencies=[admin])
    def keys() -> list[dict[str, Any]]:
        return state.keys.listing()

    @api.post("/api/v1/keys", dependencies=[admin])
    def new_key(body: KeyIn) -> dict[str, Any]:
        key_id, key = create_key(state.journal, role=body.role, note=body.note)
        state.keys.reload()
        return {"id": key_id, "key": key, "role": body.role}

    @api.delete("/api/v1/keys/{key_id}", dependencies=[admin])
    def revoke(key_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9]{1,32}$")]) -> dict[str, Any]:
        if not state.journal.revoke_key(key_id):
            raise NotFoundError(f"no live key {key_id!r}")
        state.keys.reload()
        return {"revoked": key_id}

    @api.post("/api/v1/iterations", dependencies=[read])
    def create_iteration(body: IterationIn) -> dict[str, Any]:
        return state.create_iteration(body.model_dump(exclude_none=True))

    @api.get("/api/v1/iterations", dependencies=[read])
    def iterations() -> list[dict[str, Any]]:
        return [{"id": r["id"], "key": r["key"], "epoch": r["epoch"], "config":
                 {k: v for k, v in r["config"].items() if k != "base_done"}} for r in state.journal.iterations()]

    @api.get("/api/v1/iterations/{it_id}", dependencies=[read])
    def iteration(it_id: ItId) -> dict[str, Any]:
        return state.describe(state.iteration(it_id))

    @api.get("/api/v1/iterations/{it_id}/progress", dependencies=[read])
    def progress(it_id: ItId) -> dict[str, Any]:
        return state.iteration(it_id).progress()

    @api.get("/api/v1/iterations/{it_id}/done", dependencies=[read])
    def done(it_id: ItId) -> dict[str, Any]:
        return {"rows": state.journal.done(state.iteration(it_id).id)}

    @api.get("/api/v1/iterations/{it_id}/next", dependencies=[read])
    def next_lease(it_id: ItId, client: Annotated[str, Query(pattern=_ID)], rank: Annotated[int, Query(ge=0)] = 0,
                   slot: Annotated[int, Query(ge=0)] = 0, slots: Annotated[int, Query(ge=1, le=1024)] = 1,
                   ack: Annotated[list[str] | None, Query(max_length=64)] = None,
                   x_datamill_session: Annotated[str | None, Header()] = None) -> Response:
        return next_reply(state, it_id, client=client, rank=rank, slot=slot, slots=slots, ack=ack,
                          session=x_datamill_session)

    @api.post("/api/v1/iterations/{it_id}/ack", dependencies=[read])
    def ack(it_id: ItId, body: AckIn, x_datamill_session: Annotated[str | None, Header()] = None) -> JSONResponse:
        return ack_reply(state, it_id, body, session=x_datamill_session)

    @api.post("/api/v1/iterations/{it_id}/heartbeat", dependencies=[read])
    def heartbeat(it_id: ItId, body: HeartbeatIn,
                  x_datamill_session: Annotated[str | None, Header()] = None) -> JSONResponse:
        return heartbeat_reply(state, it_id, body, session=x_datamill_session)

    @api.post("/api/v1/iterations/{it_id}/cancel", dependencies=[admin])
    def cancel(it_id: ItId) -> dict[str, Any]:
        return state.cancel(state.iteration(it_id))

    @api.post("/api/v1/iterations/{it_id}/rewind", dependencies=[read])
    def rewind(it_id: ItId, body: RewindIn) -> dict[str, Any]:
        return state.rewind(state.iteration(it_id), body.model_dump(exclude_none=True))

    from datamill.serve.ui import install_ui

    install_ui(api)  # the web UI at /ui and the dataset views (datamill.serve.views)
    wrapped = _limit_body(_guard(api, state), max_body)
    wrapped.state = api.state  # type: ignore[attr-defined]  # callers reach the state through the app
    return wrapped
