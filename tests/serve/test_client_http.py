"""The client's keep-alive connection: a server closing an idle connection is not an error."""

from __future__ import annotations

import socket
import threading

import pytest

from datamill.client.http import Http

pytestmark = pytest.mark.server

REPLY = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"ok": true}'
)


def test_a_request_on_a_connection_the_server_closed_while_idle_reconnects_once() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    served = []

    def serve() -> (
        None
    ):  # answer one request per connection, then close it (as an idle timeout would)
        for _ in range(2):
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(REPLY)
                served.append(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    h = Http(
        f"http://127.0.0.1:{port}", None, timeout=5, retry_s=0
    )  # no retry for an unreachable server
    try:
        assert h.request("GET", "/a").json() == {"ok": True}
        assert h.request("GET", "/b").json() == {
            "ok": True
        }  # the stale connection is replaced, not an error
    finally:
        h.close()
        t.join(timeout=5)
        srv.close()
    assert len(served) == 2


def _serve(*replies: bytes) -> tuple[int, threading.Thread, socket.socket, list[int]]:
    """A server on a free loopback port that takes one connection and answers its requests with
    ``replies`` in turn, then closes it; the list counts the connections it accepted."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)
    accepted: list[int] = []

    def serve() -> None:
        conn, _ = srv.accept()
        accepted.append(1)
        with conn:
            for reply in replies:
                conn.recv(65536)
                conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t, srv, accepted


def test_a_body_read_into_the_buffer_asked_for_and_an_error_reply_as_bytes() -> None:
    # a lease's body goes into a buffer the caller makes (Arrow's pool reuses that memory); a reply
    # that is not 200 is read as it always was
    import pyarrow as pa

    body = bytes(range(256)) * 5000
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    made: list[int] = []

    def into(n: int) -> pa.Buffer:
        made.append(n)
        return pa.allocate_buffer(n)

    for reply, ok, want, kind in [
        (head + body, (200,), body, pa.Buffer),
        (b"HTTP/1.1 409 Conflict\r\nContent-Length: 4\r\n\r\nwait", (409,), b"wait", bytes),
    ]:
        port, t, srv, _ = _serve(reply)
        h = Http(f"http://127.0.0.1:{port}", None, timeout=5, retry_s=0)
        try:
            res = h.request("GET", "/next", ok=ok, into=into)
        finally:
            h.close()
            t.join(timeout=5)
            srv.close()
        assert isinstance(res.body, kind) and bytes(res.body) == want
    assert made == [len(body)]


def test_a_body_cut_short_is_an_error_not_a_shorter_body() -> None:
    import pyarrow as pa

    from datamill.client.http import RemoteError

    port, t, srv, _ = _serve(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 60)
    h = Http(f"http://127.0.0.1:{port}", None, timeout=5, retry_s=0)
    try:
        with pytest.raises(RemoteError, match="cannot reach"):
            h.request("GET", "/next", into=pa.allocate_buffer)
    finally:
        h.close()
        t.join(timeout=5)
        srv.close()


def test_an_empty_body_read_into_a_buffer_leaves_the_connection_ready_for_the_next_request() -> (
    None
):
    # a direct-mode lease has no body: the reply must still be ended, or the next request on the
    # keep-alive connection fails and is sent again on a new one (a lease request twice)
    import pyarrow as pa

    empty = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    port, t, srv, accepted = _serve(empty, empty)
    h = Http(f"http://127.0.0.1:{port}", None, timeout=5, retry_s=0)
    try:
        for _ in range(2):
            assert bytes(h.request("GET", "/next", into=pa.allocate_buffer).body) == b""
    finally:
        h.close()
        t.join(timeout=5)
        srv.close()
    assert accepted == [1]


def test_headers_then_body_and_a_body_cut_off_is_an_error_not_a_request_sent_again() -> None:
    # a lease request's headers come first (the next request may go out meanwhile), its body after;
    # a body cut off then is an error of its own, not a request sent again (it had its effect)
    import pyarrow as pa

    from datamill.client.http import RemoteError

    body = bytes(range(256)) * 100
    full = b"HTTP/1.1 200 OK\r\nX-Datamill-Lease: L1\r\nContent-Length: %d\r\n\r\n" % len(body)
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 60
    port, t, srv, accepted = _serve(full + body, cut)
    h = Http(f"http://127.0.0.1:{port}", None, timeout=5, retry_s=0)
    try:
        head = h.head("GET", "/next", query=[("client", "c")])
        assert head.response.status == 200 and head.response.headers["x-datamill-lease"] == "L1"
        res = h.body(head, into=pa.allocate_buffer)
        assert isinstance(res.body, pa.Buffer) and bytes(res.body) == body
        head = h.head("GET", "/next")  # the same connection: the first body was read whole
        with pytest.raises(RemoteError, match="cut off") as err:
            h.body(head, into=pa.allocate_buffer)
        assert err.value.status == 0
    finally:
        h.close()
        t.join(timeout=5)
        srv.close()
    assert accepted == [1]  # one connection, no second try of the cut-off request
