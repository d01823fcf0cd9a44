"""Preprocessing benchmark: ``datamill.preprocess`` vs a straightforward pandas + Python-loop
pipeline.

Data: a seeded synthetic CSV (1,000,000 rows; 100,000 with ``--quick``) with four columns:
``cat`` (category, 50 Zipf-distributed values), ``tags`` (set, 1-5 tags of 100), ``seq`` (sequence,
5-20 tokens of 2,000), ``review`` (text, 4-15 words of 5,000 ASCII words with punctuation).

* datamill: ``datamill.preprocessing.api.preprocess(csv, config, output_dir=tmp)`` — read, fit
  vocabularies, transform, write ``.hdf5`` + ``.meta.json`` (cache cleared before the run).
* reference: ``pandas.read_csv(dtype=str)``; per column ``collections.Counter`` over Python-split
  tokens, vocabularies sorted by (-count, token), then a Python loop per row filling numpy matrices
  (category ids, int8 multi-hot set, int32 padded sequence, text char + word id matrices), written
  to HDF5 with h5py. Same parameters as datamill's defaults (most_common, length limits,
  lowercase text, ``space_punct`` words = ``re.findall(r"\\w+|[^\\w\\s]")``).

Both sides run in the same benchmark, one after the other, each in a fresh ``fork`` of this process
(so one side's allocator leftovers don't count against the other). Time = wall clock of the side.
Peak memory = the child's ``ru_maxrss`` (peak RSS) minus its RSS at the start (the fork's inherited
pages), i.e. the memory the side added. The outputs of both sides are compared array by array.

Also (issue 3): house_prices_train.csv repeated 100x (146,000 rows, 8 number/category/binary
features): first preprocess, cache reuse, and ``import datamill`` time (fresh interpreter).

Usage: .venv/bin/python benchmarks/bench_preprocess.py [--quick] [--rows N] [--skip-reference]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SEED = 1234
DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
CONFIG: dict[str, Any] = {
    "input_features": [
        {"name": "cat", "type": "category"},
        {"name": "tags", "type": "set"},
        {"name": "seq", "type": "sequence"},
        {"name": "review", "type": "text"},
    ],
    # no split, as the reference: every row fits the vocabularies (without it datamill applies
    # Ludwig's default 0.7/0.1/0.2 split and fits on the training rows only)
    "preprocessing": {"split": {"type": "none"}},
}
# datamill defaults, mirrored by the reference
CAT_MOST, SET_MOST, SEQ_MOST, SEQ_LEN = 10000, 10000, 20000, 256
CHAR_MOST, CHAR_LEN, WORD_MOST, WORD_LEN = 70, 1024, 20000, 256


# -- data -----------------------------------------------------------------------------------------
def _words(rng: np.random.Generator, n: int, prefix: str) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lens = rng.integers(2, 9, n)
    out = [
        "".join(letters[rng.integers(0, 26, k)]) for k in lens
    ]  # vocabulary only (n words), not rows
    return np.array([f"{prefix}{w}" if prefix else w for w in out], dtype=object)


def _ragged_join(
    rng: np.random.Generator, vocab: np.ndarray, n: int, lo: int, hi: int, sep: str
) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = rng.integers(lo, hi + 1, n)
    zipf = rng.zipf(1.3, int(lengths.sum())) % len(vocab)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(vocab[zipf].tolist(), pa.string()))
    return pc.binary_join(lists, sep)


def make_csv(path: Path, rows: int) -> None:
    """Write the seeded synthetic CSV (vectorised: pyarrow list join)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(SEED)
    cats = _words(rng, 50, "c_")
    cat = cats[rng.zipf(1.5, rows) % 50]
    tags = _ragged_join(rng, _words(rng, 100, "t"), rows, 1, 5, " ")
    seq = _ragged_join(rng, _words(rng, 2000, ""), rows, 5, 20, " ")
    words = _words(rng, 5000, "")
    words[:40] = np.array([",", ".", "!", "?"] * 10, dtype=object)[:40]
    words[40:60] = np.array([w.capitalize() for w in words[40:60]], dtype=object)
    review = _ragged_join(rng, words, rows, 4, 15, " ")
    table = pa.table(
        {"cat": pa.array(cat.tolist(), pa.string()), "tags": tags, "seq": seq, "review": review}
    )
    pacsv.write_csv(table, path)


# -- the two sides ---------------------------------------------------------------------------------
def run_datamill(csv: Path, out_dir: Path) -> dict[str, Any]:
    from datamill.preprocessing.api import preprocess

    res = preprocess(csv, CONFIG, output_dir=out_dir)
    assert not res.cached
    return {"hdf5": str(res.hdf5_path)}


def _vocab(counter: Counter[str], most: int, specials: list[str]) -> dict[str, int]:
    regular = sorted((t for t in counter if t not in specials), key=lambda t: (-counter[t], t))[
        :most
    ]
    return {t: i for i, t in enumerate(specials + regular)}


_WORD_RE = re.compile(r"\w+|[^\w\s]")


def run_reference(csv: Path, out_dir: Path) -> dict[str, Any]:
    import h5py
    import pandas as pd

    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    n = len(df)
    out: dict[str, np.ndarray] = {}
    # category: 0 = <UNK>
    cat = df["cat"].tolist()
    c2i = _vocab(Counter(cat), CAT_MOST, ["<UNK>"])
    out["cat"] = np.array([c2i.get(v, 0) for v in cat], dtype=np.int32)
    # set: multi-hot
    tag_lists = [s.split() for s in df["tags"].tolist()]
    s2i = _vocab(Counter(t for ts in tag_lists for t in ts), SET_MOST, ["<PAD>", "<UNK>"])
    multi = np.zeros((n, len(s2i)), dtype=np.int8)
    for i, ts in enumerate(tag_lists):
        for t in ts:
            multi[i, s2i.get(t, 1)] = 1
    out["tags"] = multi

    def padded(lists: list[list[str]], most: int, limit: int) -> tuple[np.ndarray, dict[str, int]]:
        t2i = _vocab(Counter(t for ts in lists for t in ts), most, ["<PAD>", "<UNK>"])
        length = min(max((len(ts) for ts in lists), default=0), limit)
        mat = np.zeros((len(lists), length), dtype=np.int32)
        for i, ts in enumerate(lists):
            ids = [t2i.get(t, 1) for t in ts[:length]]
            mat[i, : len(ids)] = ids
        return mat, t2i

    out["seq"], _ = padded([s.split() for s in df["seq"].tolist()], SEQ_MOST, SEQ_LEN)
    texts = [s.lower() for s in df["review"].tolist()]
    out["review_char"], _ = padded([list(s) for s in texts], CHAR_MOST, CHAR_LEN)
    out["review_word"], _ = padded([_WORD_RE.findall(s) for s in texts], WORD_MOST, WORD_LEN)
    path = out_dir / "reference.hdf5"
    with h5py.File(path, "w") as f:
        for k, v in out.items():
            f.create_dataset(k, data=v)
    return {"hdf5": str(path)}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child(fn: Callable[..., dict[str, Any]], args: tuple[Any, ...], q: Any) -> None:
    start_rss = _rss_bytes()
    t0 = time.perf_counter()
    try:
        res = fn(*args)
    except BaseException as exc:  # report to the parent, which prints it
        q.put({"error": repr(exc)})
        raise
    res["seconds"] = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    res["peak_added"] = peak - start_rss
    res["peak_abs"] = peak
    q.put(res)


def in_fork(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, args, q))
    p.start()
    res: dict[str, Any] = q.get()
    p.join()
    if "error" in res:
        raise SystemExit(f"{fn.__name__} failed: {res['error']}")
    return res


def compare(dm_path: str, ref_path: str) -> list[str]:
    import h5py

    problems = []
    with h5py.File(dm_path, "r") as a, h5py.File(ref_path, "r") as b:
        for key in b:
            x, y = a[key][()], b[key][()]
            if x.shape != y.shape or not np.array_equal(x, y):
                problems.append(
                    f"{key}: datamill {x.shape} {x.dtype} vs reference {y.shape} {y.dtype}"
                )
    return problems


# -- house prices (issue 3's second figure) --------------------------------------------------------
HOUSE_CONFIG: dict[str, Any] = {
    "input_features": [
        {"name": "LotArea", "type": "number", "preprocessing": {"normalization": "zscore"}},
        {"name": "GrLivArea", "type": "number", "preprocessing": {"normalization": "minmax"}},
        {
            "name": "LotFrontage",
            "type": "number",
            "preprocessing": {"missing_value_strategy": "fill_with_mean"},
        },
        {"name": "YearBuilt", "type": "number"},
        {"name": "MSZoning", "type": "category"},
        {"name": "Neighborhood", "type": "category"},
        {"name": "Alley", "type": "category"},
    ],
    "output_features": [{"name": "CentralAir", "type": "binary"}],
    "preprocessing": {
        "split": {"type": "none"}
    },  # the same work as the figures recorded before Ludwig's default split
}


def house_prices(tmp: Path) -> dict[str, float]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(DATA / "house_prices_train.csv")
    big = pa.concat_tables([table] * 100)
    path = tmp / "house_x100.csv"
    pacsv.write_csv(big, path)

    def first() -> dict[str, Any]:
        from datamill.preprocessing.api import preprocess

        t0 = time.perf_counter()
        r = preprocess(path, HOUSE_CONFIG, output_dir=tmp)
        t1 = time.perf_counter()
        r2 = preprocess(path, HOUSE_CONFIG, output_dir=tmp)
        t2 = time.perf_counter()
        return {"rows": r.num_rows, "first": t1 - t0, "cached": t2 - t1, "hit": r2.cached}

    res = in_fork(first)
    imports = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import datamill"], check=True)
        imports.append(time.perf_counter() - t0)
    res["import"] = min(imports)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100,000 rows instead of 1,000,000")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args()
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    os.environ.setdefault("DATAMILL_QUIET", "1")  # no progress bars in the figures
    # import everything both sides use before forking, so import memory is not counted as "added"
    import h5py  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.csv  # noqa: F401

    from datamill.preprocessing.api import preprocess  # noqa: F401
    from datamill.preprocessing.features import handler_class

    for name in ("category", "set", "sequence", "text"):
        handler_class(name)
    print(
        f"machine: {platform.platform()}, python {platform.python_version()}, "
        f"cpu_count={os.cpu_count()}"
    )
    with tempfile.TemporaryDirectory(prefix="bench_preprocess_") as d:
        tmp = Path(d)
        csv = tmp / "synthetic.csv"
        t0 = time.perf_counter()
        in_fork(lambda: (make_csv(csv, rows), {})[1])
        size = csv.stat().st_size
        print(
            f"data: {rows:,} rows, {size / 2**20:.1f} MiB CSV (seed {SEED}, generated in "
            f"{time.perf_counter() - t0:.1f} s)"
        )
        (tmp / "dm").mkdir()
        (tmp / "ref").mkdir()
        dm = in_fork(run_datamill, csv, tmp / "dm")
        print(
            f"datamill : {dm['seconds']:8.2f} s  {rows / dm['seconds']:>12,.0f} rows/s  "
            f"peak +{dm['peak_added'] / 2**20:,.0f} MiB RSS ({dm['peak_added'] / size:.2f}x the "
            "CSV; "
            f"absolute peak {dm['peak_abs'] / 2**20:,.0f} MiB)"
        )
        if not args.skip_reference:
            ref = in_fork(run_reference, csv, tmp / "ref")
            print(
                f"reference: {ref['seconds']:8.2f} s  {rows / ref['seconds']:>12,.0f} rows/s  "
                f"peak +{ref['peak_added'] / 2**20:,.0f} MiB RSS "
                f"({ref['peak_added'] / size:.2f}x the CSV; "
                f"absolute peak {ref['peak_abs'] / 2**20:,.0f} MiB)"
            )
            print(
                f"ratio    : datamill is {ref['seconds'] / dm['seconds']:.1f}x faster (goal >= "
                "10x); "
                "memory goal peak <= 3x CSV: "
                f"{'met' if dm['peak_added'] <= 3 * size else 'NOT met'}"
            )
            problems = compare(dm["hdf5"], ref["hdf5"])
            print(
                "outputs  : identical arrays (cat, tags, seq, review_char, review_word)"
                if not problems
                else "outputs  : DIFFER: " + "; ".join(problems)
            )
        hp = house_prices(tmp)
        print(
            f"house_prices x100: {hp['rows']:,} rows, 8 features: preprocess {hp['first']:.3f} "
            "s (goal < 0.3), "
            f"cache reuse {hp['cached'] * 1000:.1f} ms (hit={hp['hit']}, goal < 50 ms); "
            f"import datamill {hp['import']:.3f} s incl. interpreter start (goal < 0.5)"
        )


if __name__ == "__main__":
    main()
