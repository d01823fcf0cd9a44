"""An operator's day: a drain that ends cleanly with the default (byte-sized) leases, the normal 409
wait logged as what it is, and the end of an epoch after a client crash."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client
from datamill.serve.observe.logs import WAIT_NOTE, JsonFormatter, TextFormatter
from datamill.serve.protocol.iteration import DRAIN_FIRST_LEASE, drain_cap
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import free_port, make_key, read_log, start_server, start_worker, stop

pytestmark = pytest.mark.server


def _access(path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", status),
        None,
    )


def test_a_409_of_next_is_logged_as_the_normal_wait() -> None:
    wait = _access("/api/v1/iterations/it-1/next?client=c&rank=0", 409)
    assert json.loads(JsonFormatter().format(wait))["note"] == WAIT_NOTE
    assert "normal" in TextFormatter().format(wait)
    other = _access("/api/v1/iterations", 409)  # a name clash is not a wait
    assert "note" not in json.loads(JsonFormatter().format(other))
    ok = _access("/api/v1/iterations/it-1/next?client=c", 200)
    assert "note" not in json.loads(JsonFormatter().format(ok))


def test_drain_cap_follows_the_clients_rate() -> None:
    assert drain_cap([], 10.0, 30.0) == DRAIN_FIRST_LEASE
    slow = [(float(t), 1) for t in range(91, 101)]  # 1 batch/s (0.2 s steps would be 5)
    assert drain_cap(slow, 100.0, 30.0) <= 10
    fast = [(float(t) / 100, 100) for t in range(9000, 10000)]  # ~10,000 batches/s
    assert drain_cap(fast, 100.0, 30.0) > 4096  # no cap in practice: the lease size rules


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("operator")
    ShardsetDataset.create(
        base / "root" / "ds",
        pa.table({"uid": np.arange(40_000), "x": np.arange(40_000.0)}),
        uid="uid",
        shardset="main",
        shard_size=4_000,
    )
    yield {"base": base, "root": base / "root"}


@pytest.mark.slow
def test_sigterm_drain_ends_cleanly_with_default_leases(setup: dict[str, Any]) -> None:
    """A client at 20 batches/s with the default leases (256 batches of 8 small rows: 12.8 s
    each, over the 8 s drain): the server sizes its leases for the drain, so SIGTERM ends in
    `drained`, exit 0, with every lease acknowledged."""
    state, port = setup["base"] / "state-drain", free_port()
    admin = make_key(state)
    log = setup["base"] / "drain.log"
    proc = start_server(
        setup["root"], state, port, "--log-format", "json", "--drain-timeout", "8", log=log
    )
    url = f"http://127.0.0.1:{port}"
    got = setup["base"] / "client.log"
    worker = None
    try:
        with Client(url, admin) as c:
            c.register("ds", name="ds")
        worker = start_worker(url, admin, "ds", got, batch_size=8, name="drain-default", sleep=0.05)
        deadline = time.monotonic() + 60
        while len(read_log(got)) < 80:  # a few seconds of acks: the server knows its rate
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with Client(url, admin) as c:
            its = c.iterations()["iterations"]
        assert its[0]["config"]["lease_size"] == 256  # RemoteLoader's default, for rows this small
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    ends = [e for e in events if e.get("event") in ("drained", "drain timeout")]
    assert [e["event"] for e in ends] == ["drained"], ends


@pytest.mark.slow
@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "behind-a-proxy"])
def test_no_end_of_epoch_stall_after_a_client_crash(setup: dict[str, Any], proxy: bool) -> None:
    """Two dynamic clients; one is killed (-9) while holding leases; the survivor finishes the
    epoch without waiting out the dead client's lease timeout (15 s here: the survivor must end
    within half of it, a margin that holds on a loaded machine). When the clients' address is a
    trusted proxy's (``--forwarded-allow-ips``), its connections are not watched (a proxy pools and
    closes them on its own): the dead client's leases end after the lease timeout (6 s) instead."""
    state, port = setup["base"] / f"state-crash-{proxy}", free_port()
    admin = make_key(state)
    extra = ("--forwarded-allow-ips", "127.0.0.1") if proxy else ()
    lease_timeout = 6.0 if proxy else 15.0
    proc = start_server(setup["root"], state, port, "--lease-timeout", str(lease_timeout), *extra)
    url = f"http://127.0.0.1:{port}"
    logs = {k: setup["base"] / f"crash-{proxy}-{k}.log" for k in ("a", "b")}
    workers: dict[str, Any] = {}
    try:
        with Client(url, admin) as c:
            c.register("ds", name="ds")
        opts = {"batch_size": 500, "name": "crash", "mode": "dynamic", "lease_size": 4}
        workers["a"] = start_worker(url, admin, "ds", logs["a"], sleep=0.05, **opts)
        workers["b"] = start_worker(url, admin, "ds", logs["b"], sleep=0.01, **opts)
        deadline = time.monotonic() + 60
        while len(read_log(logs["a"])) < 3:
            assert workers["a"].poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        workers["a"].kill()  # holds leases it never acknowledges
        killed = time.monotonic()
        assert workers["b"].wait(timeout=60) == 0
        took = time.monotonic() - killed
        got = [u for k in ("a", "b") for batch in read_log(logs[k]) for u in batch]
        assert set(got) == set(range(40_000))
        if proxy:
            assert took > 5.0, f"the survivor finished {took:.1f} s after the crash"
        else:
            assert took < lease_timeout / 2, f"the survivor finished {took:.1f} s after the crash"
    finally:
        for w in workers.values():
            if w.poll() is None:
                w.kill()
                w.wait(timeout=10)
        stop(proc)
