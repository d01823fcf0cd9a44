"""The web UI's pages under ``/ui`` (Jinja2, rendered on the server) over the same state as the JSON
API; without a valid key a page shows only the login form (401), and state-changing forms are POSTs
with a CSRF token (:mod:`datamill.serve.ui.session`).
"""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any

from fastapi import HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from datamill.loader.samples import MAX_FILTER
from datamill.serve.data.views import LimitQuery, OffsetQuery, inspector
from datamill.serve.http.access import (
    Admin,
    Reader,
    State,
    Viewer,
    authenticate,
    check_dataset,
    may_use,
    requires,
    serve_state,
)
from datamill.serve.http.key_scope import check_revoke, visible_keys
from datamill.serve.http.routes import datasets as datasets_api
from datamill.serve.http.routes import keys as keys_api
from datamill.serve.http.routes.models import DatasetIn, KeyIn
from datamill.serve.observe import ledger
from datamill.serve.server import NotFoundError
from datamill.serve.ui.render import HERE, STATIC, form, page, render, root, router, see
from datamill.serve.ui.session import (
    COOKIE,
    check_csrf,
    check_login_csrf,
    end_session,
    login_form_token,
    set_login_cookie,
    start_session,
)
from datamill.serve.ui.svg import bars_svg, histogram_svg

__all__ = ["access_page", "root", "router"]


def access_page(request: Request) -> HTMLResponse:
    """The page of a request refused for want of a valid key (401): the login form."""
    msg = "your key is invalid or was revoked: enter a valid key"
    error = msg if request.cookies.get(COOKIE) else None
    return _login_page(request, None, status=401, error=error, next=request.url.path)


# ------------------------------------------------------------------------------------------ session
@root.get("/", dependencies=[requires("public")])
@router.get("", dependencies=[requires("public")])
@router.get("/", dependencies=[requires("public")])
def home() -> RedirectResponse:
    """The UI starts at the datasets page."""
    return see("/ui/datasets")


@router.get("/static/{name}", dependencies=[requires("public")])
def static(name: str) -> Response:
    """The CSS and JS files (nothing else is served from the package)."""
    if name not in STATIC:
        raise HTTPException(404, "no such static file")
    return Response(
        (HERE / "static" / name).read_bytes(),
        media_type=STATIC[name],
        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"},
    )


def _login_page(
    request: Request,
    who: Viewer | None,
    *,
    status: int = 200,
    error: str | None = None,
    next: str = "/ui/datasets",
) -> HTMLResponse:
    seed, token = login_form_token(request)
    res = render(
        request, "login.html", who, status=status, error=error, next=next, login_csrf=token
    )
    set_login_cookie(request, res, seed)
    return res


@router.get("/login", dependencies=[requires("public")])
@page
def login_form(request: Request) -> HTMLResponse:
    """The login form."""
    return _login_page(request, authenticate(request))


@router.post("/login", dependencies=[requires("public")])
@page
async def login(request: Request, state: State) -> Response:
    """Check the key (and the form's CSRF token) and start a session: a random id in an HttpOnly
    cookie."""
    fields = await form(request)
    key = fields.get("key", "").strip()
    nxt = fields.get("next", "/ui/datasets")
    nxt = nxt if nxt.startswith("/ui") and "//" not in nxt and "\\" not in nxt else "/ui/datasets"
    if not state.auth:
        return see(nxt)
    check_login_csrf(request, fields)
    res = see(nxt)
    if not key or not start_session(request, res, state, key):
        return _login_page(
            request, None, status=401, error="that key is invalid, expired or revoked", next=nxt
        )
    return res


@router.post("/logout")
@page
async def logout(request: Request, state: State, who: Reader) -> Response:
    """End the session: revoked in the journal, its cookie cleared."""
    check_csrf(who, await form(request))
    res = see("/ui/login")
    end_session(request, res, state if state.auth else None)
    return res


# ----------------------------------------------------------------------------------------- datasets
def _summaries(request: Request) -> list[dict[str, Any]]:
    insp = inspector(request)
    who = authenticate(request)
    return [insp.summary(ds["id"]) for ds in serve_state(request).datasets() if may_use(who, ds)]


@router.get("/datasets")
@page
def datasets_page(request: Request, who: Reader) -> HTMLResponse:
    """Every registered dataset with its kind, size, samples and shardsets."""
    return render(request, "datasets.html", who, datasets=_summaries(request), registered=None)


@router.post("/datasets")
@page
async def register(request: Request, state: State, who: Admin) -> HTMLResponse:
    """Register a dataset from a path under the server's roots (admin)."""
    fields = await form(request)
    check_csrf(who, fields)
    req = DatasetIn(path=fields.get("path", ""), name=fields.get("name", ""))
    ds = await run_in_threadpool(datasets_api.register, who, req, state)  # the API's checks
    summaries = await run_in_threadpool(_summaries, request)
    return render(request, "datasets.html", who, datasets=summaries, registered=ds)


@router.get("/datasets/{ref}")
@page
def dataset_page(request: Request, who: Reader, ref: str) -> HTMLResponse:
    """Shardsets, columns, statistics, metadata and check results of one dataset."""
    check_dataset(who, serve_state(request), ref)
    detail = inspector(request).detail(ref)
    named = ledger.runs_of_dataset(serve_state(request).journal, detail["id"])
    return render(request, "dataset.html", who, d=detail, runs=named)


@router.get("/datasets/{ref}/values/{column}", dependencies=[requires("read")])
@page
def values_fragment(request: Request, ref: str, column: str) -> HTMLResponse:
    """Top values and histogram of a column: a progress bar until computed (the page polls)."""
    check_dataset(authenticate(request), serve_state(request), ref)
    view = inspector(request).values(ref, column)
    res = view["result"] or {"histogram": None, "top": [], "of": "value"}
    hist, top = res["histogram"], [(str(t["value"]), int(t["count"])) for t in res["top"]]
    label = f"{column} ({res['of']})" if res["of"] != "value" else column
    svg = histogram_svg(hist["counts"], hist["edges"], label=label) if hist is not None else None
    bars = bars_svg(top, label=column) if top else None
    return render(request, "_values.html", None, v=view, column=column, svg=svg, bars=bars)


@router.get("/datasets/{ref}/samples")
@page
def samples_page(
    request: Request,
    who: Reader,
    ref: str,
    offset: OffsetQuery = 0,
    limit: LimitQuery = 20,
    col: Annotated[list[str] | None, Query(max_length=1000)] = None,
    find: Annotated[str, Query(max_length=MAX_FILTER)] = "",
    where: Annotated[str, Query(max_length=256)] = "",
    equals: Annotated[str, Query(max_length=MAX_FILTER)] = "",
    page_no: Annotated[int | None, Query(alias="page", ge=1, le=1 << 40)] = None,
) -> Response:
    """A page of the joined dataset: selectable columns, paging, a sample by UID or row, a column
    filter."""
    check_dataset(who, serve_state(request), ref)
    insp = inspector(request)
    if col and len(col) > 200:
        raise HTTPException(400, "at most 200 columns")
    params: list[tuple[str, str]] = [("limit", str(limit)), *(("col", c) for c in (col or []))]
    if where:
        params += [("where", where), ("equals", equals)]
    keep = urllib.parse.urlencode(params)
    notice = ""
    if find.strip():
        try:
            row = insp.locate(ref, find)
        except NotFoundError as exc:  # said on the samples page itself, above its first rows
            notice = exc.msg
        else:
            return see(
                f"/ui/datasets/{ref}/samples?{keep}&offset={row - row % limit}&mark={row}#row-{row}"
            )
    if page_no is not None:
        return see(f"/ui/datasets/{ref}/samples?{keep}&offset={(page_no - 1) * limit}")
    rows = insp.samples(
        ref,
        offset=offset,
        limit=limit,
        columns=col or None,
        where=(where, equals) if where else None,
    )
    mark = request.query_params.get("mark", "")
    return render(
        request,
        "samples.html",
        who,
        d=insp.summary(ref),
        page=rows,
        keep=keep,
        where=where,
        equals=equals,
        mark=int(mark) if mark.isdigit() else None,
        notice=notice,
        find=find.strip()[:MAX_FILTER],
        status=404 if notice else 200,
    )


@router.get("/datasets/{ref}/file", dependencies=[requires("read")])
@page
def cell_file(
    request: Request, ref: str, row: Annotated[int, Query(ge=0)], column: str
) -> Response:
    """The image a cell names by path (inside the server's roots only)."""
    check_dataset(authenticate(request), serve_state(request), ref)
    data, mime = inspector(request).cell_file(ref, row=row, column=column)
    return Response(
        data,
        media_type=mime,
        headers={"Cache-Control": "private, max-age=60", "X-Content-Type-Options": "nosniff"},
    )


# --------------------------------------------------------------------------------------------- keys
@router.get("/keys")
@page
def keys_page(request: Request, state: State, who: Admin) -> HTMLResponse:
    """Every API key (admin): create and revoke."""
    return render(request, "keys.html", who, keys=visible_keys(state, who), created=None)


@router.post("/keys")
@page
async def new_key(request: Request, state: State, who: Admin) -> HTMLResponse:
    """Create a key (the API's checks and audit); it is shown on this page once and never again."""
    fields = await form(request)
    check_csrf(who, fields)
    datasets = [d.strip() for d in fields.get("datasets", "").split(",") if d.strip()]
    body = KeyIn.model_validate(
        {
            "role": fields.get("role", "read"),
            "note": fields.get("note", "")[:200],
            "datasets": datasets or None,
            "expires": "".join(fields.get("expires", "").split()) or None,
        }
    )
    created = keys_api.new_key(who, body, state)
    return render(request, "keys.html", who, keys=visible_keys(state, who), created=created)


@router.post("/keys/{key_id}/revoke")
@page
async def revoke_key(request: Request, state: State, who: Admin, key_id: str) -> Response:
    """Revoke a key (admin) after a confirmation; your own session's key needs a second one."""
    fields = await form(request)
    check_csrf(who, fields)
    key_id = key_id[:64]
    row = check_revoke(state, who, key_id)
    own = key_id == who.key_id
    step = fields.get("confirm", "")
    if step != ("twice" if own else "yes"):
        twice = "twice" if own and step == "yes" else "yes"
        return render(request, "confirm_revoke.html", who, key=row, own=own, confirm_value=twice)
    keys_api.revoke(who, key_id, state)  # the API's revocation: journal, key table, audit
    return see("/ui/login" if own else "/ui/keys")


from datamill.serve.ui import runs  # noqa: F401  - registers the iteration pages on the same router
