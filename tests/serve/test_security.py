"""Browser security: session cookies, CSRF on login and forms, Host and Origin checks, headers on
every response."""

from __future__ import annotations

import hashlib
import http.client
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from datamill.serve.http.app import create_app
from datamill.serve.http.auth import create_key
from datamill.serve.http.guard import SECURITY_HEADERS
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import free_port, start_server, stop

pytestmark = pytest.mark.server
LOCAL = "http://127.0.0.1:8470"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("sec")
    ShardsetDataset.create(
        base / "root" / "ds",
        pa.table({"uid": np.arange(20), "x": np.arange(20.0)}),
        uid="uid",
        shardset="main",
        shard_size=10,
    )
    app = create_app(
        base / "state", roots=[base / "root"], allowed_hosts=["127.0.0.1:8470", "localhost:8470"]
    )
    app.state.serve.register("ds", name="ds")
    yield app
    app.state.serve.close()


def _client(app: Any) -> TestClient:
    return TestClient(app, base_url=LOCAL)


def _token(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)  # type: ignore[union-attr]


def _login(c: TestClient, key: str) -> Any:
    token = _token(c.get("/ui/login").text)
    return c.post(
        "/ui/login",
        data={"key": key, "csrf": token, "next": "/ui/datasets"},
        follow_redirects=False,
    )


def _key(app: Any, role: str = "admin", **kw: Any) -> tuple[str, str]:
    key_id, key = create_key(app.state.serve.journal, role=role, **kw)
    app.state.serve.keys.reload()
    return key_id, key


def test_the_cookie_holds_a_random_session_id_stored_only_as_a_hash(app: Any) -> None:
    _, key = _key(app)
    c = _client(app)
    res = _login(c, key)
    assert res.status_code == 303
    sid = c.cookies["datamill_session"]
    assert key not in sid and key.split(".")[1] not in sid and len(sid) >= 40
    header = res.headers["set-cookie"].lower()
    assert "httponly" in header and "samesite=strict" in header and "max-age=43200" in header
    db = app.state.serve.journal.path
    raw = b"".join(p.read_bytes() for p in db.parent.iterdir())
    assert sid.encode() not in raw and hashlib.sha256(sid.encode()).hexdigest().encode() in raw
    assert c.get("/ui/datasets").status_code == 200
    assert (
        c.get("/api/v1/datasets").status_code == 200
    )  # the UI's script reads the JSON views with the session
    assert (
        c.post("/api/v1/iterations", json={"dataset": "ds", "batch_size": 2}).status_code == 401
    )  # no CSRF here
    # a session of a key that expires sooner expires with it
    _, short = _key(app, expires_in=600)
    short_res = _login(_client(app), short)
    age = int(re.search(r"max-age=(\d+)", short_res.headers["set-cookie"].lower()).group(1))  # type: ignore[union-attr]
    assert 590 <= age <= 600


def test_logout_and_key_revocation_end_sessions(app: Any) -> None:
    key_id, key = _key(app)
    c = _client(app)
    _login(c, key)
    sid = c.cookies["datamill_session"]
    page = c.get("/ui/datasets")
    assert (
        c.post("/ui/logout", data={"csrf": _token(page.text)}, follow_redirects=False).status_code
        == 303
    )
    replay = _client(app)
    replay.cookies.set("datamill_session", sid)
    assert (
        replay.get("/ui/datasets").status_code == 401
    )  # the old cookie is dead on the server side
    other = _client(app)
    _login(other, key)
    assert other.get("/ui/datasets").status_code == 200
    app.state.serve.journal.revoke_key(key_id)
    app.state.serve.keys.reload()
    assert other.get("/ui/datasets").status_code == 401
    assert other.get("/api/v1/datasets").status_code == 401  # the API sees the same session


def test_csrf_on_the_login_form(app: Any) -> None:
    _, key = _key(app)
    c = _client(app)
    assert (
        c.post("/ui/login", data={"key": key}, follow_redirects=False).status_code == 403
    )  # no token
    token = _token(c.get("/ui/login").text)
    stranger = _client(app)  # a forged form: a token from another browser's login page
    assert (
        stranger.post(
            "/ui/login", data={"key": key, "csrf": token}, follow_redirects=False
        ).status_code
        == 403
    )
    assert "datamill_session" not in stranger.cookies
    assert (
        c.post("/ui/login", data={"key": key, "csrf": token}, follow_redirects=False).status_code
        == 303
    )


def test_every_ui_form_carries_a_csrf_token(app: Any) -> None:
    _, key = _key(app)
    c = _client(app)
    _login(c, key)
    it = c.post(
        "/api/v1/iterations",
        json={"dataset": "ds", "batch_size": 2, "name": "forms"},
        headers={"Authorization": f"Bearer {key}"},
    ).json()["id"]
    for page in ("/ui/datasets", "/ui/iterations", f"/ui/iterations/{it}", "/ui/keys"):
        html = c.get(page).text
        forms = re.findall(r"<form[^>]*method=\"post\"[^>]*>.*?</form>", html, flags=re.DOTALL)
        assert forms, page
        for form in forms:
            assert 'name="csrf"' in form, (page, form[:120])


def test_host_header_must_be_one_of_the_server_names(app: Any) -> None:
    c = _client(app)
    assert c.get("/api/v1/health").status_code == 200
    assert (
        c.get("/api/v1/health", headers={"Host": "localhost:8470"}).status_code == 200
    )  # --allowed-hosts names
    for host in (
        "evil.example",
        "evil.example:8470",
        "127.0.0.1.evil.example:8470",
        "127.0.0.1:9999",
        "",
    ):
        res = c.get("/api/v1/health", headers={"Host": host})
        assert res.status_code == 400 and "--allowed-hosts" in res.json()["error"], host


def test_origin_is_checked_on_state_changing_requests(app: Any) -> None:
    _, key = _key(app)
    c = _client(app)
    auth = {"Authorization": f"Bearer {key}"}
    body = {"dataset": "ds", "batch_size": 2}
    for origin in ("http://evil.example", "null", "http://127.0.0.1:9999", "file://"):
        res = c.post("/api/v1/iterations", json=body, headers={**auth, "Origin": origin})
        assert res.status_code == 403 and "cross-origin" in res.json()["error"], origin
    assert (
        c.post("/api/v1/iterations", json=body, headers={**auth, "Origin": LOCAL}).status_code
        == 200
    )
    assert (
        c.post("/api/v1/iterations", json=body, headers=auth).status_code == 200
    )  # no Origin: not a browser
    assert (
        c.get("/api/v1/datasets", headers={**auth, "Origin": "http://evil.example"}).status_code
        == 200
    )


def test_security_headers_on_every_response(app: Any) -> None:
    _, key = _key(app)
    c = _client(app)
    for method, path, headers in (
        ("GET", "/api/v1/health", {}),
        ("GET", "/api/v1/datasets", {}),
        ("GET", "/ui/login", {}),
        ("GET", "/ui/datasets", {}),
        ("GET", "/ui/static/ui.css", {}),
        ("GET", "/nope", {}),
        ("GET", "/api/v1/datasets", {"Authorization": f"Bearer {key}"}),
        ("GET", "/api/v1/health", {"Host": "evil.example"}),
    ):
        res = c.request(method, path, headers=headers)
        for name, value in SECURITY_HEADERS.items():
            assert res.headers.get(name) == value, (path, name, res.status_code)
    assert "default-src 'self'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert SECURITY_HEADERS["X-Frame-Options"] == "DENY"


def test_a_no_auth_server_refuses_a_rebound_host(tmp_path: Path, server: dict[str, Any]) -> None:
    port = free_port()
    proc = start_server(
        server["root"],
        tmp_path / "state",
        port,
        "--no-auth",
        "--allowed-hosts",
        f"127.0.0.1,datamill.internal:{port}",
    )
    try:

        def get(host: str, method: str = "GET", path: str = "/api/v1/keys") -> int:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request(
                method,
                path,
                body=b'{"role": "admin"}' if method == "POST" else None,
                headers={"Host": host, "Content-Type": "application/json"},
            )
            status = conn.getresponse().status
            conn.close()
            return status

        assert get(f"127.0.0.1:{port}") == 200 and get(f"datamill.internal:{port}") == 200
        assert get(f"localhost:{port}") == 400  # --allowed-hosts replaces the default names
        assert (
            get(f"attacker.example:{port}") == 400
        )  # DNS rebinding: the page's own name, resolved to 127.0.0.1
        assert get(f"attacker.example:{port}", "POST") == 400
    finally:
        stop(proc)


def test_the_keys_page_creates_a_limited_expiring_key(app: Any) -> None:
    _, key = _key(app)
    c = _client(app)
    _login(c, key)
    token = _token(c.get("/ui/keys").text)
    made = c.post(
        "/ui/keys", data={"csrf": token, "role": "read", "datasets": "ds", "expires": "2h"}
    )
    new = re.search(r'value="(dmk_[^"]+)"', made.text).group(1)  # type: ignore[union-attr]
    row = next(k for k in app.state.serve.journal.list_keys() if new.startswith(f"dmk_{k['id']}."))
    assert row["datasets"] == ["ds"] and 7190 < row["expires"] - row["created"] <= 7201
    assert c.post("/ui/keys", data={"csrf": token, "expires": "forever"}).status_code == 400


def test_an_expired_session_is_refused(app: Any) -> None:
    import time

    key_id, _ = _key(app)
    for sid, expires in (
        ("expired-session-id-" + "x" * 30, time.time() - 1),
        ("live-session-id-" + "y" * 30, time.time() + 60),
    ):
        app.state.serve.journal.add_session(
            hashlib.sha256(sid.encode()).hexdigest(), key_id, expires=expires
        )
        c = _client(app)
        c.cookies.set("datamill_session", sid)
        assert c.get("/ui/datasets").status_code == (401 if "expired" in sid else 200)
