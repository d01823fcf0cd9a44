"""``datamill diff``: the row-hash comparison (goal >= 5M rows/s on 2 cores) beside pandas, and the
hashing.

1. Comparison: two builds of ``--rows`` samples (int64 UIDs, 3 hashed columns) where the second has
   1% of the samples removed, 1% added and 1% changed in one column, compared from their cached
   per-row hashes (``datamill.lineage.diff._samples``), and the same question answered with pandas
   (an inner merge on the UID, column comparisons, ``isin`` for added/removed). The counts must be
   equal. With ``--string-uids`` the UIDs' hashes are cached with each build's summary (as
   ``summarize`` does) and not timed, like the row hashes; every match is checked on the strings
   (timed).
2. Hashing (the one-time pass that is cached): ``column_hash`` over the house-prices table repeated
   ``--scale`` times (81 columns of numbers and strings), rows/s.

Usage: ``python benchmarks/bench_diff.py [--rows 10000000] [--scale 100] [--string-uids]
[--reps 3] [--pandas-reps 1]`` (medians; the load average printed per round).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute
import pyarrow.csv as pacsv

from datamill.lineage.diff import BuildSummary, _samples
from datamill.lineage.rowhash import column_hash

COLS = ["a", "b", "c"]


def builds(
    rows: int, *, string_uids: bool = False
) -> tuple[BuildSummary, BuildSummary, dict[str, int]]:
    rng = np.random.default_rng(0)
    uids = rng.permutation(rows * 2)[:rows].astype(np.int64)
    hashes = {c: rng.integers(0, 2**63, size=rows, dtype=np.int64).astype(np.uint64) for c in COLS}
    k = rows // 100
    keep = np.ones(rows, dtype=bool)
    keep[rng.choice(rows, k, replace=False)] = False
    new_uids = np.setdiff1d(np.arange(rows * 2, dtype=np.int64), uids)[:k]
    b_uids = np.concatenate([uids[keep], new_uids])
    b_hashes = {
        c: np.concatenate(
            [h[keep], rng.integers(0, 2**63, size=k, dtype=np.int64).astype(np.uint64)]
        )
        for c, h in hashes.items()
    }
    changed = rng.choice(int(keep.sum()), k, replace=False)
    b_hashes["b"][changed] ^= np.uint64(1)
    perm = rng.permutation(len(b_uids))  # another shard layout: another row order
    b_uids, b_hashes = b_uids[perm], {c: h[perm] for c, h in b_hashes.items()}
    schema = dict.fromkeys(COLS, "uint64")

    def arr(x: np.ndarray) -> pa.Array:
        return (
            pa.compute.binary_join_element_wise("u", pa.array(x).cast(pa.string()), "")
            if string_uids
            else pa.array(x)
        )

    ua, ub = arr(uids), arr(b_uids)
    # string UIDs: their hashes are part of the cached summary (summarize computes them once), as
    # the row hashes
    a = BuildSummary(
        "synthetic",
        "a",
        rows,
        schema,
        "uid",
        ua,
        hashes,
        {},
        column_hash(ua) if string_uids else None,
        np.argsort(column_hash(ua), kind="stable") if string_uids else None,
    )
    b = BuildSummary(
        "synthetic",
        "b",
        len(b_uids),
        schema,
        "uid",
        ub,
        b_hashes,
        {},
        column_hash(ub) if string_uids else None,
        np.argsort(column_hash(ub), kind="stable") if string_uids else None,
    )
    return a, b, {"added": k, "removed": k, "changed": k}


def pandas_compare(a: BuildSummary, b: BuildSummary) -> dict[str, int]:
    assert a.uids is not None and b.uids is not None  # (builds() sets them)
    da = pd.DataFrame(
        {"uid": a.uids.to_numpy(zero_copy_only=False), **{c: a.hashes[c] for c in COLS}}
    )
    db = pd.DataFrame(
        {"uid": b.uids.to_numpy(zero_copy_only=False), **{c: b.hashes[c] for c in COLS}}
    )
    both = da.merge(
        db, on="uid", how="inner", suffixes=("_a", "_b")
    )  # an outer merge would turn uint64 into float
    changed = np.zeros(len(both), dtype=bool)
    for c in COLS:
        changed |= both[f"{c}_a"].to_numpy() != both[f"{c}_b"].to_numpy()
    return {
        "added": int((~db["uid"].isin(da["uid"])).sum()),
        "removed": int((~da["uid"].isin(db["uid"])).sum()),
        "changed": int(changed.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument(
        "--string-uids",
        action="store_true",
        help="string UIDs (hashed lookups) instead of dense ints",
    )
    ap.add_argument("--reps", type=int, default=3, help="rounds (median)")
    ap.add_argument(
        "--pandas-reps", type=int, default=1, help="rounds that also run pandas (slow; >= 1)"
    )
    args = ap.parse_args()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        "$ " + " ".join(["python", "benchmarks/bench_diff.py", *sys.argv[1:]]) + f"   (load {load})"
    )
    a, b, planted = builds(args.rows, string_uids=args.string_uids)
    print(
        f"comparison of two builds of {args.rows:,} samples (1% removed, 1% added, 1% changed; "
        f"3 hashed columns; {'string' if args.string_uids else 'dense int'} UIDs); {args.reps} "
        "rounds, datamill and pandas interleaved"
    )
    ours, cpus, pds = [], [], []
    ref: dict[str, int] = {}
    for r in range(args.reps):
        t0, c0 = time.perf_counter(), time.process_time()
        _, found = _samples(a, b, COLS)
        ours.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if r < max(1, args.pandas_reps):
            t0 = time.perf_counter()
            ref = pandas_compare(a, b)
            pds.append(time.perf_counter() - t0)
        got = {k: found[k] for k in ("added", "removed", "changed")}
        assert got == ref == planted, (got, ref, planted)
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"  round {r + 1}: datamill {ours[-1]:.3f} s (CPU {cpus[-1]:.3f} s)"
            + (f", pandas {pds[-1]:.2f} s" if r < max(1, args.pandas_reps) else "")
            + f" (load {load})"
        )
    t_ours, c_ours, t_pd = (float(np.median(x)) for x in (ours, cpus, pds))
    rate = (a.rows + b.rows) / t_ours
    print(f"{'median':<22}{'seconds':>9}{'rows/s':>14}")
    print(
        f"{'datamill diff':<22}{t_ours:>9.3f}{rate:>14,.0f}   goal >= 5,000,000: "
        f"{'ok' if rate >= 5e6 else 'MISSED'}"
    )
    print(
        f"{'pandas merge + isin':<22}{t_pd:>9.2f}{(a.rows + b.rows) / t_pd:>14,.0f}   ratio "
        f"{t_pd / t_ours:.1f}x"
    )
    print(f"counts equal to pandas and to what was planted: {got}")
    print(
        f"datamill diff CPU time {c_ours:.3f} s ({(a.rows + b.rows) / c_ours:,.0f} rows/s: wall "
        "time minus waiting for a core on a loaded machine)"
    )
    data = Path(os.environ.get("DATAMILL_DATA", "../shared/data")) / "house_prices_train.csv"
    table = pacsv.read_csv(data)
    big = pa.concat_tables([table] * args.scale)
    t0 = time.perf_counter()
    for name in big.column_names:
        column_hash(big.column(name))
    t_hash = time.perf_counter() - t0
    t0 = time.perf_counter()
    pd.util.hash_pandas_object(big.to_pandas(), index=False)
    t_pdh = time.perf_counter() - t0
    print(
        f"hashing (one-time, cached): house prices x{args.scale} ({big.num_rows:,} rows x "
        f"{big.num_columns} columns): "
        f"{big.num_rows / t_hash:,.0f} rows/s ({t_hash:.2f} s); pandas hash_pandas_object "
        "(to_pandas included) "
        f"{t_pdh:.2f} s, ratio {t_pdh / t_hash:.1f}x"
    )


if __name__ == "__main__":
    main()
