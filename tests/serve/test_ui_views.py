"""The web UI's pages and JSON views in process (FastAPI TestClient): kinds, metadata, errors, auth,
CSRF."""

from __future__ import annotations

import re
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from datamill.preprocessing.api import preprocess
from datamill.serve.http.app import create_app
from datamill.shards.dataset import ShardsetDataset

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f80f0000010100005d0b8a1d0000000049454e44ae426082"
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("uiviews")
    root = base / "root"
    root.mkdir()
    (base / "outside.png").write_bytes(PNG)
    (root / "in.png").write_bytes(PNG)
    t = pa.table(
        {
            "review": ["good movie", "bad plot twist", "good good fun", None],
            "color": ["red", "blue", "red", "green"],
            "x": [1.0, 2.0, 3.0, 4.0],
        }
    )
    pq.write_table(t, root / "reviews.parquet", row_group_size=2)
    preprocess(
        root / "reviews.parquet",
        {
            "input_features": [
                {"name": "review", "type": "text"},
                {"name": "color", "type": "category"},
                {"name": "x", "type": "number", "preprocessing": {"normalization": "zscore"}},
            ],
            "output_features": [],
            "preprocessing": {"split": {"type": "none"}},
        },  # every row fits the vocabulary (no default split)
        output_dir=root / "pre",
    )
    ds = ShardsetDataset.create(
        root / "pics",
        pa.table({"uid": [1, 2, 3], "img": ["../in.png", "../../outside.png", "../nothing.png"]}),
        uid="uid",
        shardset="a",
        shard_size=2,
    )
    ds.add("b", pa.table({"uid": [2], "score": [0.5]}), route=True)
    ShardsetDataset.create(
        root / "broken",
        pa.table({"uid": [1, 2, 3, 4], "v": [1, 2, 3, 4]}),
        uid="uid",
        shardset="a",
        shard_size=2,
    )
    app = create_app(base / "state", roots=[root])
    state = app.state.serve
    ids = {
        name: state.register(path, name=name)["id"]
        for name, path in (
            ("pre", "pre/reviews.hdf5"),
            ("pics", "pics"),
            ("broken", "broken"),
            ("parquet", "reviews.parquet"),
        )
    }
    (root / "broken" / "a" / "shard.00001.parquet").unlink()
    client = TestClient(app, base_url="http://127.0.0.1")
    key = app.state.initial_admin_key
    return {
        "app": app,
        "client": client,
        "key": key,
        "ids": ids,
        "root": root,
        "auth": {"Authorization": f"Bearer {key}"},
    }


def _get(env: Any, path: str, **kw: Any) -> Any:
    return env["client"].get(path, headers=env["auth"], **kw)


def test_create_app_mounts_the_pages_and_their_static_files(tmp_path: Any) -> None:
    """(Was install_ui's doctest: create_app now mounts the UI's routers itself.)"""
    client = TestClient(create_app(tmp_path, auth=False), base_url="http://localhost")
    css = client.get("/ui/static/ui.css")
    assert client.get("/ui/datasets").status_code == 200
    assert css.headers["content-type"] == "text/css; charset=utf-8"


def test_preprocessed_hdf5_metadata_and_decoded_tokens(env: Any) -> None:
    page = _get(env, f"/ui/datasets/{env['ids']['pre']}")
    assert page.status_code == 200 and "preprocessed HDF5" in page.text
    meta = page.text[page.text.index('id="meta"') :]
    assert "zscore" in meta and "category" in meta
    samples = _get(env, f"/ui/datasets/{env['ids']['pre']}/samples?col=review_word&col=color")
    cells = re.findall(r'<span class="tokens">([^<]*)</span>', samples.text)
    assert cells[:4] == ["good movie", "red", "bad plot twist", "blue"]


def test_check_violations_and_unreadable_files_are_located(env: Any) -> None:
    page = _get(env, f"/ui/datasets/{env['ids']['broken']}")
    assert page.status_code == 200
    assert 'id="violations"' in page.text and "shard.00001.parquet" in page.text
    samples = _get(env, f"/ui/datasets/{env['ids']['broken']}/samples?offset=2&limit=2")
    assert samples.status_code in (400, 404) and "shard.00001.parquet" in samples.text
    assert _get(env, "/ui/datasets/nope").status_code == 404


def test_images_only_inside_the_roots_and_missing_is_marked(env: Any) -> None:
    page = _get(env, f"/ui/datasets/{env['ids']['pics']}/samples")
    assert page.text.count("<img ") == 1 and "under the server&#39;s roots" in page.text
    assert page.text.count('class="missing"') == 2  # uids 1 and 3 lack shardset b
    ok = _get(env, f"/ui/datasets/{env['ids']['pics']}/file?row=0&column=img")
    assert ok.status_code == 200 and ok.headers["content-type"] == "image/png" and ok.content == PNG
    outside = _get(env, f"/ui/datasets/{env['ids']['pics']}/file?row=1&column=img")
    assert outside.status_code == 400 and PNG not in outside.content
    assert _get(env, f"/ui/datasets/{env['ids']['pics']}/file?row=2&column=img").status_code == 404


def test_json_views_match_describe_and_compute_values(env: Any) -> None:
    ds_id = env["ids"]["pics"]
    d = _get(env, f"/api/v1/datasets/{ds_id}/describe").json()
    assert d["describe"] == ShardsetDataset(env["root"] / "pics").describe()
    assert d["footer"]["b/score"]["min"] == 0.5 and d["footer"]["a/img"]["nulls"] == 0
    for _ in range(100):
        v = _get(env, f"/api/v1/datasets/{ds_id}/columns/img/values").json()
        if v["status"] != "running":
            break
        time.sleep(0.05)
    assert v["status"] == "done" and v["result"]["count"] == 3
    rows = _get(env, f"/api/v1/datasets/{ds_id}/samples?columns=score").json()["rows"]
    assert [r["cells"][0]["t"] for r in rows] == ["missing", "value", "missing"]
    pq_stats = _get(env, f"/api/v1/datasets/{env['ids']['parquet']}/describe").json()["footer"]
    assert (
        pq_stats["review"]["nulls"] == 1
        and pq_stats["x"]["min"] == 1.0
        and pq_stats["x"]["max"] == 4.0
    )
    assert env["client"].get(f"/api/v1/datasets/{ds_id}/describe").status_code == 401


def _login(c: TestClient, key: str, nxt: str, **kw: Any) -> Any:
    form = c.get("/ui/login")
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text).group(1)  # type: ignore[union-attr]
    return c.post("/ui/login", data={"key": key, "next": nxt, "csrf": token}, **kw)


def test_auth_cookie_csrf_and_redirects(env: Any) -> None:
    c = TestClient(env["app"], base_url="http://127.0.0.1")
    assert c.get("/ui/datasets").status_code == 401
    res = _login(c, env["key"], "//evil.example/x", follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/ui/datasets"
    assert (
        "httponly" in res.headers["set-cookie"].lower()
        and "samesite=strict" in res.headers["set-cookie"].lower()
    )
    page = c.get("/ui/keys")
    assert (
        page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    )
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    assert c.post("/ui/keys", data={"role": "read"}).status_code == 403
    assert c.post("/ui/keys", data={"role": "read", "csrf": token[::-1]}).status_code == 403
    made = c.post("/ui/keys", data={"role": "read", "csrf": token})
    key = re.search(r'value="(dmk_[^"]+)"', made.text).group(1)  # type: ignore[union-attr]
    reader = TestClient(env["app"], base_url="http://127.0.0.1")
    assert reader.get("/ui/datasets", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert reader.get("/ui/keys", headers={"Authorization": f"Bearer {key}"}).status_code == 403
    # a Bearer caller needs no CSRF token (browsers never add that header themselves)
    started = reader.post(
        "/ui/iterations",
        headers={"Authorization": f"Bearer {key}"},
        follow_redirects=False,
        data={"dataset": env["ids"]["pics"], "batch_size": "2", "shuffle": "on"},
    )
    assert started.status_code == 303 and started.headers["location"].startswith(
        "/ui/iterations/it-"
    )
    live = reader.get(
        started.headers["location"] + "/live", headers={"Authorization": f"Bearer {key}"}
    )
    assert '<progress id="progress-all" max="2" value="0">' in live.text
    assert c.get("/", follow_redirects=False).headers["location"] == "/ui/datasets"
    assert c.get("/ui/static/../app.py").status_code == 404


def test_admin_cancels_an_iteration_with_csrf_and_clients_get_410(env: Any) -> None:
    c = TestClient(env["app"], base_url="http://127.0.0.1")
    _login(c, env["key"], "/ui/iterations")
    started = c.post(
        "/ui/iterations",
        follow_redirects=False,
        headers=env["auth"],
        data={"dataset": env["ids"]["pics"], "batch_size": "1", "name": "to-cancel"},
    )
    page = c.get(started.headers["location"])
    assert 'id="cancel-form"' in page.text and 'id="reissued"' in page.text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    assert (
        c.post(started.headers["location"] + "/cancel", data={}).status_code == 403
    )  # no CSRF token
    ask = c.post(
        started.headers["location"] + "/cancel", data={"csrf": token}
    )  # a confirmation first
    assert (
        ask.status_code == 200
        and 'id="confirm-form"' in ask.text
        and "not yet delivered" in ask.text
    )
    assert not env["app"].state.serve.journal.is_cancelled(
        started.headers["location"].rsplit("/", 1)[-1]
    )
    done = c.post(started.headers["location"] + "/cancel", data={"csrf": token, "confirm": "yes"})
    assert (
        done.status_code == 200
        and 'id="cancelled"' in done.text
        and 'id="cancel-form"' not in done.text
    )
    it_id = started.headers["location"].rsplit("/", 1)[-1]
    res = env["client"].get(
        f"/api/v1/iterations/{it_id}/next", params={"client": "c1"}, headers=env["auth"]
    )
    assert res.status_code == 410 and "cancelled" in res.json()["error"]
    assert env["app"].state.serve.journal.is_cancelled(
        it_id
    )  # journaled: a restarted server keeps it
