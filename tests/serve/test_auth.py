"""Auth and hostile input against a running server: every case a 4xx JSON error, the server stays
up."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest

from datamill.client import Client, RemoteError, RemoteLoader
from tests.serve._opts import grouped
from tests.serve._proc import env, make_key

pytestmark = pytest.mark.server

EPOCHS = 6  # the client run the 200 bad requests overlap (about 0.5 s alone here)


def _raw(
    url: str,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    h = dict(headers or {})
    if key:
        h["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body=body, headers=h)
        res = conn.getresponse()
        data = res.read()
    finally:
        conn.close()
    return res.status, json.loads(data) if data else None


def _send_big(url: str, path: str, key: str, size: int) -> tuple[int, Any]:
    """POST ``size`` bytes; the server may answer 413 and close before the body is sent (as it
    should)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path)
        for k, v in (
            ("Authorization", f"Bearer {key}"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(size)),
        ):
            conn.putheader(k, v)
        conn.endheaders()
        try:
            for _ in range(size // 65536):
                conn.send(b"x" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


ATTACK = """
import http.client, json, sys, threading
url, read, admin = sys.argv[1:4]
host, port = url.removeprefix("http://").split(":")
bad = [("GET", "/api/v1/datasets", None, None), ("GET", "/api/v1/keys", None, read),
       ("POST", "/api/v1/iterations", b"{bad", read),
       ("GET", "/api/v1/iterations/..%2Fetc/next?client=c", None, read),
       ("POST", "/api/v1/datasets", b'{"path": "../outside/secret", "name": "e"}', admin)]
statuses, lock = [], threading.Lock()
def attack(i):
    for j in range(10):
        method, path, body, key = bad[(i + j) % len(bad)]
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        h = {"Content-Type": "application/json",
             **({"Authorization": "Bearer " + key} if key else {})}
        conn.request(method, path, body=body, headers=h)
        res = conn.getresponse(); res.read(); conn.close()
        with lock:
            statuses.append(res.status)
threads = [threading.Thread(target=attack, args=(i,)) for i in range(20)]
print("ready", flush=True)
sys.stdin.readline()
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps(statuses))
"""


def _alive(server: dict[str, Any]) -> None:
    assert _raw(server["url"], "GET", "/api/v1/health")[0] == 200


def test_missing_wrong_and_malformed_keys_get_401(server: dict[str, Any]) -> None:
    url, read = server["url"], server["read"]
    assert _raw(url, "GET", "/api/v1/datasets", key=read)[0] == 200
    for key in (
        None,
        read[:-2] + ("AA" if not read.endswith("AA") else "BB"),
        "dmk_nothere.xxxxxxxxxxxxxxxxxxxxxx",
        "not-a-key",
        "dmk_" + "a" * 5000,
    ):
        status, body = _raw(url, "GET", "/api/v1/datasets", key=key)
        assert status == 401 and "error" in body
    _alive(server)


def test_a_key_revoked_from_the_cli_is_refused_by_the_running_server(
    server: dict[str, Any],
) -> None:
    key = make_key(server["state"], "read")
    assert _raw(server["url"], "GET", "/api/v1/datasets", key=key)[0] == 200
    key_id = key.removeprefix("dmk_").split(".")[0]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            "keys",
            "revoke",
            key_id,
            "--state",
            str(server["state"]),
        ],
        env=env(),
        check=True,
        capture_output=True,
        timeout=60,
    )
    status, body = _raw(server["url"], "GET", "/api/v1/datasets", key=key)
    assert status == 401 and "revoked" in body["error"]
    listing = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            "keys",
            "list",
            "--state",
            str(server["state"]),
        ],
        env=env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert (
        f"{key_id}\tread\trevoked" in listing and key.split(".")[1] not in listing
    )  # never the secret


def test_read_key_on_admin_routes_gets_403(server: dict[str, Any]) -> None:
    url, read = server["url"], server["read"]
    for method, path, body in (
        ("POST", "/api/v1/datasets", {"path": "ds", "name": "x"}),
        ("GET", "/api/v1/keys", None),
        ("POST", "/api/v1/keys", {"role": "admin"}),
        ("DELETE", "/api/v1/keys/abc", None),
    ):
        status, out = _raw(
            url,
            method,
            path,
            key=read,
            body=json.dumps(body).encode() if body else None,
            headers={"Content-Type": "application/json"},
        )
        assert status == 403 and "admin" in out["error"]


def test_paths_outside_the_roots_and_symlinks_out_are_refused(server: dict[str, Any]) -> None:
    with Client(server["url"], server["admin"]) as admin:
        # the server is the package's: other tests may have registered datasets of their own
        before = [d["name"] for d in admin.datasets()]
        for path in (
            "../outside/secret",
            str(server["base"] / "outside" / "secret"),
            "escape",
            "/etc",
            "ds/../../outside/secret",
        ):
            with pytest.raises(RemoteError) as err:
                admin.register(path, name="evil")
            assert err.value.status == 400 and "outside" in str(err.value)
        assert [d["name"] for d in admin.datasets()] == before
        assert "evil" not in before
    url, read = server["url"], server["read"]
    for path in (
        "/api/v1/iterations/..%2F..%2Fetc%2Fpasswd/progress",
        "/api/v1/iterations/%2Fetc/next?client=c",
        "/api/v1/iterations/nope/progress",
    ):
        status, body = _raw(url, "GET", path, key=read)
        assert status in (404, 422) and body is not None
    body = json.dumps({"dataset": "../ds", "batch_size": 4}).encode()
    assert (
        _raw(
            url,
            "POST",
            "/api/v1/iterations",
            key=read,
            body=body,
            headers={"Content-Type": "application/json"},
        )[0]
        == 422
    )
    _alive(server)


def test_malformed_and_oversized_bodies_get_4xx_json(server: dict[str, Any]) -> None:
    url, read = server["url"], server["read"]
    ctype = {"Content-Type": "application/json"}
    for body in (
        b"{not json",
        b"[]",
        b'{"dataset": "ds"}',
        b'{"dataset": "ds", "batch_size": -1}',
        b'{"dataset": "ds", "batch_size": 4, "typo": 1}',
        b'{"dataset": "ds", "batch_size": "x"}',
        b'{"dataset": "ds", "batch_size": 4, "mode": "chaos"}',
        b"\xff\xfe",
    ):
        status, out = _raw(url, "POST", "/api/v1/iterations", key=read, body=body, headers=ctype)
        assert status == 422 and out is not None, body
    status, out = _send_big(url, "/api/v1/iterations", read, 2 << 20)
    assert status == 413 and "larger" in out["error"]
    status, out = _raw(
        url,
        "POST",
        "/api/v1/iterations",
        key=read,
        body=b"{}",
        headers={**ctype, "Content-Length": "99999999999"},
    )
    assert status == 413
    status, out = _raw(url, "GET", "/api/v1/iterations/x/next?client=c&ack=bad", key=read)
    assert status in (404, 422)
    _alive(server)


def test_200_concurrent_bad_requests_keep_a_client_within_2x(server: dict[str, Any]) -> None:
    kw = {"batch_size": 32, "seed": 1, "collate": "arrow", "lease_size": 8}

    def run(name: str) -> float:
        t0 = time.perf_counter()
        loader = RemoteLoader(server["url"], server["read"], "ds", **grouped(name=name, **kw))
        n = sum(b.num_rows for epoch in range(EPOCHS) for b in loader)  # 188 batches per epoch
        assert n == EPOCHS * 6000
        return time.perf_counter() - t0

    run("warm")
    before = run("base1")
    # the attack runs in its own process (threads in this one would compete with the client for the
    # GIL)
    attack = subprocess.Popen(
        [sys.executable, "-c", ATTACK, server["url"], server["read"], server["admin"]],
        env=env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert attack.stdout is not None and attack.stdin is not None
        assert attack.stdout.readline().strip() == "ready"
        attack.stdin.write("go\n")
        attack.stdin.flush()
        loaded = run("loaded")
        out, _ = attack.communicate(timeout=60)
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
    base = (
        before + run("base2")
    ) / 2  # alone, before and after: the machine is shared, its load drifts
    statuses = Counter(json.loads(out.strip().splitlines()[-1]))
    assert sum(statuses.values()) == 200 and all(400 <= int(s) < 500 for s in statuses), statuses
    print(f"alone {base:.3f} s, under attack {loaded:.3f} s")
    assert loaded <= 2 * base, (loaded, base)
    _alive(server)
