"""One shuffled Loader epoch over Parquet, this tree against another (e.g. main), interleaved A/B.

Measures the loader's local path alone (issue 31 point 2): each run is a fresh process (imports not
timed, so the first batch includes what a cold process pays: shard reads, pyarrow.compute, pandas if
something imports it), one epoch at the default settings, batch 256, the numpy collate, and the
consumer of ``bench_peers.py`` (uids, and every image's length and first byte). Prints samples/s per
run, the median per tree, the ratio and the load average beside every figure.

    python benchmarks/bench_take.py --data ~/.cache/datamill-bench/data/img/parquet \
        --other /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import json, sys, time
import numpy as np
from datamill.core.parquet import ParquetSource
from datamill.loader import Loader
src = ParquetSource(sys.argv[1])
start = time.perf_counter(); first = None; n = 0; total = 0
for batch in Loader(src, 256, seed=0):
    if first is None:
        first = time.perf_counter() - start
    n += len(batch["uid"])
    if "image_offsets" in batch:
        offs = batch["image_offsets"]
        total += int(offs[-1]) + int(batch["image"][offs[:-1]].sum())
    elif "image" in batch:
        total += sum(len(b) + b[0] for b in batch["image"])
seconds = time.perf_counter() - start
print(json.dumps({"samples": n, "seconds": seconds, "first": first, "check": total,
                  "pandas": "pandas" in sys.modules}))
"""


def one(src: str, data: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", RUN, data], env=env, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="a folder of Parquet files")
    ap.add_argument("--other", required=True, help="the other tree's src folder (A)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    trees = {"other": args.other, "this": str(ROOT / "src")}
    rates: dict[str, list[float]] = {k: [] for k in trees}
    checks = set()
    for rep in range(args.reps):
        for name, src in trees.items():
            res = one(src, args.data)
            rate = res["samples"] / res["seconds"]
            rates[name].append(rate)
            checks.add(res["check"])
            one_min = os.getloadavg()[0]
            print(
                f"[{rep}] {name:5s} {rate:>10,.0f} samples/s, first batch {res['first']:.2f} s, "
                f"pandas imported: {res['pandas']}, load {one_min:.2f}",
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"median: other {med['other']:,.0f}, this {med['this']:,.0f} samples/s: "
        f"{med['this'] / med['other']:.2f}x; same bytes delivered: {len(checks) == 1}; "
        f"load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
