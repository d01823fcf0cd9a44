"""The client side of ``datamill serve``: stdlib ``http.client`` keep-alive, JSON control plane.

:class:`Client` manages datasets, iterations and keys; :class:`~datamill.client.RemoteLoader`
iterates. Measured on loopback, ``http.client`` costs about a third of httpx's CPU per request,
which is why neither imports a third-party HTTP library.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamill.client.options import Leases, check_transport, served_batching
from datamill.core.errors import ConfigError, DatamillError
from datamill.loader.options import Batching

__all__ = ["Client", "Head", "RemoteError", "Response"]

RETRYABLE = (ConnectionError, http.client.HTTPException, socket.timeout, OSError)
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class RemoteError(DatamillError, RuntimeError):
    """The server answered with an error status (``status``) or could not be reached
    (``status=0``)."""

    def __init__(self, msg: str, *, status: int = 0, hint: str | None = None) -> None:
        self.status = status
        super().__init__(msg, hint=hint)


class Response:
    """Status, headers (lower-cased names) and body of one reply."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, dict(headers), body

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body) if self.body else None


def _tls_context(verify: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """A client TLS context trusting the system's CAs, or only those of the PEM file ``verify``."""
    if verify is not None and not Path(verify).is_file():
        raise ConfigError(
            "no such CA certificate file (verify=)",
            path=verify,
            hint="pass the PEM file of the CA that signed the server's certificate",
        )
    try:
        return ssl.create_default_context(cafile=None if verify is None else os.fspath(verify))
    except ssl.SSLError as exc:
        raise ConfigError(f"not a PEM CA certificate file: {exc}", path=verify) from exc


class Http:
    """One keep-alive connection (not thread-safe: one per thread), reconnecting on failure.

    Args:
        url: ``http://host:port``.
        key: the API key (``None`` for a ``--no-auth`` server).
        timeout: socket timeout in seconds. Defaults to ``60.0``.
        retry_s: how long to keep reconnecting when the server is unreachable. Defaults to ``0`` (no
            retry).
        verify: for ``https://``, a PEM file of the CA certificates to trust. Defaults to the
            system's.
    """

    def __init__(
        self,
        url: str,
        key: str | None,
        *,
        timeout: float = 60.0,
        retry_s: float = 0.0,
        verify: str | os.PathLike[str] | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"server url must look like http://host:port, got {url!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 8470)
        self.ssl = _tls_context(verify) if parts.scheme == "https" else None
        self.base = parts.path.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout, self.retry_s = timeout, retry_s
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.ssl is not None:
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=self.ssl
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Sequence[tuple[str, Any]] = (),
        ok: Sequence[int] = (200,),
        into: Callable[[int], Any] | None = None,
    ) -> Response:
        """Send one request (retrying connection failures for ``retry_s``); raise
        :class:`RemoteError` if not ``ok``. ``into(n)``: a writable buffer of ``n`` bytes that a
        ``200`` reply's body of a known length is read into (the body is then that buffer)."""
        raw, res = self._exchange(method, path, body, query, lambda raw: _read(raw, into))
        self._done(raw)
        return _checked(method, path, res, ok)

    def head(self, method: str, path: str, *, query: Sequence[tuple[str, Any]] = ()) -> Head:
        """Send one request and read its status and headers (retrying connection failures for
        ``retry_s``, as :meth:`request`); its body is read with :meth:`body`, before the next
        request on this connection."""
        raw, res = self._exchange(method, path, None, query, lambda raw: b"")
        return Head(method, path, raw, res)

    def body(
        self, head: Head, *, ok: Sequence[int] = (200,), into: Callable[[int], Any] | None = None
    ) -> Response:
        """The reply of :meth:`head` with its body (read as :meth:`request` reads it; a connection
        failure now is a :class:`RemoteError` of status 0, not retried: the request may have had
        its effect); :class:`RemoteError` if not ``ok``."""
        try:
            head.response.body = _read(head.raw, into)
        except RETRYABLE as exc:
            self.close()
            raise RemoteError(
                f"{head.method} {head.path}: the reply was cut off: {exc}", hint=_HINT
            ) from exc
        self._done(head.raw)
        return _checked(head.method, head.path, head.response, ok)

    def _done(self, raw: http.client.HTTPResponse) -> None:
        if raw.will_close:
            self.close()

    def _exchange(
        self,
        method: str,
        path: str,
        body: Any,
        query: Sequence[tuple[str, Any]],
        read: Callable[[http.client.HTTPResponse], Any],
    ) -> tuple[http.client.HTTPResponse, Response]:
        """Send the request and ``read`` its reply's body, retrying connection failures (a
        keep-alive connection the server closed: once at once) for ``retry_s``."""
        target = self.base + path + ("?" + urllib.parse.urlencode(list(query)) if query else "")
        payload = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        stale_retry = True
        while True:
            reused = self._conn is not None
            try:
                conn = self._connection()
                conn.request(method, target, body=payload, headers=headers)
                raw = conn.getresponse()
                res = Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, read(raw))
                return raw, res
            except RETRYABLE as exc:
                self.close()
                if reused and stale_retry and isinstance(exc, _STALE):
                    stale_retry = (
                        False  # the server closed an idle keep-alive connection: reconnect once
                    )
                    continue
                if time.monotonic() >= deadline:
                    raise RemoteError(
                        f"cannot reach {self.scheme}://{self.host}:{self.port}: {exc}", hint=_HINT
                    ) from exc
                time.sleep(delay)
                delay = min(1.0, delay * 2)


_HINT = "is `datamill serve` running there?"


@dataclass
class Head:
    """A request sent with :meth:`Http.head`: its reply's status and headers (``response``, whose
    body :meth:`Http.body` reads)."""

    method: str
    path: str
    raw: http.client.HTTPResponse
    response: Response


def _checked(method: str, path: str, res: Response, ok: Sequence[int]) -> Response:
    """``res``, or :class:`RemoteError` when its status is not ``ok``."""
    if res.status not in ok:
        try:
            detail = res.json().get("error", res.body[:200])
        except (ValueError, AttributeError):
            detail = res.body[:200].decode("utf-8", "replace")
        raise RemoteError(f"{method} {path}: HTTP {res.status}: {detail}", status=res.status)
    return res


def _read(raw: http.client.HTTPResponse, into: Callable[[int], Any] | None) -> Any:
    """``raw``'s body: a ``200`` reply's read into ``into(length)``, else as ``bytes`` (also when
    it is empty or its length not given: ``read`` also ends the reply, so that the connection takes
    the next request)."""
    if into is None or raw.status != 200 or not raw.length:
        return raw.read()
    buf = into(raw.length)
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = raw.readinto(view[got:])
        if not n:
            raise http.client.IncompleteRead(bytes(view[:got]), len(view) - got)
        got += n
    return buf


class Client:
    """Manage a ``datamill serve`` server: datasets, iterations, progress, keys.

    Args:
        url: the server, ``http://host:port``.
        key: an API key ``dmk_<id>.<secret>`` (``None`` for a ``--no-auth`` server). Defaults to
            ``None``.
        timeout: socket timeout in seconds. Defaults to ``60.0``.
        verify: for an ``https://`` url, a PEM file of the CA certificates to trust (a private CA,
            or the proxy's self-signed certificate). Defaults to ``None`` (the system's trust
            store).

    Examples:
        >>> Client("ftp://nowhere")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: server url must look like http://host:port, got 'ftp://nowhere'
    """

    def __init__(
        self,
        url: str,
        key: str | None = None,
        *,
        timeout: float = 60.0,
        verify: str | os.PathLike[str] | None = None,
    ) -> None:
        self.url, self.key = url, key
        self.http = Http(url, key, timeout=timeout, verify=verify)

    def close(self) -> None:
        """Close the connection."""
        self.http.close()

    def __enter__(self) -> Client:  # noqa: PYI034 - Client is not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """``{"ok": True, "boot": ..., "auth": ...}``."""
        return dict(self.http.request("GET", "/api/v1/health").json())

    def register(
        self, path: str, *, name: str, client_location: str | None = None
    ) -> dict[str, Any]:
        """Register the dataset at ``path`` (under one of the server's roots) as ``name`` (admin
        key).

        ``client_location`` (a path every client node sees, or ``s3://bucket/prefix``) allows direct
        mode:
        the server tells clients this location and they build their batches themselves.
        """
        body = {"path": str(path), "name": name}
        if client_location is not None:
            body["client_location"] = str(client_location)
        return dict(self.http.request("POST", "/api/v1/datasets", body=body).json())

    def location(self, dataset: str) -> str:
        """Where clients read ``dataset`` in direct mode (:class:`RemoteError` 400 when it has no
        client location)."""
        return str(self.location_info(dataset)["location"])

    def location_info(self, dataset: str) -> dict[str, Any]:
        """``{"dataset", "location", "identity"}``: where clients read ``dataset`` in direct mode
        and the content identity of the data the server registered
        (:func:`~datamill.core.identity.content_identity`; absent from an earlier release's
        server), which a direct client checks its copy against."""
        return dict(self.http.request("GET", f"/api/v1/datasets/{_quote(dataset)}/location").json())

    def datasets(self) -> list[dict[str, Any]]:
        """Registered datasets, each with ``id`` and ``name``."""
        return list(self.http.request("GET", "/api/v1/datasets").json())

    def iteration(
        self,
        dataset: str,
        *,
        batch_size: int,
        seed: int = 0,
        epoch: int = 0,
        columns: Sequence[str] | str | None = None,
        batching: Batching | None = None,
        leases: Leases | None = None,
        transport: str = "built",
        resume_from: str | None = None,
        loader_states: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Create (or join: same ``leases.name``, or same settings, and epoch) an iteration;
        returns its description.

        ``batching`` (the loader's :class:`~datamill.loader.Batching`: the server applies its
        ``shuffle``, ``drop_last`` and shuffle ``window``) and ``leases``
        (:class:`~datamill.client.options.Leases`: mode, world size, name, lease size and
        timeout; without a size, 16 batches) are validated where they are declared.

        ``transport="direct"`` first asks for the dataset's client location (refused, HTTP 400, when
        it was registered without one) and adds it to the description as ``location``; the iteration
        is the same for both transports (server-built and direct clients may share it).

        ``resume_from`` (an iteration id) or ``loader_states`` (every rank's
        ``Loader.state_dict()``) resume an epoch with any ``world_size``: the batches not done are
        split over the new ranks.
        """
        lease_fields = (Leases() if leases is None else leases).body()
        body: dict[str, Any] = {
            "dataset": dataset,
            "batch_size": batch_size,
            "seed": seed,
            "epoch": epoch,
            **served_batching(batching),
            **lease_fields,
        }
        if columns is not None:
            body["columns"] = [columns] if isinstance(columns, str) else list(columns)
        if resume_from is not None:
            body["resume_from"] = resume_from
        if loader_states is not None:
            body["loader_states"] = [dict(s) for s in loader_states]
        check_transport(transport)
        location = self.location(dataset) if transport == "direct" else None
        out = dict(self.http.request("POST", "/api/v1/iterations", body=body).json())
        if location is not None:
            out["location"] = location
        return out

    def iterations(
        self,
        *,
        status: str | None = None,
        dataset: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> dict[str, Any]:
        """A page of iterations, oldest first: ``{"iterations": [...], "next": id or None}`` (pass
        ``next`` as ``after`` for the following page). ``status``: running, finished, cancelled or
        stale."""
        query = [
            (k, v)
            for k, v in (
                ("status", status),
                ("dataset", dataset),
                ("limit", limit),
                ("after", after),
            )
            if v is not None
        ]
        return dict(self.http.request("GET", "/api/v1/iterations", query=query).json())

    def progress(self, iteration: str) -> dict[str, Any]:
        """``total``, ``done``, ``leased``, ``pending`` batches, ``batches_per_s`` and per-client
        stall times."""
        return dict(
            self.http.request("GET", f"/api/v1/iterations/{_quote(iteration)}/progress").json()
        )

    def done(self, iteration: str) -> list[tuple[int, int, str]]:
        """The committed record: ``(start, stop, lease)`` unit runs in commit order."""
        rows = self.http.request("GET", f"/api/v1/iterations/{_quote(iteration)}/done").json()[
            "rows"
        ]
        return [(int(a), int(b), str(c)) for a, b, c in rows]

    def rewind(
        self,
        iteration: str,
        *,
        rank: int | None = None,
        consumed: int | None = None,
        done: Sequence[tuple[int, int]] | None = None,
    ) -> dict[str, Any]:
        """Set the done set (admin key needed): rank ``rank`` consumed ``consumed`` batches, or
        ``done`` unit runs."""
        body: dict[str, Any] = {}
        if done is not None:
            body["done"] = [list(r) for r in done]
        else:
            body.update(rank=rank, consumed=consumed)
        return dict(
            self.http.request(
                "POST", f"/api/v1/iterations/{_quote(iteration)}/rewind", body=body
            ).json()
        )

    def resume(
        self, iteration: str, *, rank: int, consumed: int, session: str | None = None
    ) -> dict[str, Any]:
        """Resume rank ``rank`` of a static iteration from a checkpoint that consumed ``consumed``
        batches; with ``session`` (a dynamic state's), the batches that session consumed after
        its first ``consumed`` are served again.

        A read key may resume only the iterations it created; an admin key any.
        """
        body: dict[str, Any] = {"rank": rank, "consumed": consumed}
        if session is not None:
            body["session"] = session
        return dict(
            self.http.request(
                "POST", f"/api/v1/iterations/{_quote(iteration)}/resume", body=body
            ).json()
        )

    def cancel(self, iteration: str) -> dict[str, Any]:
        """Cancel an iteration for good (admin key needed): clients asking for a lease get HTTP
        410."""
        return dict(
            self.http.request("POST", f"/api/v1/iterations/{_quote(iteration)}/cancel").json()
        )

    def create_key(self, *, role: str = "read", note: str = "") -> dict[str, Any]:
        """A new key (admin key needed); the returned ``key`` is shown only now."""
        return dict(
            self.http.request("POST", "/api/v1/keys", body={"role": role, "note": note}).json()
        )

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key by its id (admin key needed)."""
        self.http.request("DELETE", f"/api/v1/keys/{_quote(key_id)}")


def _quote(part: str) -> str:
    return urllib.parse.quote(str(part), safe="")
