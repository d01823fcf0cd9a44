"""Iteration lifecycle: status (running, finished, cancelled, stale), start/end/duration/clients
seen, paging of GET /api/v1/iterations, ended iterations leaving memory, and `datamill serve gc`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from datamill.serve.http.app import create_app
from datamill.serve.http.auth import create_key
from datamill.serve.journal.store import Journal
from datamill.serve.observe import lifecycle
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import env

pytestmark = pytest.mark.server


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Any]:
    for name in ("a", "b"):
        ShardsetDataset.create(
            tmp_path / "root" / name,
            pa.table({"uid": np.arange(40), "x": np.arange(40.0)}),
            uid="uid",
            shardset="main",
            shard_size=10,
        )
    app = create_app(tmp_path / "state", roots=[tmp_path / "root"])
    for name in ("a", "b"):
        app.state.serve.register(name, name=name)
    yield app
    app.state.serve.close()


def _client(app: Any, role: str = "admin", **kw: Any) -> TestClient:
    _, key = create_key(app.state.serve.journal, role=role, **kw)
    app.state.serve.keys.reload()
    return TestClient(app, base_url="http://127.0.0.1", headers={"Authorization": f"Bearer {key}"})


def _drain(c: TestClient, it: str, client: str = "w1") -> int:
    """Take and acknowledge every lease of a 1-rank iteration; the number of leases."""
    for n in range(100):
        res = c.get(f"/api/v1/iterations/{it}/next", params={"client": client})
        if res.status_code == 204:
            return n
        assert res.status_code == 200, res.text
        ack = c.post(
            f"/api/v1/iterations/{it}/ack",
            json={
                "client": client,
                "leases": [[res.headers["x-datamill-lease"], res.headers["x-datamill-fence"]]],
            },
        )
        assert ack.status_code == 200, ack.text
    raise AssertionError("the iteration did not finish within 100 leases")


def test_status_start_end_clients_and_memory(app: Any) -> None:
    c = _client(app)
    state = app.state.serve
    ids = {}
    for name, ds in (("done", "a"), ("gone", "a"), ("live", "b"), ("idle", "b")):
        ids[name] = c.post(
            "/api/v1/iterations",
            json={"dataset": ds, "batch_size": 8, "name": name, "lease_size": 2},
        ).json()["id"]
    assert _drain(c, ids["done"]) == 3  # 5 batches, 2 per lease
    state.telemetry.tick(
        state
    )  # (the 204 that told the client it is over brought it back for a moment)
    assert ids["done"] not in state._iterations  # a finished iteration leaves memory
    assert c.post(f"/api/v1/iterations/{ids['gone']}/cancel").status_code == 200
    assert (
        c.get(f"/api/v1/iterations/{ids['live']}/next", params={"client": "w2"}).status_code == 200
    )
    with (
        state.journal._lock
    ):  # nobody has been seen on "idle" for far more than 3 lease timeouts (60 s)
        state.journal._db.execute(
            "UPDATE lifecycle SET last_seen = last_seen - 1000, started = started - 1000 "
            "WHERE iteration = ?",
            (ids["idle"],),
        )
    state.telemetry.tick(state)
    assert ids["gone"] not in state._iterations  # cancelled, no lease left: out of memory too
    rows = {r["key"]: r for r in c.get("/api/v1/iterations").json()["iterations"]}
    assert {k: r["status"] for k, r in rows.items()} == {
        "done": "finished",
        "gone": "cancelled",
        "live": "running",
        "idle": "stale",
    }
    done = rows["done"]
    assert done["ended"] >= done["started"] and done["duration_s"] == pytest.approx(
        done["ended"] - done["started"], abs=1e-3
    )
    assert done["clients_seen"] == 1 and done["done"] == done["total"] == 5
    assert (
        rows["live"]["ended"] is None
        and rows["live"]["duration_s"] is None
        and rows["live"]["clients_seen"] == 1
    )
    assert rows["gone"]["ended"] is not None
    # the status survives a rebuild from the journal (a new state on the same folder)
    assert lifecycle.one(state.journal, ids["done"])["status"] == "finished"  # type: ignore[index]
    # the UI shows the badges
    page = c.get("/ui/iterations").text
    for status in ("finished", "cancelled", "running", "stale"):
        assert f'class="badge status-{status}"' in page
    assert 'id="status">finished<' in c.get(f"/ui/iterations/{ids['done']}").text


def test_paging_filters_and_bounds(app: Any) -> None:
    c = _client(app)
    made = [
        c.post(
            "/api/v1/iterations",
            json={"dataset": "a" if k % 2 else "b", "batch_size": 8, "name": f"p{k}"},
        ).json()["id"]
        for k in range(7)
    ]
    seen: list[str] = []
    after = None
    for _ in range(10):
        page = c.get(
            "/api/v1/iterations", params={"limit": 3, **({"after": after} if after else {})}
        ).json()
        assert len(page["iterations"]) <= 3
        seen += [r["id"] for r in page["iterations"]]
        after = page["next"]
        if after is None:
            break
    assert seen == made  # oldest first, every one once
    only_a = c.get("/api/v1/iterations", params={"dataset": "a"}).json()["iterations"]
    assert [r["id"] for r in only_a] == made[1::2]
    c.post(f"/api/v1/iterations/{made[0]}/cancel")
    assert [
        r["id"]
        for r in c.get("/api/v1/iterations", params={"status": "cancelled"}).json()["iterations"]
    ] == [made[0]]
    assert len(c.get("/api/v1/iterations", params={"status": "running"}).json()["iterations"]) == 6
    for bad in (
        {"limit": 0},
        {"limit": lifecycle.MAX_PAGE + 1},
        {"status": "paused"},
        {"after": "../x"},
    ):
        assert c.get("/api/v1/iterations", params=bad).status_code == 422, bad
    res = c.get("/api/v1/iterations", params={"after": "it-nope"})
    assert res.status_code == 400 and "after=" in res.json()["error"]
    # a key limited to dataset a pages only its iterations, and may not ask for b's
    limited = _client(app, role="read", datasets=["a"])
    assert {r["dataset"] for r in limited.get("/api/v1/iterations").json()["iterations"]} == {
        app.state.serve.dataset("a")["id"]
    }
    assert limited.get("/api/v1/iterations", params={"dataset": "b"}).status_code == 403


def test_gc_removes_only_iterations_that_ended_long_ago(tmp_path: Path) -> None:
    j = Journal(tmp_path / "state")
    now = time.time()
    for it, status, ended in (
        ("old", "finished", now - 40 * 86400),
        ("oldc", "cancelled", now - 31 * 86400),
        ("new", "finished", now - 86400),
        ("run", None, None),
    ):
        j.add_iteration(it, it, 0, {"dataset": "ds", "lease_timeout": 60.0})
        lifecycle.started(j, it, total=4, base_done=0)
        j.add_done(it, [(0, 2)], lease="l1")
        if status:
            lifecycle.ended(j, it, status)
            j._exec(
                "UPDATE lifecycle SET ended = ?, started = ? WHERE iteration = ?",
                (ended, ended - 10, it),
            )
    j._exec(
        "UPDATE lifecycle SET last_seen = ? WHERE iteration = 'run'", (now - 90 * 86400,)
    )  # stale: kept
    j.close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            "gc",
            "--state",
            str(tmp_path / "state"),
            "--older-than",
            "30d",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "removed 2 iteration(s)" in out.stdout
    j = Journal(tmp_path / "state")
    try:
        assert sorted(r["id"] for r in j.iterations()) == ["new", "run"]
        assert j.done("old") == [] and j.done("new") == [(0, 2, "l1")]
        assert lifecycle.one(j, "old") is None
        assert "gc" in [a["action"] for a in j.audit()]
    finally:
        j.close()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            "gc",
            "--state",
            str(tmp_path / "state"),
            "--older-than",
            "soon",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
