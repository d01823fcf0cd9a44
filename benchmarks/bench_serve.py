"""``datamill serve`` throughput: 1, 2 and 4 client processes over loopback vs the in-process
Loader.

Data: ``bench_loader.py``'s dataset (3 shardsets x 100 shards, 10% of samples missing from one),
batch 256, shuffle on. The server runs as ``datamill serve ROOT --no-auth`` in its own process
(uvicorn with uvloop + httptools when installed); each client process iterates its rank of one
static iteration with :class:`datamill.serve.RemoteLoader` (``collate="numpy"``, the Loader's
default).

Measured in one run: the in-process Loader; server-built (``--build-workers 1`` and ``2``) and
direct mode (``transport="direct"``: the clients build their batches from the dataset's client
location), each with 1, 2 and 4 client processes; then a **coordination test**: 32 direct-mode
client processes that acknowledge each lease with their next request without reading anything (lease
round trips/s the server sustains, p50/p99 lease latency, server RSS). The goals are printed with
met / NOT met; the load average before and after is printed, since the machine may be shared.

Reported per client count: aggregate samples/s (all samples / wall time from the first client's
start to the last client's end), p50/p99 of the time each batch took to arrive as seen by the
training loop, and the server's peak RSS (``VmHWM``). lavender-data is measured on the same files
when its own venv exists (``.lvenv``, see ``bench_lavender_side.py``); otherwise it is skipped with
a note.

Scale (``--scale``, also run by default after the throughput table): an epoch of **100M samples in
10k shards** (synthetic shard sizes; planning needs no data, batches are built from a synthetic
source of one int64 column) served by a :class:`~datamill.serve.server.ServeState` in a fresh
process. It prints the RSS growth over the process's baseline (VmRSS/VmHWM after ``clear_refs``) and
the epoch start (creating the iteration plus the first lease of the last rank), for two epochs, with
the first epoch driven to its end (so it is evicted); and beside it the full-order way (an int64 per
sample, as the server held each epoch before) at 10M samples, with the ratio.

Usage: ``python benchmarks/bench_serve.py [--quick] [--samples N] [--clients 1,2,4] [--coord-clients
32] [--lavender-python PATH] [--scale | --no-scale]``
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CLIENT = """
import json, sys, time
import numpy as np
from datamill.serve import RemoteLoader
url, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
name, batch = sys.argv[4], int(sys.argv[5])
transport = sys.argv[6]
loader = RemoteLoader(url, None, "bench", batch_size=batch, seed=0, rank=rank, world_size=world,
                      name=name, transport=transport)
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
                  "p50_ms": float(np.percentile(waits, 50) * 1000),
                  "p99_ms": float(np.percentile(waits, 99) * 1000),
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


def _start_server(
    root: Path, state: Path, port: int, *, build_workers: int = 0
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            str(root),
            "--no-auth",
            "--port",
            str(port),
            "--state",
            str(state),
            "--build-workers",
            str(build_workers),
            "--log-level",
            "warning",
        ],
        env=_env(),
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


def run_clients(url: str, clients: int, batch: int, *, transport: str = "built") -> dict[str, Any]:
    """``clients`` processes iterate their ranks of one static iteration; aggregate figures."""
    name = f"bench-{clients}-{time.time_ns()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, str(r), str(clients), name, str(batch), transport],
            env=_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(clients)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"client exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    samples = sum(r["samples"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "clients": clients,
        "samples": samples,
        "seconds": wall,
        "samples_per_s": samples / wall,
        "p50_ms": max(r["p50_ms"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
        "stall_s": [round(r["stall_s"], 2) for r in results],
    }


COORD = """
import http.client, json, os, secrets, sys, time, urllib.parse
import numpy as np
port, it_id, start, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
headers = {"X-Datamill-Session": secrets.token_hex(16)}
client = "coord-%d" % os.getpid()
lat, leases, waits, ack = [], 0, 0, None
time.sleep(max(0.0, start - time.time()))
end = time.monotonic() + seconds
while time.monotonic() < end:
    q = [("client", client), ("transport", "direct")] + ([("ack", ack)] if ack else [])
    t = time.perf_counter()
    conn.request("GET", "/api/v1/iterations/%s/next?%s" % (it_id, urllib.parse.urlencode(q)),
                 headers=headers)
    res = conn.getresponse()
    res.read()
    lat.append(time.perf_counter() - t)
    ack = None
    # acknowledged (whole lease) with the next request, without reading a batch
    if res.status == 200:
        leases += 1
        ack = "%s:%s" % (res.getheader("X-Datamill-Lease"), res.getheader("X-Datamill-Fence"))
    elif res.status == 204:
        break
    else:
        waits += 1
        time.sleep(0.005)
print(json.dumps({"leases": leases, "waits": waits, "lat": [float(np.percentile(lat, 50)),
                  float(np.percentile(lat, 99))], "n": len(lat), "all": lat}))
"""


@contextlib.contextmanager
def _server(
    root: Path, build_workers: int, *, location: str | None = None
) -> Iterator[tuple[str, int]]:
    """A ``datamill serve`` process with ``build_workers``; the bench dataset registered; a warm-up
    run."""
    port = _free_port()
    state = root / f"state-{build_workers}-{time.time_ns()}"
    server = _start_server(root, state, port, build_workers=build_workers)
    try:
        from datamill.serve import Client

        url = f"http://127.0.0.1:{port}"
        with Client(url) as client:
            client.register("dataset", name="bench", client_location=location)
        run_clients(
            url, 1, 256, transport="direct" if location else "built"
        )  # warm-up: imports, first reads
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(timeout=60)


def _rss_mib(pid: int) -> tuple[float, float]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1]) / 1024
    return out.get("VmRSS", float("nan")), out.get("VmHWM", float("nan"))


def run_coordination(url: str, pid: int, *, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` processes take direct-mode leases (16 batches of 1 sample) and acknowledge each
    whole lease with the next request, reading nothing: the server's lease round trips per
    second."""
    import numpy as np

    from datamill.serve import Client

    with Client(url) as client:
        info = client.iteration(
            "bench",
            batch_size=1,
            mode="dynamic",
            lease_size=16,
            name=f"coord-{time.time_ns()}",
            transport="direct",
        )
    port = int(url.rsplit(":", 1)[1])
    start = (
        time.time() + 2.0 + 0.1 * clients
    )  # every process started and connected before the clock runs
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COORD, str(port), info["id"], str(start), str(seconds)],
            env=_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(clients)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"coordination client exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    lat = np.concatenate([np.asarray(r["all"]) for r in results]) * 1000
    leases = sum(r["leases"] for r in results)
    now, peak = _rss_mib(pid)
    return {
        "clients": clients,
        "leases": leases,
        "seconds": seconds,
        "leases_per_s": leases / seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "waits": sum(r["waits"] for r in results),
        "server_rss_mib": now,
        "server_peak_mib": peak,
    }


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
warm = st.create_iteration({"dataset": "synthetic", "batch_size": 7, "epoch": 0, "name": "warm-up",
                           "seed": 1})
st.next_lease(st.iteration(warm["id"]), "w")
# the earlier way: the epoch's order and a rank's plan (an int64 per sample, and more), then 16
# batches
if full:
    from datamill.loader import BatchService
    svc = BatchService(Synthetic(), batch_size=batch, collate="arrow")
    # the same warm-up
    list(BatchService(Synthetic(), batch_size=7, seed=1, collate="arrow").build(0, 0, [0]))
    base = rss()["VmRSS"]
    open("/proc/self/clear_refs", "w").write("5")
    t = time.perf_counter()
    svc.plan(0, world - 1, world)
    list(svc.build(0, world - 1, range(16), world_size=world))
    print(json.dumps({"full": True, "epoch_start_s": time.perf_counter() - t,
                      "rss_growth_mib": rss()["VmRSS"] - base,
                      "peak_growth_mib": rss()["VmHWM"] - base}))
    sys.exit(0)
base = rss()["VmRSS"]
open("/proc/self/clear_refs", "w").write("5")
out = {"full": False, "epochs": []}
for epoch in range(2):
    t = time.perf_counter()
    info = st.create_iteration({"dataset": "synthetic", "batch_size": batch, "epoch": epoch,
                                "world_size": world, "name": "scale", "lease_size": 16})
    it = st.iteration(info["id"])
    first = st.next_lease(it, "c%d" % (world - 1), rank=world - 1)
    start_s = time.perf_counter() - t
    row = {"epoch": epoch, "epoch_start_s": start_s, "units": it.total,
           "first_lease_batches": len(first.units),
           "rss_after_start_mib": rss()["VmRSS"] - base}
    # an iteration of the epoch driven to its end (bookkeeping and journal, no batch built)
    if epoch == 0:
        t = time.perf_counter()
        info = st.create_iteration({"dataset": "synthetic", "batch_size": batch, "epoch": epoch,
                                    "world_size": world, "name": "drain", "lease_size": 4096})
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


def run_scale(
    samples: int, shards: int, *, world: int = 8, batch: int = 256, full: bool = False
) -> dict[str, Any]:
    """The scale measurement in a fresh process (its RSS is the server's)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            SCALE,
            str(samples),
            str(shards),
            str(world),
            str(batch),
            str(int(full)),
        ],
        check=False,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
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
    print(
        f"scale: {samples:,} samples in {shards:,} shards, world 8, batch 256 ({e0['units']:,} "
        "batches per epoch)"
    )
    print(
        "  epoch start (create + first lease of the last rank): epoch 0 "
        f"{e0['epoch_start_s']:.3f} s, "
        f"epoch 1 {e1['epoch_start_s']:.3f} s  (goal < 0.5 s)"
    )
    print(
        f"  server RSS growth {lazy['rss_growth_mib']:.1f} MiB, peak "
        f"{lazy['peak_growth_mib']:.1f} MiB over the "
        "baseline (goal < 100 MiB); an epoch-0 iteration driven to its end in "
        f"{e0['finish_s']:.1f} s "
        f"and evicted from memory: {e0['evicted']}"
    )
    print(
        f"  at {ref_n:,} samples (epoch start = plan + first 16 batches): held per shard "
        f"{small['epochs'][0]['epoch_start_s']:.3f} s, peak "
        f"{small['peak_growth_mib']:.1f} MiB; full order (one int64 per sample, the earlier way) "
        f"{ref['epoch_start_s']:.3f} s, peak {ref['peak_growth_mib']:.1f} MiB; ratio full / per "
        "shard: "
        f"time {ref['epoch_start_s'] / max(1e-9, small['epochs'][0]['epoch_start_s']):,.0f}x, "
        f"peak memory {ref['peak_growth_mib'] / max(0.1, small['peak_growth_mib']):,.1f}x"
    )
    return {"scale": lazy, "scale_small": small, "full_order_small": ref}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 100k samples, clients 1,2, 8 coordination clients for 3 s, no scale "
        "figures",
    )
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--clients", default=None, help="comma-separated client counts (default 1,2,4)")
    ap.add_argument(
        "--lavender-python",
        type=Path,
        default=HERE.parent / ".lvenv/bin/python",
        help="Python of a venv with lavender-data (default: .lvenv/bin/python, skipped if absent)",
    )
    ap.add_argument("--lavender-batches", type=int, default=100)
    ap.add_argument(
        "--coord-clients",
        type=int,
        default=None,
        help="client processes of the coordination test (default 32; --quick: 8)",
    )
    ap.add_argument(
        "--scale",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only the 100M-sample scale figures (--no-scale: only throughput; default: both)",
    )
    args = ap.parse_args(argv)
    if args.scale:
        print(json.dumps(scale_report()))
        return
    bl = _bench_loader()
    n = args.samples or (100_000 if args.quick else 1_000_000)
    counts = [int(c) for c in (args.clients or ("1,2" if args.quick else "1,2,4")).split(",")]
    print(
        f"machine: {os.cpu_count()} cpus, {platform.platform()}, python {platform.python_version()}"
    )
    print(
        f"data: {n:,} samples, 3 shardsets x {bl.SHARDS} shards (extra: 10% missing), batch "
        f"{bl.BATCH}, shuffle on"
    )
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = Path(tmp)
        files = bl.make_data(root, n)
        source, kind = bl.shards_source(root, files)
        print(f"source: {kind}", flush=True)
        bl.warm_up(source)
        load = os.getloadavg()
        local = bl.run_datamill(source, 0)
        local_sps = local["samples"] / local["seconds"]
        location = str((root / "dataset").resolve())
        built: dict[int, list[dict[str, Any]]] = {}
        for workers in (1, 2):
            with _server(root, workers) as (url, pid):
                built[workers] = [run_clients(url, c, bl.BATCH) for c in counts]
                rss = _peak_rss_mib(pid)
        with _server(root, 0, location=location) as (url, pid):
            direct = [run_clients(url, c, bl.BATCH, transport="direct") for c in counts]
            coord = run_coordination(
                url,
                pid,
                clients=args.coord_clients or (8 if args.quick else 32),
                seconds=3.0 if args.quick else 10.0,
            )
        lav = None
        if args.lavender_python.exists():
            lav = bl.run_lavender(args.lavender_python, root, args.lavender_batches)
    print(
        f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (other jobs share this machine)"
    )
    print(f"{'in-process Loader':<36} {local_sps:>12,.0f} samples/s")

    def line(label: str, r: dict[str, Any]) -> None:
        print(
            f"{label:<36} {r['samples_per_s']:>12,.0f} samples/s  "
            f"{r['samples_per_s'] / local_sps:5.2f}x  "
            f"({r['samples']:,} samples in {r['seconds']:.2f} s; per batch p50 "
            f"{r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms; stall {r['stall_s']} s)"
        )

    for workers, rows in built.items():
        for r in rows:
            line(f"server-built, {workers} build worker(s), {r['clients']} client(s)", r)
    for r in direct:
        line(f"direct, {r['clients']} client(s)", r)
    print(
        f"server peak RSS {rss:,.0f} MiB (VmHWM of the HTTP process, 2 build workers, not "
        "counting them)"
    )
    print(
        f"coordination: {coord['clients']} direct-mode client processes acknowledging without "
        "reading: "
        f"{coord['leases_per_s']:,.0f} lease round trips/s ({coord['leases']:,} in "
        f"{coord['seconds']:.1f} s; "
        f"latency p50 {coord['p50_ms']:.2f} ms, p99 {coord['p99_ms']:.2f} ms; {coord['waits']} "
        "waits); "
        f"server RSS {coord['server_rss_mib']:,.0f} MiB (peak {coord['server_peak_mib']:,.0f} MiB)"
    )
    one = {w: next((r for r in rows if r["clients"] == 1), None) for w, rows in built.items()}
    two = {w: next((r for r in rows if r["clients"] == 2), None) for w, rows in built.items()}
    d1 = next((r for r in direct if r["clients"] == 1), None)
    goals = []
    if d1 is not None:
        goals.append(("direct, 1 client >= 0.9x in-process", d1["samples_per_s"] / local_sps, 0.9))
    for w, r1 in one.items():
        if r1 is not None:
            goals.append(
                (
                    f"server-built ({w} worker(s)), 1 client >= 0.7x in-process",
                    r1["samples_per_s"] / local_sps,
                    0.7,
                )
            )
    one2, two2 = one.get(2), two.get(2)
    if one2 is not None and two2 is not None:
        goals.append(
            (
                "server-built (2 workers): 2 clients / 1 client > 1",
                two2["samples_per_s"] / one2["samples_per_s"],
                1.0,
            )
        )
    goals.append(("lease round trips/s >= 2,000", coord["leases_per_s"], 2000))
    for label, got, want in goals:
        print(
            f"goal: {label}: {got:,.2f} -> "
            f"{'met' if got >= want and (want != 1.0 or got > want) else 'NOT met'}"
        )
    best = max(r["samples_per_s"] for r in direct + [x for rows in built.values() for x in rows])
    if lav is None:
        print(f"lavender-data: no venv at {args.lavender_python}; not measured in this run")
    elif "error" in lav:
        print(f"lavender-data: failed: {lav['error']}")
    else:
        print(
            f"lavender-data {lav['lavender_version']}: {lav['samples_per_s']:,.0f} samples/s "
            f"({lav['batches']} batches); ratio datamill serve / lavender: "
            f"{best / lav['samples_per_s']:,.0f}x"
        )
    rows = [x for rs in built.values() for x in rs]
    scale = scale_report() if args.scale is None and not args.quick else None
    print(
        json.dumps(
            {
                "samples": n,
                "local_samples_per_s": local_sps,
                "serve": rows,
                "built": built,
                "direct": direct,
                "coordination": coord,
                "load_before": load,
                "load_after": os.getloadavg(),
                "server_peak_rss_mib": rss,
                "lavender": lav,
                "scale": scale,
            }
        )
    )


if __name__ == "__main__":
    main()
