"""Every request is bounded before work: each absurd request is a 4xx JSON with one line, while
/health answers."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest

from datamill.client import Client, Leases

pytestmark = pytest.mark.server

HUGE = "9" * 5000  # a 5,000-digit number


def _raw(
    url: str, method: str, path: str, *, body: bytes | None = None, key: str | None = None
) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {key}"} if key else {}),
    }
    try:
        conn.request(method, path, body=body, headers=headers)
        res = conn.getresponse()
        data = res.read()
    finally:
        conn.close()
    return res.status, json.loads(data) if data else None


def _absurd(it: str) -> list[tuple[str, str, str, bytes | None]]:
    """(key role, method, path, body) of requests that would tie up or crash an unbounded server."""
    create = "/api/v1/iterations"
    return [
        (
            "read",
            "POST",
            create,
            b'{"dataset": "ds", "batch_size": 1, "world_size": 60000}',
        ),  # > 6,000 samples
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 1048576, "lease_size": 4096}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 1048576, "lease_bytes": 1024}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "lease_bytes": 1e18}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "lease_bytes": 0}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "lease_timeout": NaN}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "lease_timeout": Infinity}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "lease_timeout": 0.001}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "lease_timeout": 1e12}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "window": 1000000000}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": ' + HUGE.encode() + b"}"),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "columns": ["x\\u0000"]}'),
        ("read", "POST", create, b'{"dataset": "ds", "batch_size": 4, "name": "a\\u0000b"}'),
        ("admin", "POST", "/api/v1/datasets", b'{"path": "ds\\u0000/../x", "name": "nul"}'),
        ("admin", "POST", f"{create}/{it}/rewind", b'{"done": [[0, 1000000000000]]}'),
        ("admin", "POST", f"{create}/{it}/rewind", b'{"done": [[5, 2]]}'),
        ("admin", "POST", f"{create}/{it}/rewind", b'{"rank": 99999, "consumed": 1}'),
        (
            "admin",
            "POST",
            f"{create}/{it}/rewind",
            b'{"rank": 0, "consumed": ' + HUGE.encode() + b"}",
        ),
        (
            "read",
            "POST",
            f"{create}/{it}/ack",
            b'{"client": "c", "leases": [["x.1", ' + HUGE.encode() + b"]]}",
        ),
        ("read", "POST", f"{create}/{it}/ack", b'{"client": "c", "leases": [["x.1", 1e400]]}'),
        ("read", "GET", f"{create}/{it}/next?client=c&ack=x.1:{HUGE}", None),
        ("read", "GET", f"{create}/{it}/next?client=c&rank={HUGE}", None),
        ("read", "GET", f"{create}/{it}/next?client=c%00", None),
        ("read", "POST", f"{create}/{it}/heartbeat", b'{"client": "c", "stall_s": NaN}'),
        ("read", "POST", f"{create}/{it}/heartbeat", b'{"client": "c", "batches": -1}'),
        ("read", "POST", f"{create}/{it}/resume", b'{"rank": 0, "consumed": 1000000000}'),
        ("read", "GET", f"/api/v1/datasets/ds/samples?offset={HUGE}", None),
        ("admin", "POST", "/api/v1/keys", b'{"role": "read", "expires": "99999999d"}'),
        ("admin", "POST", "/api/v1/keys", b'{"role": "read", "note": "\\u0000"}'),
        (
            "read",
            "POST",
            create,
            b'{"dataset": "ds", "batch_size": 4, "loader_states": '
            + b"[" * 5000
            + b"]" * 5000
            + b"}",
        ),
    ]


def test_each_absurd_request_is_a_one_line_4xx_while_health_answers(server: dict[str, Any]) -> None:
    url = server["url"]
    with Client(url, server["read"]) as c:
        it = c.iteration("ds", batch_size=100, leases=Leases(name="bounded"))["id"]
    latencies: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        host, port = url.removeprefix("http://").split(":")
        while not stop.is_set():
            t0 = time.perf_counter()
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", "/api/v1/health")
            assert conn.getresponse().status == 200
            conn.close()
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        for role, method, path, body in _absurd(it):
            t0 = time.perf_counter()
            status, out = _raw(url, method, path, body=body, key=server[role])
            took = time.perf_counter() - t0
            assert 400 <= status < 500, (path, body and body[:80], status, out)
            assert (
                isinstance(out, dict) and isinstance(out["error"], str) and "\n" not in out["error"]
            ), out
            assert out["error"] != "There was an error parsing the body", (
                out
            )  # fastapi's words say nothing expected
            assert took < 5, (path, took)
    finally:
        stop.set()
        poller.join(timeout=10)
    assert latencies and max(latencies) < 1.0, max(latencies)
    assert _raw(url, "GET", "/api/v1/health")[0] == 200
    with Client(url, server["read"]) as c:  # the iteration was not changed by the refused rewinds
        assert c.progress(it)["done"] == 0
