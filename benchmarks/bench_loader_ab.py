"""Same-hour A/B of the in-process Loader between source trees (a change against its base commit).

The data of ``bench_loader.py`` (3 shardsets of 100 Parquet shards joined on ``uid``, 10% missing
from one) is written once; then each round runs, for every tree in turn, a fresh Python process
with that tree's ``src`` first on ``PYTHONPATH``: it opens the dataset, warms up (one batch on
another seed) and times ``--epochs`` epochs of ``Loader(source, 256, seed=0)`` (shuffled, numpy
batches, ``Workers(threads=--threads)``). The trees alternate (A B A B ...) so that a change of the
machine's load hits both. Every figure is printed with the load average beside it.

A tree is a checkout (or ``git archive COMMIT | tar -x``) holding ``src/datamill``; the Loader call
used here works on both sides of the #38 change (no ``shuffle=``/``drop_last=`` keyword).

Usage: python benchmarks/bench_loader_ab.py --tree base=/tmp/base --tree new=. [--rounds 4]
       [--samples 200000] [--epochs 2] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CHILD = """
import json, os, sys, time
sys.path.insert(0, {bench!r})
from bench_loader import BATCH
from datamill.loader import Loader, Workers
from datamill.shards import ShardsetDataset
source = ShardsetDataset({dataset!r})
it = iter(Loader(source, BATCH, seed=99)); next(it); it.close()
loader = Loader(source, BATCH, seed=0, workers=Workers(threads={threads}))
load0, t0, n = os.getloadavg()[0], time.perf_counter(), 0
for _ in range({epochs}):
    for batch in loader:
        n += len(batch["uid"])
sec = time.perf_counter() - t0
import datamill
print(json.dumps({{"samples": n, "seconds": sec, "load": [load0, os.getloadavg()[0]],
                  "datamill": datamill.__file__}}))
"""


def build(tree: Path, root: Path, n: int) -> Path:
    """Write the data and the shardset dataset (with ``tree``'s datamill); returns the dataset."""
    sys.path.insert(0, str(HERE))
    from bench_loader import make_data

    files = make_data(root, n)
    code = (
        "import sys\nfrom datamill.shards import ShardsetDataset\n"
        f"files = {json.dumps({k: [str(p) for p in v] for k, v in files.items()})}\n"
        f"ds = ShardsetDataset.create({str(root / 'dataset')!r}, files['features'], uid='uid', "
        "shardset='features')\n"
        "ds = ds.add('label', files['label']).add('extra', files['extra'])\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(tree))
    return root / "dataset"


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree / "src")}


def run(tree: Path, dataset: Path, *, epochs: int, threads: int) -> dict[str, Any]:
    """One timed child process on ``tree``."""
    code = CHILD.format(bench=str(HERE), dataset=str(dataset), threads=threads, epochs=epochs)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=_env(tree),
        timeout=600,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if not str(result["datamill"]).startswith(str(tree)):
        raise SystemExit(f"{tree}: the child imported {result['datamill']}")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (two or more)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    print(
        f"{args.samples:,} samples, batch 256, {args.epochs} epochs per run, "
        f"threads {args.threads}; trees: {', '.join(f'{k}={v}' for k, v in trees)}"
    )
    rates: dict[str, list[float]] = {name: [] for name, _ in trees}
    with tempfile.TemporaryDirectory(prefix="bench-loader-ab-") as tmp:
        t = time.perf_counter()
        dataset = build(trees[0][1], Path(tmp), args.samples)
        print(f"data written in {time.perf_counter() - t:.1f} s")
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for name, tree in order:
                res = run(tree, dataset, epochs=args.epochs, threads=args.threads)
                rate = res["samples"] / res["seconds"]
                rates[name].append(rate)
                print(
                    f"round {r} {name:<8} {rate:>10,.0f} samples/s "
                    f"({res['samples']:,.0f} in {res['seconds']:.2f} s)  "
                    f"load {res['load'][0]:.2f}-{res['load'][1]:.2f}"
                )
    for name, got in rates.items():
        print(
            f"{name:<8} median {statistics.median(got):>10,.0f} samples/s  "
            f"range {min(got):,.0f}-{max(got):,.0f}"
        )


if __name__ == "__main__":
    main()
