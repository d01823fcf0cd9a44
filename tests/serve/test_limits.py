"""Connections cannot tie the server up: header size and count answered 431, a header deadline,
connection caps answered 503 with Retry-After below the descriptor limit (a real server process,
``RLIMIT_NOFILE`` set for it)."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datamill.serve.http.limits import HEADER_TIMEOUT_S, MAX_HEADER_BYTES, MAX_HEADERS, default_caps
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import env, free_port, make_key, read_log, start_worker, stop

pytestmark = pytest.mark.server


def _serve(root: Path, state: Path, port: int, nofile: int) -> subprocess.Popen[bytes]:
    """``datamill serve`` with its descriptor limit at ``nofile``; waits until healthy."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log = open(state.parent / f"server-{port}.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "datamill.cli", "serve", str(root), "--port", str(port)]
        + ["--state", str(state)],
        env=env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=limit,  # noqa: PLW1509 - only setrlimit, no threads yet in this test
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, (state.parent / f"server-{port}.log").read_text()[-2000:]
        if _ask(port, _get(port, b"")).startswith(b"HTTP/1.1 200"):
            return proc
        time.sleep(0.1)
    stop(proc)
    raise AssertionError("server did not start")


def _ask(port: int, raw: bytes, *, source: str = "127.0.0.1", timeout: float = 10.0) -> bytes:
    """Send ``raw`` on a new connection; the answer's bytes (b"" when refused or reset)."""
    try:
        with socket.create_connection(
            ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
        ) as s:
            try:
                s.sendall(raw)
            except OSError:
                pass  # the server answered and closed while we were still sending
            return _read(s)
    except OSError:
        return b""


def _read(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("limits")
    ShardsetDataset.create(
        base / "root" / "big",
        pa.table({"uid": np.arange(40_000), "x": np.arange(40_000.0)}),
        uid="uid",
        shardset="main",
        shard_size=4_000,
    )
    (base / "serve.yaml").write_text("roots: [root]\ndatasets: {big: big}\n")
    return base


@pytest.fixture(scope="module")
def small(root: Path) -> Iterator[int]:
    """A server at ``ulimit -n 256``: caps (128 total, 32 per address)."""
    port = free_port()
    proc = _serve(root / "serve.yaml", root / "state-small", port, 256)
    yield port
    stop(proc)


def _get(port: int, headers: bytes) -> bytes:
    host = b"Host: 127.0.0.1:%d\r\nConnection: close\r\n" % port
    return b"GET /api/v1/health HTTP/1.1\r\n" + host + headers + b"\r\n"


def test_header_size_and_count_are_answered_431(small: int) -> None:
    assert _ask(small, _get(small, b"")).startswith(b"HTTP/1.1 200")
    at_limit = _get(small, b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS - 2)))
    assert _ask(small, at_limit).startswith(b"HTTP/1.1 200")
    many = _get(small, b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS - 1)))
    assert _ask(small, many).startswith(b"HTTP/1.1 431")
    big = _get(small, b"X-Big: " + b"a" * (MAX_HEADER_BYTES + 10) + b"\r\n")
    got = _ask(small, big)
    assert got.startswith(b"HTTP/1.1 431") and b"65536 bytes" in got
    long_url = b"GET /api/v1/health?" + b"q" * (MAX_HEADER_BYTES + 10) + b" HTTP/1.1\r\n\r\n"
    assert _ask(small, long_url).startswith(b"HTTP/1.1 431")


def test_an_endless_header_is_cut_off_as_it_arrives(small: int) -> None:
    """64 MiB of one header: answered 431 after about 128 KiB, the rest never read."""
    with socket.create_connection(("127.0.0.1", small), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        try:
            while sent < 64 << 20:
                s.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass
        got = _read(s)
    assert got.startswith(b"HTTP/1.1 431"), got[:100]
    assert sent < 16 << 20, sent  # the server stopped reading long before 64 MiB


def test_a_client_address_over_its_cap_gets_503_with_retry_after(small: int) -> None:
    total, per_client = default_caps(256)
    assert (total, per_client) == (128, 32)
    held = []
    try:
        for _ in range(per_client):
            held.append(
                socket.create_connection(("127.0.0.1", small), source_address=("127.0.0.3", 0))
            )
        refused = _ask(small, _get(small, b""), source="127.0.0.3")
        assert refused.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in refused.lower()
        assert _ask(small, _get(small, b""), source="127.0.0.1").startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while not _ask(small, _get(small, b""), source="127.0.0.3").startswith(b"HTTP/1.1 200"):
        assert time.monotonic() < deadline, "the address's slots were not given back"
        time.sleep(0.05)


@pytest.mark.slow
def test_1100_slow_connections_under_ulimit_1024_while_a_client_trains(root: Path) -> None:
    """1,100 connections that never finish their headers, from 11 addresses, against a server
    at ``ulimit -n 1024`` while a real RemoteLoader trains on it: the client never fails, the
    connections beyond the cap get 503 at once, the others are closed by the header deadline."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    port = free_port()
    state = root / "state-big"
    key = make_key(state, role="read")
    server = _serve(root / "serve.yaml", state, port, 1024)
    log = root / "client.log"
    worker = start_worker(f"http://127.0.0.1:{port}", key, "big", log, batch_size=64, sleep=0.004)
    slow: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while len(read_log(log)) < 5:
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        for i in range(1100):
            s = socket.socket()
            s.setblocking(True)
            s.settimeout(30)
            s.bind((f"127.0.0.{2 + i % 11}", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            slow.append(s)
        opened = time.monotonic() - started
        before = len(read_log(log))
        # answers: 503 for those beyond the cap (at once), 408 for the rest (the deadline)
        answers = [_read(s) for s in slow]
        waited = time.monotonic() - started
        assert worker.poll() in (None, 0)
        during = len(read_log(log)) - before
        refused = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
        timed_out = sum(a.startswith(b"HTTP/1.1 408") for a in answers)
        total, _ = default_caps(1024)
        print(
            f"opened 1100 in {opened:.1f} s; 503: {refused}, 408: {timed_out}; all closed after "
            f"{waited:.1f} s; the client trained {during} batches meanwhile"
        )
        assert refused >= 1100 - total and refused + timed_out == 1100
        assert HEADER_TIMEOUT_S - 1 <= waited <= HEADER_TIMEOUT_S + 15
        assert during > 0
        assert worker.wait(timeout=120) == 0, (Path(str(log) + ".err")).read_text()[-3000:]
        got = [u for batch in read_log(log) for u in batch]
        assert sorted(got) == list(range(40_000))
        assert _ask(port, _get(port, b"")).startswith(b"HTTP/1.1 200")
    finally:
        for s in slow:
            s.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
        stop(server)
