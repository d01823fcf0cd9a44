"""Scoped keys stay in scope: every key route (API and UI) x every kind of managing key.

A key may create, list and revoke only keys within its own scope (datasets a subset of its own,
role no stronger, expiry no later); only an unscoped admin manages unscoped keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from datamill.serve.http.app import create_app
from datamill.serve.http.auth import create_key
from datamill.shards.dataset import ShardsetDataset

pytestmark = pytest.mark.server

DAY = 86400.0
# managing keys: (datasets, expires_in)
MANAGERS = {
    "unscoped": (None, None),
    "only-a": (["a"], None),
    "only-a-1d": (["a"], DAY),
    "all-1d": (None, DAY),
}
# keys one may try to create: (role, datasets, expires)
WANTED = [
    ("admin", None, None),
    ("admin", ["a"], None),
    ("read", ["a"], "1h"),
    ("read", ["b"], "1h"),
    ("admin", ["a", "b"], "1h"),
    ("metrics", None, "1h"),
    ("read", ["a"], "30d"),
    ("read", ["ID_A"], "2h"),  # dataset a by its id
]
_SECONDS = {"1h": 3600.0, "2h": 7200.0, "30d": 30 * DAY}


def _allowed(manager: str, datasets: list[str] | None, expires: float | None) -> bool:
    """The model: within scope iff datasets are a subset and the expiry no later."""
    m_ds, m_exp = MANAGERS[manager]
    if m_ds is not None and (datasets is None or not set(datasets) <= {"a", "ID_A"}):
        return False
    return m_exp is None or (expires is not None and expires <= m_exp)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("scope")
    for name in ("a", "b"):
        ShardsetDataset.create(
            base / "root" / name,
            pa.table({"uid": np.arange(8), "x": np.arange(8.0)}),
            uid="uid",
            shardset="main",
            shard_size=4,
        )
    app = create_app(base / "state", roots=[base / "root"])
    state = app.state.serve
    for name in ("a", "b"):
        state.register(name, name=name)
    keys = {
        m: create_key(state.journal, role="admin", datasets=ds, expires_in=exp)
        for m, (ds, exp) in MANAGERS.items()
    }
    state.keys.reload()
    yield {"app": app, "state": state, "keys": keys, "id_a": state.dataset("a")["id"]}
    state.close()


def _resolve(env: dict[str, Any], datasets: list[str] | None) -> list[str] | None:
    return None if datasets is None else [env["id_a"] if d == "ID_A" else d for d in datasets]


class _Api:
    def __init__(self, env: dict[str, Any], manager: str) -> None:
        self.c = TestClient(env["app"], base_url="http://127.0.0.1")
        self.h = {"Authorization": f"Bearer {env['keys'][manager][1]}"}

    def create(self, role: str, datasets: list[str] | None, expires: str | None) -> bool:
        body = {"role": role, "datasets": datasets, "expires": expires}
        res = self.c.post("/api/v1/keys", json=body, headers=self.h)
        assert res.status_code in (200, 403), res.text
        if res.status_code == 403:
            assert "scope" in res.json()["error"]
        return res.status_code == 200

    def listing(self) -> set[str]:
        res = self.c.get("/api/v1/keys", headers=self.h)
        assert res.status_code == 200
        return {k["id"] for k in res.json()}

    def revoke(self, key_id: str) -> bool:
        res = self.c.delete(f"/api/v1/keys/{key_id}", headers=self.h)
        assert res.status_code in (200, 404), res.text
        return res.status_code == 200


class _Ui:
    def __init__(self, env: dict[str, Any], manager: str) -> None:
        self.c = TestClient(env["app"], base_url="http://127.0.0.1")
        form = self.c.get("/ui/login")
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text).group(1)  # type: ignore[union-attr]
        key = env["keys"][manager][1]
        res = self.c.post(
            "/ui/login",
            data={"key": key, "next": "/ui/keys", "csrf": token},
            follow_redirects=False,
        )
        assert res.status_code == 303
        page = self.c.get("/ui/keys")
        self.csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]

    def create(self, role: str, datasets: list[str] | None, expires: str | None) -> bool:
        form = {"role": role, "datasets": ",".join(datasets or []), "expires": expires or ""}
        res = self.c.post("/ui/keys", data={**form, "csrf": self.csrf})
        assert res.status_code in (200, 403), res.text
        if res.status_code == 403:
            assert "scope" in res.text and "Traceback" not in res.text
        return res.status_code == 200

    def listing(self) -> set[str]:
        page = self.c.get("/ui/keys")
        assert page.status_code == 200
        return set(re.findall(r'action="/ui/keys/([0-9a-f]+)/revoke"', page.text))

    def revoke(self, key_id: str) -> bool:
        res = self.c.post(
            f"/ui/keys/{key_id}/revoke",
            data={"csrf": self.csrf, "confirm": "yes"},
            follow_redirects=False,
        )
        assert res.status_code in (303, 404), res.text
        return res.status_code == 303


@pytest.mark.parametrize("surface", [_Api, _Ui], ids=["api", "ui"])
@pytest.mark.parametrize("manager", list(MANAGERS))
def test_create_list_and_revoke_stay_in_scope(
    env: dict[str, Any], surface: type[_Api | _Ui], manager: str
) -> None:
    state = env["state"]
    client = surface(env, manager)
    for role, datasets, expires in WANTED:
        secs = None if expires is None else _SECONDS[expires]
        want = _allowed(manager, datasets, secs)
        got = client.create(role, _resolve(env, datasets), expires)
        assert got == want, (manager, role, datasets, expires)
    # every kind of key exists now (the managers', and one of each wanted kind by the unscoped one)
    made = {}
    for role, datasets, expires in WANTED:
        secs = None if expires is None else _SECONDS[expires]
        made[(role, str(datasets), expires)] = create_key(
            state.journal, role=role, datasets=_resolve(env, datasets), expires_in=secs
        )[0]
    state.keys.reload()
    rows = {k["id"]: k for k in state.journal.list_keys()}

    mine = rows[env["keys"][manager][0]]

    def in_scope(key_id: str) -> bool:
        row = rows[key_id]
        ds = row["datasets"]
        if mine["datasets"] is not None and (ds is None or not set(ds) <= {"a", env["id_a"]}):
            return False
        return mine["expires"] is None or (
            row["expires"] is not None and row["expires"] <= mine["expires"]
        )

    seen = client.listing()
    live = {k for k, r in rows.items() if not r["revoked"]}
    assert seen & live == {k for k in live if in_scope(k)}, manager
    # revoke: every wanted kind and a fresh key of every manager's kind (the managers themselves
    # stay: the matrix needs them), then the other managers where out of scope
    for ds, exp in MANAGERS.values():
        made[("copy", str(ds), exp)] = create_key(
            state.journal, role="admin", datasets=ds, expires_in=exp
        )[0]
    state.keys.reload()
    rows = {k["id"]: k for k in state.journal.list_keys()}
    out = [k for k, _ in env["keys"].values() if not in_scope(k)]
    for key_id in [*made.values(), *out]:
        want = in_scope(key_id)
        assert client.revoke(key_id) == want, (manager, rows[key_id])
        state.keys.reload()
        assert (state.keys.by_id(key_id) is None) == want, (manager, key_id)


def test_scoped_key_cannot_mint_a_key_for_another_dataset_that_reads_it(
    env: dict[str, Any],
) -> None:
    c = TestClient(env["app"], base_url="http://127.0.0.1")
    scoped = {"Authorization": f"Bearer {env['keys']['only-a'][1]}"}
    res = c.post("/api/v1/keys", json={"role": "admin"}, headers=scoped)
    assert res.status_code == 403 and "every dataset" in res.json()["error"]
    res = c.post("/api/v1/keys", json={"role": "read", "datasets": ["b"]}, headers=scoped)
    assert res.status_code == 403 and "datasets b" in res.json()["error"]
    unscoped_id = env["keys"]["unscoped"][0]
    assert c.delete(f"/api/v1/keys/{unscoped_id}", headers=scoped).status_code == 404
    assert unscoped_id not in {k["id"] for k in c.get("/api/v1/keys", headers=scoped).json()}
