"""Blocking test helpers over :class:`~datamill.serve.server.ServeState`'s one round trip and
acknowledgement (both async): each runs it in an event loop of its own (a thread may call them)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import AckItem
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
