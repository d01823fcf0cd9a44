"""Flat RemoteLoader keywords (as the tests' worker processes receive them in JSON) -> the option
objects :class:`~datamill.client.RemoteLoader` takes."""

from __future__ import annotations

from typing import Any

from datamill.client import Leases, Transport
from datamill.loader import Batching

__all__ = ["grouped"]

_LEASES = {
    "mode": "mode",
    "world_size": "world_size",
    "name": "name",
    "lease_size": "size",
    "lease_bytes": "nbytes",
    "lease_timeout": "timeout",
}
_TRANSPORT = {
    "transport": "kind",
    "prefetch": "prefetch",
    "ack_window": "ack_window",
    "reconnect_s": "reconnect_s",
    "verify": "verify",
    "cache_dir": "cache_dir",
    "cache_limit": "cache_limit",
    "slot": "slot",
    "slots": "slots",
    "on_commit": "on_commit",
}


_BATCHING = ("shuffle", "drop_last", "window")


def grouped(**flat: Any) -> dict[str, Any]:
    """``flat`` with its batching, lease and transport keywords gathered into ``batching=``,
    ``leases=`` and ``transport=`` (the other keywords as they are)."""
    out = {
        k: v
        for k, v in flat.items()
        if k not in _LEASES and k not in _TRANSPORT and k not in _BATCHING
    }
    batching = {k: v for k, v in flat.items() if k in _BATCHING}
    if batching:
        out["batching"] = Batching(**batching)
    leases = {_LEASES[k]: v for k, v in flat.items() if k in _LEASES}
    transport = {_TRANSPORT[k]: v for k, v in flat.items() if k in _TRANSPORT}
    if leases:
        out["leases"] = Leases(**leases)
    if transport:
        out["transport"] = Transport(**transport)
    return out
