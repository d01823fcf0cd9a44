"""Authorization as data: every route declares exactly one role, and each role is enforced (in-process app)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from datamill.serve.access import ROLES, route_roles, routes
from datamill.serve.app import create_app
from datamill.serve.auth import create_key

pytestmark = pytest.mark.server

# the role of every route: a new route must be added here (and to docs/serving.md) to pass
EXPECTED = {
    ("GET", "/api/v1/health"): "public", ("GET", "/api/v1/openapi.json"): "public",
    ("GET", "/api/v1/datasets"): "read", ("POST", "/api/v1/datasets"): "admin",
    ("GET", "/api/v1/datasets/{ref}/describe"): "read", ("GET", "/api/v1/datasets/{ref}/columns/{column}/values"): "read",
    ("GET", "/api/v1/datasets/{ref}/samples"): "read",
    ("GET", "/api/v1/keys"): "admin", ("POST", "/api/v1/keys"): "admin", ("DELETE", "/api/v1/keys/{key_id}"): "admin",
    ("POST", "/api/v1/iterations"): "read", ("GET", "/api/v1/iterations"): "read",
    ("GET", "/api/v1/iterations/{it_id}"): "read", ("GET", "/api/v1/iterations/{it_id}/progress"): "read",
    ("GET", "/api/v1/iterations/{it_id}/done"): "read", ("POST", "/api/v1/iterations/{it_id}/cancel"): "admin",
    ("POST", "/api/v1/iterations/{it_id}/rewind"): "read",
    ("GET", "/api/v1/iterations/{it_id}/next"): "read", ("POST", "/api/v1/iterations/{it_id}/ack"): "read",
    ("POST", "/api/v1/iterations/{it_id}/heartbeat"): "read",
    ("GET", "/"): "public", ("GET", "/ui"): "public", ("GET", "/ui/"): "public",
    ("GET", "/ui/static/{name}"): "public", ("GET", "/ui/login"): "public", ("POST", "/ui/login"): "public",
    ("POST", "/ui/logout"): "read", ("GET", "/ui/datasets"): "read", ("POST", "/ui/datasets"): "admin",
    ("GET", "/ui/datasets/{ref}"): "read", ("GET", "/ui/datasets/{ref}/values/{column}"): "read",
    ("GET", "/ui/datasets/{ref}/samples"): "read", ("GET", "/ui/datasets/{ref}/file"): "read",
    ("GET", "/ui/iterations"): "read", ("POST", "/ui/iterations"): "read",
    ("GET", "/ui/iterations/{it_id}"): "read", ("GET", "/ui/iterations/{it_id}/live"): "read",
    ("POST", "/ui/iterations/{it_id}/rewind"): "admin", ("POST", "/ui/iterations/{it_id}/cancel"): "admin",
    ("GET", "/ui/keys"): "admin", ("POST", "/ui/keys"): "admin", ("POST", "/ui/keys/{key_id}/revoke"): "admin",
}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    app = create_app(tmp_path_factory.mktemp("state"))
    yield app
    app.state.serve.close()


def _routes(app: Any) -> dict[tuple[str, str], list[str]]:
    table: dict[tuple[str, str], list[str]] = {}
    for route in routes(app):
        assert isinstance(route.original_route if hasattr(route, "original_route") else route, APIRoute), \
            f"{route!r} is not an APIRoute: it cannot declare a role"
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
    url = path.replace("{ref}", "nope").replace("{column}", "c").replace("{it_id}", "nope").replace(
        "{key_id}", "nope").replace("{name}", "ui.css")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.request(method, url, headers=headers, follow_redirects=False).status_code


def test_each_role_is_enforced_on_every_route(app: Any) -> None:
    _, read = create_key(app.state.serve.journal, role="read")
    app.state.serve.keys.reload()
    client = TestClient(app)
    for (method, path), role in EXPECTED.items():
        if role == "public":
            if (method, path) != ("POST", "/ui/login"):  # a login without a key is refused by the route itself
                assert _call(client, method, path, None) not in (401, 403), (method, path)
            continue
        assert _call(client, method, path, None) == 401, (method, path)
        assert _call(client, method, path, "dmk_abcdefgh." + "x" * 43) == 401, (method, path)
        got = _call(client, method, path, read)
        assert (got == 403) == (role == "admin"), (method, path, got)
