"""``datamill serve`` throughput: 1, 2 and 4 client processes over loopback vs the in-process Loader.

Data: ``bench_loader.py``'s dataset (3 shardsets x 100 shards, 10% of samples missing from one),
batch 256, shuffle on. The server runs as ``datamill serve ROOT --no-auth`` in its own process
(uvicorn with uvloop + httptools when installed); each client process iterates its rank of one static
iteration with :class:`datamill.serve.RemoteLoader` (``collate="numpy"``, the Loader's default).

Reported per client count: aggregate samples/s (all samples / wall time from the first client's start
to the last client's end), p50/p99 of the time each batch took to arrive as seen by the training loop,
and the server's peak RSS (``VmHWM``). lavender-data is measured on the same files when its own venv
exists (``.lvenv``, see ``bench_lavender_side.py``); otherwise it is skipped with a note.

Usage: ``python benchmarks/bench_serve.py [--quick] [--samples N] [--clients 1,2,4] [--lavender-python PATH]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CLIENT = """
import json, sys, time
import numpy as np
from datamill.serve import RemoteLoader
url, rank, world, name, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
loader = RemoteLoader(url, None, "bench", batch_size=batch, seed=0, rank=rank, world_size=world, name=name)
waits, n = [], 0
start = time.time()
t = time.perf_counter()
for b in loader:
    now = time.perf_counter()
    waits.append(now - t)
    n += len(b["uid"])
    t = time.perf_counter()
end = time.time()
print(json.dumps({"samples": n, "batches": len(waits), "start": start, "end": end,
                  "p50_ms": float(np.percentile(waits, 50) * 1000), "p99_ms": float(np.percentile(waits, 99) * 1000),
                  "stall_s": loader.stall_s}))
"""


def _bench_loader() -> Any:
    spec = importlib.util.spec_from_file_location("bench_loader", HERE / "bench_loader.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _start_server(root: Path, state: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "datamill.cli", "serve", str(root), "--no-auth", "--port", str(port),
                             "--state", str(state)], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def run_clients(url: str, clients: int, batch: int) -> dict[str, Any]:
    """``clients`` processes iterate their ranks of one static iteration; aggregate figures."""
    name = f"bench-{clients}-{time.time_ns()}"
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, url, str(r), str(clients), name, str(batch)],
                              env=_env(), stdout=subprocess.PIPE, text=True) for r in range(clients)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"client exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    samples = sum(r["samples"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {"clients": clients, "samples": samples, "seconds": wall, "samples_per_s": samples / wall,
            "p50_ms": max(r["p50_ms"] for r in results), "p99_ms": max(r["p99_ms"] for r in results),
            "stall_s": [round(r["stall_s"], 2) for r in results]}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k samples instead of 1M, clients 1,2")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--clients", default=None, help="comma-separated client counts (default 1,2,4)")
    ap.add_argument("--lavender-python", type=Path, default=HERE.parent / ".lvenv/bin/python",
                    help="Python of a venv with lavender-data (default: .lvenv/bin/python, skipped if absent)")
    ap.add_argument("--lavender-batches", type=int, default=100)
    args = ap.parse_args(argv)
    bl = _bench_loader()
    n = args.samples or (100_000 if args.quick else 1_000_000)
    counts = [int(c) for c in (args.clients or ("1,2" if args.quick else "1,2,4")).split(",")]
    print(f"machine: {os.cpu_count()} cpus, {platform.platform()}, python {platform.python_version()}")
    print(f"data: {n:,} samples, 3 shardsets x {bl.SHARDS} shards (extra: 10% missing), batch {bl.BATCH}, shuffle on")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = Path(tmp)
        files = bl.make_data(root, n)
        source, kind = bl.shards_source(root, files)
        print(f"source: {kind}")
        bl.warm_up(source)
        local = bl.run_datamill(source, 0)
        rows = []
        port = _free_port()
        server = _start_server(root, root / "state", port)
        try:
            from datamill.serve import Client

            url = f"http://127.0.0.1:{port}"
            with Client(url) as client:
                client.register("dataset", name="bench")
            run_clients(url, 1, bl.BATCH)  # warm-up: the server's imports, plans and first shard reads
            for c in counts:
                rows.append(run_clients(url, c, bl.BATCH))
            rss = _peak_rss_mib(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
        lav = None
        if args.lavender_python.exists():
            lav = bl.run_lavender(args.lavender_python, root, args.lavender_batches)
    print(f"{'in-process Loader':<28} {local['samples'] / local['seconds']:>12,.0f} samples/s")
    for r in rows:
        print(f"{'serve, ' + str(r['clients']) + ' client process(es)':<28} {r['samples_per_s']:>12,.0f} samples/s  "
              f"({r['samples']:,} samples in {r['seconds']:.2f} s; per batch p50 {r['p50_ms']:.2f} ms, "
              f"p99 {r['p99_ms']:.2f} ms; stall {r['stall_s']} s)")
    print(f"server peak RSS {rss:,.0f} MiB (VmHWM, whole process)")
    best = max(r["samples_per_s"] for r in rows)
    if lav is None:
        print(f"lavender-data: no venv at {args.lavender_python}; not measured in this run")
    elif "error" in lav:
        print(f"lavender-data: failed: {lav['error']}")
    else:
        print(f"lavender-data {lav['lavender_version']}: {lav['samples_per_s']:,.0f} samples/s "
              f"({lav['batches']} batches); ratio datamill serve / lavender: {best / lav['samples_per_s']:,.0f}x")
    print("goals: >= 400,000 samples/s with 2-4 clients; >= 1,000x lavender-data's batched HTTP figure")
    print(json.dumps({"samples": n, "local_samples_per_s": local["samples"] / local["seconds"], "serve": rows,
                      "server_peak_rss_mib": rss, "lavender": lav}))


if __name__ == "__main__":
    main()
