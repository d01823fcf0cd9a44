"""Same-hour A/B of two source trees: each benchmark run alternately from tree A and tree B.

Each run is a fresh subprocess started in the tree (``cwd=<tree>``, ``PYTHONPATH=<tree>/src``,
the tree's own ``benchmarks/<script>``), so A and B measure their own code with their own script.
The order alternates A/B, B/A, A/B, ... so neither side always runs first. Every run prints the load
average beside its figures; the summary gives each figure's median and range per side and the
ratio of the medians (B / A; for a time, below 1 means B is faster).

Usage (A: a worktree of the commit before the change, B: the branch)::

    git worktree add --detach /tmp/ab-A <commit>
    python benchmarks/bench_ab.py --a /tmp/ab-A --b . --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["BENCHES", "main"]

# name -> (script arguments, {figure: (regex with one number group, unit)})
BENCHES: dict[str, tuple[list[str], dict[str, tuple[str, str]]]] = {
    "loader": (
        [
            "bench_loader.py",
            "--quick",
            "--reference-batches",
            "20",
            "--lavender-python",
            "/nonexistent",
        ],
        {
            "Loader samples/s": (
                (
                    r"datamill Loader \(num_workers=0\)\s+[\d,]+ samples\s+[\d.]+ s\s+"
                    r"([\d,]+) samples/s"
                ),
                "/s",
            ),
            "ratio to torch+pandas": (r"ratio \(samples/s, datamill / reference\): ([\d.]+)x", "x"),
        },
    ),
    "preprocess_small": (
        ["bench_preprocess_small.py", "--quick", "--repeat", "3"],
        {
            "preprocess median s": (
                r"datamill preprocess \(read\+fit\+transform\+HDF5\+meta\): median ([\d.]+) s",
                "s",
            ),
            "in memory median s": (r"datamill in memory \(skip_save\):\s+median ([\d.]+) s", "s"),
            "ratio pandas/datamill": (r"ratio pandas / datamill: ([\d.]+)x", "x"),
            "import datamill ms": (
                r"import datamill \(fresh subprocess, best of 3\): (\d+) ms",
                "ms",
            ),
        },
    ),
    "text": (
        ["bench_text.py", "--quick", "--data", "{data}"],
        {
            "char vocab+encode s": (
                r"\| vocab build \+ encode, char \| [\d.]+ \| ([\d.]+) \|",
                "s",
            ),
            "word vocab+encode s": (
                r"\| vocab build \+ encode, word \| [\d.]+ \| ([\d.]+) \|",
                "s",
            ),
            "LM random s": (r"\| LM batches random \(32x35\) \| [\d.]+ \| ([\d.]+) \|", "s"),
            "LM sequential s": (
                r"\| LM batches sequential \(32x35\) \| [\d.]+ \| ([\d.]+) \|",
                "s",
            ),
        },
    ),
    "shards": (
        ["bench_shards.py", "--quick"],
        {
            "read_shard scan s": (
                r"datamill read_shard \(left join, all columns\)\s+([\d.]+) s",
                "s",
            ),
            "scan speed-up vs pandas": (r"scan speed-up datamill / pandas: ([\d.]+)x", "x"),
            "get warm mean ms": (r"get warm \(2000 random uids\): mean ([\d.]+) ms", "ms"),
        },
    ),
}


def run_once(tree: Path, bench: str) -> tuple[dict[str, float], float, float]:
    """Run one benchmark from ``tree``: its figures, the 1-minute load before it, its wall time."""
    args, figures = BENCHES[bench]
    data = os.environ.get("DATAMILL_DATA", str(Path(__file__).resolve().parents[2] / "shared/data"))
    args = [a.replace("{data}", data) for a in args]
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / args[0]), *args[1:]],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{bench} failed in {tree} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    out: dict[str, float] = {}
    for name, (pattern, _unit) in figures.items():
        m = re.search(pattern, proc.stdout)
        if m is None:
            sys.exit(f"{bench} in {tree}: no match for {name!r} ({pattern}) in:\n{proc.stdout}")
        out[name] = float(m.group(1).replace(",", ""))
    return out, load, wall


def main(argv: list[str] | None = None) -> None:
    """Run the benches alternately from both trees and print medians, ranges and B/A ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="tree A (the commit before)")
    ap.add_argument("--b", type=Path, required=True, help="tree B (the change)")
    ap.add_argument("--rounds", type=int, default=3, help="A/B pairs per benchmark (default 3)")
    ap.add_argument("--bench", action="append", choices=sorted(BENCHES), help="default: all")
    ns = ap.parse_args(argv)
    trees = {"A": ns.a.resolve(), "B": ns.b.resolve()}
    for side, tree in trees.items():
        commit = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        print(f"{side} = {tree} ({commit or 'not a git tree'})")
    for bench in ns.bench or list(BENCHES):
        results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
        loads: list[float] = []
        for r in range(ns.rounds):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                figs, load, wall = run_once(trees[side], bench)
                results[side].append(figs)
                loads.append(load)
                shown = "  ".join(f"{k} {v:,.4g}" for k, v in figs.items())
                print(f"[{bench}] round {r + 1} {side}: {shown}  (load {load:.2f}, {wall:.1f} s)")
        print(f"[{bench}] load average during the runs: {min(loads):.2f}-{max(loads):.2f}")
        for name in BENCHES[bench][1]:
            a = [f[name] for f in results["A"]]
            b = [f[name] for f in results["B"]]
            ma, mb = statistics.median(a), statistics.median(b)
            print(
                f"  {name:26s} A median {ma:,.4g} ({min(a):,.4g}-{max(a):,.4g})   "
                f"B median {mb:,.4g} ({min(b):,.4g}-{max(b):,.4g})   B/A {mb / ma:.2f}"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
