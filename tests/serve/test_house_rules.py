"""Every case the audit found answered as the house rules say: one line and exit 2 at the command
line, a 4xx JSON for the API, never a traceback or a silent success."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from datamill.serve.http.app import create_app
from datamill.serve.http.auth import create_key
from datamill.serve.journal import DB_NAME
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import env

pytestmark = pytest.mark.server


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datamill.cli", "serve", *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line_exit_2(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "--older-than", "1d"],
        ["backup", "OUT"],
        ["keys", "list"],
        ["keys", "revoke", "abcdef123456"],
        ["audit"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_commands_on_a_folder_without_a_journal_refuse_and_create_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    state = tmp_path / "mistyped-state"
    argv = [str(tmp_path / "copy.sqlite3") if a == "OUT" else a for a in argv]
    out = _cli(*argv, "--state", str(state))
    _one_line_exit_2(out)
    assert "no journal here" in out.stderr
    assert not state.exists() and not (tmp_path / "copy.sqlite3").exists()


def test_keys_create_on_a_new_folder_still_creates_the_journal(tmp_path: Path) -> None:
    out = _cli("keys", "create", "--state", str(tmp_path / "new"), "--role", "admin")
    assert out.returncode == 0 and out.stdout.startswith("dmk_")
    assert (tmp_path / "new" / DB_NAME).is_file()
    assert _cli("gc", "--older-than", "1d", "--state", str(tmp_path / "new")).returncode == 0


def _certs(d: Path) -> dict[str, Path]:
    import trustme

    ca = trustme.CA()
    out: dict[str, Path] = {}
    for name in ("one", "two"):
        cert = ca.issue_cert("127.0.0.1")
        out[f"{name}.cert"], out[f"{name}.key"] = d / f"{name}.crt", d / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(out[f"{name}.cert"]))
        cert.private_key_pem.write_to_path(str(out[f"{name}.key"]))
    (d / "garbage.crt").write_text("-----BEGIN CERTIFICATE-----\nnot base64!\n")
    out["garbage"] = d / "garbage.crt"
    return out


@pytest.mark.parametrize("case", ["garbage", "mismatched", "cert-as-key"])
def test_bad_tls_files_are_one_line_before_anything_is_printed(tmp_path: Path, case: str) -> None:
    (tmp_path / "root").mkdir()
    c = _certs(tmp_path)
    cert, key = {
        "garbage": (c["garbage"], c["one.key"]),
        "mismatched": (c["one.cert"], c["two.key"]),
        "cert-as-key": (c["one.cert"], c["one.cert"]),
    }[case]
    state = tmp_path / "state"
    out = _cli(
        str(tmp_path / "root"),
        "--state",
        str(state),
        "--port",
        "1",  # never bound: the check comes first
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
    )
    _one_line_exit_2(out)
    assert "TLS certificate and key" in out.stderr and str(cert) in out.stderr
    assert out.stdout == "" and "dmk_" not in out.stderr  # no admin key was made or printed
    assert not (state / DB_NAME).exists()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("house")
    ShardsetDataset.create(
        base / "root" / "a",
        pa.table({"uid": np.arange(64), "x": np.arange(64.0)}),
        uid="uid",
        shardset="main",
        shard_size=16,
    )
    app = create_app(base / "state", roots=[base / "root"])
    app.state.serve.register("a", name="a")
    yield app
    app.state.serve.close()


def _bearer(app: Any, role: str = "admin") -> tuple[str, dict[str, str]]:
    _, key = create_key(app.state.serve.journal, role=role)
    app.state.serve.keys.reload()
    return key, {"Authorization": f"Bearer {key}"}


def test_registering_a_registered_path_under_a_second_name_is_409_json(app: Any) -> None:
    _, admin = _bearer(app)
    c = TestClient(app, base_url="http://127.0.0.1")
    res = c.post("/api/v1/datasets", json={"path": "a", "name": "a-again"}, headers=admin)
    assert res.status_code == 409, res.text
    assert "already registered as dataset 'a'" in res.json()["error"]
    assert c.post("/api/v1/datasets", json={"path": "a", "name": "a"}, headers=admin).is_success


def test_non_ascii_csrf_tokens_are_403_not_500(app: Any) -> None:
    key, _ = _bearer(app)
    c = TestClient(app, base_url="http://127.0.0.1")
    c.get("/ui/login")
    res = c.post("/ui/login", data={"key": key, "next": "/ui/keys", "csrf": "é" * 40})
    assert res.status_code == 403 and "CSRF" in res.text
    page = c.get("/ui/login")
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    assert c.post(
        "/ui/login", data={"key": key, "next": "/ui/keys", "csrf": token}, follow_redirects=False
    ).is_redirect
    for path in ("/ui/keys", "/ui/datasets", "/ui/iterations", "/ui/logout"):
        res = c.post(path, data={"csrf": "ü" * 43, "role": "read"})
        assert res.status_code == 403, (path, res.status_code)


def _lease(c: TestClient, headers: dict[str, str], it: str) -> dict[str, str]:
    h = {**headers, "X-Datamill-Session": "s" * 32}
    res = c.get(f"/api/v1/iterations/{it}/next", params={"client": "c0"}, headers=h)
    assert res.status_code == 200, res.text
    return {k: res.headers[f"X-Datamill-{k}"] for k in ("Lease", "Fence", "Positions")}


def test_an_ack_outside_its_lease_is_422_and_records_nothing(app: Any) -> None:
    _, read = _bearer(app, "read")
    c = TestClient(app, base_url="http://127.0.0.1")
    it = c.post(
        "/api/v1/iterations",
        json={"dataset": "a", "batch_size": 4, "lease_size": 2, "name": "outside"},
        headers=read,
    ).json()["id"]
    lease = _lease(c, read, it)
    _, span = lease["Positions"].split(":")
    start, stop = map(int, span.split("-"))
    h = {**read, "X-Datamill-Session": "s" * 32}
    for a, b in ((stop, stop + 1), (start + 100, start + 101), (start, stop + 1)):
        body = {"client": "c0", "acks": [[lease["Lease"], lease["Fence"], a, b]]}
        res = c.post(f"/api/v1/iterations/{it}/ack", json=body, headers=h)
        assert res.status_code == 422, (a, b, res.text)
        assert res.json()["acks"][lease["Lease"]] == "outside" and "outside" in res.json()["error"]
    for a, b in ((start, start), (stop, start)):  # empty or reversed: refused before any work
        body = {"client": "c0", "acks": [[lease["Lease"], lease["Fence"], a, b]]}
        res = c.post(f"/api/v1/iterations/{it}/ack", json=body, headers=h)
        assert res.status_code == 422 and "start < stop" in res.text, res.text
    ack = f"{lease['Lease']}:{lease['Fence']}:{stop}-{start}"
    res = c.get(f"/api/v1/iterations/{it}/next", params={"client": "c0", "ack": ack}, headers=h)
    assert res.status_code == 422 and "start < stop" in res.text, res.text
    assert c.get(f"/api/v1/iterations/{it}/progress", headers=read).json()["done"] == 0
    body = {"client": "c0", "acks": [[lease["Lease"], lease["Fence"], start, stop]]}
    res = c.post(f"/api/v1/iterations/{it}/ack", json=body, headers=h)
    assert res.status_code == 200 and res.json()["acks"][lease["Lease"]] == "ok"


def test_a_session_cookie_reads_but_cannot_take_leases_or_ack(app: Any) -> None:
    key, read = _bearer(app, "read")
    c = TestClient(app, base_url="http://127.0.0.1")
    it = c.post(
        "/api/v1/iterations", json={"dataset": "a", "batch_size": 4, "name": "cookie"}, headers=read
    ).json()["id"]
    page = c.get("/ui/login")
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    c.post("/ui/login", data={"key": key, "next": "/ui/datasets", "csrf": token})
    assert c.get("/api/v1/datasets").status_code == 200  # a read: the cookie is enough
    assert c.get(f"/api/v1/iterations/{it}/progress").status_code == 200
    h = {"X-Datamill-Session": "k" * 32}
    assert (
        c.get(f"/api/v1/iterations/{it}/next", params={"client": "c"}, headers=h).status_code == 401
    )
    res = c.get(f"/api/v1/iterations/{it}/next", params={"client": "c", "ack": "x1:ab"}, headers=h)
    assert res.status_code == 401
    assert (
        c.post(f"/api/v1/iterations/{it}/ack", json={"client": "c", "acks": []}).status_code == 401
    )
    assert c.get(f"/api/v1/iterations/{it}/progress").json()["done"] == 0
