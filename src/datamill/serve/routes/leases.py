"""``/api/v1/iterations/{id}/next|ack|heartbeat``: take, acknowledge and keep leases (read)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response

from datamill.serve.access import Reader, ScopedIteration, State
from datamill.serve.routes.models import ID_PATTERN, AckIn, HeartbeatIn
from datamill.serve.server import ARROW_STREAM

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/iterations")


@router.get("/{it_id}/next")
def next_lease(who: Reader, it: ScopedIteration, state: State, client: Annotated[str, Query(pattern=ID_PATTERN)],
               rank: Annotated[int, Query(ge=0, le=1 << 16)] = 0, slot: Annotated[int, Query(ge=0, le=1024)] = 0,
               slots: Annotated[int, Query(ge=1, le=1024)] = 1,
               ack: Annotated[list[Annotated[str, Query(max_length=120)]] | None, Query(max_length=64)] = None,
               ) -> Response:
    """The client's next lease as an Arrow IPC stream (``204`` nothing left, ``409`` wait)."""
    statuses = []
    for item in ack or ():
        lease_id, _, fence = item.partition(":")
        if not (fence.isascii() and fence.isdigit()) or len(fence) > 40 or len(lease_id) > 64:
            raise HTTPException(422, f"expected ack=<lease>:<fence> (a lease id and up to 40 digits), got {item[:80]!r}")
        statuses.append(f"{lease_id}={state.ack(it, lease_id, int(fence)).status}")
    acks = {"X-Datamill-Acks": ",".join(statuses)}
    payload = state.next_lease(it, client, rank=rank, slot=slot, slots=slots)
    if payload is None:
        if it.finished(rank=rank):
            return Response(status_code=204, headers=acks)
        return JSONResponse({"error": "wait: other leases are in flight"}, status_code=409,
                            headers={**acks, "Retry-After": "0.05"})
    lease = payload.lease
    return Response(payload.body, media_type=ARROW_STREAM, headers={
        **acks, "X-Datamill-Lease": lease.id, "X-Datamill-Fence": str(lease.fence),
        "X-Datamill-Positions": f"{lease.queue}:{lease.start}-{lease.stop}",
        "X-Datamill-Units": ",".join(map(str, payload.units)), "X-Datamill-Epoch": str(payload.epoch)})


@router.post("/{it_id}/ack")
def ack(who: Reader, it: ScopedIteration, body: AckIn, state: State) -> JSONResponse:
    """Acknowledge leases (journaled before the answer; ``410`` gone, ``409`` fenced)."""
    results = {lease_id: state.ack(it, lease_id, fence).status for lease_id, fence in body.leases}
    code = 410 if "gone" in results.values() else 409 if "fenced" in results.values() else 200
    return JSONResponse({"acks": results}, status_code=code)


@router.post("/{it_id}/heartbeat")
def heartbeat(who: Reader, it: ScopedIteration, body: HeartbeatIn) -> dict[str, Any]:
    """Keep a client's leases alive; answers the ones it lost."""
    lost = it.heartbeat(body.client, leases=body.leases, stall_s=body.stall_s,
                                            batches=body.batches)
    return {"lost": lost}
