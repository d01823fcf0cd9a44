"""Metrics, logs and shutdown of a real `datamill serve` process: a real Prometheus scraping it,
counters rebuilt from the journal after a restart, JSON event logs, SIGTERM drain.

Prometheus is Debian's package (scripts/test.sh installs it when absent); every process started here
binds 127.0.0.1 on a free port and is stopped by pid in a finally.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from datamill.client import Client, Leases, RemoteLoader
from datamill.client.http import RemoteError
from datamill.core.errors import ConfigError
from datamill.serve.http.app import create_app
from datamill.serve.http.run import serve
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import free_port, make_key, start_server, stop

pytestmark = pytest.mark.server

N, BATCH = 2000, 64
UNITS = math.ceil(N / BATCH)


def _dataset(root: Path) -> None:
    ShardsetDataset.create(
        root / "ds",
        pa.table({"uid": np.arange(N, dtype=np.int64), "x": np.arange(N, dtype=np.float32)}),
        uid="uid",
        shardset="main",
        shard_size=250,
    )


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    _dataset(tmp_path / "root")
    state = tmp_path / "state"
    return {
        "root": tmp_path / "root",
        "state": state,
        "admin": make_key(state, "admin"),
        "read": make_key(state, "read"),
        "metrics": make_key(state, "metrics"),
        "base": tmp_path,
    }


def _start(s: dict[str, Any], *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = start_server(
        s["root"], s["state"], port, "--log-format", "json", *extra, log=s["base"] / "server.log"
    )
    url = f"http://127.0.0.1:{port}"
    with Client(url, s["admin"]) as c:
        c.register("ds", name="ds")
    return proc, url


def _scrape(url: str, key: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as res:
        text = res.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return sum(
        v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= set(lab)
    )


def _log_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))  # every line of the JSON log is one JSON object
    return out


def _epoch(url: str, key: str, name: str) -> str:
    loader = RemoteLoader(
        url, key, "ds", batch_size=BATCH, collate="arrow", leases=Leases(name=name, size=4)
    )
    uids = np.concatenate([b.column("uid").to_numpy() for b in loader])
    np.testing.assert_array_equal(np.sort(uids), np.arange(N))
    assert loader.iteration_id is not None
    return loader.iteration_id


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="Debian's prometheus (scripts/test.sh installs it)"
)
def test_a_real_prometheus_sees_every_unit_acknowledged(setup: dict[str, Any]) -> None:
    proc, url = _start(setup, "--lease-timeout", "5")
    prom = None
    try:
        it = _epoch(url, setup["read"], "prom")
        port = free_port()
        tmp = Path(tempfile.mkdtemp(dir=setup["base"]))
        (tmp / "prometheus.yml").write_text(
            json.dumps(
                {  # JSON is YAML
                    "global": {
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "evaluation_interval": "1s",
                    },
                    "scrape_configs": [
                        {
                            "job_name": "datamill",
                            "metrics_path": "/metrics",
                            "authorization": {"type": "Bearer", "credentials": setup["metrics"]},
                            "static_configs": [{"targets": [url.removeprefix("http://")]}],
                        }
                    ],
                }
            )
        )
        with open(tmp / "prometheus.log", "wb") as log:
            prom = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        query = f'datamill_units_acknowledged_total{{iteration="{it}"}}'
        got: list[Any] = []
        up: list[Any] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                got = _prom_query(port, query)
                up = _prom_query(port, 'up{job="datamill"}')
            except OSError:
                got = []
            if got and float(got[0]["value"][1]) == UNITS:
                break
            time.sleep(0.5)
        assert got and float(got[0]["value"][1]) == UNITS, (
            got,
            (tmp / "prometheus.log").read_text()[-2000:],
        )
        assert up and float(up[0]["value"][1]) == 1.0
        assert got[0]["metric"]["dataset"] == "ds" and got[0]["metric"]["job"] == "datamill"
    finally:
        if prom is not None and prom.poll() is None:
            os.kill(prom.pid, signal.SIGTERM)
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(prom.pid, signal.SIGKILL)
                prom.wait(timeout=10)
        stop(proc)


def _prom_query(port: int, query: str) -> list[Any]:
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=5) as res:
        body = json.loads(res.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_counters_survive_a_restart_and_events_are_json_lines(setup: dict[str, Any]) -> None:
    proc, url = _start(setup)
    try:
        it = _epoch(url, setup["read"], "restart")
        before = _scrape(url, setup["metrics"])
        assert _value(before, "datamill_units_acknowledged_total", iteration=it) == UNITS
        issued = _value(before, "datamill_leases_issued_total", iteration=it)
        assert issued >= math.ceil(UNITS / 4)
        assert _value(before, "datamill_leases_acknowledged_total", iteration=it) == issued
        assert _value(before, "datamill_bytes_sent_total", iteration=it) > N * 8
        assert _value(before, "datamill_lease_build_seconds_count") == issued
        assert _value(before, "datamill_iterations", status="finished") == 1
        assert (
            _value(
                before,
                "datamill_http_requests_total",
                route="/api/v1/iterations/{it_id}/next",
                status="200",
            )
            == issued
        )
        # a metrics key scrapes and nothing else; a read key may not scrape
        with Client(url, setup["metrics"]) as c, pytest.raises(RemoteError) as denied:
            c.datasets()
        assert denied.value.status == 403
        with pytest.raises(urllib.error.HTTPError) as no:
            _scrape(url, setup["read"])
        assert no.value.code == 403
        no.value.close()  # the error holds the response's socket
    finally:
        stop(proc)
    proc, url = _start(setup)
    try:
        after = _scrape(url, setup["metrics"])
        for name in (
            "datamill_units_acknowledged_total",
            "datamill_leases_issued_total",
            "datamill_leases_acknowledged_total",
            "datamill_bytes_sent_total",
        ):
            assert _value(after, name, iteration=it) == _value(before, name, iteration=it), name
        assert _value(after, "datamill_iterations", status="finished") == 1
    finally:
        stop(proc)
    events = _log_events(setup["base"] / "server.log")
    names = [e["event"] for e in events]
    assert (
        names.count("start") == 2 and "iteration created" in names and "iteration finished" in names
    )
    assert "register dataset" in names and "key denied" in names and "drained" in names
    start = [e for e in events if e["event"] == "start"][-1]
    assert start["iterations"] == 1 and start["finished"] == 1 and start["datasets"] == 1
    access = [e for e in events if e["event"] == "request"]
    assert access and {"method", "path", "status"} <= set(
        access[0]
    )  # uvicorn's access log, as JSON


def _call(
    url: str, key: str, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, str], Any]:
    """One request on its own connection, closed before returning."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(
            method,
            path,
            body=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/json",
                "Connection": "close",
            },
        )
        res = conn.getresponse()
        data = res.read()
        headers = {k.lower(): v for k, v in res.getheaders()}
        res.close()
    finally:
        conn.close()
    is_json = headers.get("content-type", "").startswith("application/json")
    return res.status, headers, json.loads(data) if is_json and data else data


def test_sigterm_drains_leases_in_flight_then_exits_0(setup: dict[str, Any]) -> None:
    proc, url = _start(setup, "--lease-timeout", "60", "--drain-timeout", "30")
    key = setup["read"]
    try:
        with Client(url, key) as c:
            it = c.iteration(
                "ds", batch_size=BATCH, leases=Leases(name="drain", size=4, mode="dynamic")
            )["id"]
        status, head, _ = _call(url, key, "GET", f"/api/v1/iterations/{it}/next?client=c1")
        assert status == 200
        lease, fence = head["x-datamill-lease"], head["x-datamill-fence"]
        os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _value(_scrape(url, setup["metrics"]), "datamill_draining") != 1:
            assert time.monotonic() < deadline, "the server did not start draining"
        assert proc.poll() is None  # still serving: a lease is in flight
        status, head, out = _call(url, key, "GET", f"/api/v1/iterations/{it}/next?client=c2")
        assert status == 503 and "draining" in out["error"] and head["retry-after"]
        assert (
            _call(
                url,
                key,
                "POST",
                f"/api/v1/iterations/{it}/heartbeat",
                {"client": "c1", "leases": [[lease, fence]]},
            )[0]
            == 200
        )
        status, _, out = _call(
            url,
            key,
            "POST",
            f"/api/v1/iterations/{it}/ack",
            {"client": "c1", "leases": [[lease, fence]]},
        )
        assert status == 200 and out["acks"] == {lease: "ok"}
        assert proc.wait(timeout=15) == 0
    finally:
        stop(proc)
    events = _log_events(setup["base"] / "server.log")
    drained = [e for e in events if e["event"] in ("drained", "drain timeout")]
    assert [e["event"] for e in drained] == ["drained"] and drained[0]["leases_left"] == 0
    # the ack was journaled: a new server has those units done
    proc, url = _start(setup)
    try:
        with Client(url, key) as c:
            assert c.progress(it)["done"] == 4
    finally:
        stop(proc)


def test_sigterm_gives_up_after_the_drain_timeout(setup: dict[str, Any]) -> None:
    proc, url = _start(setup, "--lease-timeout", "60", "--drain-timeout", "1")
    try:
        with Client(url, setup["read"]) as c:
            it = c.iteration("ds", batch_size=BATCH, leases=Leases(name="stuck", size=4))["id"]
        assert _call(url, setup["read"], "GET", f"/api/v1/iterations/{it}/next?client=c1")[0] == 200
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert 0.9 <= time.monotonic() - t0 < 15
    finally:
        stop(proc)
    gave_up = [
        e for e in _log_events(setup["base"] / "server.log") if e["event"] == "drain timeout"
    ]
    assert len(gave_up) == 1 and gave_up[0]["leases_left"] == 1


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Any]:
    app = create_app(tmp_path / "state", metrics_no_auth=True)
    yield app
    app.state.serve.close()


def test_5xx_carries_a_request_id_that_the_log_names(
    app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    @app.get("/api/v1/boom", dependencies=[])
    def boom() -> None:
        raise RuntimeError("kaput")

    c = TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)
    with caplog.at_level("INFO", logger="datamill.serve"):
        res = c.get("/api/v1/boom")
    assert res.status_code == 500
    rid = res.json()["request_id"]
    assert len(rid) == 16 and res.headers["x-request-id"] == rid and rid in res.json()["error"]
    errors = [r for r in caplog.records if r.getMessage() == "server error"]
    assert errors and errors[0].fields["request_id"] == rid and "kaput" in errors[0].fields["error"]  # type: ignore[attr-defined]
    ok = c.get("/api/v1/health")
    assert len(ok.headers["x-request-id"]) == 16 and ok.headers["x-request-id"] != rid
    assert c.get("/metrics").status_code == 200  # --metrics-no-auth: no key needed


def test_metrics_no_auth_and_no_auth_only_on_loopback(tmp_path: Path) -> None:
    _dataset(tmp_path / "root")
    for opts in ({"metrics_no_auth": True}, {"auth": False}):
        with pytest.raises(ConfigError, match="only on a loopback address"):
            serve(tmp_path / "root", host="0.0.0.0", state=tmp_path / "state", **opts)


def test_per_iteration_series_are_bounded(app: Any) -> None:
    from datamill.serve.observe.metrics import MAX_ITERATION_SERIES

    journal = app.state.serve.journal
    for k in range(MAX_ITERATION_SERIES + 7):
        journal.add_iteration(
            f"it-{k:03d}", f"k{k}", 0, {"dataset": "ds-x", "lease_timeout": 60.0, "mode": "static"}
        )
        journal.add_done(f"it-{k:03d}", [(0, k + 1)], lease="l")
    text = TestClient(app, base_url="http://127.0.0.1").get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    acked = {
        s.labels["iteration"]: s.value
        for s in fams["datamill_units_acknowledged"].samples
        if s.name.endswith("_total")
    }
    assert len(acked) == MAX_ITERATION_SERIES  # the most recent ones
    assert (
        acked[f"it-{MAX_ITERATION_SERIES + 6:03d}"] == MAX_ITERATION_SERIES + 7
        and "it-000" not in acked
    )
