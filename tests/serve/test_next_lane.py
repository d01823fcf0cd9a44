"""The lease route's dispatch past FastAPI's router
(:class:`datamill.serve.http.routes.leases.NextLane`)
answers every request as the router would: same status, same JSON, same headers but the random ids
(in-process apps, one with the lane and one without)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from datamill.serve.http.app import create_app
from datamill.serve.http.auth import create_key
from datamill.serve.http.routes.leases import NextLane
from datamill.shards.dataset import ShardsetDataset

pytestmark = pytest.mark.server

_RANDOM = {"x-request-id", "x-datamill-lease", "x-datamill-fence", "x-datamill-acks"}


def _app(base: Path, name: str, *, lane: bool) -> Any:
    app = create_app(base / name, roots=[base / "root"])
    app.state.serve.register("a", name="a")
    if not lane:  # the same app with the lane taken out: the router answers every request
        app.user_middleware = [m for m in app.user_middleware if m.cls is not NextLane]  # type: ignore[comparison-overlap]
        app.middleware_stack = None
    return app


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[Any, dict[str, str]]]]:
    base = tmp_path_factory.mktemp("lane")
    ShardsetDataset.create(
        base / "root" / "a",
        pa.table({"uid": np.arange(40), "x": np.arange(40.0)}),
        uid="uid",
        shardset="main",
        shard_size=10,
    )
    out = []
    for name, lane in (("s1", True), ("s2", False)):
        app = _app(base, name, lane=lane)
        keys = {
            role: create_key(app.state.serve.journal, role=role)[1] for role in ("read", "metrics")
        }
        app.state.serve.keys.reload()
        out.append((app, keys))
    yield out
    for app, _ in out:
        app.state.serve.close()


def _answer(res: Any) -> tuple[int, Any, dict[str, str]]:
    try:
        body = res.json()
    except ValueError:
        body = res.content
    headers = {k: v for k, v in res.headers.items() if k not in _RANDOM}
    return res.status_code, body, headers


def test_the_lane_answers_as_the_router(apps: list[tuple[Any, dict[str, str]]]) -> None:
    answers: list[list[tuple[int, Any, dict[str, str]]]] = [[], []]
    for i, (app, keys) in enumerate(apps):
        read = {"Authorization": f"Bearer {keys['read']}"}
        c = TestClient(app, base_url="http://127.0.0.1")
        it = c.post(
            "/api/v1/iterations",
            json={"dataset": "a", "batch_size": 10, "lease_size": 2},
            headers=read,
        ).json()["id"]
        nxt = f"/api/v1/iterations/{it}/next"
        for path, headers in (
            (nxt + "?client=c1", {}),  # no key: 401
            (nxt + "?client=c1", {"Authorization": f"Bearer {keys['metrics']}"}),  # 403
            (nxt, read),  # no client: 422
            (nxt + "?client=c1&rank=-1", read),  # 422
            (nxt + "?client=c1&transport=carrier-pigeon", read),  # 422
            (nxt + "?client=c1&ack=nonsense", read),  # 422 from the handler
            ("/api/v1/iterations/" + "x" * 80 + "/next?client=c1", read),  # 422 (the path)
            ("/api/v1/iterations/nope/next?client=c1", read),  # 404
            (nxt + "?client=c1&rank=3", read),  # 400: no such rank
            (nxt + "?client=c1", {**read, "X-Datamill-Session": "short"}),  # 422
        ):
            answers[i].append(_answer(c.get(path, headers=headers)))
        first = c.get(nxt + "?client=c1", headers=read)
        second = c.get(nxt + "?client=c1", headers=read)
        acks = [
            f"{r.headers['x-datamill-lease']}:{r.headers['x-datamill-fence']}"
            for r in (first, second)
        ]
        wait = c.get(nxt + f"?client=c1&ack={acks[0]}", headers=read)  # 409: one in flight
        done = c.get(nxt + f"?client=c1&ack={acks[1]}", headers=read)  # 204: all done
        answers[i] += [_answer(first), _answer(second), _answer(wait), _answer(done)]
        answers[i].append(_answer(c.post(nxt + "?client=c1", headers=read)))  # 405
    statuses = [a[0] for a in answers[0]]
    assert statuses == [401, 403, 422, 422, 422, 422, 422, 404, 400, 422, 200, 200, 409, 204, 405]
    for got, want in zip(answers[0], answers[1], strict=True):
        assert got[:2] == want[:2] if isinstance(got[1], dict) else got[0] == want[0]
        assert got[2] == want[2]


def test_the_lane_counts_requests_under_the_routes_template(
    apps: list[tuple[Any, dict[str, str]]],
) -> None:
    with_lane, keys = apps[0]
    c = TestClient(with_lane, base_url="http://127.0.0.1")
    c.get(
        "/api/v1/iterations/nope/next?client=c9",
        headers={"Authorization": f"Bearer {keys['read']}"},
    )
    counted = with_lane.state.serve.telemetry.requests.labels(
        "/api/v1/iterations/{it_id}/next", "GET", "404"
    )._value.get()
    assert counted >= 1


def test_the_lane_serves_next_itself(
    apps: list[tuple[Any, dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from datamill.serve.http.routes import leases

    calls: list[str] = []
    real = leases.next_lease

    async def counted(request: Any, who: Any) -> Any:
        calls.append(request.url.path)
        return await real(request, who)

    monkeypatch.setattr(leases, "next_lease", counted)  # the router keeps the real function
    for app, keys in apps:
        c = TestClient(app, base_url="http://127.0.0.1")
        c.get(
            "/api/v1/iterations/nope/next?client=c1",
            headers={"Authorization": f"Bearer {keys['read']}"},
        )
    assert calls == ["/api/v1/iterations/nope/next"]  # the app with the lane only


@given(st.text(alphabet="ab=&%+;c2F36Dd\u00e9 ", max_size=40))  # %26, %3D: escaped & and =
def test_the_lanes_query_reading_is_starlettes(query: str) -> None:
    from starlette.datastructures import QueryParams

    from datamill.serve.http.routes.leases import _params

    raw = query.encode("utf-8")
    params = QueryParams(raw)
    assert _params(raw) == {k: params.getlist(k) for k in params}
