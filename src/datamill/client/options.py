"""The client's lease defaults: how many batches a lease holds when a loader creates the
iteration, and how much a direct client caches.
"""

from __future__ import annotations

from datamill.core.errors import ConfigError
from datamill.core.wire import TRANSPORTS

__all__ = [
    "DIRECT_CACHE_LIMIT",
    "DIRECT_LEASE_SIZE",
    "LEASE_BYTES",
    "LEASE_SIZE",
    "check_transport",
    "default_lease_size",
    "lease_args",
]

DIRECT_CACHE_LIMIT = 8 << 30
"""Bytes of ``s3://`` shards a direct-mode client keeps in its local cache at most (8 GiB)."""

LEASE_SIZE = 64
"""Batches per lease of a direct-mode iteration by default. A lease round trip (a journal commit on
the server) costs about what building 10-20k samples does; the next lease is built by the client
while this one is consumed, so a lease must carry more work than a round trip. Each lease's batches
are held in memory (``prefetch`` + 1 leases): lower it for large samples."""
DIRECT_LEASE_SIZE = LEASE_SIZE
"""The direct-mode default, :data:`LEASE_SIZE` (kept for code that imports it)."""
LEASE_BYTES = 8 << 20
"""Bytes per lease a server-built iteration is sized for by default (8 MiB): the server picks
16-256 batches from the dataset's stored bytes per sample (64 when it cannot tell). A server-built
lease's round trip (the journal commit, the lease's bytes handed from a build worker to the HTTP
process and sent) costs the server and the client per lease, whatever the lease holds: small rows
take 256 batches a lease, large ones (images) 16, so a client holds ``prefetch`` + 1 leases of
about 8 MiB either way."""


def check_transport(transport: str) -> str:
    """``transport`` if it is one of :data:`~datamill.core.wire.TRANSPORTS`, else a
    :class:`ConfigError`.

    Examples:
        >>> check_transport("direct")
        'direct'
    """
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}"
        )
    return transport


def default_lease_size(transport: str) -> int | None:
    """Batches per lease when the loader creates the iteration and ``lease_size`` is not given:
    :data:`LEASE_SIZE` in direct mode; ``None`` in server-built mode (the server sizes leases to
    :data:`LEASE_BYTES`).

    Examples:
        >>> default_lease_size("built"), default_lease_size("direct")
        (None, 64)
    """
    return LEASE_SIZE if check_transport(transport) == "direct" else None


def lease_args(transport: str, lease_size: int | None) -> dict[str, int | None]:
    """The iteration's ``lease_size`` and ``lease_bytes`` when the loader creates it: the size
    given, else :func:`default_lease_size` (server-built: leases of :data:`LEASE_BYTES`).

    Examples:
        >>> lease_args("built", None)
        {'lease_size': None, 'lease_bytes': 8388608}
    """
    if lease_size is not None:
        return {"lease_size": lease_size, "lease_bytes": None}
    size = default_lease_size(transport)
    return {"lease_size": size, "lease_bytes": LEASE_BYTES if size is None else None}
