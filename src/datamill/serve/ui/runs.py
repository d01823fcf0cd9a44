"""The UI's iteration pages: the filtered, paged list; one iteration (status, live progress, charts,
rewind and cancel behind a confirmation page, then post/redirect/get); a named run's epochs.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Annotated, Any

from fastapi import HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from datamill.serve.catalog import check_name
from datamill.serve.http.access import (
    Admin,
    Reader,
    State,
    audit,
    authenticate,
    check_dataset,
    may_use,
    serve_state,
)
from datamill.serve.http.routes import iterations as iterations_api
from datamill.serve.http.routes.models import IterationIn, RewindIn
from datamill.serve.observe import ledger, lifecycle
from datamill.serve.server import NotFoundError
from datamill.serve.ui.render import form, page, render, router, see
from datamill.serve.ui.session import check_csrf
from datamill.serve.ui.svg import ack_history, rewind_times, throughput_svg

__all__ = ["PAGE_SIZES", "iteration_view"]

PAGE_SIZES = (10, 25, 50, 100)
"""Rows per page the iterations list offers (any 1..100 is accepted)."""
MAX_FILTER = 64
"""Longest accepted name filter."""


def iteration_view(request: Request, it_id: str) -> dict[str, Any]:
    """Everything the iteration page shows (live progress plus the journaled lifecycle and
    counters)."""
    state = serve_state(request)
    it = state.iteration(it_id)
    check_dataset(authenticate(request), state, str(it.config["dataset"]))
    desc = state.describe(it)
    p = state.progress(it)
    life = lifecycle.one(state.journal, it.id) or {}
    start, end = life.get("started"), life.get("ended")
    marks = [(t, "rewind") for t in rewind_times(state.journal, it.id)]
    acks = ack_history(state.journal, it.id)  # the journal's ack records (a rewind's left out)
    if end is not None and life.get("status") == "cancelled":
        marks.append((end, "cancelled"))
    svg = throughput_svg(
        acks,
        start=start,
        end=end if end is not None else (time.time() if start is not None else None),
        marks=marks,
    )
    # counters from the journal (they survive a restart), not from this process's memory
    for key, name in (("expired_leases", "leases_expired"), ("reissued_leases", "leases_reissued")):
        p[key] = max(p[key], int(state.telemetry.counter(it.id, name)))
    live, memo = p["clients"], state.telemetry.client_memo  # a client gone: the page's defaults
    journaled = ledger.clients(state.journal, it.id, live=it, memo=memo)
    p["clients"] = {cid: {**live.get(cid, {}), **c} for cid, c in journaled.items()}
    names = {d["id"]: d["name"] for d in state.datasets()}
    ds_id = desc["config"]["dataset"]
    return {
        "id": it.id,
        "config": desc["config"],
        "dataset": names.get(ds_id, "?"),
        "dataset_id": ds_id,
        "name": life.get("key"),  # the run's name, from the journal's iterations row
        "p": p,
        "svg": svg,
        "status": life.get("status", "running"),
        "life": life,
        "rewind": _last_rewind(state, it.id),
    }


def _last_rewind(state: Any, it_id: str) -> dict[str, Any] | None:
    for row in reversed(state.journal.audit()):
        if row["action"] == "rewind iteration" and row["detail"].startswith(it_id + " {"):
            try:
                change = json.loads(row["detail"][len(it_id) + 1 :])
            except ValueError:
                continue
            return (
                {**change, "at": row["at"], "key": row["key"]} if isinstance(change, dict) else None
            )
    return None


# --------------------------------------------------------------------------------------------- list
@router.get("/iterations")
@page
def iterations_page(
    request: Request,
    state: State,
    who: Reader,
    dataset: Annotated[str, Query(max_length=MAX_FILTER)] = "",
    status: Annotated[str, Query(max_length=16)] = "",
    name: Annotated[str, Query(max_length=MAX_FILTER)] = "",
    after: Annotated[str, Query(max_length=MAX_FILTER)] = "",
    limit: Annotated[int, Query(ge=1, le=100)] = 25,
) -> HTMLResponse:
    """Iterations, newest first, a page at a time, filtered by dataset, status and name."""
    if status and status not in lifecycle.STATUSES:
        raise HTTPException(
            400, f"unknown status {status!r}; expected one of {', '.join(lifecycle.STATUSES)}"
        )
    names = {d["id"]: d["name"] for d in state.datasets()}
    allowed = [d["id"] for d in state.journal.datasets() if may_use(who, d)]
    if dataset:
        allowed = [d for d in allowed if dataset in (d, names.get(d))]
    rows, nxt = lifecycle.page(
        state.journal,
        status=status or None,
        datasets=allowed,
        name=name.strip() or None,
        after=after or None,
        limit=limit,
        newest_first=True,
    )
    out = [_listed(state, r, names) for r in rows]
    query = {"dataset": dataset, "status": status, "name": name, "limit": str(limit)}
    keep = urllib.parse.urlencode({k: v for k, v in query.items() if v})
    return render(
        request,
        "iterations.html",
        who,
        iterations=out,
        datasets=state.datasets(),
        statuses=lifecycle.STATUSES,
        f={**query, "after": after},
        next=nxt,
        keep=keep,
        page_sizes=PAGE_SIZES,
    )


def _listed(state: Any, r: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An iteration's row of the list: its name, its dataset's name, its progress (live when it
    runs in this server) and its elapsed time."""
    live = state._iterations.get(r["id"])
    p = (
        state.progress(live)
        if live is not None
        else {"total": r["total"] or 0, "done": r["done"], "batches_per_s": 0}
    )
    return {
        **r,
        "name": r["key"],
        "dataset": names.get(r["dataset"], "?"),
        "p": p,
        "elapsed": (r["ended"] if r["ended"] is not None else time.time()) - r["started"],
    }


@router.post("/iterations")
@page
async def start_iteration(request: Request, state: State, who: Reader) -> Response:
    """Start (or join) an iteration from the form: a loader configuration to try before training."""
    fields = await form(request)
    check_csrf(who, fields)
    numbers = ("batch_size", "seed", "epoch", "world_size", "lease_size")
    body = IterationIn.model_validate(
        {
            "dataset": fields.get("dataset", ""),
            "shuffle": fields.get("shuffle") == "on",
            "drop_last": fields.get("drop_last") == "on",
            "mode": fields.get("mode", "static"),
            "name": fields.get("name", "").strip() or None,
            "columns": [c.strip() for c in fields.get("columns", "").split(",") if c.strip()]
            or None,
            **{f: fields[f].strip() for f in numbers if fields.get(f, "").strip()},
        }
    )
    check_dataset(who, state, body.dataset)
    if body.name:
        _refuse_ended_name(state, body.name, body.epoch)
    desc = await run_in_threadpool(iterations_api.create_iteration, who, body, state)
    return see(f"/ui/iterations/{desc['id']}")


def _refuse_ended_name(state: Any, name: str, epoch: int) -> None:
    """409 when the form names an iteration of this epoch that was cancelled or has finished (the
    API joins it; the form would silently open it)."""
    for (it_id,) in state.journal._exec(
        "SELECT id FROM iterations WHERE key = ? AND epoch = ?", (name, int(epoch))
    ):
        row = lifecycle.one(state.journal, it_id)
        if row is not None and row["status"] in ("cancelled", "finished"):
            raise HTTPException(
                409,
                f"an iteration named {name!r} of epoch {epoch} exists and is {row['status']}: "
                "choose another name to start a new one (or another epoch)",
            )


# ---------------------------------------------------------------------------------------------- one
@router.get("/iterations/{it_id}")
@page
def iteration_page(request: Request, who: Reader, it_id: str) -> HTMLResponse:
    """One iteration: status, config, live progress per rank and client, throughput, rewind,
    cancel."""
    return render(request, "iteration.html", who, it=iteration_view(request, it_id))


@router.get("/iterations/{it_id}/live")
@page
def iteration_live(request: Request, who: Reader, it_id: str) -> HTMLResponse:
    """The live part of the iteration page (polled by ui.js)."""
    return render(request, "_live.html", None, it=iteration_view(request, it_id))


@router.post("/iterations/{it_id}/rewind")
@page
async def rewind(request: Request, state: State, who: Admin, it_id: str) -> Response:
    """Rewind a rank to a checkpoint's consumed batch count (admin); confirmed first while clients
    hold leases."""
    fields = await form(request)
    check_csrf(who, fields)
    rewind_in = {"rank": fields.get("rank", "0"), "consumed": fields.get("consumed", "0")}
    body = RewindIn.model_validate(rewind_in).model_dump(exclude_none=True)
    it = state.iteration(it_id)
    check_dataset(who, state, str(it.config["dataset"]))
    state.check_rewind(it, body)
    with state.lock(it):
        held = [x for x in it.leases.values() if x.queue == body["rank"]]
    before = next(q["done"] for q in state.progress(it)["queues"] if q["rank"] == body["rank"])
    if held and fields.get("confirm") != "yes":
        holders = sorted({x.client for x in held})
        return render(
            request,
            "confirm_rewind.html",
            who,
            it=it,
            fields=body,
            held=len(held),
            holders=holders,
            before=before,
        )
    await state.rewind(it, body)
    change = {**body, "before": before, "revoked": len(held)}
    audit(state, who, "rewind iteration", f"{it.id} {json.dumps(change, sort_keys=True)}")
    return see(f"/ui/iterations/{it.id}#rewound")


@router.post("/iterations/{it_id}/cancel")
@page
async def cancel(request: Request, state: State, who: Admin, it_id: str) -> Response:
    """Cancel an iteration for good (admin), after a confirmation that says what is lost."""
    fields = await form(request)
    check_csrf(who, fields)
    it = state.iteration(it_id)
    check_dataset(who, state, str(it.config["dataset"]))
    if it.cancelled:
        return see(f"/ui/iterations/{it.id}")
    if fields.get("confirm") != "yes":
        p = state.progress(it)
        live = sum(1 for v in p["clients"].values() if v["leases"])
        return render(request, "confirm_cancel.html", who, it=it, p=p, live=live)
    await run_in_threadpool(iterations_api.cancel, who, it, state)
    return see(f"/ui/iterations/{it.id}")


# --------------------------------------------------------------------------------------------- runs
@router.get("/runs/{name}")
@page
def run_page(request: Request, state: State, who: Reader, name: str) -> HTMLResponse:
    """A named run across epochs: per epoch its status, duration, throughput and each client's
    stall."""
    check_name(name, what="run name")
    rows = state.journal._exec(
        "SELECT id FROM iterations WHERE key = ? ORDER BY epoch, rowid", (name,)
    )
    if not rows:
        raise NotFoundError(f"no run named {name!r}")
    epochs = []
    ds_id = None
    names = {d["id"]: d["name"] for d in state.journal.datasets()}
    for it_id in (str(r[0]) for r in rows):
        life = lifecycle.one(state.journal, it_id)
        if life is None or not may_use(
            who, {"id": life["dataset"], "name": names.get(life["dataset"], "")}
        ):
            continue
        ds_id = life["dataset"]
        hist = ack_history(state.journal, it_id)
        acked = sum(n for _, n in hist)
        last = hist[-1][0] if hist else life["started"]
        dur = max((life["ended"] if life["ended"] is not None else last) - life["started"], 0.0)
        live, memo = state._iterations.get(it_id), state.telemetry.client_memo
        clients = ledger.clients(state.journal, it_id, live=live, memo=memo)
        rate = acked / dur if dur > 0 else None
        epochs.append({**life, "duration": dur, "acked": acked, "rate": rate, "clients": clients})
    if not epochs:
        raise NotFoundError(f"no run named {name!r} on a dataset this key may use")
    return render(
        request,
        "run.html",
        who,
        run=name,
        epochs=epochs,
        dataset={"id": ds_id, "name": names.get(ds_id or "", "?")},
    )
