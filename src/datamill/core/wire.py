"""The wire names of ``datamill serve`` that the server and its clients share.

The server (:mod:`datamill.serve`) and the client (:mod:`datamill.client`) both import these
from here, so neither package imports the other's internals: the API prefix, the transports, the
lease headers (their lower-case form is what a client reads from ``http.client``) and the
``X-Datamill-Runs`` value of a direct lease.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ACKS_HEADER",
    "API",
    "DONE_HEADER",
    "EPOCH_HEADER",
    "FENCE_HEADER",
    "FENCE_PATTERN",
    "ID_PATTERN",
    "LEASE_HEADER",
    "MAX_LEASE_SAMPLES",
    "POSITIONS_HEADER",
    "RUNS_HEADER",
    "SESSION_HEADER",
    "SESSION_PATTERN",
    "TRANSPORTS",
    "TTL_HEADER",
    "UNITS_HEADER",
    "format_runs",
    "parse_runs",
]

API = "/api/v1"
"""The JSON API's path prefix."""
TRANSPORTS = ("built", "direct")
"""``built``: the server builds each lease's batches (Arrow IPC); ``direct``: the client builds
them."""
MAX_LEASE_SAMPLES = 1 << 22
"""Samples one lease may hold at most (``batch_size * lease_size``): a request's work is bounded."""

SESSION_HEADER = "X-Datamill-Session"
"""A loader's random session secret: its leases are acknowledged or extended by no other."""
SESSION_PATTERN = r"^[0-9A-Za-z_-]{16,128}$"
"""A session secret (:data:`SESSION_HEADER`)."""
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""A dataset, iteration, lease or client name or id: letters, digits, ``_.-`` (never a path)."""
FENCE_PATTERN = r"^[0-9a-f]{1,64}$"
"""A lease's fence: 128 random bits as 32 hex digits (longer or other text is refused before any
work)."""
LEASE_HEADER = "X-Datamill-Lease"
FENCE_HEADER = "X-Datamill-Fence"
POSITIONS_HEADER = "X-Datamill-Positions"
"""``<queue>:<start>-<stop>``: the lease's positions in its queue."""
UNITS_HEADER = "X-Datamill-Units"
EPOCH_HEADER = "X-Datamill-Epoch"
DONE_HEADER = "X-Datamill-Done"
"""The queue's done prefix (static) or done batches (dynamic) when the lease was taken."""
RUNS_HEADER = "X-Datamill-Runs"
"""A direct lease's units as runs of one plan rank's batches (:func:`format_runs`)."""
TTL_HEADER = "X-Datamill-Lease-TTL"
"""A lease reply's lifetime in seconds."""
ACKS_HEADER = "X-Datamill-Acks"
"""``lease=status,...``: the server's answer to the acknowledgements a request carried."""


def format_runs(runs: Sequence[tuple[int, int, int]]) -> str:
    """The ``X-Datamill-Runs`` header value (:data:`RUNS_HEADER`).

    Examples:
        >>> format_runs([(0, 4, 5), (1, 0, 2)])
        '0:4-5;1:0-2'
    """
    return ";".join(f"{r}:{a}-{b}" for r, a, b in runs)


def parse_runs(value: str) -> list[tuple[int, int, int]]:
    """The inverse of :func:`format_runs`.

    Examples:
        >>> parse_runs('0:4-5;1:0-2')
        [(0, 4, 5), (1, 0, 2)]
    """
    out = []
    for part in filter(None, value.split(";")):
        r, _, span = part.partition(":")
        a, _, b = span.partition("-")
        out.append((int(r), int(a), int(b)))
    return out
