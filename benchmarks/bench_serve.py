"""``datamill serve`` throughput: 1, 2 and 4 client processes over loopback vs the in-process
Loader, measured in A/B pairs.

Data: ``bench_loader.py``'s dataset (3 shardsets x 100 shards, 10% of samples missing from one),
batch 256, shuffle on. Each server runs as ``datamill serve ROOT --no-auth`` in its own process and
its own session, as a service does (so that with Linux's autogroup scheduling its CPU does not come
out of the share of the benchmark's session, where the in-process Loader and the clients run);
uvicorn with uvloop + httptools when installed. Each client process iterates its rank of one static
iteration with :class:`datamill.serve.RemoteLoader` (``collate="numpy"``, the Loader's default) for
two epochs: the first is **cold** (the process joins, opens the dataset, plans), the second
**warm**, like the in-process Loader, whose source is open and warm; the goals use the warm epoch.
Every client starts an epoch at the same moment (a barrier through the clients' stdin, as DDP ranks
start an epoch together), so the aggregate's wall time is the epoch's own, not stretched by how much
later one client finished its cold epoch than another.

Measured in one run, in A/B pairs: every configuration (server-built with ``--build-workers 1``
and ``2``, and direct mode, ``transport="direct"``, each with 1, 2 and 4 client processes) runs
right after an in-process Loader run, ``--reps`` times (default 3); each pair gives a ratio taken
at the same moment of the machine's load, and the medians are reported with the load of each pair.
Then a **coordination test**: 32 direct-mode client processes that acknowledge each lease with their
next request without reading anything (lease round trips/s the server sustains, p50/p99 lease
latency, server RSS). Server-built mode's goal is printed once more for rep 0's epoch 2 alone: the
first pass of a server's build workers over an epoch (as every epoch of a training run is; later
reps go over epochs the same server built before). The goals are printed with met / NOT met; the
load average before and after is printed, since the machine may be shared.

Reported per configuration: aggregate samples/s (all samples / wall time from the first client's
start to the last client's end), the time to the first batch, p50/p99 of the time each batch took
to arrive as seen by the training loop, the clients' stall (waiting for a lease) and CPU seconds,
and the server's peak RSS (``VmHWM``). lavender-data is measured on the same files when its own venv
exists (``.lvenv``, see ``bench_lavender_side.py``); otherwise it is skipped with a note.

Scale (``--scale``, also run by default after the throughput table): an epoch of **100M samples in
10k shards** (synthetic shard sizes; planning needs no data, batches are built from a synthetic
source of one int64 column) served by a :class:`~datamill.serve.server.ServeState` in a fresh
process. It prints the RSS growth over the process's baseline (VmRSS/VmHWM after ``clear_refs``) and
the epoch start (creating the iteration plus the first lease of the last rank), for two epochs, with
the first epoch driven to its end (so it is evicted); and beside it the full-order way (an int64 per
sample, as the server held each epoch before) at 10M samples, with the ratio.

Datasets (``--datasets``, default ``loader,many``): ``loader`` above, and ``many``: **one shardset
of 40 Parquet shards**, 2M samples (``--many-samples``; uid, 16 float32, a label), the dataset issue
#41 measured direct mode on; ``img`` (not by default; ``--img-samples``, 200k): 3 KB binary samples,
for what a lease's bytes cost (printed without goals). Every run is ``--epochs`` epochs (default 3)
in-process and served, and **every epoch** is reported with its ratio (epoch 0 of both opens the
dataset: the in-process Loader's epoch 0 counts ``ShardsetDataset(path)``, as a client's first epoch
counts its join and open; the in-process Loader runs in a new process with the clients' imports done
before the clock, as each client does, so that both epoch 0s pay a new process's first calls alike:
``--warm-inprocess`` runs it in the benchmark's warmed-up process as before); the direct-mode goal
(>= 0.9x) is checked on each epoch of each dataset. CI-sized:
``--quick`` (100k and 200k samples, 1 repetition) or ``--samples``/``--many-samples``.

Usage: ``python benchmarks/bench_serve.py [--quick] [--samples N] [--clients 1,2,4] [--reps 3]
[--datasets loader,many,img] [--many-samples N] [--img-samples N] [--epochs 3]
[--modes built1,built2,direct] [--ack-window N] [--lease-size N] [--step-ms MS] [--coord-clients 32]
[--lavender-python PATH]
[--scale | --no-scale]``; e.g. the data-path goals alone: ``--clients 1,2 --reps 3 --no-scale
--coord-clients 0``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import bench_coord  # the coordination test (one copy, both benchmarks)

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CLIENT = """
import json, os, sys, time
import numpy as np
from datamill.client import Leases, RemoteLoader, Transport
import importlib
import datamill.loader, datamill.shards  # imported before the clock, as in the in-process run
from datamill.loader.sources import PROVIDERS
for module in PROVIDERS:  # open_source's one-time imports of every format (~0.25 s: pandas...)
    importlib.import_module(module)  # are a process's start, not an epoch's: before the clock too
url, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
name, batch, transport, epochs = sys.argv[4], int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
window = os.environ.get("BENCH_ACK_WINDOW")  # --ack-window (the loader's default when unset)
size = os.environ.get("BENCH_LEASE_SIZE")  # --lease-size (the loader's choice when unset)
step = float(os.environ.get("BENCH_STEP_S", "0"))  # --step-ms: the training step, a sleep
loader = RemoteLoader(url, None, "bench", batch_size=batch, seed=0, rank=rank,
                      leases=Leases(world_size=world, name=name, size=int(size) if size else None),
                      transport=Transport(transport, ack_window=int(window) if window else 1))
out = []
for epoch in range(epochs):  # epoch 0: cold (joins, opens the dataset); then warm
    print("ready", flush=True)  # every client starts the epoch at once, as DDP ranks do
    sys.stdin.readline()
    waits, n = [], 0
    stall0, build0 = loader.stall_s, loader.stats["build_s"]
    start, cpu = time.time(), time.process_time()
    t = time.perf_counter()
    for b in loader:
        now = time.perf_counter()
        waits.append(now - t)
        n += len(b["uid"])
        if step:
            time.sleep(step)
        t = time.perf_counter()
    end = time.time()
    out.append({"samples": n, "batches": len(waits), "start": start, "end": end,
                "cpu_s": time.process_time() - cpu,
                "first_s": waits[0], "p50_ms": float(np.percentile(waits, 50) * 1000),
                "p99_ms": float(np.percentile(waits, 99) * 1000),
                "stall_s": loader.stall_s - stall0,
                "build_s": loader.stats["build_s"] - build0})
print(json.dumps(out))
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


SERVER_SESSION = True
"""Start the server in its own session (``--same-session``: in the benchmark's)."""


def _start_server(
    root: Path, state: Path, port: int, *, build_workers: int = 0
) -> subprocess.Popen[bytes]:
    # its own session, as a service runs: with Linux's autogroup scheduling (one CPU share per
    # session) the server's CPU then does not come out of the share of the benchmark's session,
    # where the in-process Loader and the client processes run
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
        start_new_session=SERVER_SESSION,
    )
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def run_together(script: str, argvs: Sequence[Sequence[str]], epochs: int) -> list[Any]:
    """One process of ``python -c script`` per argv, every epoch started in all of them at once (a
    barrier through their stdin: each prints ``ready`` and waits for a line, as DDP ranks start an
    epoch together); the JSON of each one's last line of output."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    for _ in range(epochs):  # a barrier: the epoch starts when every process is ready for it
        for p in procs:
            assert p.stdout is not None
            while (line := p.stdout.readline()) and line.strip() != "ready":
                pass
            if not line:
                raise RuntimeError(f"benchmark process exited with {p.wait()}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"benchmark process exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run_clients(
    url: str, clients: int, batch: int, *, transport: str = "built", epochs: int = 2
) -> dict[str, Any]:
    """``clients`` processes iterate their ranks of one static iteration for ``epochs`` epochs; the
    aggregate figures of the first epoch (``cold``: the processes join, open the dataset and plan)
    and of the last one (``warm``, the figure compared with the in-process Loader, whose source is
    open and warm too)."""
    name = f"bench-{clients}-{time.time_ns()}"
    results = run_together(
        CLIENT,
        [
            [url, str(r), str(clients), name, str(batch), transport, str(epochs)]
            for r in range(clients)
        ],
        epochs,
    )

    def agg(epoch: int) -> dict[str, Any]:
        rows = [r[epoch] for r in results]
        samples = sum(r["samples"] for r in rows)
        wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        return {
            "samples": samples,
            "seconds": wall,
            "samples_per_s": samples / wall,
            "first_batch_s": max(r["first_s"] for r in rows),
            "p50_ms": max(r["p50_ms"] for r in rows),
            "p99_ms": max(r["p99_ms"] for r in rows),
            "stall_s": [round(r["stall_s"], 2) for r in rows],
            "cpu_s": [round(r["cpu_s"], 2) for r in rows],
            "build_s": [round(r["build_s"], 2) for r in rows],
        }

    return {
        "clients": clients,
        "transport": transport,
        "cold": agg(0),
        "warm": agg(epochs - 1),
        "epochs": [agg(e) for e in range(epochs)],
    }


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
        from datamill.client import Client

        url = f"http://127.0.0.1:{port}"
        with Client(url) as client:
            client.register("dataset", name="bench", client_location=location)
        # warm-up: the server's imports and first reads
        run_clients(url, 1, 256, transport="direct" if location else "built", epochs=1)
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
    second (:func:`bench_coord.run`, plus the server's peak RSS)."""
    r = bench_coord.run(
        url, pid, clients=clients, seconds=seconds, key="", bs=sys.modules[__name__]
    )
    now, peak = _rss_mib(pid)
    return {**r, "server_rss_mib": now, "server_peak_mib": peak, "load": os.getloadavg()[0]}


SCALE = """
import asyncio, json, os, sys, tempfile, time
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
asyncio.run(st.round_trip(st.iteration(warm["id"]), "w", ()))
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
    first = asyncio.run(st.round_trip(it, "c%d" % (world - 1), (), rank=world - 1))[1]
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
                lease = it.take("c%d" % r, rank=r, now=time.monotonic())
                if lease is None:
                    break
                done = [(lease.id, lease.fence, None, None)]
                asyncio.run(st.ack_batches(it, done, client="c%d" % r))
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


MANY_SHARDS = 40
"""Shards of the one-shardset dataset (``--datasets many``)."""
DATASETS = ("loader", "many", "img")
"""``loader``: bench_loader.py's dataset (3 shardsets x 100 shards, a left join per shard);
``many``: one shardset of :data:`MANY_SHARDS` Parquet shards (uid, 16 float32, a label), the
dataset issue #41 measured direct mode on; ``img``: one shardset of 100 shards of 3 KB binary
samples (uid, a label, ``image``), as ``bench_peers.py``'s ``img``: the bytes a lease carries. The
goals are those of ``loader`` and ``many``; ``img`` is printed for comparison."""
GOAL_DATASETS = ("loader", "many")
IMAGE_BYTES = 3072


def make_img(root: Path, n: int, *, shards: int = 100, seed: int = 0) -> Path:
    """Write ``n`` samples of :data:`IMAGE_BYTES` random bytes (uid, label, image) as one shardset
    of ``shards`` Parquet shards and create its ShardsetDataset at ``root / "dataset"``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamill.shards import ShardsetDataset

    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, n, shards + 1).astype(np.int64)
    (root / "images").mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(shards):
        m = int(bounds[k + 1] - bounds[k])
        offsets = pa.py_buffer((np.arange(m + 1) * IMAGE_BYTES).astype(np.int32))
        data = pa.py_buffer(rng.integers(0, 256, m * IMAGE_BYTES, dtype=np.uint8))
        image = pa.BinaryArray.from_buffers(pa.binary(), m, [None, offsets, data])
        uid = np.arange(bounds[k], bounds[k + 1], dtype=np.int64) + 10_000_000
        path = root / "images" / f"shard.{k:05d}.parquet"
        pq.write_table(pa.table({"uid": uid, "label": uid % 10, "image": image}), path)
        files.append(str(path))
    ShardsetDataset.create(root / "dataset", files, uid="uid", shardset="images")
    return root / "dataset"


def make_many(root: Path, n: int, *, shards: int = MANY_SHARDS, seed: int = 0) -> Path:
    """Write ``n`` samples as one shardset of ``shards`` Parquet shards and create its
    ShardsetDataset at ``root / "dataset"``; returns that folder."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamill.shards import ShardsetDataset

    rng = np.random.default_rng(seed)
    uid = rng.permutation(n).astype(np.int64) + 10_000_000
    x = rng.standard_normal((n, 16), dtype=np.float32)
    label = rng.integers(0, 10, n)
    bounds = np.linspace(0, n, shards + 1).astype(np.int64)
    (root / "features").mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(shards):
        a, b = bounds[k], bounds[k + 1]
        xs = pa.FixedSizeListArray.from_arrays(pa.array(x[a:b].reshape(-1)), 16)
        path = root / "features" / f"shard.{k:05d}.parquet"
        pq.write_table(pa.table({"uid": uid[a:b], "x": xs, "label": label[a:b]}), path)
        files.append(str(path))
    ShardsetDataset.create(root / "dataset", files, uid="uid", shardset="features")
    return root / "dataset"


INPROCESS = """
import importlib, json, sys
from pathlib import Path
import datamill.loader, datamill.shards  # the client's imports before the clock (CLIENT)
from datamill.loader.sources import PROVIDERS
for module in PROVIDERS:
    importlib.import_module(module)
sys.path.insert(0, sys.argv[1])
import bench_serve
print(json.dumps(bench_serve.run_inprocess(Path(sys.argv[2]), int(sys.argv[3]),
                                           step_s=float(sys.argv[4]))))
"""
WARM_INPROCESS = False
"""``--warm-inprocess``: run the in-process Loader in the benchmark's own process (warmed up by the
dataset's first run) instead of a new process like each client's."""


def run_inprocess_fresh(location: Path, epochs: int, *, step_s: float = 0.0) -> list[Any]:
    """:func:`run_inprocess` in a new Python process with the served clients' imports done before
    the clock (:data:`CLIENT`): epoch 0 of both sides then pays the same first calls of a process
    (0.5-1 s of a 2M-sample epoch 0 on this machine, absent from a process that ran an epoch
    before); with :data:`WARM_INPROCESS` in this process."""
    if WARM_INPROCESS:
        return run_inprocess(location, epochs, step_s=step_s)
    out = subprocess.run(
        [sys.executable, "-c", INPROCESS, str(HERE), str(location), str(epochs), str(step_s)],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: list[Any] = json.loads(out.strip().splitlines()[-1])
    return result


def run_inprocess(location: Path, epochs: int, *, step_s: float = 0.0) -> list[dict[str, float]]:
    """``epochs`` epochs of one in-process Loader over the ShardsetDataset at ``location`` (batch
    256, shuffle, seed 0: the served clients' batches); epoch 0 counts opening the dataset, as a
    direct client's first epoch does."""
    from datamill.loader import Loader
    from datamill.shards import ShardsetDataset

    out = []
    t0 = time.perf_counter()
    loader = Loader(ShardsetDataset(location), 256, seed=0)
    for _ in range(epochs):
        n, first = 0, None
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            n += len(batch["uid"])
            if step_s:
                time.sleep(step_s)
        seconds = time.perf_counter() - t0
        out.append(
            {
                "samples": n,
                "seconds": seconds,
                "samples_per_s": n / seconds,
                "first_batch_s": first or 0.0,
            }
        )
        t0 = time.perf_counter()
    return out


MODES = ("built1", "built2", "direct")
"""The served configurations ``--modes`` chooses from: server-built with 1 or 2 build workers, and
direct mode."""


def _configs(counts: Sequence[int], modes: Sequence[str] = MODES) -> list[tuple[str, int, int]]:
    """(transport, build workers, clients) of every served measurement."""
    out = [("built", w, c) for w in (1, 2) if f"built{w}" in modes for c in counts]
    return out + [("direct", 0, c) for c in counts if "direct" in modes]


def _label(transport: str, workers: int, clients: int) -> str:
    if transport == "direct":
        return f"direct, {clients} client(s)"
    return f"server-built, {workers} build worker(s), {clients} client(s)"


def measure(
    location: Path,
    servers: dict[tuple[str, int], str],
    counts: Sequence[int],
    *,
    reps: int,
    modes: Sequence[str] = MODES,
    epochs: int = 3,
) -> dict[str, Any]:
    """Every configuration ``reps`` times, each right after ``epochs`` epochs of the in-process
    Loader (A/B/A/B): the ratio of each epoch of each pair, measured at the same moment of the
    machine's load, and their medians."""
    configs = _configs(counts, modes)
    pairs: dict[tuple[str, int, int], list[dict[str, Any]]] = {k: [] for k in configs}
    step = float(os.environ.get("BENCH_STEP_S", "0"))
    for rep in range(reps):
        for transport, workers, clients in configs:
            local = run_inprocess_fresh(location, epochs, step_s=step)
            r = run_clients(
                servers[(transport, workers)], clients, 256, transport=transport, epochs=epochs
            )
            load = os.getloadavg()[0]
            for e, row in enumerate(r["epochs"]):
                row["ratio"] = row["samples_per_s"] / local[e]["samples_per_s"]
            r["cold"], r["warm"] = r["epochs"][0], r["epochs"][-1]
            pairs[(transport, workers, clients)].append(
                {
                    **r,
                    "local": local,
                    "local_samples_per_s": local[-1]["samples_per_s"],
                    "load": load,
                }
            )
            per = ", ".join(
                f"e{e} {loc['samples_per_s']:,.0f} / {row['samples_per_s']:,.0f} "
                f"({row['ratio']:.2f}x)"
                for e, (loc, row) in enumerate(zip(local, r["epochs"], strict=True))
            )
            warm = r["warm"]
            print(
                f"  rep {rep}: {_label(transport, workers, clients):<44} in-process / served "
                f"samples/s: {per}; warm first batch {warm['first_batch_s']:.3f} s "
                f"(in-process {local[-1]['first_batch_s']:.3f} s), client stall "
                f"{warm['stall_s']} s, CPU {warm['cpu_s']} s; load {load:.1f}",
                flush=True,
            )
    return {
        _label(*k): {
            "transport": k[0],
            "workers": k[1],
            "clients": k[2],
            "warm_ratio": statistics.median(p["warm"]["ratio"] for p in rows),
            "cold_ratio": statistics.median(p["cold"]["ratio"] for p in rows),
            "epoch_ratios": [
                statistics.median(p["epochs"][e]["ratio"] for p in rows) for e in range(epochs)
            ],
            "epoch_samples_per_s": [
                statistics.median(p["epochs"][e]["samples_per_s"] for p in rows)
                for e in range(epochs)
            ],
            "local_epoch_samples_per_s": [
                statistics.median(p["local"][e]["samples_per_s"] for p in rows)
                for e in range(epochs)
            ],
            "warm_samples_per_s": statistics.median(p["warm"]["samples_per_s"] for p in rows),
            "local_samples_per_s": statistics.median(p["local_samples_per_s"] for p in rows),
            "loads": [round(p["load"], 1) for p in rows],
            "runs": rows,
        }
        for k, rows in pairs.items()
    }


FIRST_PASS_EPOCH = 2
"""The epoch of rep 0 reported apart as a server's first pass: the warm-up of a server (see
:func:`_server`) runs epoch 0, whose last lease starts epoch 1's build, so epoch 2 is the first
epoch a server builds only as the clients ask for it."""


def report(
    results: dict[str, dict[str, Any]], coord: dict[str, Any] | None, rss: float
) -> list[tuple[str, float, float]]:
    """Print the tables (one per dataset, every epoch) and the goals; returns ``(goal, got,
    want)``."""
    goals: list[tuple[str, float, float]] = []
    for dataset, res in results.items():
        epochs = len(next(iter(res.values()))["epoch_ratios"]) if res else 0
        print(f"dataset {dataset}: medians of the A/B pairs, samples/s in-process / served (ratio)")
        for label, r in res.items():
            cells = "  ".join(
                f"e{e} {a:>9,.0f} / {b:>9,.0f} ({x:.2f}x)"
                for e, (a, b, x) in enumerate(
                    zip(
                        r["local_epoch_samples_per_s"],
                        r["epoch_samples_per_s"],
                        r["epoch_ratios"],
                        strict=True,
                    )
                )
            )
            warm = r["runs"][len(r["runs"]) // 2]["warm"]
            print(
                f"  {label:<44} {cells}  warm first batch {warm['first_batch_s']:.3f} s  "
                f"loads {r['loads']}"
            )
        if dataset not in GOAL_DATASETS:
            continue
        d1 = res.get(_label("direct", 0, 1))
        if d1 is not None:
            goals += [
                (f"{dataset}: direct, 1 client >= 0.9x in-process (epoch {e})", x, 0.9)
                for e, x in enumerate(d1["epoch_ratios"])
            ]
        for w in (1, 2):
            r1 = res.get(_label("built", w, 1))
            if r1 is not None:
                goals.append(
                    (
                        f"{dataset}: server-built ({w} worker(s)), 1 client >= 0.7x in-process"
                        + f" (epoch {epochs - 1})",
                        r1["warm_ratio"],
                        0.7,
                    )
                )
            if r1 is not None and epochs >= FIRST_PASS_EPOCH + 1:
                # the server's warm-up built epoch 0 (and the first batches of epoch 1): in rep 0,
                # epoch 2 is the first one its build workers build, as each epoch of a training run
                # is; later reps pass over epochs the same server built before
                label = (
                    f"{dataset}: server-built ({w} worker(s)), 1 client, first pass over an "
                    f"epoch (rep 0, epoch {FIRST_PASS_EPOCH}) >= 0.7x in-process"
                )
                goals.append((label, r1["runs"][0]["epochs"][FIRST_PASS_EPOCH]["ratio"], 0.7))
        one, two = res.get(_label("built", 2, 1)), res.get(_label("built", 2, 2))
        if one is not None and two is not None:  # each as a ratio to its in-process run
            goals.append(
                (
                    f"{dataset}: server-built (2 workers): 2 clients / 1 client > 1",
                    two["warm_ratio"] / one["warm_ratio"],
                    1.0,
                )
            )
    print(
        f"server peak RSS {rss:,.0f} MiB (VmHWM of the HTTP process, 2 build workers, not "
        "counting them)"
    )
    if coord is not None:
        print(
            f"coordination: {coord['clients']} direct-mode client processes acknowledging without "
            f"reading: {coord['leases_per_s']:,.0f} lease round trips/s ({coord['leases']:,} in "
            f"{coord['seconds']:.1f} s; latency p50 {coord['p50_ms']:.2f} ms, p99 "
            f"{coord['p99_ms']:.2f} ms; {coord['waits']} waits); server RSS "
            f"{coord['server_rss_mib']:,.0f} MiB (peak {coord['server_peak_mib']:,.0f} MiB); "
            f"load {coord['load']:.1f}"
        )
        goals.append(("lease round trips/s >= 2,000", coord["leases_per_s"], 2000))
    for label, got, want in goals:
        met = got > want if want == 1.0 else got >= want
        print(f"goal: {label}: {got:,.2f} -> {'met' if met else 'NOT met'}")
    return goals


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 100k samples, clients 1,2, 1 repetition, 8 coordination clients for 3 s, "
        "no scale figures",
    )
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--clients", default=None, help="comma-separated client counts (default 1,2,4)")
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="A/B repetitions of every configuration (default 3; --quick: 1); medians are reported",
    )
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
        help="client processes of the coordination test (default 32; --quick: 8; 0: skip it)",
    )
    ap.add_argument(
        "--scale",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only the 100M-sample scale figures (--no-scale: only throughput; default: both)",
    )
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help="served configurations to measure, comma-separated from "
        f"{', '.join(MODES)} (default: all; the coordination test needs direct)",
    )
    ap.add_argument(
        "--ack-window",
        type=int,
        default=None,
        help="Transport(ack_window=N) of the served clients (default: the loader's, 1)",
    )
    ap.add_argument(
        "--lease-size",
        type=int,
        default=None,
        help="Leases(size=N) of the served clients: batches a lease (default: the loader's choice, "
        "by the dataset's bytes per sample)",
    )
    ap.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="a training step after each batch (a sleep), in-process and served alike (default 0)",
    )
    ap.add_argument(
        "--datasets",
        default=",".join(GOAL_DATASETS),
        help="datasets to measure, comma-separated from loader (3 shardsets x 100 shards), "
        f"many (one shardset of {MANY_SHARDS} shards) and img (3 KB binary samples) (default: "
        "loader,many)",
    )
    ap.add_argument(
        "--img-samples",
        type=int,
        default=None,
        help="samples of the img dataset (default 200,000; --quick: 20,000)",
    )
    ap.add_argument(
        "--many-samples",
        type=int,
        default=None,
        help="samples of the many-shard dataset (default 2,000,000; --quick: 200,000)",
    )
    ap.add_argument(
        "--warm-inprocess",
        action="store_true",
        help="run the in-process Loader in this (warmed-up) process, not in a new process with the "
        "clients' imports (the default: both sides' epoch 0 then starts a process alike)",
    )
    ap.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="epochs per run, each reported (epoch 0 opens the dataset; default 3)",
    )
    args = ap.parse_args(argv)
    global WARM_INPROCESS  # a command-line switch of this script
    WARM_INPROCESS = args.warm_inprocess
    os.environ["BENCH_STEP_S"] = str(args.step_ms / 1000)
    if args.ack_window is not None:
        os.environ["BENCH_ACK_WINDOW"] = str(args.ack_window)
    if args.lease_size is not None:
        os.environ["BENCH_LEASE_SIZE"] = str(args.lease_size)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"unknown --modes {unknown}; expected some of {', '.join(MODES)}")
    print("command: python " + " ".join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)]))
    if args.scale:
        print(json.dumps(scale_report()))
        return
    n = args.samples or (100_000 if args.quick else 1_000_000)
    n_many = args.many_samples or (200_000 if args.quick else 2_000_000)
    counts = [int(c) for c in (args.clients or ("1,2" if args.quick else "1,2,4")).split(",")]
    reps = args.reps or (1 if args.quick else 3)
    datasets = [d for d in args.datasets.split(",") if d]
    if sorted(set(datasets) - set(DATASETS)):
        ap.error(f"unknown --datasets {datasets}; expected some of {', '.join(DATASETS)}")
    print(
        f"machine: {os.cpu_count()} cpus, {platform.platform()}, python {platform.python_version()}"
    )
    print(
        f"data: loader = {n:,} samples, 3 shardsets x 100 shards (extra: 10% missing); many = "
        f"{n_many:,} samples, one shardset of {MANY_SHARDS} shards; img = 3 KB binary samples; "
        "batch 256, shuffle on, "
        f"{args.epochs} epochs per run (epoch 0 opens the dataset, in-process and served); "
        f"{reps} A/B repetition(s); ack_window {args.ack_window or 'the loader default (1)'}, "
        f"lease size {args.lease_size or 'the loader default'}, "
        f"step {args.step_ms} ms; in-process Loader in "
        f"{'this warmed-up process' if args.warm_inprocess else 'a new process like a client'}"
    )
    load = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    coord, rss, lav = None, float("nan"), None
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        for dataset in datasets:
            r = _measure_dataset(Path(tmp) / dataset, dataset, n, n_many, counts, reps, modes, args)
            results[dataset] = r["results"]
            rss = r["rss"] if r["rss"] == r["rss"] else rss
            coord = coord or r["coord"]
            lav = lav or r["lav"]
    print(
        f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (other jobs share this machine)"
    )
    goals = report(results, coord, rss)
    best = max(
        (r["warm_samples_per_s"] for res in results.values() for r in res.values()),
        default=float("nan"),
    )
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
    scale = scale_report() if args.scale is None and not args.quick else None
    print(
        json.dumps(
            {
                "samples": n,
                "many_samples": n_many,
                "reps": reps,
                "results": {
                    d: {k: {x: y for x, y in v.items() if x != "runs"} for k, v in res.items()}
                    for d, res in results.items()
                },
                "runs": {d: {k: v["runs"] for k, v in res.items()} for d, res in results.items()},
                "goals": goals,
                "coordination": coord,
                "load_before": load,
                "load_after": os.getloadavg(),
                "server_peak_rss_mib": rss,
                "lavender": lav,
                "scale": scale,
            }
        )
    )


def _measure_dataset(
    root: Path,
    dataset: str,
    n: int,
    n_many: int,
    counts: Sequence[int],
    reps: int,
    modes: Sequence[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One dataset's data written under ``root``, its servers started, every configuration
    measured (the coordination test and lavender-data on bench_loader's dataset only)."""
    bl = _bench_loader()
    root.mkdir(parents=True)
    if dataset in ("many", "img"):
        if dataset == "many":
            make_many(root, n_many)
        else:
            make_img(root, args.img_samples or (20_000 if args.quick else 200_000))
        run_inprocess(root / "dataset", 1)  # warm-up: imports and the page cache
    else:
        files = bl.make_data(root, n)
        source, kind = bl.shards_source(root, files)
        print(f"source: {kind}", flush=True)
        bl.warm_up(source)
    location = (root / "dataset").resolve()
    out: dict[str, Any] = {"rss": float("nan"), "coord": None, "lav": None}
    with contextlib.ExitStack() as stack:
        servers: dict[tuple[str, int], str] = {}
        pids: dict[tuple[str, int], int] = {}
        for key, loc in (
            (("built", 1), None),
            (("built", 2), None),
            (("direct", 0), str(location)),
        ):
            if f"{key[0]}{key[1] or ''}" in modes:
                servers[key], pids[key] = stack.enter_context(_server(root, key[1], location=loc))
        out["results"] = measure(
            location, servers, counts, reps=reps, modes=modes, epochs=args.epochs
        )
        if ("built", 2) in pids:
            out["rss"] = _peak_rss_mib(pids[("built", 2)])
        if dataset == "loader" and args.coord_clients != 0 and "direct" in modes:
            out["coord"] = run_coordination(
                servers[("direct", 0)],
                pids[("direct", 0)],
                clients=args.coord_clients or (8 if args.quick else 32),
                seconds=3.0 if args.quick else 10.0,
            )
    if dataset == "loader" and args.lavender_python.exists():
        out["lav"] = bl.run_lavender(args.lavender_python, root, args.lavender_batches)
    return out


if __name__ == "__main__":
    main()
