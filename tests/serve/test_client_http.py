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
