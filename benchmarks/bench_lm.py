"""Language-model batches side by side: datamill's packing against grain's and a numpy loop.

The documents have WikiText-2's real lengths (articles split at their ``= Title =`` lines, in
words; paragraphs as a second, shorter-tailed set) resampled to ``--tokens`` tokens of random
int32 ids, in a Parquet-like in-memory table. Every packer gets the same documents:

* **datamill** ``Loader(..., packing=Packing(seq_len, strategy="best_fit" | "concat",
  window=1000))``: global steps of ``--batch`` rows with ``input_ids``, ``labels``,
  ``position_ids`` and ``segment_ids``;
* **grain** (``grain`` from PyPI, in its own venv ``/work/venvs/grain`` made here when missing):
  ``BestFitPackIterDataset`` (``num_packing_bins`` = the batch, and 1,000) and
  ``ConcatThenSplitIterDataset``, batched (tokens, segment ids and positions; no labels), over the
  same documents cut to ``seq_len`` pieces first (grain truncates longer ones);
* **packing alone** (one thread, wall clock): each window's plan (``pack_window`` /
  ``cut_stream``) and its sequences collated ``--batch`` rows at a time from in-memory tokens: the
  goal's "packing at >= 20M tokens/s on one core" (the loader lines add reading, the shuffled
  gather and the deal);
* **numpy concat-and-cut**: the hand-written loop over the flat token stream (reshape, shifted
  labels masked at boundaries, segment and position ids from a cumulative sum): the ceiling for
  ``concat``.

Then per-rank cost imbalance (max / mean per step) of datamill's deal against round-robin
(contiguous) dealing, over the packed sequences, and the deal's planning speed. Every figure is
printed with its goal and the load average (the machine is shared: wall-clock rates fall with
the load; CPU-time rates are printed beside them).

Run: ``python benchmarks/bench_lm.py`` (``--quick``: fewer tokens).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.source import TableSource
from datamill.loader import Loader, Packing
from datamill.loader.balance import (
    cost_function,
    deal,
    imbalance,
    lower_bound,
    round_robin,
    unit_costs,
)
from datamill.loader.packing import collate_units, cut_stream, pack_window

GRAIN = "grain==0.2.18"
VENV = Path(os.environ.get("DATAMILL_BENCH_VENVS", "/work/venvs")) / "grain"

GRAIN_SCRIPT = r"""
import json, sys, time
import numpy as np
import grain
from grain import experimental as gx

path, what = sys.argv[1], sys.argv[4]
seq_len, batch, bins = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
data = np.load(path)
values, offsets = data["values"], data["offsets"]
docs = [{"tokens": values[offsets[i]:offsets[i + 1]]} for i in range(len(offsets) - 1)]
ds = grain.MapDataset.source(docs).to_iter_dataset()
if what == "best_fit":
    ds = gx.BestFitPackIterDataset(ds, length_struct={"tokens": seq_len}, num_packing_bins=bins,
                                   seed=0)
else:
    ds = gx.ConcatThenSplitIterDataset(ds, length_struct={"tokens": seq_len})
ds = ds.batch(batch, drop_remainder=True)
t, c = time.perf_counter(), time.process_time()
slots = real = 0
for b in ds:
    slots += b["tokens"].size
    real += int((b["tokens_segment_ids"] > 0).sum())
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c,
                  "slots": slots, "real": real}))
"""


def load() -> float:
    return os.getloadavg()[0]


def wikitext_lengths(data: Path) -> dict[str, np.ndarray]:
    """Words per article and per paragraph of WikiText-2 (test split)."""
    text = (data / "wikitext2_test.raw").read_text(encoding="utf-8")
    arts = [a for a in re.split(r"\n = [^=\n]+ = \n", text) if a.strip()]
    paras = [ln for ln in text.split("\n") if ln.strip() and not ln.strip().startswith("=")]
    return {
        "articles": np.array([len(a.split()) for a in arts], dtype=np.int64),
        "paragraphs": np.array([len(p.split()) for p in paras], dtype=np.int64),
    }


def documents(lengths: np.ndarray, tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)``: documents with lengths resampled from ``lengths``, ~``tokens``."""
    rng = np.random.default_rng(seed)
    n = max(1, int(tokens / lengths.mean()))
    ln = rng.choice(lengths, n)
    offsets = np.concatenate([[0], np.cumsum(ln)]).astype(np.int64)
    return rng.integers(1, 50_000, int(offsets[-1])).astype(np.int32), offsets


def as_table(values: np.ndarray, offsets: np.ndarray) -> pa.Table:
    arr = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.table({"tokens": arr})


def bench_datamill(table: pa.Table, *, seq_len: int, batch: int, strategy: str) -> dict[str, Any]:
    ld = Loader(
        TableSource(table, shard_size=8192),
        batch,
        packing=Packing(seq_len=seq_len, strategy=strategy, window=1000),  # type: ignore[arg-type]
        seed=0,
    )
    total = int(pa.compute.sum(pa.compute.list_value_length(table.column("tokens"))).as_py())
    steps = max(1, total // (seq_len * batch) - 2)  # about one epoch
    it = iter(ld)
    t, c = time.perf_counter(), time.process_time()
    slots = real = 0
    for b in itertools.islice(it, steps):
        slots += b["input_ids"].size
        real += int(np.count_nonzero(b["segment_ids"]))
    return {
        "wall": time.perf_counter() - t,
        "cpu": time.process_time() - c,
        "slots": slots,
        "real": real,
    }


def bench_packing_alone(
    values: np.ndarray, offsets: np.ndarray, *, seq_len: int, batch: int, strategy: str
) -> dict[str, Any]:
    """Packing alone, one thread: plan each window of 1,000 documents (``pack_window`` or
    ``cut_stream``) and collate its sequences ``batch`` rows at a time (``collate_units``: input
    ids, labels, positions, segments) from the in-memory tokens; no reading, shuffle or deal."""
    ln = np.diff(offsets)
    rng, packing = np.random.default_rng(0), Packing(seq_len=seq_len)
    t, c = time.perf_counter(), time.process_time()
    slots = real = 0
    for w in range(0, len(ln), 1000):
        part = ln[w : w + 1000]
        if strategy == "best_fit":
            units = pack_window(part, packing=packing, rng=rng)
        else:
            zero = np.zeros(len(part), dtype=np.int64)
            units = cut_stream(np.arange(len(part)), zero, part, seq_len=seq_len)
        base = offsets[w : w + len(part) + 1] - offsets[w]
        tokens = values[offsets[w] : offsets[w + len(part)]]
        for b in range(0, len(units), batch):
            mine = units.take(np.arange(b, min(b + batch, len(units))))
            out = collate_units(mine, base, tokens, width=seq_len)
            slots += out["input_ids"].size
            real += int(mine.seg_len.sum())
    return {
        "wall": time.perf_counter() - t,
        "cpu": time.process_time() - c,
        "slots": slots,
        "real": real,
    }


def bench_numpy_concat(
    values: np.ndarray, offsets: np.ndarray, *, seq_len: int, batch: int
) -> dict[str, Any]:
    """The hand-written concat-and-cut loop: the ceiling for ``concat``."""
    starts = np.zeros(len(values) + 1, dtype=bool)
    starts[offsets[:-1]] = True
    per = seq_len * batch
    t, c = time.perf_counter(), time.process_time()
    slots = 0
    for a in range(0, len(values) - per - 1, per):
        ids = values[a : a + per].reshape(batch, seq_len)
        first = starts[a : a + per].reshape(batch, seq_len).copy()
        first[:, 0] = True
        seg = np.cumsum(first, axis=1, dtype=np.int32)
        idx = np.arange(per, dtype=np.int32).reshape(batch, seq_len)
        pos = idx - np.maximum.accumulate(np.where(first, idx, 0), axis=1)
        labels = np.where(
            starts[a + 1 : a + per + 1].reshape(batch, seq_len),
            -100,
            values[a + 1 : a + per + 1].reshape(batch, seq_len),
        )
        labels[:, -1] = -100
        slots += ids.size + 0 * int(seg[0, 0] + pos[0, 0] + labels[0, 0])
    return {
        "wall": time.perf_counter() - t,
        "cpu": time.process_time() - c,
        "slots": slots,
        "real": slots,
    }


def ensure_grain() -> Path | None:
    """The grain venv's python (created when missing), or ``None`` when grain does not install."""
    python = VENV / "bin" / "python"
    marker = VENV / ".datamill-bench-ready"
    if marker.exists():
        return python
    print(f"[setup] creating {VENV} with {GRAIN} ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", GRAIN, "numpy"], check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"[setup] grain does not install here: {exc}")
        return None
    marker.write_text("ok\n")
    return python


def bench_grain(
    python: Path, npz: Path, *, seq_len: int, batch: int, what: str, bins: int
) -> dict[str, Any] | None:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GRAIN_SCRIPT)
    try:
        out = subprocess.run(
            [str(python), f.name, str(npz), str(seq_len), str(batch), what, str(bins)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"[grain {what}] failed: {exc}")
        return None
    finally:
        Path(f.name).unlink()
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def chunked(values: np.ndarray, offsets: np.ndarray, seq_len: int) -> np.ndarray:
    """Offsets of the documents cut into pieces of at most ``seq_len`` (grain truncates)."""
    ln = np.diff(offsets)
    n = -(-ln // seq_len)
    first = np.repeat(offsets[:-1], n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    starts = first + k * seq_len
    return np.append(starts, offsets[-1])


def line(name: str, r: dict[str, Any] | None, goal: str = "") -> None:
    if r is None:
        print(f"{name:<44} (not run)")
        return
    pad = 1 - r["real"] / r["slots"] if r["slots"] else 0.0
    wall, cpu = r["real"] / r["wall"] / 1e6, r["real"] / r["cpu"] / 1e6
    print(
        f"{name:<40} {wall:6.1f}M tok/s wall {cpu:6.1f}M tok/s CPU  padding {pad:6.2%}  "
        f"load {load():.1f}  {goal}"
    )


def bench_balance(values_offsets: tuple[np.ndarray, np.ndarray], *, seq_len: int) -> None:
    _, offsets = values_offsets
    ln = np.diff(offsets)
    rng = np.random.default_rng(0)
    windows = [
        pack_window(ln[w : w + 1000], packing=Packing(seq_len=seq_len), rng=rng)
        for w in range(0, len(ln), 1000)
    ]
    for kind in ("tokens", "tokens_squared"):
        cost = cost_function(kind)  # tokens: activations; tokens_squared: masked attention
        c = np.concatenate([unit_costs(u.unit_ptr, u.seg_len, cost) for u in windows])
        for world, per in ((8, 16), (8, 32), (64, 4), (64, 8)):
            steps = len(c) // (world * per)
            if not steps:
                continue
            cs = c[: steps * world * per].reshape(steps, world * per)
            ranks = deal(cs, world_size=world, rng=np.random.default_rng(1))
            ours = np.array([imbalance(cs[s], ranks[s], world_size=world) for s in range(steps)])
            rr_ranks = round_robin(world * per, world_size=world)
            rr = [imbalance(cs[s], rr_ranks, world_size=world) for s in range(steps)]
            bound = lower_bound(cs, world_size=world)
            gap = ours / bound
            many = np.tile(cs, (max(1, 200_000 // cs.size), 1))  # time ~200k units
            t = time.process_time()
            deal(many, world_size=world, rng=np.random.default_rng(1))
            rate = many.size / (time.process_time() - t) / 1e6
            print(
                f"balance {kind:<14} {world:>2} ranks x {per:>2}: max/mean worst {ours.max():.4f} "
                f"mean {ours.mean():.4f} (worst / equal-count lower bound {gap.max():.4f}; "
                f"round-robin worst {max(rr):.3f} mean {np.mean(rr):.3f}); {steps} steps; planned "
                f"at {rate:.2f}M units per CPU-s  load {load():.1f}  goal <= 1.02, >= 1M/s"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("DATAMILL_DATA", "/work/shared/data"))
    ap.add_argument("--tokens", type=float, default=20e6, help="tokens per document set")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="2M tokens")
    ap.add_argument("--no-grain", action="store_true", help="skip grain")
    ap.add_argument(
        "--grain-tokens", type=float, default=2e6, help="tokens grain packs (it is slow)"
    )
    args = ap.parse_args()
    tokens = 2e6 if args.quick else args.tokens
    sets = wikitext_lengths(Path(args.data))
    python = None if args.no_grain else ensure_grain()
    print(
        f"# bench_lm {time.strftime('%Y-%m-%d %H:%M')}  seq_len {args.seq_len}  batch {args.batch}"
        f"  ~{tokens / 1e6:.0f}M tokens per set  load {load():.1f}"
    )
    for name, lengths in sets.items():
        values, offsets = documents(lengths, int(tokens), seed=0)
        print(
            f"## {name}: {len(offsets) - 1:,} documents, {len(values):,} tokens, mean "
            f"{np.diff(offsets).mean():.0f}, max {np.diff(offsets).max():,}"
        )
        table = as_table(values, offsets)
        kw = {"seq_len": args.seq_len, "batch": args.batch}
        line(
            "datamill best_fit (window 1000)",
            bench_datamill(table, strategy="best_fit", **kw),
            "goal: padding <= 1%, >= 20M tok/s on one core",
        )
        line("datamill concat", bench_datamill(table, strategy="concat", **kw), "goal >= 20M tok/s")
        for strategy in ("best_fit", "concat"):
            line(
                f"packing alone, {strategy}, 1 thread",
                bench_packing_alone(values, offsets, strategy=strategy, **kw),
                "goal >= 20M tok/s on one core (wall)",
            )
        line("numpy concat-and-cut loop (ceiling)", bench_numpy_concat(values, offsets, **kw))
        if python is not None:
            with tempfile.TemporaryDirectory() as tmp:
                npz = Path(tmp) / "docs.npz"
                cut = chunked(values, offsets, args.seq_len)
                cut = cut[: int(np.searchsorted(cut, args.grain_tokens)) + 1]
                np.savez(npz, values=values, offsets=cut)
                for bins in (args.batch, 1000):
                    line(
                        f"grain BestFitPack (bins {bins})",
                        bench_grain(python, npz, what="best_fit", bins=bins, **kw),
                    )
                line("grain ConcatThenSplit", bench_grain(python, npz, what="concat", bins=0, **kw))
        bench_balance((values, offsets), seq_len=args.seq_len * 4)


if __name__ == "__main__":
    main()
