"""The lease routes' request and reply handling (imports fastapi): next, ack, heartbeat.

The routes (in :mod:`datamill.serve.http.routes.leases`) only declare paths and roles and call these
functions.

* ``GET .../next?client=&rank=&slot=&slots=&ack=<lease>:<fence>:<start>-<stop>`` (``ack`` repeated,
  at most 64; ``:<start>-<stop>`` are positions of the lease, all of it when left out) -> ``200``
  Arrow IPC stream with headers ``X-Datamill-Lease``, ``-Fence``, ``-Units``, ``-Positions``,
  ``-Epoch``, ``-Done`` (the queue's done prefix in static mode, its done batches in dynamic mode)
  and ``-Acks`` (``<lease>=<status>,...``) and ``-Runs`` (``<plan rank>:<first>-<stop>;...``, the
  batches of the lease); with ``transport=direct`` the body is empty (the client builds the batches,
  see :mod:`datamill.serve.data.direct`); ``204`` nothing left for this client; ``409`` wait (others
  hold the rest). ``-Lease-TTL`` is the lease's time to live in seconds: its holder yields none of
  its batches past that long after the reply (or its last heartbeat's or ack's) by its own clock;
  the server hands them out again only a grace later
  (:func:`~datamill.serve.protocol.state.lease_grace`).
* ``POST .../ack`` ``{"client", "acks": [[lease, fence, start, stop], ...]}`` (or ``"leases":
  [[lease, fence], ...]`` for whole leases) -> ``{"acks": {lease: status}}``: ``200`` when every ack
  is ``ok`` or ``already``, ``422`` when one names positions outside its lease (``outside``:
  nothing recorded), ``409`` when one is refused (another session's lease, a wrong fence), else
  ``410`` when one lease is no longer live. On ``/next`` the same statuses are in
  ``X-Datamill-Acks``.
* ``POST .../heartbeat`` ``{"client", "leases": [[lease, fence], ...], "stall_s", "batches"}`` ->
  ``{"lost": [...], "refused": [...]}`` with the same status rule.

The session is the ``X-Datamill-Session`` header (the client id when absent). A journal that cannot
be written answers ``503`` with ``Retry-After`` (see :mod:`datamill.serve.journal.leases`).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse, Response

from datamill.core.wire import FENCE_PATTERN, ID_PATTERN, SESSION_PATTERN, format_runs
from datamill.serve.http.routes.models import AckIn, HeartbeatIn
from datamill.serve.journal.leases import RETRY_AFTER_S, UnavailableError
from datamill.serve.protocol.iteration import Iteration
from datamill.serve.server import ARROW_STREAM, ServeState

__all__ = ["ack_reply", "heartbeat_reply", "next_reply", "unavailable_reply"]

_ACK_RE = re.compile(  # an id, a fence, positions of at most 12 digits (below MAX_UNITS, 2**40)
    rf"^({ID_PATTERN[1:-1]}):({FENCE_PATTERN[1:-1]})(?::(\d{{1,12}})-(\d{{1,12}}))?$"
)


def _session(session: str | None, client: str) -> str:
    if session is not None and not re.fullmatch(SESSION_PATTERN, session):
        raise HTTPException(422, "X-Datamill-Session must be 16-128 letters, digits, '_' or '-'")
    return client if session is None else session


def _check_items(items: list[tuple[str, str, int | None, int | None]]) -> None:
    """Refuse (422) an empty or reversed range of positions (the ids, fences and bounds are checked
    before: by :data:`_ACK_RE` on ``/next``, by the body's model on ``/ack``)."""
    bad = next(((a, b) for *_, a, b in items if a is not None and b is not None and a >= b), None)
    if bad is not None:
        raise HTTPException(422, f"an ack's positions need start < stop, got {list(bad)}")


def _code(statuses: Any) -> int:
    values = set(statuses)
    if "outside" in values:
        return 422
    return 409 if "refused" in values else 410 if values & {"expired"} else 200


def _reply(out: dict[str, Any], code: int) -> JSONResponse:
    """An ack's or heartbeat's answer, with what its status code means."""
    if code != 200:
        out["error"] = {
            409: "refused: a lease of another session, or a wrong fence",
            410: "expired: a lease that is no longer live (its batches go to another lease)",
            422: "outside: positions [start, stop) not within the lease's X-Datamill-Positions",
        }[code]
    return JSONResponse(out, status_code=code)


def unavailable_reply(exc: UnavailableError) -> JSONResponse:
    """``503`` with ``Retry-After``: the journal cannot be written now."""
    return JSONResponse(
        {"error": exc.one_line(), "type": type(exc).__name__},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def next_reply(
    state: ServeState,
    it: Iteration,
    *,
    client: str,
    rank: int,
    slot: int,
    slots: int,
    ack: list[str] | None,
    session: str | None,
    owner: str = "",
    transport: str = "built",
) -> Response:
    """Acknowledge the piggy-backed acks, then hand out the client's next lease (one journal write;
    only a server-built lease's build leaves the event loop, for a thread)."""
    secret = _session(session, client)
    items: list[tuple[str, str, int | None, int | None]] = []
    for raw in ack or ():
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
        client,
        items,
        rank=rank,
        slot=slot,
        slots=slots,
        session=secret,
        owner=owner,
        transport=transport,
    )
    acks = {"X-Datamill-Acks": ",".join(f"{k}={v}" for k, v in statuses.items())}
    if payload is None:
        if it.finished(rank=rank):
            return Response(status_code=204, headers=acks)
        return JSONResponse(
            {"error": "wait: other leases are in flight"},
            status_code=409,
            headers={**acks, "Retry-After": "0.05"},
        )
    lease = payload.lease
    return Response(
        payload.body,
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


async def ack_reply(
    state: ServeState, it: Iteration, body: AckIn, *, session: str | None
) -> JSONResponse:
    """Acknowledge batches (one journal transaction); the status rule is in the module docstring."""
    items: list[tuple[str, str, int | None, int | None]] = [
        (a, f, None, None) for a, f in body.leases
    ]
    items += [(a, f, s, e) for a, f, s, e in body.acks]
    _check_items(items)
    statuses, _ = await state.ack_batches(it, items, session=_session(session, body.client))
    return _reply({"acks": statuses}, _code(statuses.values()))


def heartbeat_reply(
    state: ServeState, it: Iteration, body: HeartbeatIn, *, session: str | None
) -> JSONResponse:
    """Extend (after a restart: reclaim) the client's leases."""
    res = state.heartbeat(
        it,
        body.client,
        leases=body.leases,
        session=_session(session, body.client),
        stall_s=body.stall_s,
        batches=body.batches,
    )
    return _reply(dict(res), 409 if res["refused"] else 410 if res["lost"] else 200)
