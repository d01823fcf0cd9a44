"""``datamill serve`` throughput: 1, 2 and 4 client processes over loopback vs the in-process Loader.

Data: ``bench_loader.py``'s dataset (3 shardsets x 100 shards, 10% of samples missing from one),
batch 256, shuffle on. The server runs as ``datamill serve ROOT --no-auth`` in its own process
(uvicorn with uvloop + httptools when installed); each client process iterates its rank of one static
iteration with :class:`datamill.serve.RemoteLoader` (``collate="numpy"``, the Loader's default).

Reported per client count: aggregate samples/s (all samples / wall time from the first client's start
to the last client's end), p50/p99 of the time each batch took to arrive as seen by the training loop,
and the server's peak RSS (``VmHWM``). lavender-data is measured on the same files when its own venv
exists (``.lvenv``, see ``bench_lavender_side.py``); otherwise it is skipped with a note.

Scale (``--scale``, also run by default after the throughput table): an epoch of **100M samples in
10k shards** (synthetic shard sizes; planning needs no data, batches are built from a synthetic source
of one int64 column) served by a :class:`~datamill.serve.server.ServeState` in a fresh process. It
prints the RSS growth over the process's baseline (VmRSS/VmHWM after ``clear_refs``) and the epoch
start (creating the iteration plus the first lease of the last rank), for two epochs, with the first
epoch driven to its end (so it is evicted); and beside it the full-order way (an int64 per sample, as
the server held each epoch before) at 10M samples, with the ratio.

Usage: ``python benchmarks/bench_serve.py [--quick] [--samples N] [--clients 1,2,4] [--lavender-python PATH]
[--scale | --no-scale]``
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


SCALE = """
import json, os, sys, tempfile, time
import numpy as np, pyarrow as pa
from datamill.serve.server import ServeState

samples, shards, world, batch, full = (int(x) for x in sys.argv[1:6])
rng = np.random.default_rng(0)
sizes = rng.integers(samples // shards // 2, samples // shards * 3 // 2, shards)
sizes[-1] += samples - int(sizes.sum())
offsets = np.concatenate([[0], np.cumsum(sizes)])


class Synthetic:
    columns = ["uid"]
    def num_shards(self): return len(sizes)
    def shard_sizes(self): return sizes.tolist()
    def fingerprint(self): return "synthetic-%d-%d" % (samples, shards)
    def read_shard(self, k, columns=None):
        return pa.table({"uid": np.arange(offsets[k], offsets[k + 1], dtype=np.int64)})


def rss():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


class State(ServeState):
    def open_source(self, path):
        return Synthetic()


st = State(tempfile.mkdtemp(), auth=False)
st.journal.add_dataset("ds-synthetic", "synthetic", "/synthetic")
# warm-up on another dataset: the process's one-time imports and threads are not an epoch's cost
warm = st.create_iteration({"dataset": "synthetic", "batch_size": 7, "epoch": 0, "name": "warm-up", "seed": 1})
st.next_lease(st.iteration(warm["id"]), "w")
if full:  # the earlier way: the epoch's order and a rank's plan (an int64 per sample, and more), then 16 batches
    from datamill.loader import BatchService
    svc = BatchService(Synthetic(), batch_size=batch, collate="arrow")
    list(BatchService(Synthetic(), batch_size=7, seed=1, collate="arrow").build(0, 0, [0]))  # the same warm-up
    base = rss()["VmRSS"]
    open("/proc/self/clear_refs", "w").write("5")
    t = time.perf_counter()
    svc.plan(0, world - 1, world)
    list(svc.build(0, world - 1, range(16), world_size=world))
    print(json.dumps({"full": True, "epoch_start_s": time.perf_counter() - t, "rss_growth_mib": rss()["VmRSS"] - base,
                      "peak_growth_mib": rss()["VmHWM"] - base}))
    sys.exit(0)
base = rss()["VmRSS"]
open("/proc/self/clear_refs", "w").write("5")
out = {"full": False, "epochs": []}
for epoch in range(2):
    t = time.perf_counter()
    info = st.create_iteration({"dataset": "synthetic", "batch_size": batch, "epoch": epoch, "world_size": world,
                                "name": "scale", "lease_size": 16})
    it = st.iteration(info["id"])
    first = st.next_lease(it, "c%d" % (world - 1), rank=world - 1)
    start_s = time.perf_counter() - t
    row = {"epoch": epoch, "epoch_start_s": start_s, "units": it.total, "first_lease_batches": len(first.units),
           "rss_after_start_mib": rss()["VmRSS"] - base}
    if epoch == 0:  # an iteration of the epoch driven to its end (bookkeeping and journal, no batch built)
        t = time.perf_counter()
        info = st.create_iteration({"dataset": "synthetic", "batch_size": batch, "epoch": epoch, "world_size": world,
                                    "name": "drain", "lease_size": 4096})
        it = st.iteration(info["id"])
        for r in range(world):
            while True:
                lease = it.take("c%d" % r, rank=r)
                if lease is None:
                    break
                st.ack(it, lease.id, lease.fence, client="c%d" % r)
        row["finish_s"] = time.perf_counter() - t
        row["evicted"] = info["id"] not in st._iterations
    out["epochs"].append(row)
r = rss()
out.update(rss_growth_mib=r["VmRSS"] - base, peak_growth_mib=r["VmHWM"] - base)
print(json.dumps(out))
"""


def run_scale(samples: int, shards: int, *, world: int = 8, batch: int = 256, full: bool = False) -> dict[str, Any]:
    """The scale measurement in a fresh process (its RSS is the server's)."""
    out = subprocess.run([sys.executable, "-c", SCALE, str(samples), str(shards), str(world), str(batch),
                          str(int(full))], check=False, env=_env(), capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def scale_report(*, samples: int = 100_000_000, shards: int = 10_000) -> dict[str, Any]:
    """Print the 100M-sample memory and epoch-start figures against the goals; returns them."""
    lazy = run_scale(samples, shards)
    ref_n = samples // 10
    small = run_scale(ref_n, shards)
    ref = run_scale(ref_n, shards, full=True)
    e0, e1 = lazy["epochs"]
    print(f"scale: {samples:,} samples in {shards:,} shards, world 8, batch 256 ({e0['units']:,} batches per epoch)")
    print(f"  epoch start (create + first lease of the last rank): epoch 0 {e0['epoch_start_s']:.3f} s, "
          f"epoch 1 {e1['epoch_start_s']:.3f} s  (goal < 0.5 s)")
    print(f"  server RSS growth {lazy['rss_growth_mib']:.1f} MiB, peak {lazy['peak_growth_mib']:.1f} MiB over the "
          f"baseline (goal < 100 MiB); an epoch-0 iteration driven to its end in {e0['finish_s']:.1f} s "
          f"and evicted from memory: {e0['evicted']}")
    print(f"  at {ref_n:,} samples (epoch start = plan + first 16 batches): held per shard {small['epochs'][0]['epoch_start_s']:.3f} s, peak "
          f"{small['peak_growth_mib']:.1f} MiB; full order (one int64 per sample, the earlier way) "
          f"{ref['epoch_start_s']:.3f} s, peak {ref['peak_growth_mib']:.1f} MiB; ratio full / per shard: "
          f"time {ref['epoch_start_s'] / max(1e-9, small['epochs'][0]['epoch_start_s']):,.0f}x, "
          f"peak memory {ref['peak_growth_mib'] / max(0.1, small['peak_growth_mib']):,.1f}x")
    return {"scale": lazy, "scale_small": small, "full_order_small": ref}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k samples instead of 1M, clients 1,2")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--clients", default=None, help="comma-separated client counts (default 1,2,4)")
    ap.add_argument("--lavender-python", type=Path, default=HERE.parent / ".lvenv/bin/python",
                    help="Python of a venv with lavender-data (default: .lvenv/bin/python, skipped if absent)")
    ap.add_argument("--lavender-batches", type=int, default=100)
    ap.add_argument("--scale", action=argparse.BooleanOptionalAction, default=None,
                    help="only the 100M-sample scale figures (--no-scale: only throughput; default: both)")
    args = ap.parse_args(argv)
    if args.scale:
        print(json.dumps(scale_report()))
        return
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
    scale = scale_report() if args.scale is None else None
    print(json.dumps({"samples": n, "local_samples_per_s": local["samples"] / local["seconds"], "serve": rows,
                      "server_peak_rss_mib": rss, "lavender": lav, "scale": scale}))


if __name__ == "__main__":
    main()
