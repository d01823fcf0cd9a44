"""House prices x100 (146,000 rows), 8 number/category/binary features: datamill vs pandas.

Measures (goals from issue #3): preprocessing time (< 0.3 s), cache reuse (< 0.05 s), and
``import datamill`` in a fresh subprocess (< 0.5 s). The reference is the straightforward pandas
way (read_csv, fillna, value_counts -> dict -> map, numpy normalization, h5py write), written here.

    .venv/bin/python benchmarks/bench_preprocess_small.py [--quick] [--repeat N]

Peak memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (whole-process high-water mark, so the
figure after each phase includes the phases before it).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DATAMILL_DATA", ROOT.parent / "shared" / "data"))

CONFIG = {
    "input_features": [
        {"name": "LotArea", "type": "number", "preprocessing": {"normalization": "zscore"}},
        {
            "name": "LotFrontage",
            "type": "number",
            "preprocessing": {
                "normalization": "minmax",
                "missing_value_strategy": "fill_with_mean",
            },
        },
        {"name": "YearBuilt", "type": "number", "preprocessing": {"normalization": "minmax"}},
        {"name": "MSZoning", "type": "category"},
        {"name": "Neighborhood", "type": "category"},
        {"name": "MSSubClass", "type": "category"},
        {"name": "CentralAir", "type": "binary"},
    ],
    "output_features": [
        {"name": "SalePrice", "type": "number", "preprocessing": {"normalization": "log1p"}}
    ],
    "preprocessing": {
        "split": {"type": "none"}
    },  # as the reference (no split); Ludwig's default would add one
}


def make_input(folder: Path, times: int) -> Path:
    """house_prices_train.csv with its data rows repeated ``times`` times."""
    lines = (DATA / "house_prices_train.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    out = folder / f"house_x{times}.csv"
    with open(out, "w", encoding="utf-8") as f:
        f.write(lines[0])
        body = "".join(lines[1:])
        f.writelines(body for _ in range(times))
    return out


def reference(path: Path, out: Path) -> None:
    """The straightforward pandas way (vectorised pandas, dict maps, numpy maths, h5py)."""
    import h5py
    import pandas as pd

    df = pd.read_csv(
        path,
        usecols=[f["name"] for f in CONFIG["input_features"] + CONFIG["output_features"]],
        keep_default_na=True,
    )
    arrays = {}
    la = df["LotArea"].astype("float64")
    arrays["LotArea"] = ((la - la.mean()) / la.std()).to_numpy(np.float32)
    lf = df["LotFrontage"].fillna(df["LotFrontage"].mean())
    arrays["LotFrontage"] = ((lf - lf.min()) / (lf.max() - lf.min())).to_numpy(np.float32)
    yb = df["YearBuilt"].astype("float64")
    arrays["YearBuilt"] = ((yb - yb.min()) / (yb.max() - yb.min())).to_numpy(np.float32)
    arrays["SalePrice"] = np.log1p(df["SalePrice"].to_numpy(np.float64)).astype(np.float32)
    for c in ("MSZoning", "Neighborhood", "MSSubClass"):
        col = df[c].astype("string").fillna("<UNK>")
        counts = col.value_counts()
        vocab = ["<UNK>"] + sorted(
            (t for t in counts.index if t != "<UNK>"), key=lambda t: (-counts[t], t)
        )
        str2idx = {t: i for i, t in enumerate(vocab)}
        arrays[c] = col.map(str2idx).fillna(0).to_numpy(np.int32)
    arrays["CentralAir"] = df["CentralAir"].str.lower().isin(["y", "yes", "true", "1"]).to_numpy()
    with h5py.File(out, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)


def import_time() -> float:
    """Seconds of ``import datamill`` in a fresh interpreter (best of 3, interpreter start
    excluded)."""
    code = "import time; t=time.perf_counter(); import datamill; print(time.perf_counter()-t)"
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            ).stdout
        )
        for _ in range(3)
    ]
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="x10 instead of x100")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    times = 10 if args.quick else 100

    from datamill.core.progress import set_quiet
    from datamill.preprocessing.api import preprocess

    set_quiet(True)
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-pre-small-"))
    try:
        path = make_input(tmp, times)
        size = path.stat().st_size
        print(
            f"input: house_prices_train.csv x{times} = {1460 * times:,} rows, {size / 1e6:.1f} MB, "
            f"{len(CONFIG['input_features']) + len(CONFIG['output_features'])} features"
        )
        preprocess(path, CONFIG, skip_save=True)  # warm-up: imports, page cache

        full, mem_only, cached, ref = [], [], [], []
        for _ in range(args.repeat):
            for p in tmp.glob("*.hdf5"):
                p.unlink()
            for p in tmp.glob("*.meta.json"):
                p.unlink()
            t = time.perf_counter()
            out = preprocess(path, CONFIG)
            full.append(time.perf_counter() - t)
            assert not out.cached
            t = time.perf_counter()
            again = preprocess(path, CONFIG)
            cached.append(time.perf_counter() - t)
            assert again.cached
            t = time.perf_counter()
            preprocess(path, CONFIG, skip_save=True)
            mem_only.append(time.perf_counter() - t)
        rss_datamill = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for _ in range(args.repeat):
            t = time.perf_counter()
            reference(path, tmp / "ref.h5")
            ref.append(time.perf_counter() - t)
        rss_ref = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        n = 1460 * times
        med = statistics.median
        print(
            f"datamill preprocess (read+fit+transform+HDF5+meta): median {med(full):.3f} s, "
            f"best {min(full):.3f} s "
            f"({n / med(full):,.0f} rows/s)  goal < 0.3 s: "
            f"{'MET' if med(full) < 0.3 else 'NOT MET'}"
        )
        print(f"datamill in memory (skip_save):                     median {med(mem_only):.3f} s")
        print(
            "datamill cache reuse:                               median "
            f"{med(cached) * 1000:.1f} ms  "
            f"goal < 50 ms: {'MET' if med(cached) < 0.05 else 'NOT MET'}"
        )
        print(
            f"pandas reference (read_csv+maps+h5py):              median {med(ref):.3f} s "
            f"({n / med(ref):,.0f} rows/s)"
        )
        print(f"ratio pandas / datamill: {med(ref) / med(full):.2f}x")
        print(
            f"peak RSS (ru_maxrss, cumulative): after datamill {rss_datamill:.0f} MB, after "
            f"reference {rss_ref:.0f} MB"
        )
        it = import_time()
        print(
            f"import datamill (fresh subprocess, best of 3): {it * 1000:.0f} ms  goal < 500 ms: "
            f"{'MET' if it < 0.5 else 'NOT MET'}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
