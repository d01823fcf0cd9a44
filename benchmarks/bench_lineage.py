"""Trace speed on a 100M-sample dataset (synthetic shard sizes), beside the straightforward way.

The record comes from a real ``Loader`` (8 ranks, batch 256, default shuffle window) over a source
that has only shard sizes; its ``until`` is set to the end of epoch 9, as a run that trained 10
epochs would write (running 10 epochs over 100M samples is not what is measured here). Measured:

* the one-time index: per epoch, the shard permutation and the generator state before each window's
  shuffle (``O(shards)`` numbers), written beside the record;
* one UID over 10 epochs, each query from a fresh ``Tracer`` (index read from disk): goal < 100 ms;
* one step -> its UIDs, fresh ``Tracer`` each time: goal < 10 ms;
* the reference: materialise one epoch's order (``shard_order``, 800 MB) and search it (as a user
  without an index would), for 1 epoch; the trace results are checked equal to it.

Usage: ``python benchmarks/bench_lineage.py [--samples 100000000] [--epochs 10] [--queries 20]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.lineage.trace import Tracer
from datamill.loader import Loader
from datamill.loader.order import shard_order, split_for_rank


class SizesOnly:
    """A Source with shard sizes only (never read: trace does not read data)."""

    def __init__(self, sizes: NDArray[np.int64]) -> None:
        self.sizes = sizes
        self.columns = ["x"]
        self.num_shards = len(sizes)

    def shard_sizes(self) -> NDArray[np.int64]:
        return self.sizes

    def read_shard(self, index: int, *, columns: Any = None) -> Any:
        raise RuntimeError("not read")

    def fingerprint(self) -> str:
        return "synthetic-" + str(int(self.sizes.sum()))


def synthetic_sizes(total: int, *, seed: int = 0) -> NDArray[np.int64]:
    """Shards of 8,000..12,000 samples (about 10,000 shards for 100M), summing to ``total``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(8_000, 12_001, size=max(1, total // 10_000 + 2)).astype(np.int64)
    cum = np.cumsum(sizes)
    k = int(np.searchsorted(cum, total))
    sizes = sizes[: k + 1].copy()
    sizes[-1] -= int(sizes.sum()) - total
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    sizes = synthetic_sizes(args.samples)
    loader = Loader(SizesOnly(sizes), args.batch_size, seed=17, world_size=args.world_size)
    record = loader.run_record()
    record["until"] = {"epoch": args.epochs, "batches_seen": 0}
    print(
        f"{args.samples:,} samples in {len(sizes):,} shards (8k..12k each); window "
        f"{loader.service.window} shards; "
        f"world {args.world_size}, batch {args.batch_size}; record {len(json.dumps(record))} bytes"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.json"
        path.write_text(json.dumps(record))
        t0 = time.perf_counter()
        Tracer(path).build_index(range(args.epochs))
        build = time.perf_counter() - t0
        index_bytes = sum(p.stat().st_size for p in (Path(tmp) / "run.json.index").iterdir())
        print(
            f"one-time index, {args.epochs} epochs: {build:.1f} s, {index_bytes / 1024:.0f} KiB "
            "on disk "
            f"({index_bytes / args.epochs / 1024:.0f} KiB per epoch)"
        )
        rng = np.random.default_rng(1)
        uid_times, step_times, uid_cpu, step_cpu = [], [], [], []
        first: list[Any] = []
        for q in range(args.queries):
            uid = int(rng.integers(args.samples))
            t0, c0 = time.perf_counter(), time.process_time()
            hits = Tracer(path).find([uid])
            uid_times.append(time.perf_counter() - t0)
            uid_cpu.append(time.process_time() - c0)
            assert len(hits) == args.epochs, (uid, len(hits))  # once per epoch without drop_last
            if q < 3:
                first.append((uid, hits[0]))
        steps_per_epoch = -(-args.samples // args.world_size // args.batch_size)
        batches: list[Any] = []
        for q in range(args.queries):
            e, r, s = (
                int(rng.integers(args.epochs)),
                int(rng.integers(args.world_size)),
                int(rng.integers(steps_per_epoch)),
            )
            t0, c0 = time.perf_counter(), time.process_time()
            b = Tracer(path).batch(rank=r, step=s, epoch=e)
            step_times.append(time.perf_counter() - t0)
            step_cpu.append(time.process_time() - c0)
            if e == 0 and len(batches) < 3:
                batches.append(b)
        while len(batches) < 3:
            r, s = int(rng.integers(args.world_size)), int(rng.integers(steps_per_epoch))
            batches.append(Tracer(path).batch(rank=r, step=s, epoch=0))
    uid_ms = statistics.median(uid_times) * 1000
    step_ms = statistics.median(step_times) * 1000
    # the reference: materialise epoch 0's order, search it
    t0 = time.perf_counter()
    order = shard_order(sizes, seed=17, epoch=0, window=loader.service.window)
    materialise = time.perf_counter() - t0
    t0 = time.perf_counter()
    for uid, hit in first:
        pos = int(np.flatnonzero(order == uid)[0])
        part = split_for_rank(np.arange(args.samples), rank=hit.rank, world_size=args.world_size)
        assert (
            part[0] <= pos < part[-1] + 1
            and pos - part[0] == hit.step * args.batch_size + hit.position
        )
    search = (time.perf_counter() - t0) / max(1, len(first))
    for b in batches:
        part = split_for_rank(order, rank=b.rank, world_size=args.world_size)
        assert b.samples == part[b.step * args.batch_size : (b.step + 1) * args.batch_size].tolist()
    ref_uid = materialise + search
    print(f"{'query':<34}{'trace ms':>10}{'reference ms':>14}{'ratio':>9}{'goal':>9}")
    print(
        f"{'one UID, ' + str(args.epochs) + ' epochs (median)':<34}{uid_ms:>10.1f}"
        f"{ref_uid * args.epochs * 1000:>14.0f}"
        f"{ref_uid * args.epochs * 1000 / uid_ms:>8.0f}x{'< 100':>9}  "
        f"{'ok' if uid_ms < 100 else 'MISSED'}"
    )
    print(
        f"{'one step -> UIDs (median)':<34}{step_ms:>10.2f}{materialise * 1000:>14.0f}"
        f"{materialise * 1000 / step_ms:>8.0f}x{'< 10':>9}  {'ok' if step_ms < 10 else 'MISSED'}"
    )
    print(
        f"reference: materialise one epoch's order {materialise:.2f} s "
        f"({order.nbytes / 2**20:.0f} MiB) + search "
        f"{search * 1000:.0f} ms, x{args.epochs} epochs for the UID; trace results equal to it "
        "(3 UIDs, 3 steps of epoch 0)"
    )
    print(
        f"p90: UID {np.quantile(uid_times, 0.9) * 1000:.1f} ms, step "
        f"{np.quantile(step_times, 0.9) * 1000:.2f} ms; "
        f"CPU time (median; wall time minus waiting for a core on a loaded machine): UID "
        f"{statistics.median(uid_cpu) * 1000:.1f} ms, step "
        f"{statistics.median(step_cpu) * 1000:.2f} ms"
    )
    print("load average " + "/".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
