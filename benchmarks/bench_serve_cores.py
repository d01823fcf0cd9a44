"""How busy the machine is while server-built clients iterate: is one client already CPU-bound?

``bench_serve.py``'s "2 clients / 1 client" goal (server-built, 2 build workers) asks for more
throughput from a second client. This script starts the same server (``bench_serve``'s dataset:
1M samples, 3 shardsets, batch 256; ``--build-workers 2``) and runs 1 and then 2 client processes
for two epochs, ``--reps`` times, sampling the whole machine's busy CPU (``/proc/stat``, every 20
ms) during each warm epoch, and the CPU each process spent per 1M samples (the HTTP process and
its build workers from ``/proc/PID/stat``, each client its own): when one client already keeps most
cores busy, a second one can only share them.

Then the machine's own ceiling, with no server: the in-process Loader as one process doing the
epoch, and as 2 rank processes (``rank=r, world_size=2``) started together, each over its half; what
2 ranks get over 1 is the most 2 clients could get over 1 if serving cost nothing.

Usage: ``python benchmarks/bench_serve_cores.py [--samples 1000000] [--reps 3]`` (Linux).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import bench_serve as bs

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

RANK = """
import json, sys, time
from datamill.loader import Loader
from datamill.shards import ShardsetDataset
root, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
source, out = ShardsetDataset(root), []
for epoch in range(2):  # the first epoch warms the process up; the second is measured
    loader = Loader(source, 256, seed=0, rank=rank, world_size=world)
    print("ready", flush=True)
    sys.stdin.readline()
    start, cpu, n = time.time(), time.process_time(), 0
    for b in loader:
        n += len(b["uid"])
    out.append({"start": start, "end": time.time(), "samples": n,
                "cpu_s": time.process_time() - cpu})
print(json.dumps(out[-1]))
"""


def _cpu() -> tuple[int, int]:
    """Busy and total jiffies of the machine."""
    with open("/proc/stat", encoding="ascii") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the server, its executors' forkserver and build workers)."""
    cmd = ["pgrep", "-P", str(pid)]  # exit 1: no child
    out = subprocess.run(cmd, check=False, capture_output=True, text=True).stdout
    return [pid] + [q for child in out.split() for q in _tree(int(child))]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def ranks(dataset: Path, world: int) -> tuple[float, list[float]]:
    """``world`` in-process rank processes started together: samples/s of the measured epoch (all
    samples / the time from the first start to the last end) and each one's CPU seconds."""
    rows = bs.run_together(RANK, [[str(dataset), str(r), str(world)] for r in range(world)], 2)
    wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    return sum(r["samples"] for r in rows) / wall, [round(r["cpu_s"], 2) for r in rows]


def served(
    url: str, server: int, args: argparse.Namespace, samples: list[tuple[float, int, int]]
) -> None:
    """1 and 2 clients, ``--reps`` times: throughput, busy cores, CPU per 1M samples."""
    cores = os.cpu_count() or 1
    for rep in range(args.reps):
        for clients in (1, 2):
            pids = _tree(server)
            before = {p: _cpu_s(p) for p in pids}
            r = bs.run_clients(url, clients, 256, transport="built", epochs=2)
            end = time.time()  # the warm epoch is the last one: its wall before now
            window = [s for s in samples if end - r["warm"]["seconds"] - 0.05 <= s[0]]
            busy = (window[-1][1] - window[0][1]) / max(1, window[-1][2] - window[0][2])
            per_m = 1e6 / r["warm"]["samples"]
            # the server's processes over both epochs (2 x the samples), the clients' warm epoch
            server_s = {p: (_cpu_s(p) - before[p]) * per_m / 2 for p in pids}
            http = server_s.pop(server)
            workers = sorted((v for v in server_s.values() if v > 0.01), reverse=True)
            print(
                f"rep {rep}, {clients} client(s): warm {r['warm']['samples_per_s']:,.0f} "
                f"samples/s, {busy * cores:.2f} of {cores} cores busy; CPU per 1M samples: HTTP "
                f"process {http:.2f} s, build workers {[round(w, 2) for w in workers]} s, clients "
                f"{[round(c * per_m, 2) for c in r['warm']['cpu_s']]} s; load "
                f"{os.getloadavg()[0]:.1f}",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            samples.append((time.time(), *_cpu()))

    bl = bs._bench_loader()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source, _ = bl.shards_source(root, bl.make_data(root, args.samples))
        bl.warm_up(source)
        threading.Thread(target=sample, daemon=True).start()
        with bs._server(root, 2) as (url, server):
            served(url, server, args, samples)
        for rep in range(args.reps):
            one, cpu1 = ranks(root / "dataset", 1)
            two, cpu2 = ranks(root / "dataset", 2)
            print(
                f"rep {rep}, no server: in-process Loader, 1 process {one:,.0f} samples/s (CPU "
                f"{cpu1} s); 2 rank processes {two:,.0f} samples/s (CPU {cpu2} s): "
                f"{two / one:.2f}x; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    done.set()


if __name__ == "__main__":
    main()
