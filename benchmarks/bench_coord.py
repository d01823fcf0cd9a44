"""The server's cost of one lease round trip (#25): direct-mode clients that acknowledge
without reading.

Each client process loops ``GET /next?transport=direct&ack=<previous lease>``: the server journals
the previous lease's acknowledgement and the new lease (both durable before the reply) and answers
the lease's runs; the client reads nothing. The clients are load generators: one keep-alive socket
each, the request written as bytes and only the status line and headers of the reply parsed (as
``wrk`` does), so that the figure is the server's: with ``http.client`` (which parses every reply's
headers with the ``email`` package) each round trip cost 0.32 ms of client CPU on the same 2 cores
as the server, against 0.07-0.09 ms now (``benchmarks/RESULTS.md``).

This is the coordination test of ``bench_serve.py`` alone, run for several client counts in one
run, with the CPU split between the server process and the clients (the clients share this
machine's cores with the server: when their own CPU bounds the figure, the run with fewer, busier
clients shows the server's capacity). The load average is printed beside each figure.

Usage: ``python benchmarks/bench_coord.py [--clients 32,8,4] [--seconds 8] [--repeat 1] [--auth]
[--reference OTHER/src] [--in-process TRIPS]`` (``--reference``: the same runs against another
datamill's server, interleaved, e.g. an export of the commit before; ``--in-process``: the server's
ASGI app driven without sockets, its CPU per round trip).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from datamill.client import Leases

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CLIENT = """
import json, os, secrets, socket, sys, time, urllib.parse
port, it_id, key = int(sys.argv[1]), sys.argv[2], sys.argv[5]
start, seconds = float(sys.argv[3]), float(sys.argv[4])
sock = socket.create_connection(("127.0.0.1", port), timeout=60)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
head = "Host: 127.0.0.1:%d\\r\\nX-Datamill-Session: %s\\r\\n" % (port, secrets.token_hex(16))
if key:
    head += "Authorization: Bearer %s\\r\\n" % key
client = "coord-%d" % os.getpid()
base = "GET /api/v1/iterations/%s/next?client=%s&transport=direct" % (it_id, client)
buf = b""


def reply():
    # one HTTP/1.1 response: the status, the lease and fence headers, the body skipped
    global buf
    while b"\\r\\n\\r\\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    raw, _, buf = buf.partition(b"\\r\\n\\r\\n")
    lines = raw.decode("latin-1").split("\\r\\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    fields = {k.lower(): v for k, v in fields.items()}
    size = int(fields.get("content-length", "0"))
    while len(buf) < size:
        buf += sock.recv(65536)
    buf = buf[size:]
    return int(lines[0].split(" ", 2)[1]), fields


lat, leases, waits, ack = [], 0, 0, None
time.sleep(max(0.0, start - time.time()))
cpu0 = time.process_time()
end = time.monotonic() + seconds
while time.monotonic() < end:
    t = time.perf_counter()
    query = base + ("&ack=" + urllib.parse.quote(ack) if ack else "")
    sock.sendall((query + " HTTP/1.1\\r\\n" + head + "\\r\\n").encode())
    status, fields = reply()
    lat.append(time.perf_counter() - t)
    ack = None
    if status == 200:
        leases += 1
        ack = "%s:%s" % (fields["x-datamill-lease"], fields["x-datamill-fence"])
    elif status == 204:
        break
    else:
        waits += 1
        time.sleep(0.005)
cpu = time.process_time() - cpu0
print(json.dumps({"leases": leases, "waits": waits, "lat": lat, "cpu_s": cpu}))
"""


def _bench_serve() -> Any:
    spec = importlib.util.spec_from_file_location("bench_serve", HERE / "bench_serve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def make_dataset(root: Path, n: int) -> Path:
    """A one-column shardset dataset of ``n`` samples (batch 1: one unit per sample)."""
    import numpy as np
    import pyarrow as pa

    from datamill.shards import ShardsetDataset

    table = pa.table({"uid": np.arange(n, dtype=np.int64)})
    ShardsetDataset.create(root / "dataset", table, uid="uid", shardset="base", shard_size=n // 8)
    return root / "dataset"


def run(
    url: str, pid: int, *, clients: int, seconds: float, key: str, bs: Any, spy: str = ""
) -> dict[str, Any]:
    """One timed run of ``clients`` processes against a fresh dynamic iteration."""
    import numpy as np

    from datamill.client import Client

    with Client(url, key or None) as client:
        info = client.iteration(
            "bench",
            batch_size=1,
            transport="direct",
            leases=Leases(mode="dynamic", size=16, name=f"coord-{time.time_ns()}"),
        )
    port = int(url.rsplit(":", 1)[1])
    start = time.time() + 1.5 + 0.05 * clients
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(port), info["id"], str(start), str(seconds), key],
            env=bs._env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(clients)
    ]
    time.sleep(max(0.0, start - time.time()))
    load0, cpu0 = _load(), _cpu_s(pid)
    prof = None
    if spy:  # py-spy (if installed): samples of the server's threads holding the GIL
        cmd = [
            os.environ.get("PY_SPY", "py-spy"),
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(seconds)),
        ]
        cmd += ["-r", "200", "-f", "raw", "--gil", "--nonblocking", "-o", spy]
        prof = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    cpu1, load1 = _cpu_s(pid), _load()
    if prof is not None:
        prof.wait(timeout=60)
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"coordination client exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    lat = np.concatenate([np.asarray(r["lat"]) for r in results]) * 1000
    leases = sum(r["leases"] for r in results)
    return {
        "clients": clients,
        "leases": leases,
        "seconds": seconds,
        "leases_per_s": leases / seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "waits": sum(r["waits"] for r in results),
        "server_cpu_s": cpu1 - cpu0,
        "clients_cpu_s": sum(r["cpu_s"] for r in results),
        "server_cpu_ms_per_trip": 1000 * (cpu1 - cpu0) / max(1, leases),
        "load": f"{load0} -> {load1}",
        "server_rss_mib": bs._rss_mib(pid)[0],
    }


def in_process(samples: int, *, clients: int, trips: int) -> dict[str, Any]:
    """The server's own CPU per round trip: its ASGI app driven in this process (no sockets, no
    client processes), ``clients`` concurrent tasks of ``trips`` round trips each."""
    import asyncio
    import secrets
    from urllib.parse import urlencode

    from datamill.serve.http.app import create_app

    root = Path(tempfile.mkdtemp(prefix="bench-coord-asgi-"))
    loc = str(make_dataset(root, samples).resolve())
    app = create_app(root / "state", roots=[root], auth=False)
    st = app.state.serve
    st.register("dataset", name="bench", client_location=loc)
    it_id = st.create_iteration(
        {"dataset": "bench", "batch_size": 1, "mode": "dynamic", "lease_size": 16}
    )["id"]

    async def call(query: str, session: bytes) -> dict[bytes, bytes]:
        path = f"/api/v1/iterations/{it_id}/next"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"x-datamill-session", session)],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000),
        }
        out: dict[bytes, bytes] = {}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                assert msg["status"] == 200, msg
                out.update(dict(msg["headers"]))

        await app(scope, receive, send)
        return out

    async def client(k: int, n: int) -> int:
        session, ack = secrets.token_hex(16).encode(), None
        for _ in range(n):
            q = [("client", f"c{k}"), ("transport", "direct")] + ([("ack", ack)] if ack else [])
            h = await call(urlencode(q), session)
            ack = f"{h[b'x-datamill-lease'].decode()}:{h[b'x-datamill-fence'].decode()}"
        return n

    async def measure() -> dict[str, Any]:
        await asyncio.gather(*(client(k, 50) for k in range(4)))  # warm-up
        w0, c0, t0, tt0 = (
            st.writes.commits,
            time.process_time(),
            time.perf_counter(),
            time.thread_time(),
        )
        n = sum(await asyncio.gather(*(client(k, trips) for k in range(clients))))
        c1, t1, tt1 = time.process_time(), time.perf_counter(), time.thread_time()
        return {
            "clients": clients,
            "round_trips": n,
            "round_trips_per_s": n / (t1 - t0),
            "cpu_ms_per_trip": 1000 * (c1 - c0) / n,
            "loop_cpu_ms_per_trip": 1000 * (tt1 - tt0) / n,
            "writes_per_commit": n / max(1, st.writes.commits - w0),
            "load": _load(),
        }

    try:
        return asyncio.run(measure())
    finally:
        st.close()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="32,8,4", help="client counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the client counts")
    ap.add_argument("--samples", type=int, default=2_000_000)
    ap.add_argument("--auth", action="store_true", help="with API keys (an admin key)")
    ap.add_argument("--py-spy", default="", help="record the server's first run with py-spy here")
    ap.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="TRIPS",
        help="also drive the server's ASGI app in this process (no sockets, no client processes): "
        "TRIPS round trips per client, its CPU per round trip",
    )
    ap.add_argument(
        "--reference",
        default="",
        help="the src folder of another datamill (e.g. a checkout of the previous commit): its "
        "server runs the same clients, interleaved with this one's (A/B/A/B)",
    )
    args = ap.parse_args(argv)
    bs = _bench_serve()
    counts = [int(c) for c in args.clients.split(",")]
    sides = [("datamill", str(SRC))] + ([("reference", args.reference)] if args.reference else [])
    with tempfile.TemporaryDirectory(prefix="bench-coord-") as tmp:
        root = Path(tmp)
        location = str(make_dataset(root, args.samples).resolve())
        servers: dict[str, tuple[str, Any, str]] = {}
        try:
            for name, src in sides:
                state, key = root / f"state-{name}", ""
                if args.auth:
                    from datamill.serve.http.auth import create_key
                    from datamill.serve.journal.store import Journal

                    journal = Journal(state)
                    key = create_key(journal, role="admin")[1]
                    journal.close()
                port = bs._free_port()
                proc = _start(root, state, port, auth=args.auth, src=src)
                url = f"http://127.0.0.1:{port}"
                servers[name] = (url, proc, key)
                from datamill.client import Client

                with Client(url, key or None) as client:
                    client.register("dataset", name="bench", client_location=location)
            rows = []
            for _ in range(args.repeat):
                for c in counts:
                    for name, (url, proc, key) in servers.items():  # A/B/A/B
                        spy, args.py_spy = args.py_spy, ""
                        r = run(
                            url, proc.pid, clients=c, seconds=args.seconds, key=key, bs=bs, spy=spy
                        )
                        rows.append({"server": name, **r})
                        print(
                            f"{name:<9} {c:>3} clients: {r['leases_per_s']:>7,.0f} round trips/s"
                            f"  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:7.2f} ms"
                            f"  waits {r['waits']}  CPU server {r['server_cpu_s']:.2f} s"
                            f" ({r['server_cpu_ms_per_trip']:.3f} ms per trip), clients"
                            f" {r['clients_cpu_s']:.2f} s, of {r['seconds']:.0f} s"
                            f" x {os.cpu_count()} cores  RSS {r['server_rss_mib']:.0f} MiB"
                            f"  load {r['load']}",
                            flush=True,
                        )
        finally:
            for _, proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    if args.in_process:
        for c in counts:
            r = in_process(args.samples, clients=c, trips=args.in_process)
            rows.append({"server": "in-process", **r})
            print(
                f"in-process {c:>3} clients: {r['round_trips_per_s']:>7,.0f} round trips/s,"
                f" server CPU {r['cpu_ms_per_trip']:.3f} ms per trip (event loop"
                f" {r['loop_cpu_ms_per_trip']:.3f} ms), {r['writes_per_commit']:.1f} writes per"
                f" commit  load {r['load']}",
                flush=True,
            )
    print(json.dumps(rows))


def _start(root: Path, state: Path, port: int, *, auth: bool, src: str) -> Any:
    """A ``datamill serve`` process of the datamill in ``src`` (uvicorn log level warning)."""
    import urllib.request

    cmd = [sys.executable, "-m", "datamill.cli", "serve", str(root), "--port", str(port)]
    cmd += ["--state", str(state), "--build-workers", "0", "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.Popen(
        cmd + ([] if auth else ["--no-auth"]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


if __name__ == "__main__":
    main()
