"""Key management stays inside the manager's own scope (``docs/serving.md``, *Keys*): datasets a
subset of its own (by id or name, resolved to the registered name), a role no stronger, an expiry
no later. The API and the UI both go through :func:`check_create`, :func:`visible_keys` and
:func:`check_revoke`.

Examples:
    >>> s = Scope(role="admin", datasets=frozenset({"a"}), expires=100.0)
    >>> within(s, Scope(role="read", datasets=frozenset({"a"}), expires=50.0))
    ''
    >>> within(s, Scope(role="read", datasets=None, expires=50.0))
    'every dataset (your key may use a only)'
    >>> within(s, Scope(role="read", datasets=frozenset({"a"}), expires=None))
    'no expiry (your key expires, so a key it manages must expire no later)'
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException

from datamill.serve.http.viewer import Viewer
from datamill.serve.server import NotFoundError, ServeState

__all__ = ["Scope", "check_create", "check_revoke", "key_scope", "visible_keys", "within"]

_STRENGTH = {"admin": {"admin", "read", "metrics"}, "read": {"read"}, "metrics": {"metrics"}}


@dataclass(frozen=True)
class Scope:
    """What a key reaches: its role, datasets (canonical names; ``None``: all) and expiry
    (``None``: never)."""

    role: str
    datasets: frozenset[str] | None
    expires: float | None


def within(outer: Scope, inner: Scope) -> str:
    """Empty when ``inner`` lies within ``outer``, else what exceeds it (for the message)."""
    if inner.role not in _STRENGTH.get(outer.role, set()):
        return f"role {inner.role} (stronger than your key's {outer.role})"
    if outer.datasets is not None:
        if inner.datasets is None:
            return f"every dataset (your key may use {', '.join(sorted(outer.datasets))} only)"
        extra = inner.datasets - outer.datasets
        if extra:
            return (
                f"datasets {', '.join(sorted(extra))} (your key may use "
                f"{', '.join(sorted(outer.datasets))} only)"
            )
    if outer.expires is not None:
        if inner.expires is None:
            return "no expiry (your key expires, so a key it manages must expire no later)"
        if inner.expires > outer.expires + 1e-6:
            return (
                f"an expiry {inner.expires - outer.expires:.0f} s after your key's own "
                f"(it expires in {max(0.0, outer.expires - time.time()):.0f} s)"
            )
    return ""


def _canonical(state: ServeState, refs: Iterable[str] | None) -> frozenset[str] | None:
    if refs is None:
        return None
    names = {ref: ds["name"] for ds in state.datasets() for ref in (ds["id"], ds["name"])}
    return frozenset(names.get(r, r) for r in refs)


def key_scope(state: ServeState, who: Viewer | None) -> Scope:
    """The caller's scope (unscoped on a ``--no-auth`` server)."""
    if who is None or who.key_id is None:
        return Scope("admin", None, None)
    row = next((k for k in state.keys.listing() if k["id"] == who.key_id), None)
    return Scope(who.role, _canonical(state, who.datasets), None if row is None else row["expires"])


def check_create(
    state: ServeState,
    who: Viewer | None,
    *,
    role: str,
    datasets: list[str] | None,
    expires_in: float | None,
) -> None:
    """403 unless a key of ``role``, ``datasets`` and ``expires_in`` lies within the caller's
    scope."""
    mine = key_scope(state, who)
    expires = None if expires_in is None else time.time() + expires_in
    exceeds = within(mine, Scope(role, _canonical(state, datasets), expires))
    if exceeds:
        msg = f"your key may create keys within its own scope only; this one would have {exceeds}"
        raise HTTPException(403, msg)


def visible_keys(state: ServeState, who: Viewer | None) -> list[dict[str, Any]]:
    """The keys the caller may see and manage: those within its scope (all for an unscoped
    key)."""
    mine = key_scope(state, who)
    rows = state.keys.listing()
    if mine.datasets is None and mine.expires is None and mine.role == "admin":
        return rows
    return [
        r
        for r in rows
        if not within(mine, Scope(r["role"], _canonical(state, r["datasets"]), r["expires"]))
    ]


def check_revoke(state: ServeState, who: Viewer | None, key_id: str) -> dict[str, Any]:
    """The live key ``key_id`` when it lies within the caller's scope, else 404 (a key outside
    it is not shown to the caller, so it is not confirmed to exist either)."""
    row = next(
        (k for k in visible_keys(state, who) if k["id"] == key_id and not k["revoked"]), None
    )
    if row is None:
        raise NotFoundError(f"no live key {key_id!r} within your key's scope")
    return row
