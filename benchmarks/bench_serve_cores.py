"""How busy the machine is while server-built clients iterate: is one client already CPU-bound?

``bench_serve.py``'s "2 clients / 1 client" goal (server-built, 2 build workers) asks for more
throughput from a second client. This script starts the same server (``bench_serve``'s dataset:
1M samples, 3 shardsets, batch 256; ``--build-workers 2``) and runs 1 and then 2 client processes
for two epochs, ``--reps`` times, sampling the whole machine's busy CPU (``/proc/stat``, every 20
ms) during each warm epoch: when one client already keeps most cores busy, a second one can only
share them.

Usage: ``python benchmarks/bench_serve_cores.py [--samples 1000000] [--reps 3]`` (Linux).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import bench_serve as bs


def _cpu() -> tuple[int, int]:
    """Busy and total jiffies of the machine."""
    with open("/proc/stat", encoding="ascii") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


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
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source, _ = bl.shards_source(root, bl.make_data(root, args.samples))
        bl.warm_up(source)
        threading.Thread(target=sample, daemon=True).start()
        with bs._server(root, 2) as (url, _):
            for rep in range(args.reps):
                for clients in (1, 2):
                    r = bs.run_clients(url, clients, bl.BATCH, transport="built", epochs=2)
                    end = time.time()  # the warm epoch is the last one: its wall before now
                    window = [s for s in samples if end - r["warm"]["seconds"] - 0.05 <= s[0]]
                    busy = (window[-1][1] - window[0][1]) / max(1, window[-1][2] - window[0][2])
                    print(
                        f"rep {rep}, {clients} client(s): warm {r['warm']['samples_per_s']:,.0f} "
                        f"samples/s, {busy * cores:.2f} of {cores} cores busy, "
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    done.set()


if __name__ == "__main__":
    main()
