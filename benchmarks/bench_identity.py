"""Cost of a direct client's identity check (``datamill.core.identity``) per epoch.

``python benchmarks/bench_identity.py``: ``content_identity`` (what the server records at
registration) and ``check_identity`` (what a direct client runs before each epoch of a local copy)
on a 1M-row shardset of 300 shards (the shape of ``bench_serve.py``'s data), warm page cache,
median of 7.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from datamill.core.identity import check_identity, content_identity
from datamill.shards.dataset import ShardsetDataset

n = 1_000_000
d = Path(tempfile.mkdtemp()) / "ds"
uid = np.arange(n, dtype=np.int64)
t = pa.table(
    {
        "uid": uid,
        "x": np.random.default_rng(0).normal(size=n).astype(np.float32),
        "label": pa.array([f"c{i % 10}" for i in range(n)]),
    }
)
ShardsetDataset.create(d, t, uid="uid", shardset="main", shard_size=n // 300 + 1)
files = [p for p in d.rglob("*") if p.is_file()]
print(
    f"dataset: {n:,} rows, {len(files)} files, "
    f"{sum(p.stat().st_size for p in files) / 2**20:.1f} MiB"
)
t0 = time.perf_counter()
ident = content_identity(d)
reg = time.perf_counter() - t0
times: list[float] = []
for _ in range(7):
    t0 = time.perf_counter()
    check_identity(d, ident, dataset="bench")
    times.append(time.perf_counter() - t0)
med, lo, hi = (1000 * f(times) for f in (statistics.median, min, max))
print(
    f"content_identity (registration) {reg * 1000:.1f} ms; check_identity per epoch: median "
    f"{med:.1f} ms (min {lo:.1f}, max {hi:.1f}) over 7; load {os.getloadavg()}"
)
