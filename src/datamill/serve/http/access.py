"""Who may call what: the one authentication path of the server and the role every route declares
(:func:`requires`: ``public``, ``read``, ``admin`` or ``metrics``; :func:`route_roles` reads it back
for the test of ``docs/serving.md``'s table), from a Bearer key or the UI's session cookie: 401 or
403 before the route does any work.

Examples:
    >>> may_call("metrics", "read"), may_call("admin", "metrics"), may_call("read", "metrics")
    (False, True, False)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from datamill.serve.http.routes.models import ItId
from datamill.serve.http.viewer import Viewer
from datamill.serve.protocol.iteration import Iteration
from datamill.serve.server import ServeState

__all__ = [
    "ROLES",
    "Admin",
    "Caller",
    "Reader",
    "ScopedIteration",
    "State",
    "Viewer",
    "audit",
    "authenticate",
    "check_dataset",
    "may_call",
    "may_use",
    "requires",
    "role_check",
    "route_roles",
    "routes",
    "serve_state",
]

ROLES = ("public", "read", "admin", "metrics")
"""Route roles: an ``admin`` key may call every route, a ``read`` key the ``read`` and ``public``
ones, a ``metrics`` key the ``metrics`` and ``public`` ones (see :func:`may_call`)."""
_ROLE_ATTR = "datamill_role"


def may_call(key_role: str, route_role: str) -> bool:
    """Whether a key of ``key_role`` may call a route that declares ``route_role``."""
    return route_role == "public" or key_role in ("admin", route_role)


def serve_state(request: Request) -> ServeState:
    """The app's :class:`~datamill.serve.server.ServeState`."""
    state: ServeState = request.app.state.serve
    return state


async def _state(request: Request) -> ServeState:
    # dependencies are async where they do not block: a sync one costs a thread-pool hop per request
    return serve_state(request)


State = Annotated[ServeState, Depends(_state)]
"""A route parameter ``state: State`` receives the server state."""


def authenticate(request: Request) -> Viewer | None:
    """The caller of ``request``, or ``None`` without a valid, unrevoked key (cached on the
    request)."""
    cached = request.scope.get("datamill.viewer", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return]
    from datamill.serve.ui.session import session_viewer

    state = serve_state(request)
    who: Viewer | None = None
    header = request.headers.get("authorization", "")
    if not state.auth:
        who = session_viewer(request, None)
    elif header.startswith("Bearer "):
        info = state.keys.check(header[len("Bearer ") :].strip())
        who = None if info is None else Viewer(info.role, "bearer", "", info.id, info.datasets)
    elif request.url.path.startswith("/ui/") or (
        request.method in ("GET", "HEAD") and not request.url.path.endswith("/next")
    ):
        who = session_viewer(request, state)
    # else a state-changing API call (and GET .../next, which takes leases and applies ?ack=) needs
    # the Bearer header: a session cookie alone (and no CSRF token) is not enough
    request.scope["datamill.viewer"] = who
    return who


def _denied(request: Request, status: int, who: Viewer | None) -> None:
    from datamill.serve.observe.logs import event

    event(
        "key denied",
        status=status,
        method=request.method,
        path=request.url.path[:200],
        key=who.key_id if who else None,
        role=who.role if who else None,
        client=request.client.host if request.client else None,
    )


async def _authenticate(request: Request) -> Viewer | None:
    """:func:`authenticate` inline for a Bearer key (in memory), in a worker thread for a session (a
    journal read)."""
    if (
        "datamill.viewer" in request.scope
        or request.headers.get("authorization", "").startswith("Bearer ")
        or not serve_state(request).auth
    ):
        return authenticate(request)
    return await run_in_threadpool(authenticate, request)


def _checker(role: str) -> Callable[..., Any]:
    async def check(request: Request) -> Viewer | None:
        who = await _authenticate(request)
        if role == "public":
            return who
        if who is None:
            _denied(request, 401, None)
            msg = (
                "missing, invalid, expired or revoked API key: send `Authorization: Bearer dmk_...`"
            )
            raise HTTPException(401, msg)
        if not may_call(who.role, role):
            _denied(request, 403, who)
            needs = "an admin" if role == "admin" else f"a {role} (or admin)"
            raise HTTPException(403, f"this route needs {needs} key; yours is a {who.role} key")
        return who

    setattr(check, _ROLE_ATTR, role)
    return check


_CHECKS = {role: _checker(role) for role in ROLES}


def role_check(role: str) -> Callable[[Request], Awaitable[Viewer | None]]:
    """The check behind :func:`requires` (for a layer that dispatches a declared route itself, see
    :class:`datamill.serve.http.routes.leases.NextLane`): authenticates, then 401/403 as the route
    would."""
    return _CHECKS[role]


def requires(role: str) -> Any:
    """The dependency that declares (and enforces) a route's role:
    ``dependencies=[requires("admin")]``.

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


Reader = Annotated[Viewer, requires("read")]
"""A route parameter ``who: Reader`` declares the ``read`` role and receives the caller."""
Admin = Annotated[Viewer, requires("admin")]
"""A route parameter ``who: Admin`` declares the ``admin`` role and receives the caller."""


Caller = Annotated["Viewer | None", Depends(_authenticate)]
"""The caller (``None`` when anonymous) without declaring a role: for checks beyond the role."""


def may_use(who: Viewer | None, ds: Mapping[str, Any]) -> bool:
    """Whether the caller's key may use a dataset (a registered row with ``id`` and ``name``)."""
    return (
        who is None or who.datasets is None or not {ds["id"], ds["name"]}.isdisjoint(who.datasets)
    )


def check_dataset(who: Viewer | None, state: ServeState, ref: str) -> dict[str, Any]:
    """The dataset ``ref`` (id or name), or 403 when the caller's key is limited to other
    datasets."""
    ds = state.dataset(ref)
    if not may_use(who, ds):
        assert who is not None and who.datasets is not None
        raise HTTPException(
            403,
            f"this key may use the datasets {', '.join(sorted(who.datasets))} only, "
            f"not {ds['name']!r}",
        )
    return ds


async def scoped_iteration(it_id: ItId, state: State, who: Caller) -> Iteration:
    """The iteration of the path, or 403 when its dataset is outside the caller's key's datasets."""
    it = state.live_iteration(it_id)  # in memory: no thread hop on the lease path
    if it is None:  # rebuilt from the journal (reads): in a worker thread
        it = await run_in_threadpool(state.iteration, it_id)
    if who is not None and who.datasets is not None:  # only a limited key pays (the lease path)
        check_dataset(who, state, str(it.config["dataset"]))
    return it


ScopedIteration = Annotated[Iteration, Depends(scoped_iteration)]
"""A route parameter ``it: ScopedIteration`` receives the path's iteration, checked against the
key's datasets."""


def audit(state: ServeState, who: Viewer | None, action: str, detail: str = "") -> None:
    """Record an admin action in the journal's audit table (and log it as an event)."""
    from datamill.serve.observe.logs import event

    state.journal.add_audit(who.key_id if who else None, action, detail[:500])
    event(action, key=who.key_id if who else None, detail=detail[:500])
