"""Browser-facing checks every request passes before routing: the ``Host`` among the server's names
(``--allowed-hosts``; else 400, against DNS rebinding), the ``Origin`` of a state-changing request
(else 403), security headers on every response; ``docs/serving.md`` (*Browser security*).

Examples:
    >>> hosts = AllowedHosts(["127.0.0.1:8470", "localhost"])
    >>> (
    ...     hosts.allows("127.0.0.1:8470"),
    ...     hosts.allows("localhost:9"),
    ...     hosts.allows("evil.example:8470"),
    ... )
    (True, True, False)
    >>> hosts.allows_origin("http://localhost:8470"), hosts.allows_origin("null")
    (True, False)
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DEFAULT_HOSTS", "SECURITY_HEADERS", "AllowedHosts", "Guard", "default_hosts"]

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "[::1]")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def default_hosts(host: str, port: int) -> list[str]:
    """The names a server bound to ``host:port`` accepts by default: the loopback names and
    ``host``."""
    names = [f"{h}:{port}" for h in DEFAULT_HOSTS]
    bound = f"[{host}]" if ":" in host and not host.startswith("[") else host
    if bound not in DEFAULT_HOSTS and bound not in ("0.0.0.0", "[::]"):
        names.append(f"{bound}:{port}")
    return names


class AllowedHosts:
    """Host names (``name`` for any port, ``name:port`` for one; ``*`` for any host)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = [n.strip().lower() for n in names if n.strip()]
        self.any = "*" in self.names

    def allows(self, host: str) -> bool:
        """Whether a ``Host`` header value (``name`` or ``name:port``) is one of the names."""
        host = host.strip().lower()
        if self.any:
            return True
        if not host or len(host) > 300:
            return False
        if host.startswith("["):
            name = host[: host.find("]") + 1]
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return host in self.names or name in self.names

    def allows_origin(self, origin: str) -> bool:
        """Whether an ``Origin`` header names one of the hosts (``null`` and other schemes never
        do)."""
        parsed = urllib.parse.urlsplit(origin.strip())
        return parsed.scheme in ("http", "https") and self.allows(parsed.netloc)


class Guard:
    """ASGI middleware: the ``Host`` and ``Origin`` checks and the security headers (module
    docstring)."""

    def __init__(self, app: ASGIApp, *, hosts: AllowedHosts) -> None:
        self.app, self.hosts = app, hosts
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = dict(scope.get("headers", []))
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.hosts.allows(host):
            return 400, (
                f"Host {host[:100]!r} is not one of this server's names "
                f"({', '.join(self.hosts.names)}): add it with --allowed-hosts"
            )
        origin = headers.get(b"origin", b"").decode("latin-1")
        if (
            b"origin" in headers
            and scope["method"] in _UNSAFE
            and not self.hosts.allows_origin(origin)
        ):
            return 403, (
                f"cross-origin {scope['method']} from {origin[:100]!r} refused: expected a request "
                "from this server's own pages"
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is not None:
            from starlette.responses import JSONResponse

            answer = JSONResponse({"error": refusal[1]}, refusal[0], headers=SECURITY_HEADERS)
            return await answer(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                have = {k.lower() for k, _ in msg.get("headers", [])}
                msg["headers"] = [
                    *msg.get("headers", []),
                    *((k, v) for k, v in self.headers if k not in have),
                ]
            await send(msg)

        await self.app(scope, receive, send_with_headers)
