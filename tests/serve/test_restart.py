"""kill -9 of the server mid-epoch, restart on the same state folder: the epoch completes exactly once."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datamill.serve import Client
from tests.serve._proc import free_port, read_log, start_server, start_worker, stop
from tests.serve.conftest import N

pytestmark = pytest.mark.server


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_server_killed_mid_epoch_and_restarted_completes_the_epoch_exactly_once(
        server: dict[str, Any], tmp_path: Path, mode: str) -> None:
    state, port = tmp_path / "state", free_port()
    shutil.copytree(server["state"], state)  # the shared server's keys and datasets, a private journal
    url = f"http://127.0.0.1:{port}"
    name = f"restart-{mode}"
    opts = {"batch_size": 40, "seed": 4, "mode": mode, "world_size": 2 if mode == "static" else 1, "name": name,
            "lease_size": 3, "sleep": 0.01}
    proc = start_server(server["root"], state, port, "--lease-timeout", "2")
    workers, logs = [], [tmp_path / f"w{r}.log" for r in range(2)]
    try:
        for r in range(2):
            workers.append(start_worker(url, server["read"], "ds", logs[r],
                                        **({**opts, "rank": r} if mode == "static" else opts)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and min(len(read_log(x)) for x in logs) < 8:
            time.sleep(0.05)
        stop(proc, kill=True)
        before = [len(read_log(x)) for x in logs]
        assert min(before) >= 8
        deadline = time.monotonic() + 10  # the port refuses connections: the workers see the server gone
        while time.monotonic() < deadline and _accepts(port):
            time.sleep(0.05)
        proc = start_server(server["root"], state, port, "--lease-timeout", "2")
        for w in workers:
            assert w.wait(timeout=60) == 0
        assert all(x.read_text().endswith("END\n") for x in logs)
        with Client(url, server["read"]) as client:
            progress, done = client.progress(name), client.done(name)
    finally:
        for w in workers:
            stop(w, kill=True)
        stop(proc)
    total = 150
    assert progress["total"] == progress["done"] == total and progress["pending"] == progress["leased"] == 0
    count = np.zeros(total, dtype=np.int64)
    for a, b, _ in done:
        count[a:b] += 1
    assert (count == 1).all()  # the committed record: every batch exactly once
    uids = Counter(u for x in logs for batch in read_log(x) for u in batch)
    assert set(uids) == set(range(N))
    if mode == "static":  # re-issued leases already yielded are acknowledged, not yielded again
        assert max(uids.values()) == 1


def _accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
