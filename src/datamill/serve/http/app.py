"""The HTTP layer: a FastAPI app over :class:`~datamill.serve.server.ServeState` (imports fastapi):
one router per resource, each route declaring its role (the one place a caller is authenticated);
every error a JSON body ``{"error": ...}`` with a 4xx status (the UI renders it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from datamill.core.errors import BuildError, DataFileNotFoundError, DatamillError
from datamill.serve.data.views import Inspector
from datamill.serve.data.views import router as views_router
from datamill.serve.http.auth import create_key
from datamill.serve.http.guard import DEFAULT_HOSTS, AllowedHosts, Guard
from datamill.serve.http.routes import datasets, health, iterations, keys, leases, trace
from datamill.serve.http.routes.leases import NextLane
from datamill.serve.http.routes.metrics import metrics_router
from datamill.serve.http.routes.models import one_line
from datamill.serve.journal.leases import RETRY_AFTER_S, UnavailableError
from datamill.serve.observe.metrics import RequestMetrics
from datamill.serve.server import CancelledError, ConflictError, NotFoundError, ServeState
from datamill.serve.ui import lineage
from datamill.serve.ui.pages import root as ui_root
from datamill.serve.ui.pages import router as ui_router

__all__ = ["MAX_BODY", "create_app"]

MAX_BODY = 1 << 20
"""Largest request body accepted (bytes); larger ones get 413."""


class _TooLargeError(Exception):
    pass


class _BodyLimit:
    """Refuse bodies over ``limit`` bytes with a 413 JSON error (by header, or while streaming)."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app, self.limit = app, limit
        self.refusal = JSONResponse(
            {"error": f"request body larger than {limit} bytes"},
            status_code=413,
            headers={"connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if any(
            name == b"content-length" and (not value.isdigit() or int(value) > self.limit)
            for name, value in scope.get("headers", [])
        ):
            return await self.refusal(scope, receive, send)
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                raise _TooLargeError
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLargeError:
            if not started:
                await self.refusal(scope, receive, send)


_STATUS = {
    NotFoundError: 404,
    DataFileNotFoundError: 404,
    CancelledError: 410,
    ConflictError: 409,
    BuildError: 503,  # the server's build, not the request: the client retries
}


async def _on_datamill_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DatamillError)
    status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 400)
    return JSONResponse({"error": exc.one_line(), "type": type(exc).__name__}, status_code=status)


async def _on_unavailable(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, UnavailableError)  # the journal cannot be written now
    body = {"error": exc.one_line(), "type": type(exc).__name__}
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if request.url.path.startswith("/ui/") and exc.status_code == 401:
        from datamill.serve.ui.pages import access_page

        return access_page(request)
    if _ui(request):  # a key without the role, an unknown /ui/... path: the UI's own error page
        from datamill.serve.ui.render import error_page

        return error_page(request, exc.status_code, str(exc.detail))
    detail = exc.detail
    if exc.status_code == 400 and detail == "There was an error parsing the body":  # a ValueError
        detail = (
            f"{request.method} {request.url.path}: expected a JSON body (UTF-8, integers of at "
            "most 4,300 digits), could not parse it"
        )
    return JSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)


async def _on_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    if _ui(request):  # a bad query parameter of a page: the UI's own error page
        from datamill.serve.ui.render import error_page

        return error_page(request, 400, one_line(exc.errors()))
    return JSONResponse({"error": one_line(exc.errors())}, status_code=422)


def _ui(request: Request) -> bool:
    path = request.url.path
    return (path == "/ui" or path.startswith("/ui/")) and not path.startswith("/ui/static/")


async def _on_bug(request: Request, exc: Exception) -> Response:
    rid = request.scope.get("datamill.request_id", "")
    return JSONResponse(
        {
            "error": f"internal error: {type(exc).__name__} (request id {rid}, in the server log)",
            "request_id": rid,
        },
        status_code=500,
        headers={"X-Request-Id": rid},
    )


@contextlib.asynccontextmanager
async def _closing(app: FastAPI) -> AsyncIterator[None]:
    app.state.serve.telemetry.start(app.state.serve)
    yield
    app.state.serve.close()


def _routers() -> list[APIRouter]:
    """Every router of the server, the web UI's included, in the order they are mounted (here, above
    both the API's routes and the UI, which calls some of them)."""
    return [
        leases.router,  # first: the lease round trip is most requests (routes are matched in order)
        health.router,
        datasets.router,
        views_router,
        keys.router,
        iterations.router,
        trace.router,
        trace.runs_router,
        lineage.router,
        ui_router,
        ui_root,
    ]


def create_app(
    state_dir: str | os.PathLike[str],
    *,
    allowed_hosts: Sequence[str] = DEFAULT_HOSTS,
    metrics_no_auth: bool = False,
    **options: Any,
) -> FastAPI:
    """The FastAPI application of a server with its state in ``state_dir``.

    Args:
        state_dir: folder of the SQLite journal (created).
        allowed_hosts: accepted ``Host`` names (``name`` or ``name:port``; ``*`` any). Defaults to
            the loopback names.
        metrics_no_auth: ``GET /metrics`` without a key (the caller checks the address is loopback).
            Defaults to ``False`` (a ``metrics`` or ``admin`` key).
        **options: the :class:`~datamill.serve.server.ServeState`'s, whole: ``roots``, ``auth``
            (``Authorization: Bearer dmk_...`` keys), ``lease_timeout``, ``cache_shards``,
            ``build_workers``.

    Returns:
        The app: ``app.state.serve`` is the :class:`ServeState`; ``app.state.initial_admin_key`` is
        the one-time admin key created on a first start with auth and no key, else ``None``.

    Examples:
        >>> import tempfile
        >>> app = create_app(tempfile.mkdtemp(), auth=False)
        >>> app.state.serve.datasets()
        []
    """
    state = ServeState(state_dir, **options)
    app = FastAPI(
        title="datamill serve",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=_closing,
        exception_handlers={
            DatamillError: _on_datamill_error,
            UnavailableError: _on_unavailable,
            StarletteHTTPException: _on_http_error,
            RequestValidationError: _on_invalid,
            Exception: _on_bug,
        },
    )
    for router in _routers():
        app.include_router(router)
    app.include_router(metrics_router(public=metrics_no_auth))
    app.add_middleware(NextLane)  # innermost: the lease route past the router (see its docstring)
    app.add_middleware(_BodyLimit, limit=MAX_BODY)
    app.add_middleware(Guard, hosts=AllowedHosts(allowed_hosts))
    app.add_middleware(RequestMetrics, telemetry=state.telemetry)
    app.state.serve, app.state.ui_secret = state, secrets.token_bytes(32)
    app.state.inspector = Inspector(state)
    app.state.initial_admin_key = None
    if state.auth and state.keys.count() == 0:
        _, app.state.initial_admin_key = create_key(state.journal, role="admin", note="first start")
        state.keys.reload()
    return app
