"""What every UI page module shares: the Jinja2 environment and its filters, the ``/ui`` router,
rendering, the error-page wrapper, form parsing and the post/redirect/get answer."""

from __future__ import annotations

import functools
import inspect
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from datamill.core.errors import DatamillError
from datamill.serve.http.access import Viewer, authenticate
from datamill.serve.http.routes.models import one_line
from datamill.serve.server import NotFoundError
from datamill.serve.ui.session import CSRF_FIELD

__all__ = ["HERE", "STATIC", "error_page", "form", "page", "render", "root", "router", "see"]

HERE = Path(__file__).resolve().parent
STATIC = {
    "ui.css": "text/css; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["num"] = lambda v: f"{v:,}" if isinstance(v, int) else ("" if v is None else str(v))
_ENV.filters["bytes"] = lambda n: next(
    f"{n / 1024**i:,.1f} {u}"
    for i, u in enumerate(["B", "KiB", "MiB", "GiB", "TiB"])
    if n < 1024 ** (i + 1) or u == "TiB"
)
_ENV.filters["whenshort"] = lambda t: "" if t is None else time.strftime("%F %T", time.gmtime(t))
_ENV.filters["when"] = lambda t: "" if t is None else _ENV.filters["whenshort"](t) + " UTC"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


_ENV.filters["dur"] = _duration
_ENV.filters["rate"] = lambda r: "-" if r is None else f"{r:,.1f}" if r < 1000 else f"{r:,.0f}"
_ENV.filters["label"] = lambda k: str(k).replace("_", " ")
_ENV.filters["pct"] = lambda p: f"{100 * p['done'] / p['total']:.0f}%" if p["total"] else "100%"

router = APIRouter(prefix="/ui", include_in_schema=False)
root = APIRouter(include_in_schema=False)


def render(
    request: Request, name: str, who: Viewer | None, *, status: int = 200, **ctx: Any
) -> HTMLResponse:
    html = _ENV.get_template(name).render(
        who=who, csrf_field=CSRF_FIELD, here=request.url.path, **ctx
    )
    return HTMLResponse(html, status, headers={"Cache-Control": "no-store"})  # + SECURITY_HEADERS


_KINDS = {
    400: "Bad request",
    401: "Not logged in",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed",
    409: "Conflict",
    413: "Too large",
    422: "Bad request",
}


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """The UI's own error page (a heading for the status and the one-line message; never an
    exception's class name), for the page routes and for unknown ``/ui/...`` paths and bad query
    parameters."""
    return render(
        request,
        "error.html",
        authenticate(request),
        status=status,
        error=message,
        kind=_KINDS.get(status, f"HTTP {status}"),
    )


def page(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Render an error page for located errors (4xx) and for a form's fields that its request model
    refuses (400); a sync page runs in the thread pool."""
    is_async = inspect.iscoroutinefunction(fn)

    @functools.wraps(fn)
    async def wrapper(request: Request, *args: Any, **kwargs: Any) -> Any:
        try:
            if is_async:
                return await fn(request, *args, **kwargs)
            return await run_in_threadpool(fn, request, *args, **kwargs)
        except DatamillError as exc:
            code = 404 if isinstance(exc, NotFoundError) else 400
            return error_page(request, code, exc.one_line())
        except HTTPException as exc:
            return error_page(request, exc.status_code, str(exc.detail))
        except ValidationError as exc:
            return error_page(request, 400, one_line(exc.errors()))

    return wrapper


async def form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}


def see(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})
