"""Connection bounds in front of the app: uvicorn's httptools protocol subclassed
(:func:`guarded_protocol`, passed as uvicorn's ``http=``) with header size and count limits, header
and body deadlines, caps on concurrent connections (total and per client address), and the watch of
each client session's connections (:class:`SessionWatch`). The bounds and why uvicorn needs them:
``docs/serving.md`` (*Connections*); what a session's closed connections do to its leases:
``docs/serving-delivery.md``.

Examples:
    >>> default_caps(1024)
    (768, 192)
    >>> default_caps(65536)
    (16384, 4096)
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BODY_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "ConnectionCaps",
    "SessionWatch",
    "default_caps",
    "guarded_http",
    "guarded_protocol",
]

MAX_HEADER_BYTES = 64 * 1024
"""The request line and header fields of one request, in bytes."""
MAX_HEADERS = 100
"""Header fields of one request."""
HEADER_TIMEOUT_S = 10.0
"""Seconds a request's headers may take to arrive."""
BODY_TIMEOUT_S = 30.0
"""Seconds a request's body may take to arrive after its headers."""
_REFUSED_CLOSE_S = 1.0  # a refused connection waits this long for its request to be read (no RST)


def default_caps(nofile: int | None = None) -> tuple[int, int]:
    """``(total, per address)`` connection caps for a descriptor limit (``None``: this process's
    soft ``RLIMIT_NOFILE``): three quarters of it (at most 16,384), a quarter of that per address;
    the rest stays for the journal, shard files and build workers."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    total = max(16, min(16384, nofile - 128, nofile * 3 // 4))
    return total, max(8, total // 4)


@dataclass
class ConnectionCaps:
    """The live connection counts of one server (one event loop: no lock) and their caps."""

    total: int
    per_client: int
    trusted: frozenset[str] = frozenset()
    open: int = 0
    by_client: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    _logged: float = 0.0

    def admit(self, host: str) -> bool:
        """Count a new connection from ``host``, or ``False`` when a cap is reached."""
        held = self.by_client.get(host, 0)
        if self.open >= self.total or (host not in self.trusted and held >= self.per_client):
            self.refused += 1
            self._log(host)
            return False
        self.open, self.by_client[host] = self.open + 1, held + 1
        return True

    def release(self, host: str) -> None:
        """Forget a closed connection of ``host``."""
        self.open -= 1
        if (left := self.by_client.pop(host, 1) - 1) > 0:
            self.by_client[host] = left

    def _log(self, host: str) -> None:
        now = time.monotonic()
        if now - self._logged >= 10.0:  # at most one line per 10 s, with the count
            self._logged = now
            from datamill.serve.observe.logs import event

            event(
                "connections refused",
                refused_total=self.refused,
                open=self.open,
                cap=self.total,
                per_client_cap=self.per_client,
                client=host,
                client_open=self.by_client.get(host, 0),
            )


def _reply(transport: Any, status: str, error: str, extra: str = "") -> None:
    """Answer ``{"error": ...}`` with ``status`` and close (written before uvicorn parses)."""
    body = json.dumps({"error": error})
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    transport.write((head + extra + "connection: close\r\n\r\n" + body).encode("ascii"))


class _TooLarge(Exception):
    pass


class SessionWatch:
    """Open connections per client session; ``closed(session)`` is called when the last one is
    closed by its peer, ``opened(session)`` when the session has a connection again (all calls
    in the event loop's thread).

    Examples:
        >>> gone = []
        >>> w = SessionWatch(gone.append)
        >>> w.opened("s"); w.opened("s"); w.lost("s", by_peer=True); gone
        []
        >>> w.lost("s", by_peer=True); gone
        ['s']
        >>> w.opened("t"); w.lost("t", by_peer=False); gone  # closed by the server: not a death
        ['s']
    """

    def __init__(
        self, closed: Callable[[str], None], reopened: Callable[[str], None] | None = None
    ) -> None:
        self.closed, self.reopened = closed, reopened
        self.open: dict[str, int] = {}

    def opened(self, session: str) -> None:
        """A connection carried ``session`` for the first time."""
        n = self.open.get(session, 0)
        self.open[session] = n + 1
        if n == 0 and self.reopened is not None:
            self.reopened(session)

    def lost(self, session: str, *, by_peer: bool) -> None:
        """A connection that carried ``session`` is gone (``by_peer``: the client closed it)."""
        if (n := self.open.pop(session, 0) - 1) > 0:
            self.open[session] = n
        elif by_peer:
            self.closed(session)


_SESSION = b"x-datamill-session"


# long (131 lines): a class: uvicorn's protocol with the bounds, each hook a few lines
def guarded_protocol(
    caps: ConnectionCaps,
    watch: SessionWatch | None = None,
    *,
    proxies: frozenset[str] | None = frozenset(),
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the bounds of this module, counting into ``caps`` (and
    the client sessions of its connections into ``watch``, except connections from ``proxies``:
    a proxy pools its connections across clients and closes them on its own, so their close says
    nothing of a client; ``None`` = every address may be a proxy, nothing watched)."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _host = ""
        _refused = False
        _in_headers = True
        _raw = 0  # bytes received while in a request's headers (a coarse bound, per chunk)
        _size = 0  # exact: request line + header fields
        _count = 0
        _deadline: asyncio.TimerHandle | None = None
        _sessions: tuple[str, ...] = ()
        _by_peer = False
        _watched = False  # a client's own connection (not a proxy's): its sessions are watched

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            self._host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if not caps.admit(self._host):
                self._refused = True
                self.transport = transport
                msg = "too many connections: retry in a second"
                _reply(transport, "503 Service Unavailable", msg, "retry-after: 1\r\n")
                self._deadline = self.loop.call_later(_REFUSED_CLOSE_S, transport.close)
                return
            self._watched = watch is not None and proxies is not None and self._host not in proxies
            super().connection_made(transport)
            self._arm(HEADER_TIMEOUT_S, self._header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._refused:
                return
            caps.release(self._host)
            if watch is not None:
                for s in self._sessions:
                    watch.lost(s, by_peer=self._by_peer or exc is not None)
            super().connection_lost(exc)

        def eof_received(self) -> None:
            self._by_peer = True  # the client closed its side (it exited, or was killed)
            super().eof_received()

        def _arm(self, seconds: float, fn: Any) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, fn)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _header_timeout(self) -> None:
            self._deadline = None
            if self.transport.is_closing() or not self._in_headers:
                return
            if self._raw:
                msg = f"request headers not complete within {HEADER_TIMEOUT_S:.0f} s"
                _reply(self.transport, "408 Request Timeout", msg)
            self.transport.close()

        def _body_timeout(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def _too_large(self) -> None:
            msg = f"request headers over {MAX_HEADER_BYTES} bytes or {MAX_HEADERS} fields"
            _reply(self.transport, "431 Request Header Fields Too Large", msg)
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                self.transport.close()  # its request is read: closing sends no reset
                return
            if self._in_headers:
                if not self._raw and self._deadline is None:  # a kept-alive connection's next
                    self._arm(HEADER_TIMEOUT_S, self._header_timeout)
                self._raw += len(data)
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _TooLarge):
                    self._too_large()
                    return
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
                return
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            if self._in_headers and self._raw > 2 * MAX_HEADER_BYTES:
                self._too_large()  # one endless header: cut off before it is complete

        def on_message_begin(self) -> None:
            self._size = self._count = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._size += len(url)
            if self._size > MAX_HEADER_BYTES:
                raise _TooLarge
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._size += len(name) + len(value) + 4
            self._count += 1
            if self._size > MAX_HEADER_BYTES or self._count > MAX_HEADERS:
                raise _TooLarge
            if self._watched and watch is not None and name.lower() == _SESSION:
                s = value.decode("latin-1")
                if s not in self._sessions:
                    self._sessions += (s,)
                    watch.opened(s)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._arm(BODY_TIMEOUT_S, self._body_timeout)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_headers, self._raw = True, 0
            self._disarm()  # the next request's deadline starts with its first byte
            super().on_message_complete()

    return GuardedHttpToolsProtocol


def guarded_http(
    forwarded_allow_ips: Iterable[str] | None = None,
    *,
    session_closed: Callable[[str], None] | None = None,
    session_opened: Callable[[str], None] | None = None,
) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http=``, with :func:`default_caps`; the literal proxy
    addresses of ``forwarded_allow_ips`` have no per-address cap; ``session_closed(secret)`` is
    told of each client session whose connections its client all closed (:class:`SessionWatch`),
    ``session_opened(secret)`` of each that has a connection again."""
    allowed = list(forwarded_allow_ips or ())
    trusted = frozenset(a for a in allowed if a != "*")
    watch = None if session_closed is None else SessionWatch(session_closed, session_opened)
    return guarded_protocol(
        ConnectionCaps(*default_caps(), trusted=trusted),
        watch,
        proxies=None if "*" in allowed else trusted,  # a proxy closes its own connections
    )
