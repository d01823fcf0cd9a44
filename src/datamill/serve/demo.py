"""Demo section: ``datamill serve`` on loopback feeding two client processes the cifar10_tiny
shardsets."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["run"]

_CLIENT = """
import sys
from datamill.client import Leases, RemoteLoader
url, key, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = RemoteLoader(url, key, "cifar10_tiny", batch_size=16, seed=0, rank=rank,
                      columns=["id", "label"], leases=Leases(world_size=2, name="demo", size=2))
n = sum(len(b["id"]) for b in loader)
print(f"  client rank {rank}: {n} samples")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen[bytes], port: int, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the demo server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/api/v1/health")
            ok = conn.getresponse().status == 200
            conn.close()
            if ok:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the demo server did not answer within {timeout:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # SIGTERM (nothing when it exited already)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def run(data_dir: Path, work_dir: Path) -> None:
    """Start a server on a free loopback port, register cifar10_tiny, iterate it from 2 processes,
    stop."""
    from datamill.client import Client
    from datamill.shards.dataset import ShardsetDataset
    from datamill.shards.demo import cifar_tables

    labels, images = cifar_tables(data_dir)
    images = images.select(["id", "png"])
    root = Path(work_dir) / "serve_root"
    state = Path(work_dir) / "serve_state"
    ds = ShardsetDataset.create(
        root / "cifar10_tiny", images, uid="id", shardset="image", shard_size=25
    )
    ds.add("label", labels.select(["id", "label"]), route=True)

    cli = [sys.executable, "-m", "datamill.cli", "--quiet"]
    made = subprocess.run(
        [*cli, "serve", "keys", "create", "--state", str(state), "--role", "admin"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    key = made.stdout.strip().splitlines()[-1]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(state / "server.log", "ab")  # noqa: SIM115 - closed right after the server starts
    server = subprocess.Popen(
        [*cli, "serve", str(root), "--port", str(port), "--state", str(state)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        _wait_healthy(server, port)
        print(f"server: {url} (pid {server.pid}), state in {state}")
        with Client(url, key) as client:
            client.register("cifar10_tiny", name="cifar10_tiny")
            print("registered:", ", ".join(f"{d['name']} ({d['id']})" for d in client.datasets()))
            clients = [
                subprocess.Popen(
                    [sys.executable, "-c", _CLIENT, url, key, str(r)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for r in range(2)
            ]
            for c in clients:
                out, _ = c.communicate(timeout=120)
                if c.returncode != 0:
                    raise RuntimeError(f"a demo client exited with {c.returncode}")
                print(out, end="")
        # a new connection: the first idled past the server's keep-alive meanwhile
        with Client(url, key) as client:
            p = client.progress("demo")
            print(f"{'iteration':<10} {'total':>6} {'done':>6} {'leased':>7} {'pending':>8}")
            print(f"{'demo':<10} {p['total']:>6} {p['done']:>6} {p['leased']:>7} {p['pending']:>8}")
    finally:
        _stop(server)
    print("server stopped")
