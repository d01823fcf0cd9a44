"""``datamill check-splits`` beside pandas (exact leaks) and datasketch MinHash LSH (near-duplicate
text).

1. Exact: house prices repeated ``--scale`` times (so many rows repeat across splits), a random
   80/10/10 split, every column an input. datamill: ``check_splits``; references: pandas (an inner
   merge of validation/test on the deduplicated training rows: the leak counts, which must be
   equal) and ``DataFrame.duplicated`` over the same columns (speed only). Goal >= 1M rows/s.
2. Near-duplicate text: the BERT corpus (``wikitext2_test.raw``) lines of >= 8 words repeated
   ``--text-scale`` times with one word changed in every copy, a random 80/20 split. datamill:
   MinHash (64 values, 3-word shingles) + LSH at Jaccard 0.8; reference: ``datasketch``
   ``MinHash``/``MinHashLSH`` (64 permutations, threshold 0.8) on the first ``--ds-rows`` rows,
   both compared with the exact Jaccard of every pair either reports. Goal >= 100k rows/s; also
   reported per sentence (rows cut at ". "), BERT's unit.

Every measurement runs ``--reps`` rounds, datamill and the reference interleaved, and reports
medians with the machine's load average per round.

Usage: ``python benchmarks/bench_splits.py [--scale 100] [--text-scale 10] [--ds-rows 3000]
[--reps 3] [--only exact|near]``
(datasketch: ``pip install datasketch==2.0.0``, in the test extra).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from datamill.lineage.near import near_duplicates, signatures
from datamill.lineage.splits import check_splits

DATA = Path(os.environ.get("DATAMILL_DATA", "../shared/data"))


def _load() -> str:
    return "load " + "/".join(f"{x:.1f}" for x in os.getloadavg())


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def exact(scale: int, reps: int) -> None:
    houses = pacsv.read_csv(DATA / "house_prices_train.csv")
    table = pa.concat_tables([houses] * scale)
    rng = np.random.default_rng(0)
    split = rng.choice(3, size=table.num_rows, p=[0.8, 0.1, 0.1]).astype(np.int8)
    table = table.append_column("split", pa.array(split))
    cols = [c for c in table.column_names if c != "split"]
    df = table.to_pandas()

    def pandas_leaks() -> dict[str, int]:
        train = df[df["split"] == 0][cols].drop_duplicates()
        return {
            name: len(df[df["split"] == s][cols].merge(train, on=cols, how="inner"))
            for s, name in ((1, "validation"), (2, "test"))
        }

    n = table.num_rows
    print(
        f"exact: house prices x{scale} = {n:,} rows x {len(cols)} input columns, random 80/10/10 "
        f"split; {reps} rounds, interleaved (datamill, pandas merge, pandas duplicated)"
    )
    ours, ours_cpu, merge, dup = [], [], [], []
    for r in range(reps):
        t, c, report = _timed(lambda: check_splits(table, columns=cols, text_columns=[]))
        ours.append(t)
        ours_cpu.append(c)
        t, _, ref = _timed(pandas_leaks)
        merge.append(t)
        t, _, dups = _timed(lambda: int(df.duplicated(subset=cols).sum()))
        dup.append(t)
        got = {k: v["rows"] for k, v in report.exact.items()}
        assert got == ref, (got, ref)
        print(
            f"  round {r + 1}: datamill {ours[-1]:.3f} s, merge {merge[-1]:.3f} s, duplicated "
            f"{dup[-1]:.3f} s ({_load()})"
        )
    m, mm, md = float(np.median(ours)), float(np.median(merge)), float(np.median(dup))
    print(f"{'median':<34}{'seconds':>9}{'rows/s':>13}")
    print(
        f"{'datamill check_splits':<34}{m:>9.3f}{n / m:>13,.0f}   goal >= 1,000,000: "
        f"{'ok' if n / m >= 1e6 else 'MISSED'}"
    )
    print(f"{'pandas merge (leak reference)':<34}{mm:>9.3f}{n / mm:>13,.0f}   ratio {mm / m:.1f}x")
    print(
        f"{'pandas duplicated (speed ref.)':<34}{md:>9.3f}{n / md:>13,.0f}   ratio {md / m:.1f}x "
        f"({dups:,} duplicated rows)"
    )
    cpu = float(np.median(ours_cpu))
    print(
        f"leaking rows equal to pandas in every round: {got}; datamill CPU time {cpu:.3f} s "
        f"({n / cpu:,.0f} rows/s: wall time minus waiting for a core on a loaded machine)"
    )


def shingles(text: str, k: int = 3) -> set[str]:
    w = text.lower().split()
    return {" ".join(w[i : i + k]) for i in range(len(w) - k + 1)} or {" ".join(w)}


def jaccard(a: str, b: str) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


def near(text_scale: int, ds_rows: int, reps: int, *, sentences: bool) -> None:
    lines = [
        ln.strip() for ln in (DATA / "wikitext2_test.raw").read_text(encoding="utf-8").splitlines()
    ]
    base = [ln for ln in lines if len(ln.split()) >= 8]
    if sentences:
        base = [s.strip() for ln in base for s in ln.split(" . ") if len(s.split()) >= 8]
    rng = np.random.default_rng(1)
    rows = list(base)
    for c in range(1, text_scale):  # copies with one word changed
        for t in base:
            w = t.split()
            w[int(rng.integers(len(w)))] = f"w{c}"
            rows.append(" ".join(w))
    split = (rng.random(len(rows)) < 0.2).astype(np.int8) * 2  # 0 train, 2 test
    table = pa.table({"text": rows, "split": split})
    n = len(rows)
    unit = "sentences" if sentences else "lines"
    words = sum(len(r.split()) for r in rows)
    print(
        f"near-duplicate text: wikitext2 test {unit} x{text_scale} (one word changed per copy) = "
        f"{n:,} rows, {words / n:.0f} words per row"
    )
    times, cpus = [], []
    for r in range(reps):
        secs, cpu_s, report = _timed(
            lambda: check_splits(table, columns=["text"], text_columns=["text"], threshold=0.8)
        )
        times.append(secs)
        cpus.append(cpu_s)
        print(f"  round {r + 1}: datamill {secs:.3f} s (CPU {cpu_s:.3f} s; {_load()})")
    ours, cpu = float(np.median(times)), float(np.median(cpus))
    print(
        f"  datamill MinHash+LSH median: {ours:.3f} s, {n / ours:,.0f} rows/s "
        f"({words / ours / 1e6:.1f}M words/s)   goal >= 100,000 rows/s: "
        f"{'ok' if n / ours >= 1e5 else 'MISSED'}; {report.near['text']['test']['rows']:,} test "
        f"rows with a near-duplicate in train; CPU time {cpu:.2f} s ({n / cpu:,.0f} rows/s)"
    )
    try:
        from datasketch import MinHash, MinHashLSH
    except ImportError:
        print("  datasketch not installed: reference skipped (pip install datasketch==2.0.0)")
        return
    sub = min(ds_rows, n)
    sub_table = table.slice(0, sub)

    def datasketch() -> set[tuple[int, int]]:
        lsh = MinHashLSH(threshold=0.8, num_perm=64)
        hashes = []
        for i in range(sub):
            m = MinHash(num_perm=64, seed=1)
            m.update_batch([s.encode("utf-8") for s in shingles(rows[i])])
            hashes.append(m)
            if split[i] == 0:
                lsh.insert(str(i), m)
        theirs = set()
        for i in range(sub):
            if split[i] == 2:
                for key in lsh.query(hashes[i]):
                    if hashes[i].jaccard(hashes[int(key)]) >= 0.8:
                        theirs.add((i, int(key)))
        return theirs

    def datamill() -> set[tuple[int, int]]:
        sig = signatures(sub_table.column("text"))
        r, left, _ = near_duplicates(
            sig, np.flatnonzero(split[:sub] == 0), np.flatnonzero(split[:sub] == 2), threshold=0.8
        )
        return set(zip(r.tolist(), left.tolist()))

    t_ds, t_sub = [], []
    for r in range(reps):  # interleaved, the same rows
        secs, _, mine = _timed(datamill)
        t_sub.append(secs)
        secs, _, theirs = _timed(datasketch)
        t_ds.append(secs)
        print(
            f"  round {r + 1} on {sub:,} rows: datamill {t_sub[-1]:.3f} s, datasketch "
            f"{secs:.2f} s ({_load()})"
        )
    ms, md = float(np.median(t_sub)), float(np.median(t_ds))
    true = {p for p in mine | theirs if jaccard(rows[p[0]], rows[p[1]]) >= 0.8}
    print(
        f"  on the first {sub:,} rows (median): datamill {ms:.3f} s ({sub / ms:,.0f} rows/s), "
        f"datasketch {md:.2f} s ({sub / md:,.0f} rows/s), ratio {md / ms:.0f}x"
    )
    print(
        f"  pairs with exact Jaccard >= 0.8 among both answers: {len(true):,}; datamill found "
        f"{len(mine & true):,} (+{len(mine - true)} below 0.8), datasketch "
        f"{len(theirs & true):,} (+{len(theirs - true)} below 0.8); both found "
        f"{len(mine & theirs & true):,}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument("--text-scale", type=int, default=10)
    ap.add_argument("--ds-rows", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3, help="rounds per measurement (median)")
    ap.add_argument("--only", choices=["exact", "near"], help="run one part")
    args = ap.parse_args()
    print(
        "$ " + " ".join(["python", "benchmarks/bench_splits.py", *sys.argv[1:]]) + f"   ({_load()})"
    )
    if args.only != "near":
        exact(args.scale, args.reps)
    if args.only != "exact":
        near(args.text_scale, args.ds_rows, args.reps, sentences=False)
        near(args.text_scale, args.ds_rows, args.reps, sentences=True)


if __name__ == "__main__":
    main()
