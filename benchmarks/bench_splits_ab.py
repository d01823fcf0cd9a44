"""``check_splits`` of two source trees, A/B/A/B in one run (exact: house prices x100; near:
wikitext lines x10), each round a fresh process per tree (best of ``--best`` calls), medians and
ratios with the load average.

Usage: ``python benchmarks/bench_splits_ab.py --a /path/to/other/src [--b src] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import json, os, sys, time
import numpy as np, pyarrow as pa, pyarrow.csv as pacsv
from datamill.lineage.splits import check_splits
data, best = os.environ["DATAMILL_DATA"], int(sys.argv[1])
with open(os.path.join(data, "wikitext2_test.raw"), encoding="utf-8") as f:
    base = [ln.strip() for ln in f if len(ln.split()) >= 8]
rng = np.random.default_rng(1)
rows = list(base)
for c in range(1, 10):  # (as bench_splits.py: copies with one word changed)
    for t in base:
        w = t.split()
        w[int(rng.integers(len(w)))] = f"w{c}"
        rows.append(" ".join(w))
near = pa.table({"text": rows, "split": (rng.random(len(rows)) < 0.2).astype(np.int8) * 2})
houses = pacsv.read_csv(os.path.join(data, "house_prices_train.csv"))
exact = pa.concat_tables([houses] * 100)
split = np.random.default_rng(0).choice(3, size=exact.num_rows, p=[0.8, 0.1, 0.1]).astype(np.int8)
exact = exact.append_column("split", pa.array(split))
cols = [c for c in exact.column_names if c != "split"]
out = {}
for name, table, kw in (("near", near, dict(columns=["text"], text_columns=["text"])),
                        ("exact", exact, dict(columns=cols, text_columns=[]))):
    times = []
    for _ in range(best):
        t0 = time.perf_counter()
        report = check_splits(table, **kw)
        times.append(time.perf_counter() - t0)
    out[name], out[name + "_rows"], out[name + "_leaks"] = min(times), table.num_rows, report.leaks
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the other tree's src folder (e.g. main's)")
    ap.add_argument("--b", default=str(Path(__file__).resolve().parent.parent / "src"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--best", type=int, default=3, help="calls per process (best kept)")
    args = ap.parse_args()
    print("$ " + " ".join(["python", "benchmarks/bench_splits_ab.py", *sys.argv[1:]]))
    got: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b"):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, side)))
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.best)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            got[side].append(json.loads(done.stdout.splitlines()[-1]))
            load = "/".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"  round {r + 1} {side}: {got[side][-1]} (load {load})", flush=True)
    for part in ("near", "exact"):
        a = float(np.median([x[part] for x in got["a"]]))
        b = float(np.median([x[part] for x in got["b"]]))
        n = got["a"][0][part + "_rows"]
        same = {x[part + "_leaks"] for x in got["a"]} | {x[part + "_leaks"] for x in got["b"]}
        print(
            f"{part}: a {a * 1e3:.0f} ms ({n / a:,.0f} rows/s), b {b * 1e3:.0f} ms "
            f"({n / b:,.0f} rows/s), b/a speed {a / b:.2f}x; leaking rows {sorted(same)}"
        )


if __name__ == "__main__":
    main()
