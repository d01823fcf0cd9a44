"""Helpers for the server tests: a free loopback port, a server subprocess, a client worker
subprocess."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[2] / "src")
WORKER = str(Path(__file__).with_name("_worker.py"))


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = SRC + os.pathsep + e.get("PYTHONPATH", "")
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_key(state: Path, role: str = "admin") -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            "keys",
            "create",
            "--state",
            str(state),
            "--role",
            role,
        ],
        env=env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip().splitlines()[-1]


def start_server(
    root: Path, state: Path, port: int, *extra: str, log: Path | None = None
) -> subprocess.Popen[bytes]:
    out = open(log or state.parent / f"server-{port}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            str(root),
            "--port",
            str(port),
            "--state",
            str(state),
            *extra,
        ],
        env=env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/api/v1/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.1)
        finally:  # a refused or cut-off probe's socket too (else a ResourceWarning fails a test)
            conn.close()
    stop(proc)
    raise RuntimeError("server did not start within 30 s")


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def start_worker(
    url: str, key: str, dataset: str, log: Path, **opts: object
) -> subprocess.Popen[bytes]:
    with open(str(log) + ".err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, WORKER, url, key, dataset, str(log), json.dumps(opts)],
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def read_log(log: Path) -> list[list[int]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("]")]


def assert_once_after_kills(
    progress: dict[str, Any],
    done: list[Any],
    logs: dict[str, Path],
    *,
    samples: int,
    total: int,
    killed: str = "a",
) -> None:
    """The orchestration tests' verdict: the journal holds every unit once, the clients' logs hold
    every sample (0 lost), and the only batches received twice (at most 3) are among the killed
    client's last 3 (none from a server restart)."""
    from collections import Counter

    import numpy as np

    assert progress["done"] == progress["total"] == total
    count = np.zeros(total, dtype=np.int64)
    for a, b, _ in done:
        count[a:b] += 1
    assert (count == 1).all()  # the committed record: exactly once
    received = {k: [tuple(b) for b in read_log(v)] for k, v in logs.items()}
    every = Counter(b for batches in received.values() for b in batches)
    assert {u for b in every for u in b} == set(range(samples)) and len(every) == total  # 0 lost
    twice = [b for b, n in every.items() if n > 1]
    assert max(every.values()) <= 2
    # every duplicate is one of the killed client's last batches: none comes from the server restart
    assert all(b in received[killed][-3:] for b in twice), (
        len(twice),
        len(received[killed]),
        [received[killed].index(b) for b in twice if b in received[killed]],
    )
    print(
        f"received twice: {len(twice)} of {total} batches (killed client yielded "
        f"{len(received[killed])})"
    )
    assert len(twice) <= 3
