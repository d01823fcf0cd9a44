"""Test helpers: blocking calls of :class:`~datamill.serve.server.ServeState`'s one round trip and
acknowledgement (both async; each runs in an event loop of its own, so a thread may call them), and
a journal-less ack of an :class:`~datamill.serve.protocol.iteration.Iteration`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple

from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import AckItem, session_digest
from datamill.serve.server import LeasePayload, ServeState


def next_lease(state: ServeState, it: Iteration, client: str, **trip: Any) -> LeasePayload | None:
    """The client's next lease (server-built unless ``transport=``), or ``None``."""
    return asyncio.run(state.round_trip(it, client, (), **trip))[1]


def ack_batches(
    state: ServeState, it: Iteration, items: Sequence[AckItem], **who: str
) -> tuple[dict[str, str], dict[str, list[tuple[int, int]]]]:
    """:meth:`ServeState.ack_batches` (``who``: ``session=`` or ``client=``)."""
    return asyncio.run(state.ack_batches(it, items, **who))


def ack(state: ServeState, it: Iteration, lease_id: str, fence: str, **who: str) -> str:
    """Acknowledge a whole lease: its status."""
    return ack_batches(state, it, [(lease_id, fence, None, None)], **who)[0][lease_id]


class Acked(NamedTuple):
    """A journal-less ack's status (see :data:`~datamill.serve.protocol.state.AckItem`) and the
    unit runs it completed."""

    status: str
    units: list[tuple[int, int]]


def pure_ack(
    it: Iteration,
    lease_id: str,
    fence: str,
    *,
    session: str | None = None,
    start: int | None = None,
    stop: int | None = None,
    client: str | None = None,
    now: float,
) -> Acked:
    """Acknowledge positions ``[start, stop)`` of a lease (all of it by default) through the
    protocol's ack transitions, with no journal (``session``: the secret; ``client``'s id when
    ``None``; the lease's holder when both are)."""
    if session is None:
        lease = it.leases.get(lease_id)
        session = client if client is not None else lease.client if lease is not None else ""
    item = [(lease_id, fence, start, stop)]
    statuses, marks = it.plan_acks(item, session=session_digest(session), now=now)
    units = it.units_of_marks(marks).get(lease_id, [])
    it.begin_acks(marks, now=now)
    it.apply_acks(marks, now=now)
    return Acked(statuses[lease_id], units)
