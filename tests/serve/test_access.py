"""Authorization as data: every route declares exactly one role, and each role is enforced
(in-process app)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from datamill.serve.http.access import ROLES, route_roles, routes
from datamill.serve.http.app import create_app
from datamill.serve.http.auth import create_key
from datamill.shards.dataset import ShardsetDataset

pytestmark = pytest.mark.server

# the role of every route: a new route must be added here (and to docs/serving.md) to pass
EXPECTED = {
    ("GET", "/api/v1/health"): "public",
    ("GET", "/api/v1/openapi.json"): "public",
    ("GET", "/api/v1/datasets"): "read",
    ("POST", "/api/v1/datasets"): "admin",
    ("GET", "/api/v1/datasets/{ref}/describe"): "read",
    ("GET", "/api/v1/datasets/{ref}/columns/{column}/values"): "read",
    ("GET", "/api/v1/datasets/{ref}/samples"): "read",
    ("GET", "/api/v1/datasets/{ref}/location"): "read",
    ("GET", "/api/v1/keys"): "admin",
    ("POST", "/api/v1/keys"): "admin",
    ("DELETE", "/api/v1/keys/{key_id}"): "admin",
    ("POST", "/api/v1/iterations"): "read",
    ("GET", "/api/v1/iterations"): "read",
    ("GET", "/api/v1/iterations/{it_id}"): "read",
    ("GET", "/api/v1/iterations/{it_id}/progress"): "read",
    ("GET", "/api/v1/iterations/{it_id}/done"): "read",
    ("GET", "/api/v1/iterations/{it_id}/trace"): "read",
    ("GET", "/api/v1/runs/{name}/trace"): "read",
    ("POST", "/api/v1/iterations/{it_id}/cancel"): "admin",
    ("POST", "/api/v1/iterations/{it_id}/rewind"): "admin",
    ("POST", "/api/v1/iterations/{it_id}/resume"): "read",
    ("GET", "/api/v1/iterations/{it_id}/next"): "read",
    ("POST", "/api/v1/iterations/{it_id}/ack"): "read",
    ("POST", "/api/v1/iterations/{it_id}/heartbeat"): "read",
    ("GET", "/"): "public",
    ("GET", "/ui"): "public",
    ("GET", "/ui/"): "public",
    ("GET", "/ui/static/{name}"): "public",
    ("GET", "/ui/login"): "public",
    ("POST", "/ui/login"): "public",
    ("POST", "/ui/logout"): "read",
    ("GET", "/ui/datasets"): "read",
    ("POST", "/ui/datasets"): "admin",
    ("GET", "/ui/datasets/{ref}"): "read",
    ("GET", "/ui/datasets/{ref}/values/{column}"): "read",
    ("GET", "/ui/datasets/{ref}/samples"): "read",
    ("GET", "/ui/datasets/{ref}/lineage"): "read",
    ("GET", "/ui/iterations/{it_id}/steps"): "read",
    ("GET", "/ui/datasets/{ref}/file"): "read",
    ("GET", "/ui/iterations"): "read",
    ("POST", "/ui/iterations"): "read",
    ("GET", "/ui/iterations/{it_id}"): "read",
    ("GET", "/ui/iterations/{it_id}/live"): "read",
    ("GET", "/ui/runs/{name}"): "read",
    ("POST", "/ui/iterations/{it_id}/rewind"): "admin",
    ("POST", "/ui/iterations/{it_id}/cancel"): "admin",
    ("GET", "/ui/keys"): "admin",
    ("POST", "/ui/keys"): "admin",
    ("POST", "/ui/keys/{key_id}/revoke"): "admin",
    ("GET", "/metrics"): "metrics",
}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("access")
    for name in ("a", "b"):
        ShardsetDataset.create(
            base / "root" / name,
            pa.table({"uid": np.arange(40), "x": np.arange(40.0)}),
            uid="uid",
            shardset="main",
            shard_size=10,
        )
    app = create_app(base / "state", roots=[base / "root"])
    for name in ("a", "b"):
        app.state.serve.register(name, name=name)
    yield app
    app.state.serve.close()


def _key(app: Any, role: str = "read", **kw: Any) -> dict[str, str]:
    _, key = create_key(app.state.serve.journal, role=role, **kw)
    app.state.serve.keys.reload()
    return {"Authorization": f"Bearer {key}"}


def _routes(app: Any) -> dict[tuple[str, str], list[str]]:
    table: dict[tuple[str, str], list[str]] = {}
    for route in routes(app):
        assert isinstance(
            route.original_route if hasattr(route, "original_route") else route, APIRoute
        ), f"{route!r} is not an APIRoute: it cannot declare a role"
        for method in set(route.methods) - {"HEAD"}:
            table[(method, route.path)] = route_roles(route)
    return table


def test_every_route_declares_exactly_one_role(app: Any) -> None:
    table = _routes(app)
    missing = {r: roles for r, roles in table.items() if len(roles) != 1}
    assert not missing, f"routes without exactly one role: {missing}"
    assert all(roles[0] in ROLES for roles in table.values())
    assert {r: roles[0] for r, roles in table.items()} == EXPECTED


def test_the_walk_fails_on_a_route_without_a_role(app: Any, tmp_path: Path) -> None:
    other = create_app(tmp_path)
    try:

        @other.get("/api/v1/sneaky")
        def sneaky() -> dict[str, Any]:
            return {}

        assert _routes(other)[("GET", "/api/v1/sneaky")] == []
    finally:
        other.state.serve.close()


def _call(client: TestClient, method: str, path: str, key: str | None) -> int:
    url = (
        path.replace("{ref}", "nope")
        .replace("{column}", "c")
        .replace("{it_id}", "nope")
        .replace("{key_id}", "nope")
        .replace("{name}", "ui.css")
    )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.request(method, url, headers=headers, follow_redirects=False).status_code


def test_each_role_is_enforced_on_every_route(app: Any) -> None:
    _, read = create_key(app.state.serve.journal, role="read")
    _, scraper = create_key(app.state.serve.journal, role="metrics")
    app.state.serve.keys.reload()
    client = TestClient(app, base_url="http://127.0.0.1")
    for (method, path), role in EXPECTED.items():
        if role == "public":
            if (method, path) != (
                "POST",
                "/ui/login",
            ):  # a login without a key is refused by the route itself
                assert _call(client, method, path, None) not in (401, 403), (method, path)
            continue
        assert _call(client, method, path, None) == 401, (method, path)
        assert _call(client, method, path, "dmk_abcdefgh." + "x" * 43) == 401, (method, path)
        got = _call(client, method, path, read)
        assert (got == 403) == (role in ("admin", "metrics")), (method, path, got)
        got = _call(
            client, method, path, scraper
        )  # a metrics key scrapes, and may call nothing else
        assert (got == 403) == (role != "metrics"), (method, path, got)


def test_read_key_gets_403_json_on_every_admin_action(app: Any) -> None:
    read, admin = _key(app), _key(app, "admin")
    c = TestClient(app, base_url="http://127.0.0.1")
    it = c.post(
        "/api/v1/iterations", json={"dataset": "a", "batch_size": 4, "name": "adm"}, headers=read
    ).json()["id"]
    for method, path, body in (
        ("POST", f"/api/v1/iterations/{it}/rewind", {"rank": 0, "consumed": 0}),
        ("POST", f"/api/v1/iterations/{it}/cancel", None),
        ("POST", "/api/v1/datasets", {"path": "a", "name": "a2"}),
        ("GET", "/api/v1/keys", None),
        ("POST", "/api/v1/keys", {"role": "admin"}),
        ("DELETE", "/api/v1/keys/abcdef", None),
    ):
        res = c.request(method, path, json=body, headers=read)
        assert (
            res.status_code == 403
            and "admin" in res.json()["error"]
            and "\n" not in res.json()["error"]
        ), path
    assert (
        c.post(
            f"/api/v1/iterations/{it}/rewind", json={"rank": 0, "consumed": 0}, headers=admin
        ).status_code
        == 200
    )


def test_only_the_creating_key_resumes_an_iteration(app: Any) -> None:
    mine, other, admin = _key(app), _key(app), _key(app, "admin")
    c = TestClient(app, base_url="http://127.0.0.1")
    it = c.post(
        "/api/v1/iterations", json={"dataset": "a", "batch_size": 4, "name": "own"}, headers=mine
    ).json()["id"]
    c.post(
        "/api/v1/iterations", json={"dataset": "a", "batch_size": 4, "name": "own"}, headers=other
    )  # joins
    body = {"rank": 0, "consumed": 2}
    assert c.post(f"/api/v1/iterations/{it}/resume", json=body, headers=other).status_code == 403
    assert c.post(f"/api/v1/iterations/{it}/resume", json=body, headers=mine).status_code == 200
    assert c.post(f"/api/v1/iterations/{it}/resume", json=body, headers=admin).status_code == 200
    assert (
        c.post(
            f"/api/v1/iterations/{it}/resume", json={"rank": 0, "consumed": 10**6}, headers=mine
        ).status_code
        == 400
    )


def test_a_key_limited_to_datasets_sees_and_uses_only_those(app: Any) -> None:
    only_a = _key(app, datasets=["a"])
    c = TestClient(app, base_url="http://127.0.0.1")
    assert [d["name"] for d in c.get("/api/v1/datasets", headers=only_a).json()] == ["a"]
    assert c.get("/api/v1/datasets/a/describe", headers=only_a).status_code == 200
    for path in (
        "/api/v1/datasets/b/describe",
        "/api/v1/datasets/b/samples",
        "/api/v1/datasets/b/columns/x/values",
    ):
        res = c.get(path, headers=only_a)
        assert res.status_code == 403 and "a only" in res.json()["error"], path
    res = c.post("/api/v1/iterations", json={"dataset": "b", "batch_size": 4}, headers=only_a)
    assert res.status_code == 403
    it_b = c.post(
        "/api/v1/iterations",
        json={"dataset": "b", "batch_size": 4, "name": "bb"},
        headers=_key(app),
    ).json()
    for method, path in (
        ("GET", ""),
        ("GET", "/progress"),
        ("GET", "/done"),
        ("GET", "/next?client=c1"),
    ):
        assert (
            c.request(method, f"/api/v1/iterations/{it_b['id']}{path}", headers=only_a).status_code
            == 403
        ), path
    assert it_b["id"] not in [
        r["id"] for r in c.get("/api/v1/iterations", headers=only_a).json()["iterations"]
    ]
    assert (
        c.post(
            "/api/v1/iterations", json={"dataset": "a", "batch_size": 4}, headers=only_a
        ).status_code
        == 200
    )


def test_expired_keys_are_refused_and_expiry_is_parsed(app: Any) -> None:
    c = TestClient(app, base_url="http://127.0.0.1")
    assert c.get("/api/v1/datasets", headers=_key(app, expires_in=3600)).status_code == 200
    res = c.get("/api/v1/datasets", headers=_key(app, expires_in=-1))
    assert res.status_code == 401 and "expired" in res.json()["error"]
    admin = _key(app, "admin")
    made = c.post(
        "/api/v1/keys", json={"role": "read", "expires": "30d", "datasets": ["a"]}, headers=admin
    ).json()
    row = next(k for k in c.get("/api/v1/keys", headers=admin).json() if k["id"] == made["id"])
    assert (
        row["datasets"] == ["a"]
        and 29.9 * 86400 < row["expires"] - row["created"] <= 30 * 86400 + 1
    )
    assert c.post("/api/v1/keys", json={"expires": "soon"}, headers=admin).status_code == 422


def test_audit_records_admin_actions_and_first_use_per_day(app: Any) -> None:
    admin, read = _key(app, "admin"), _key(app)
    c = TestClient(app, base_url="http://127.0.0.1")
    for _ in range(3):
        c.get("/api/v1/datasets", headers=read)
    made = c.post("/api/v1/keys", json={"role": "read"}, headers=admin).json()
    c.delete(f"/api/v1/keys/{made['id']}", headers=admin)
    rows = app.state.serve.journal.audit()
    read_id = read["Authorization"].split("_", 1)[1].split(".")[0]
    assert sum(1 for r in rows if r["key"] == read_id and r["action"] == "first use") == 1
    actions = [
        (r["action"], r["detail"].split()[0])
        for r in rows
        if r["action"] in ("create key", "revoke key")
    ]
    assert ("create key", made["id"]) in actions and ("revoke key", made["id"]) in actions


def test_the_route_table_in_the_docs_is_the_apps(app: Any) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^\| (GET|POST|DELETE|PUT|PATCH) \| `([^`]+)` \| (\w+) \|$", doc, flags=re.MULTILINE
    )
    documented = {(method, path): role for method, path, role in rows}
    assert documented == {r: roles[0] for r, roles in _routes(app).items()}
