"""The web UI's pages under ``/ui``: Jinja2 templates rendered on the server, one CSS file, a little JS.

Every page reads the same server state as the JSON API (:class:`~datamill.serve.server.ServeState`
and :class:`~datamill.serve.views.Inspector`). Without a valid key a page shows only the login form
(401); state-changing forms are POSTs that carry a CSRF token (see :mod:`datamill.serve.ui.session`).
"""

from __future__ import annotations

import functools
import inspect
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from datamill.core.errors import DatamillError
from datamill.serve import lifecycle
from datamill.serve.access import (
    Admin,
    Reader,
    State,
    Viewer,
    audit,
    authenticate,
    check_dataset,
    may_use,
    requires,
    serve_state,
)
from datamill.serve.auth import create_key, parse_duration
from datamill.serve.routes.bounds import check_iteration, check_rewind
from datamill.serve.routes.models import DatasetIn, IterationIn, RewindIn, one_line
from datamill.serve.server import NotFoundError
from datamill.serve.ui.session import (
    COOKIE,
    CSRF_FIELD,
    check_csrf,
    check_login_csrf,
    end_session,
    login_form_token,
    set_login_cookie,
    start_session,
)
from datamill.serve.ui.svg import ack_history, histogram_svg, throughput_svg
from datamill.serve.views import MAX_LIMIT, Inspector, inspector

__all__ = ["access_page", "root", "router"]

HERE = Path(__file__).resolve().parent
STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                          trim_blocks=True, lstrip_blocks=True)
_ENV.filters["num"] = lambda v: f"{v:,}" if isinstance(v, int) else ("" if v is None else str(v))
_ENV.filters["bytes"] = lambda n: next(f"{n / 1024 ** i:,.1f} {u}" for i, u in enumerate(["B", "KiB", "MiB", "GiB", "TiB"])
                                       if n < 1024 ** (i + 1) or u == "TiB")
_ENV.filters["when"] = lambda t: "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
_ENV.filters["pct"] = lambda p: f"{100 * p['done'] / p['total']:.0f}%" if p["total"] else "100%"

router = APIRouter(prefix="/ui", include_in_schema=False)
root = APIRouter(include_in_schema=False)


def _render(request: Request, name: str, who: Viewer | None, *, status: int = 200, **ctx: Any) -> HTMLResponse:
    html = _ENV.get_template(name).render(who=who, csrf_field=CSRF_FIELD, here=request.url.path, **ctx)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})  # + guard.SECURITY_HEADERS


def access_page(request: Request, status: int, detail: str) -> HTMLResponse:
    """The page for a refused request: the login form (401) or an error page (403)."""
    if status == 401:
        msg = "your key is invalid or was revoked: enter a valid key" if request.cookies.get(COOKIE) else None
        return _login_page(request, None, status=401, error=msg, next=request.url.path)
    return _render(request, "error.html", authenticate(request), status=status, error=detail,
                   kind=f"HTTP {status}")


def _page(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Render an error page for located errors (4xx)."""

    async def handle(request: Request, call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except DatamillError as exc:
            code = 404 if isinstance(exc, NotFoundError) else 400
            return _render(request, "error.html", authenticate(request), status=code, error=exc.one_line(),
                           kind=type(exc).__name__)
        except HTTPException as exc:
            return _render(request, "error.html", authenticate(request), status=exc.status_code, error=str(exc.detail),
                           kind=f"HTTP {exc.status_code}")

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper_async(request: Request, *args: Any, **kwargs: Any) -> Any:
            return await handle(request, lambda: fn(request, *args, **kwargs))
        return wrapper_async

    @functools.wraps(fn)
    async def wrapper(request: Request, *args: Any, **kwargs: Any) -> Any:
        return await handle(request, lambda: run_in_threadpool(fn, request, *args, **kwargs))
    return wrapper


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}


def _see(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


# ---------------------------------------------------------------------------------------------- session
@root.get("/", dependencies=[requires("public")])
@router.get("", dependencies=[requires("public")])
@router.get("/", dependencies=[requires("public")])
def home() -> RedirectResponse:
    """The UI starts at the datasets page."""
    return _see("/ui/datasets")


@router.get("/static/{name}", dependencies=[requires("public")])
def static(name: str) -> Response:
    """The CSS and JS files (nothing else is served from the package)."""
    if name not in STATIC:
        raise HTTPException(404, "no such static file")
    return Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name],
                    headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})


def _login_page(request: Request, who: Viewer | None, *, status: int = 200, error: str | None = None,
                next: str = "/ui/datasets") -> HTMLResponse:
    seed, token = login_form_token(request)
    res = _render(request, "login.html", who, status=status, error=error, next=next, login_csrf=token)
    set_login_cookie(request, res, seed)
    return res


@router.get("/login", dependencies=[requires("public")])
@_page
def login_form(request: Request) -> HTMLResponse:
    """The login form."""
    return _login_page(request, authenticate(request))


@router.post("/login", dependencies=[requires("public")])
@_page
async def login(request: Request, state: State) -> Response:
    """Check the key (and the form's CSRF token) and start a session: a random id in an HttpOnly cookie."""
    form = await _form(request)
    key = form.get("key", "").strip()
    nxt = form.get("next", "/ui/datasets")
    nxt = nxt if nxt.startswith("/ui") and "//" not in nxt and "\\" not in nxt else "/ui/datasets"
    if not state.auth:
        return _see(nxt)
    check_login_csrf(request, form)
    res = _see(nxt)
    if not key or not start_session(request, res, state, key):
        return _login_page(request, None, status=401, error="that key is invalid, expired or revoked", next=nxt)
    return res


@router.post("/logout")
@_page
async def logout(request: Request, state: State, who: Reader) -> Response:
    """End the session: revoked in the journal, its cookie cleared."""
    check_csrf(who, await _form(request))
    res = _see("/ui/login")
    end_session(request, res, state if state.auth else None)
    return res


# ---------------------------------------------------------------------------------------------- datasets
def _summaries(request: Request) -> list[dict[str, Any]]:
    insp = inspector(request)
    who = authenticate(request)
    return [insp.summary(ds["id"]) for ds in serve_state(request).datasets() if may_use(who, ds)]


@router.get("/datasets")
@_page
def datasets_page(request: Request, who: Reader) -> HTMLResponse:
    """Every registered dataset with its kind, size, samples and shardsets."""
    return _render(request, "datasets.html", who, datasets=_summaries(request), registered=None)


@router.post("/datasets")
@_page
async def register(request: Request, state: State, who: Admin) -> HTMLResponse:
    """Register a dataset from a path under the server's roots (admin)."""
    form = await _form(request)
    check_csrf(who, form)
    try:
        req = DatasetIn(path=form.get("path", ""), name=form.get("name", ""))
    except ValidationError as exc:
        raise HTTPException(400, one_line(exc.errors())) from exc
    if not may_use(who, {"id": "", "name": req.name}):
        raise HTTPException(403, f"this key may not use a dataset named {req.name!r}")
    ds = await run_in_threadpool(state.register, req.path, name=req.name)
    audit(state, who, "register dataset", f"{req.name} = {req.path}")
    summaries = await run_in_threadpool(_summaries, request)
    return _render(request, "datasets.html", who, datasets=summaries, registered=ds)


@router.get("/datasets/{ref}")
@_page
def dataset_page(request: Request, who: Reader, ref: str) -> HTMLResponse:
    """Shardsets, columns, statistics, metadata and check results of one dataset."""
    check_dataset(who, serve_state(request), ref)
    return _render(request, "dataset.html", who, d=inspector(request).detail(ref))


@router.get("/datasets/{ref}/values/{column}", dependencies=[requires("read")])
@_page
def values_fragment(request: Request, ref: str, column: str) -> HTMLResponse:
    """Top values and histogram of a column: a progress bar until computed (the page polls)."""
    check_dataset(authenticate(request), serve_state(request), ref)
    insp: Inspector = inspector(request)
    src = insp.source(ref)
    if column not in src.columns:
        raise NotFoundError(f"no column {column!r}; columns: {list(src.columns)}")
    view = insp.values.get(src.fingerprint(), column, lambda: src).view()
    svg = None
    res = view["result"]
    if res is not None and res["histogram"] is not None:
        svg = histogram_svg(res["histogram"]["counts"], res["histogram"]["edges"],
                            label=f"{column} {res['of']}" if res["of"] != "value" else column)
    return _render(request, "_values.html", None, v=view, column=column, svg=svg)


@router.get("/datasets/{ref}/samples")
@_page
def samples_page(request: Request, who: Reader, ref: str, offset: Annotated[int, Query(ge=0)] = 0,
                 limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 20,
                 col: Annotated[list[str] | None, Query(max_length=1000)] = None) -> HTMLResponse:
    """A page of the joined dataset with selectable columns."""
    check_dataset(who, serve_state(request), ref)
    insp = inspector(request)
    page = insp.samples(ref, offset=offset, limit=limit, columns=col or None)
    chosen = "".join(f"&col={urllib.parse.quote(c)}" for c in (col or []))
    return _render(request, "samples.html", who, d=insp.summary(ref), page=page, chosen=chosen)


@router.get("/datasets/{ref}/file", dependencies=[requires("read")])
@_page
def cell_file(request: Request, ref: str, row: Annotated[int, Query(ge=0)], column: str) -> Response:
    """The image a cell names by path (inside the server's roots only)."""
    check_dataset(authenticate(request), serve_state(request), ref)
    data, mime = inspector(request).cell_file(ref, row=row, column=column)
    return Response(data, media_type=mime, headers={"Cache-Control": "private, max-age=60",
                                                    "X-Content-Type-Options": "nosniff"})


# ---------------------------------------------------------------------------------------------- iterations
def _iteration_view(request: Request, it_id: str) -> dict[str, Any]:
    state = serve_state(request)
    it = state.iteration(it_id)
    check_dataset(authenticate(request), state, str(it.config["dataset"]))
    desc = state.describe(it)
    progress = it.progress()
    names = {d["id"]: d["name"] for d in state.datasets()}
    svg = throughput_svg(ack_history(state.journal.path, it.id))
    life = lifecycle.one(state.journal, it.id) or {}
    return {"id": it.id, "config": desc["config"], "dataset": names.get(desc["config"]["dataset"], "?"),
            "p": progress, "svg": svg, "status": life.get("status", "running"), "life": life}


@router.get("/iterations")
@_page
def iterations_page(request: Request, state: State, who: Reader) -> HTMLResponse:
    """Every iteration with its progress, and the form that starts one."""
    rows = []
    names = {d["id"]: d["name"] for d in state.datasets()}
    allowed = [d["id"] for d in state.journal.datasets() if may_use(who, d)]
    page, _ = lifecycle.page(state.journal, datasets=allowed, limit=lifecycle.MAX_PAGE)  # finished ones stay on disk
    for r in page:
        live = state._iterations.get(r["id"])
        p = live.progress() if live is not None else {"total": r["total"] or 0, "done": r["done"], "batches_per_s": 0}
        rows.append({"id": r["id"], "key": r["key"], "epoch": r["epoch"], "created": r["started"],
                     "dataset": names.get(r["dataset"], "?"), "mode": r["mode"], "p": p, "status": r["status"]})
    return _render(request, "iterations.html", who, iterations=rows, datasets=state.datasets())


@router.post("/iterations")
@_page
async def start_iteration(request: Request, state: State, who: Reader) -> Response:
    """Start (or join) an iteration from the form: a loader configuration to try before training."""
    form = await _form(request)
    check_csrf(who, form)
    req: dict[str, Any] = {"dataset": form.get("dataset", "")}
    try:
        for f in ("batch_size", "seed", "epoch", "world_size", "lease_size"):
            if form.get(f, "").strip():
                req[f] = int(form[f])
    except ValueError as exc:
        raise HTTPException(400, f"not a whole number: {exc}") from exc
    req["shuffle"] = form.get("shuffle") == "on"
    req["drop_last"] = form.get("drop_last") == "on"
    req["mode"] = form.get("mode", "static")
    if form.get("name", "").strip():
        req["name"] = form["name"].strip()
    if form.get("columns", "").strip():
        req["columns"] = [c.strip() for c in form["columns"].split(",") if c.strip()]
    if "batch_size" not in req:
        raise HTTPException(400, "batch size is required")
    try:
        body = IterationIn(**req)
    except ValidationError as exc:
        raise HTTPException(400, one_line(exc.errors())) from exc
    ds = check_dataset(who, state, body.dataset)
    await run_in_threadpool(check_iteration, state, ds, body)
    desc = await run_in_threadpool(state.create_iteration, body.model_dump(exclude_none=True))
    state.journal.set_owner(desc["id"], who.key_id or "")
    return _see(f"/ui/iterations/{desc['id']}")


@router.get("/iterations/{it_id}")
@_page
def iteration_page(request: Request, who: Reader, it_id: str) -> HTMLResponse:
    """One iteration: config, live progress per rank and client, throughput, rewind."""
    return _render(request, "iteration.html", who, it=_iteration_view(request, it_id), rewound=None)


@router.get("/iterations/{it_id}/live", dependencies=[requires("read")])
@_page
def iteration_live(request: Request, it_id: str) -> HTMLResponse:
    """The live part of the iteration page (polled by ui.js)."""
    return _render(request, "_live.html", None, it=_iteration_view(request, it_id))


@router.post("/iterations/{it_id}/rewind")
@_page
async def rewind(request: Request, state: State, who: Admin, it_id: str) -> HTMLResponse:
    """Rewind a rank to a checkpoint's consumed batch count (admin)."""
    form = await _form(request)
    check_csrf(who, form)
    try:
        body = {"rank": int(form.get("rank", "0")), "consumed": int(form.get("consumed", "0"))}
    except ValueError as exc:
        raise HTTPException(400, f"rank and consumed must be whole numbers: {exc}") from exc
    it = state.iteration(it_id)
    check_dataset(who, state, str(it.config["dataset"]))
    check_rewind(it, RewindIn.model_validate(body))
    await run_in_threadpool(state.rewind, it, body)
    audit(state, who, "rewind iteration", f"{it.id} {body}")
    view = await run_in_threadpool(_iteration_view, request, it_id)
    return _render(request, "iteration.html", who, it=view, rewound=body)


@router.post("/iterations/{it_id}/cancel")
@_page
async def cancel(request: Request, state: State, who: Admin, it_id: str) -> HTMLResponse:
    """Cancel an iteration for good (admin): no more leases are handed out."""
    check_csrf(who, await _form(request))
    it = state.iteration(it_id)
    check_dataset(who, state, str(it.config["dataset"]))
    await run_in_threadpool(state.cancel, it)
    audit(state, who, "cancel iteration", it.id)
    view = await run_in_threadpool(_iteration_view, request, it_id)
    return _render(request, "iteration.html", who, it=view, rewound=None)


# ---------------------------------------------------------------------------------------------- keys
@router.get("/keys")
@_page
def keys_page(request: Request, state: State, who: Admin) -> HTMLResponse:
    """Every API key (admin): create and revoke."""
    return _render(request, "keys.html", who, keys=state.keys.listing(), created=None)


@router.post("/keys")
@_page
async def new_key(request: Request, state: State, who: Admin) -> HTMLResponse:
    """Create a key; it is shown on this page once and never again."""
    form = await _form(request)
    check_csrf(who, form)
    role = form.get("role", "read")
    if role not in ("read", "admin", "metrics"):
        raise HTTPException(400, f"unknown role {role!r}")
    datasets = [d.strip() for d in form.get("datasets", "").split(",") if d.strip()] or None
    expires = form.get("expires", "").strip() or None
    key_id, key = create_key(state.journal, role=role, note=form.get("note", "")[:200], datasets=datasets,
                             expires_in=parse_duration(expires) if expires else None)
    audit(state, who, "create key", f"{key_id} role={role} datasets={datasets} expires={expires}")
    state.keys.reload()
    created = {"id": key_id, "key": key, "role": role}
    return _render(request, "keys.html", who, keys=state.keys.listing(), created=created)


@router.post("/keys/{key_id}/revoke")
@_page
async def revoke_key(request: Request, state: State, who: Admin, key_id: str) -> Response:
    """Revoke a key (admin)."""
    check_csrf(who, await _form(request))
    if not state.journal.revoke_key(key_id[:64]):
        raise NotFoundError(f"no live key {key_id!r}")
    state.keys.reload()
    audit(state, who, "revoke key", key_id)
    return _see("/ui/keys")
