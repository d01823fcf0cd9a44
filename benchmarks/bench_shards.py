"""Shardset dataset: full joined scan and random get, datamill vs a straightforward pandas merge.

    .venv/bin/python benchmarks/bench_shards.py [--quick]

Synthetic data (fixed seed): N samples with random int64 UIDs, 100 shards, 3 shardsets:
``base`` (all samples: float64, int32, short string), ``extra`` (10% of samples missing: float32,
string), ``more`` (all samples: int64, list<int32> of 4). ``extra`` and ``more`` are added with
``route=True`` from shuffled tables. The pandas way reads each shardset's shard k with
``pd.read_parquet`` and left-merges them on the UID, per shard. Memory: peak RSS of the process
(``resource.getrusage``, includes data generation), and the pyarrow pool's bytes after each phase.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from datamill.shards import ShardsetDataset, check_dataset


def build(root: Path, n: int, n_shards: int) -> ShardsetDataset:
    rng = np.random.default_rng(0)
    uids = rng.choice(np.iinfo(np.int64).max // 2, size=n, replace=False).astype(np.int64)
    words = np.array(["cat", "dog", "bird", "horse", "ship", "truck", "frog", "deer"])
    base = pa.table(
        {
            "uid": uids,
            "x": rng.normal(size=n),
            "y": rng.integers(0, 1000, n).astype(np.int32),
            "name": pa.array(words[rng.integers(0, 8, n)]),
        }
    )
    ds = ShardsetDataset.create(
        root, base, uid="uid", shardset="base", shard_size=-(-n // n_shards)
    )
    keep = rng.permutation(n)[: n - n // 10]
    extra = pa.table(
        {
            "uid": uids[keep],
            "score": rng.random(len(keep)).astype(np.float32),
            "tag": pa.array(words[rng.integers(0, 8, len(keep))]),
        }
    )
    ds = ds.add("extra", extra, route=True)
    perm = rng.permutation(n)
    vals = rng.integers(0, 30000, (n, 4)).astype(np.int32)
    more = pa.table(
        {
            "uid": uids[perm],
            "z": np.arange(n, dtype=np.int64),
            "ids": pa.ListArray.from_arrays(
                pa.array(np.arange(0, 4 * n + 1, 4, dtype=np.int32)), pa.array(vals.reshape(-1))
            ),
        }
    )
    return ds.add("more", more, route=True)


def scan_datamill(ds: ShardsetDataset) -> int:
    return sum(ds.read_shard(k).num_rows for k in range(ds.num_shards))


def scan_pandas(ds: ShardsetDataset) -> int:
    root = Path(ds.loc.path)
    rows = 0
    for k in range(ds.num_shards):
        df = None
        for ss in ds.shardsets:
            part = pd.read_parquet(root / ds.shard_path(ss, k))
            df = part if df is None else df.merge(part, on="uid", how="left")
        assert df is not None
        rows += len(df)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100k samples instead of 1M")
    args = ap.parse_args()
    n, n_shards = (100_000, 100) if args.quick else (1_000_000, 100)
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.platform()}, python "
        f"{platform.python_version()}, "
        f"pyarrow {pa.__version__}, pandas {pd.__version__}"
    )
    tmp = Path(tempfile.mkdtemp())
    try:
        t0 = time.perf_counter()
        ds = build(tmp / "ds", n, n_shards)
        print(
            f"built {n:,} samples x 3 shardsets x {n_shards} shards in "
            f"{time.perf_counter() - t0:.1f} s "
            f"({sum(f.stat().st_size for f in (tmp / 'ds').rglob('*') if f.is_file()) / 1e6:.0f} "
            "MB)"
        )
        t0 = time.perf_counter()
        problems = check_dataset(tmp / "ds")
        print(f"check_dataset: {len(problems)} violations in {time.perf_counter() - t0:.2f} s")
        ds = ShardsetDataset(tmp / "ds", cache_shards=3 * n_shards)
        scan_datamill(ds)  # warm the OS page cache for both
        res = {}
        for name, fn in (
            ("datamill read_shard (left join, all columns)", scan_datamill),
            ("pandas read_parquet + merge per shard", scan_pandas),
        ):
            best = float("inf")
            for _ in range(2):
                gc.collect()
                gc.disable()  # as timeit does: no collector pauses inside either side's timing
                t0 = time.perf_counter()
                rows = fn(ds)
                best = min(best, time.perf_counter() - t0)
                gc.enable()
            assert rows == n
            res[name] = best
            print(
                f"{name:48s} {best:7.3f} s  {n / best / 1e6:6.2f} M rows/s  "
                f"(peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)"
            )
        a, b = res.values()
        print(f"scan speed-up datamill / pandas: {b / a:.1f}x")
        rng = np.random.default_rng(1)
        picks = ds.uids.take(pa.array(rng.integers(0, n, 2000))).to_pylist()
        t0 = time.perf_counter()
        for u in picks[:200]:
            ds.get(u)
        cold = (time.perf_counter() - t0) / 200
        for k in range(ds.num_shards):  # warm every shard of every shardset
            ds.get(ds.uids[int(ds.mapping.offsets[k])].as_py())
        lat = []
        for u in picks:
            t0 = time.perf_counter()
            ds.get(u)
            lat.append(time.perf_counter() - t0)
        ms = np.array(lat) * 1e3
        print(f"get (first 200, mostly cold shards): {cold * 1e3:.2f} ms mean")
        print(
            f"get warm ({len(ms)} random uids): mean {ms.mean():.3f} ms, p50 "
            f"{np.median(ms):.3f} ms, "
            f"p99 {np.percentile(ms, 99):.3f} ms"
        )
        pdf = pd.read_parquet(tmp / "ds" / "base").set_index("uid")
        t0 = time.perf_counter()
        for u in picks:
            pdf.loc[u]
        print(
            "(reference: pandas .loc on one in-memory shardset: "
            f"{(time.perf_counter() - t0) / len(picks) * 1e3:.3f} ms)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
