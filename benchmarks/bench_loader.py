"""Loader benchmark: datamill's Loader vs torch DataLoader over a pandas-joined map-style dataset.

Data: N samples (1M; 100k with --quick) in 3 shardsets of 100 Parquet shards each, keyed by ``uid``:
``features`` (uid, x: 16 x float32), ``label`` (uid, label: int64), ``extra`` (uid, score: float32,
tag: int32) with 10% of the samples missing. Batch 256, shuffle on, one epoch, numpy batches.

* datamill: ``datamill.shards.ShardsetDataset`` when that package can build the dataset here, else a
  minimal in-benchmark shardset Source (per-shard left join with pyarrow ``index_in``/``take``; said
  in the output) -> ``Loader(source, 256)`` (shuffled).
* reference: pandas reads every shardset, merges them on ``uid`` (left join), a map-style
  ``Dataset`` returns one sample dict from numpy columns,
  ``torch.utils.data.DataLoader(batch_size=256, shuffle=True)`` with the default collate.

Both run in this process, one after the other, after a warm-up (imports, one datamill batch on
another seed). Time to first batch includes building the Loader / the pandas join. Peak memory =
peak RSS increase over the RSS before the side starts (sampled every 5 ms from /proc/self/statm by a
thread).

``lavender-data`` pins numpy 2.1.2 / pyarrow 19.0.1, so it lives in its own venv
(``python3 -m venv .lvenv && .lvenv/bin/pip install lavender-data tqdm``). When that venv exists
(or ``--lavender-python`` names one), ``bench_lavender_side.py`` runs in it on the same files: a
local lavender server, the three shardsets registered, ``LavenderDataLoader(shuffle=True,
batch_size=256)`` timed over ``--lavender-batches`` batches (it serves a few hundred samples/s here,
so a whole epoch would take most of an hour).

Usage: .venv/bin/python benchmarks/bench_loader.py [--quick] [--samples N] [--workers W]
       [--lavender-python PATH] [--lavender-batches N]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamill.loader import Workers

SHARDS = 100
BATCH = 256


class PeakRSS:
    """Context manager sampling RSS; ``.peak_mb`` is the peak increase over the start."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak_mb = 0.0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._rss())
            time.sleep(0.005)

    def __enter__(self) -> Self:
        gc.collect()
        self._start = self._peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._peak = max(self._peak, self._rss())
        self.peak_mb = (self._peak - self._start) / 2**20


def make_data(root: Path, n: int, seed: int = 0) -> dict[str, list[Path]]:
    """Write the 3 shardsets (100 shards each) as Parquet; returns shardset -> shard files."""
    rng = np.random.default_rng(seed)
    uid = rng.permutation(n).astype(np.int64) + 10_000_000  # uids unrelated to positions
    bounds = np.linspace(0, n, SHARDS + 1).astype(np.int64)
    x = rng.standard_normal((n, 16), dtype=np.float32)
    label = rng.integers(0, 10, n)
    present = rng.random(n) >= 0.10
    score = rng.random(n, dtype=np.float32)
    tag = rng.integers(0, 1000, n).astype(np.int32)
    files: dict[str, list[Path]] = {"features": [], "label": [], "extra": []}
    for name in files:
        (root / name).mkdir(parents=True, exist_ok=True)
    for k in range(SHARDS):
        a, b = bounds[k], bounds[k + 1]
        u = uid[a:b]
        tables = {
            "features": pa.table(
                {"uid": u, "x": pa.FixedSizeListArray.from_arrays(pa.array(x[a:b].reshape(-1)), 16)}
            ),
            "label": pa.table({"uid": u, "label": label[a:b]}),
            "extra": pa.table(
                {
                    "uid": u[present[a:b]],
                    "score": score[a:b][present[a:b]],
                    "tag": tag[a:b][present[a:b]],
                }
            ),
        }
        for name, t in tables.items():
            p = root / name / f"shard.{k:05d}.parquet"
            pq.write_table(t, p)
            files[name].append(p)
    return files


class MiniShardset:
    """Minimal shardset Source: shard k = left join of shard k of every shardset on uid."""

    def __init__(self, files: dict[str, list[Path]]) -> None:
        self.files = files
        self.base = "features"
        self._sizes = np.array(
            [pq.read_metadata(p).num_rows for p in files[self.base]], dtype=np.int64
        )
        self._cols = {
            name: [c for c in pq.read_schema(ps[0]).names if c != "uid"]
            for name, ps in files.items()
        }

    @property
    def columns(self) -> list[str]:
        return ["uid"] + [c for cs in self._cols.values() for c in cs]

    @property
    def num_shards(self) -> int:
        return len(self._sizes)

    def shard_sizes(self) -> np.ndarray:
        return self._sizes.copy()

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        want = self.columns if columns is None else list(columns)
        base = pq.read_table(self.files[self.base][index])
        out = {"uid": base.column("uid")}
        for name, cols in self._cols.items():
            chosen = [c for c in cols if c in want]
            if not chosen:
                continue
            t = (
                base
                if name == self.base
                else pq.read_table(self.files[name][index], columns=["uid", *chosen])
            )
            if name == self.base:
                out.update({c: t.column(c) for c in chosen})
                continue
            pos = pc.index_in(base.column("uid"), value_set=t.column("uid"))
            out.update({c: t.column(c).take(pos) for c in chosen})
        return pa.table({c: out[c] for c in want})

    def fingerprint(self) -> str:
        return "bench-" + str(int(self._sizes.sum()))


def shards_source(root: Path, files: dict[str, list[Path]]) -> tuple[Any, str]:
    """datamill.shards.ShardsetDataset over the files, when that package is available; else
    MiniShardset."""
    try:
        from datamill.shards import ShardsetDataset
    except ImportError:
        return MiniShardset(files), "in-benchmark MiniShardset (datamill.shards not available)"
    try:
        ds = ShardsetDataset.create(
            root / "dataset", [str(p) for p in files["features"]], uid="uid", shardset="features"
        )
        ds = ds.add("label", [str(p) for p in files["label"]])
        ds = ds.add("extra", [str(p) for p in files["extra"]])
        return ShardsetDataset(
            root / "dataset"
        ), "datamill.shards.ShardsetDataset (left join per shard)"
    except Exception as exc:  # noqa: BLE001 - API differs from what this benchmark expects: say so, fall back
        return MiniShardset(
            files
        ), f"in-benchmark MiniShardset (ShardsetDataset.create failed: {type(exc).__name__}: {exc})"


def warm_up(source: Any) -> None:
    """Import both sides' modules and run one datamill batch, so neither side pays one-time
    costs."""
    import pandas  # noqa: F401
    import torch
    import torch.utils.data  # noqa: F401

    from datamill.loader import Loader

    it = iter(Loader(source, BATCH, seed=99))
    next(it)
    it.close()


def run_datamill(source: Any, workers: int, *, step_s: float = 0.0) -> dict[str, float]:
    """One epoch of the in-process Loader (``step_s``: a training step after each batch)."""
    from datamill.loader import Loader

    with PeakRSS() as mem:
        t0 = time.perf_counter()
        loader = Loader(source, BATCH, seed=0, workers=Workers(threads=workers))  # shuffled
        it = iter(loader)
        first = next(it)
        t_first = time.perf_counter() - t0
        n = len(first["uid"])
        for batch in it:
            n += len(batch["uid"])
            if step_s:
                time.sleep(step_s)
        total = time.perf_counter() - t0
    st = loader.stats()
    return {
        "samples": n,
        "seconds": total,
        "first_batch_s": t_first,
        "peak_mb": mem.peak_mb,
        "shards_read": st["shards_read"],
        "peak_shards": st["peak_shards_in_memory"],
    }


def run_reference(files: dict[str, list[Path]], limit_batches: int | None) -> dict[str, float]:
    import pandas as pd
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Joined(Dataset):  # type: ignore[misc]
        def __init__(self) -> None:
            frames = {
                name: pd.concat([pd.read_parquet(p) for p in ps], ignore_index=True)
                for name, ps in files.items()
            }
            df = (
                frames["features"]
                .merge(frames["label"], on="uid", how="left")
                .merge(frames["extra"], on="uid", how="left")
            )
            self.uid = df["uid"].to_numpy()
            self.x = np.stack(df["x"].to_numpy()).astype(np.float32)
            self.label = df["label"].to_numpy()
            self.score = df["score"].to_numpy()
            self.tag = df["tag"].to_numpy()

        def __len__(self) -> int:
            return len(self.uid)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {
                "uid": self.uid[i],
                "x": self.x[i],
                "label": self.label[i],
                "score": self.score[i],
                "tag": self.tag[i],
            }

    with PeakRSS() as mem:
        t0 = time.perf_counter()
        ds = Joined()
        loader = DataLoader(
            ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        it = iter(loader)
        first = next(it)
        t_first = time.perf_counter() - t0
        n, b = len(first["uid"]), 1
        for batch in it:
            n += len(batch["uid"])
            b += 1
            if limit_batches and b >= limit_batches:
                break
        total = time.perf_counter() - t0
    return {"samples": n, "seconds": total, "first_batch_s": t_first, "peak_mb": mem.peak_mb}


def run_lavender(python: Path, root: Path, batches: int) -> dict[str, Any]:
    """``bench_lavender_side.py`` in lavender's own venv on the same files; its JSON result."""
    import json
    import subprocess

    side = Path(__file__).with_name("bench_lavender_side.py")
    try:
        done = subprocess.run(
            [str(python), str(side), str(root), "--batches", str(batches)],
            check=False,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            return {"error": f"no result (exit {done.returncode}): {done.stderr.strip()[-300:]}"}
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k samples instead of 1M")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument(
        "--workers", type=int, default=0, help="datamill num_workers (threads), default 0"
    )
    ap.add_argument(
        "--reference-batches",
        type=int,
        default=None,
        help="stop the reference after this many batches and extrapolate (default: full epoch)",
    )
    ap.add_argument(
        "--lavender-python",
        type=Path,
        default=Path(__file__).resolve().parents[1] / ".lvenv/bin/python",
        help="Python of a venv with lavender-data (default: .lvenv/bin/python, skipped if absent)",
    )
    ap.add_argument(
        "--lavender-batches", type=int, default=100, help="lavender batches to time (default 100)"
    )
    args = ap.parse_args(argv)
    n = args.samples or (100_000 if args.quick else 1_000_000)
    print(
        f"machine: {os.cpu_count()} cpus, {platform.platform()}, python {platform.python_version()}"
    )
    print(
        f"data: {n:,} samples, 3 shardsets x {SHARDS} shards (extra: 10% missing), batch "
        f"{BATCH}, shuffle on"
    )
    lavender = args.lavender_python if args.lavender_python.exists() else None
    if lavender is None:
        print(
            f"lavender-data: no venv at {args.lavender_python} (it needs its own: it pins numpy "
            "2.1.2 / "
            "pyarrow 19.0.1); not measured"
        )
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        t = time.perf_counter()
        files = make_data(Path(tmp), n)
        print(f"wrote the shardsets in {time.perf_counter() - t:.1f} s")
        source, kind = shards_source(Path(tmp), files)
        print(f"datamill source: {kind}")
        warm_up(source)
        ours = run_datamill(source, args.workers)
        from datamill.loader.order import default_window

        window = default_window(source.shard_sizes())
        print(
            f"datamill shuffle window: {window} shards = {window * n // SHARDS:,} samples; "
            f"shards read {ours['shards_read']:.0f}, at most {ours['peak_shards']:.0f} shards "
            "in memory at once"
        )
        ref = run_reference(files, args.reference_batches)
        lav = (
            run_lavender(lavender, Path(tmp), args.lavender_batches)
            if lavender is not None
            else None
        )

    def line(name: str, r: dict[str, float]) -> str:
        return (
            f"{name:<34} {r['samples']:>9,.0f} samples {r['seconds']:>7.2f} s "
            f"{r['samples'] / r['seconds']:>12,.0f} samples/s"
            f"  first batch {r['first_batch_s'] * 1000:>8.1f} ms  peak +{r['peak_mb']:,.0f} MiB"
        )

    print(line(f"datamill Loader (num_workers={args.workers})", ours))
    print(line("torch DataLoader + pandas merge", ref))
    ratio = (ours["samples"] / ours["seconds"]) / (ref["samples"] / ref["seconds"])
    print(
        f"ratio (samples/s, datamill / reference): {ratio:.1f}x   goals: >= 10x and >= 500,000 "
        "samples/s"
    )
    if lav is not None and "error" in lav:
        print(f"lavender-data: failed: {lav['error']}")
    elif lav is not None:
        print(
            line(
                f"lavender-data {lav['lavender_version']} ({lav['batches']} batches)",
                {**lav, "peak_mb": lav["server_peak_mib"] + lav["client_peak_mib"]},
            )
        )
        print(
            "  lavender: server + client peak RSS (absolute), setup (server start, register, "
            "sync) "
            f"{lav['setup_s']:.1f} s not counted; batches are Python lists; samples missing "
            "from a shardset "
            "are left out of its iteration"
        )
        print(
            f"ratio (samples/s, datamill / lavender-data): "
            f"{(ours['samples'] / ours['seconds']) / lav['samples_per_s']:,.0f}x"
        )


if __name__ == "__main__":
    main()
