"""Who may call what: the one authentication path of the server and the role every route declares.

A route states its role with a dependency from :func:`requires` (``public``, ``read`` or ``admin``);
:func:`route_roles` reads it back, so a test walks ``app.routes`` and fails on any route without exactly
one. The dependency authenticates the caller once per request, from an ``Authorization: Bearer`` header
or the UI's session cookie (:mod:`datamill.serve.ui.session`), and answers 401 (no valid key) or 403
(a key without the role) before the route does any work.

Examples:
    >>> rank("admin") > rank("read") > rank("public")
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from datamill.serve.server import ServeState

__all__ = ["ROLES", "State", "Viewer", "authenticate", "rank", "requires", "route_roles", "routes", "serve_state"]

ROLES = ("public", "read", "admin")
"""Route roles, weakest first: a key of a role may call the routes of every weaker role."""
_ROLE_ATTR = "datamill_role"


@dataclass(frozen=True)
class Viewer:
    """An authenticated caller.

    ``role`` is ``"read"`` or ``"admin"``; ``via`` is ``"bearer"``, ``"cookie"`` or ``"none"`` (a
    ``--no-auth`` server); ``key_id`` names the key (``None`` without auth); ``datasets`` the dataset
    ids and names it may use (``None``: all); ``csrf`` the token its forms carry (empty for bearer).
    """

    role: str
    via: str
    csrf: str = ""
    key_id: str | None = None
    datasets: frozenset[str] | None = None

    @property
    def admin(self) -> bool:
        """Whether the caller may manage keys, register datasets, rewind and cancel iterations."""
        return self.role == "admin"


def rank(role: str) -> int:
    """The strength of a role (its index in :data:`ROLES`)."""
    return ROLES.index(role)


def serve_state(request: Request) -> ServeState:
    """The app's :class:`~datamill.serve.server.ServeState` (a dependency)."""
    state: ServeState = request.app.state.serve
    return state


State = Annotated[ServeState, Depends(serve_state)]
"""A route parameter ``state: State`` receives the server state."""


def authenticate(request: Request) -> Viewer | None:
    """The caller of ``request``, or ``None`` without a valid, unrevoked key (cached on the request)."""
    cached = request.scope.get("datamill.viewer", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return]
    from datamill.serve.ui.session import session_viewer

    state = serve_state(request)
    who: Viewer | None
    header = request.headers.get("authorization", "")
    if not state.auth:
        who = session_viewer(request, None)
    elif header.startswith("Bearer "):
        role = state.keys.check(header[len("Bearer "):].strip())
        who = None if role is None else Viewer(role, "bearer")
    else:
        who = session_viewer(request, state)
    request.scope["datamill.viewer"] = who
    return who


def _checker(role: str) -> Callable[..., Any]:
    if role == "public":
        def check_public(request: Request) -> Viewer | None:
            return authenticate(request)
        fn: Callable[..., Any] = check_public
    else:
        def check(request: Request) -> Viewer:
            who = authenticate(request)
            if who is None:
                raise HTTPException(401, "missing, invalid or revoked API key: send `Authorization: Bearer dmk_...`")
            if rank(who.role) < rank(role):
                raise HTTPException(403, f"this route needs an {role} key; yours is a {who.role} key")
            return who
        fn = check
    setattr(fn, _ROLE_ATTR, role)
    return fn


_CHECKS = {role: _checker(role) for role in ROLES}


def requires(role: str) -> Any:
    """The dependency that declares (and enforces) a route's role: ``dependencies=[requires("admin")]``.

    Raises:
        ValueError: an unknown role (a programming error, at import time).
    """
    if role not in _CHECKS:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    return Depends(_CHECKS[role])


def routes(app: Any) -> Iterator[Any]:
    """Every route of an app, those of included routers too, with its full path and dependencies."""
    from fastapi import routing

    walk = getattr(routing, "iter_route_contexts", None)  # fastapi >= 0.165 includes routers lazily
    yield from (walk(app.routes) if walk else app.routes)


def route_roles(route: Any) -> list[str]:
    """The roles a route (from :func:`routes`) declares: a correct route declares exactly one."""
    found: list[str] = []
    stack = list(getattr(getattr(route, "dependant", None), "dependencies", None) or [])
    while stack:
        dep = stack.pop()
        role = getattr(dep.call, _ROLE_ATTR, None)
        if role is not None:
            found.append(role)
        stack.extend(dep.dependencies)
    return found

