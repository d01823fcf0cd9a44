"""``datamill tokenize`` vs Hugging Face ``datasets.map`` vs the ceiling, same tokenizer, same
documents, one run.

Run: ``.venv/bin/python benchmarks/bench_tokenize.py [--mb 200] [--workers 2]``

Inputs (built once in a temporary folder): ``wiki.jsonl``, WikiText-2 (``wikitext2_test.raw`` of
the shared data, one document per non-empty line) repeated to >= ``--mb`` MB; ``skewed.jsonl``,
documents of very different lengths (log-uniform from 10 characters to 200 KB, cut from the same
text) to >= ``--mb / 2`` MB. The tokenizer: a 16k byte-level BPE trained once on WikiText-2
(:func:`datamill.text.tok_vocab.train_bpe`), the same JSON file for the three.

Each contender runs in its own process (so its peak RSS is its own), timed end to end from the
JSONL file on disk:

1. datamill: ``tokenize(path, out=..., tokenizer=..., workers=W)``: planning, reading, tokenizing
   in W processes, shard files, the published shardset dataset (every stage charged).
2. ``datasets``: ``load_dataset("json", data_files=path)`` (its Arrow cache) then
   ``.map(batched=True, num_proc=2)`` calling the same tokenizer's ``encode_batch_fast`` and writing
   ``input_ids`` to Arrow (the cache files); both stages charged.
3. the ceiling: the texts already decoded in memory (not timed), ``encode_batch_fast`` over batches
   of 10,000 (the library's own threads on every core), the output discarded.

The three token counts must agree. Peak RSS: the run's process (``ru_maxrss``) plus, for the worker
processes, the largest one's peak times the worker count (an upper bound of their sum). The machine
is shared (2 cores, other sessions): the load average is printed beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(
    os.environ.get("DATAMILL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
MB = 1 << 20


def _wiki_lines() -> list[str]:
    raw = (DATA / "wikitext2_test.raw").read_text(encoding="utf-8")
    return [line.strip() for line in raw.splitlines() if line.strip()]


def build_inputs(work: Path, mb: float) -> dict[str, Path]:
    """``wiki.jsonl`` (>= mb MB), ``skewed.jsonl`` (>= mb/2 MB) and ``tokenizer.json``."""
    from datamill.text.tok_vocab import train_bpe

    lines = _wiki_lines()
    tok = work / "tokenizer.json"
    tok.write_text(train_bpe(lines, vocab_size=16000), encoding="utf-8")
    block = "".join(json.dumps({"text": t}) + "\n" for t in lines).encode("utf-8")
    wiki = work / "wiki.jsonl"
    with wiki.open("wb") as f:
        for _ in range(int(np.ceil(mb * MB / len(block)))):
            f.write(block)
    text = " ".join(lines)
    rng = np.random.default_rng(0)
    skewed = work / "skewed.jsonl"
    size = 0
    with skewed.open("w", encoding="utf-8") as f:
        while size < mb * MB / 2:
            n = int(np.exp(rng.uniform(np.log(10), np.log(200_000))))
            at = int(rng.integers(0, len(text) - n))
            rec = json.dumps({"text": text[at : at + n]}) + "\n"
            f.write(rec)
            size += len(rec.encode("utf-8"))
    return {"wiki": wiki, "skewed": skewed, "tokenizer": tok}


# ----------------------------------------------------------------------------- the contenders
def eta_check(history: list[tuple[float, int]], total: int) -> dict[str, float]:
    """The run's own progress: the ETA shown after 5% of the work vs the real end of the tasks, and
    the share of the work done in the last 5% of their time."""
    from datamill.text.tok_run import eta

    t = np.asarray([h[0] for h in history])
    done = np.asarray([h[1] for h in history], dtype=np.float64)
    end = float(t[-1])
    i = int(np.searchsorted(done, 0.05 * total))
    left = eta(float(t[i]), float(done[i]), total) or 0.0
    j = int(np.searchsorted(t, 0.95 * end))
    before = float(done[j - 1]) if j else 0.0
    return {
        "eta_error": abs(float(t[i]) + left - end) / end,
        "tail_share": (total - before) / total,
    }


def run_datamill(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    from datamill.core.progress import set_quiet
    from datamill.text import tokenize
    from datamill.text.tok_run import TokenizeProgress

    set_quiet(True)
    bars: list[TokenizeProgress] = []
    init = TokenizeProgress.__init__

    def keep(self: TokenizeProgress, total: int, done: int) -> None:
        init(self, total, done)
        bars.append(self)

    TokenizeProgress.__init__ = keep  # type: ignore[method-assign]  # to read the bar's history
    t = time.perf_counter()
    res = tokenize(path, out=out, tokenizer=tok, workers=workers)
    seconds = time.perf_counter() - t
    eta_res = eta_check(bars[0].history, bars[0].total) if bars and bars[0].history else {}
    return {"seconds": seconds, "tokens": res.tokens, "documents": res.documents, **eta_res}


def run_datasets(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    tokenizer = Tokenizer.from_file(tok)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        encs = tokenizer.encode_batch_fast(batch["text"], add_special_tokens=False)
        return {"input_ids": [e.ids for e in encs]}

    t = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=out)
    loaded = time.perf_counter() - t
    mapped = ds.map(encode, batched=True, num_proc=2, remove_columns=["text"])
    seconds = time.perf_counter() - t
    tokens = sum(len(x) for b in mapped.iter(batch_size=10_000) for x in b["input_ids"])
    return {"seconds": seconds, "load_seconds": loaded, "tokens": tokens, "documents": len(mapped)}


def run_ceiling(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tok)
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tokens = 0
    t = time.perf_counter()
    for lo in range(0, len(texts), 10_000):
        encs = tokenizer.encode_batch_fast(texts[lo : lo + 10_000], add_special_tokens=False)
        tokens += sum(len(e) for e in encs)
    return {"seconds": time.perf_counter() - t, "tokens": tokens, "documents": len(texts)}


RUNNERS = {"datamill": run_datamill, "datasets": run_datasets, "ceiling": run_ceiling}


def child(kind: str, path: str, tok: str, out: str, workers: int) -> None:
    res = RUNNERS[kind](path, tok, out, workers)
    res["rss_self_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["rss_child_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("RESULT " + json.dumps(res))


def measure(kind: str, path: Path, tok: Path, work: Path, workers: int) -> dict[str, Any]:
    out = work / f"out-{kind}-{path.stem}"
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    cmd = [sys.executable, __file__, "--child", kind, str(path), str(tok), str(out), str(workers)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    res: dict[str, Any] = json.loads(line[len("RESULT ") :])
    procs = workers if kind == "datamill" else 2 if kind == "datasets" else 0
    res["rss_mb"] = res["rss_self_mb"] + procs * res["rss_child_mb"]
    res["load"] = (load, os.getloadavg()[0])
    shutil.rmtree(out, ignore_errors=True)
    out.with_name(out.name + ".tokenizer.json").unlink(missing_ok=True)  # datamill's copy
    return res


def report(name: str, size: int, rows: dict[str, dict[str, Any]]) -> list[str]:
    dm, hf, ceil = rows["datamill"], rows["datasets"], rows["ceiling"]
    assert dm["tokens"] == hf["tokens"] == ceil["tokens"], {k: v["tokens"] for k, v in rows.items()}
    out = [
        f"### {name}: {size / MB:,.1f} MB, {dm['documents']:,} documents, {dm['tokens']:,} tokens"
    ]
    goal_hf = "met" if hf["seconds"] / dm["seconds"] >= 2 else "NOT met"
    goal_ceil = "met" if ceil["seconds"] / dm["seconds"] >= 0.8 else "NOT met"
    out.append("| | seconds | MB/s | tokens/s | peak RSS (MB) | load avg (before, after) |")
    out.append("|---|---:|---:|---:|---:|---|")
    for kind, r in rows.items():
        extra = f" (load_dataset {r['load_seconds']:.1f} s)" if "load_seconds" in r else ""
        out.append(
            f"| {kind}{extra} | {r['seconds']:.1f} | {size / MB / r['seconds']:.2f} | "
            f"{r['tokens'] / r['seconds']:,.0f} | {r['rss_mb']:,.0f} | "
            f"{r['load'][0]:.1f}, {r['load'][1]:.1f} |"
        )
    vs_hf, vs_ceil = hf["seconds"] / dm["seconds"], ceil["seconds"] / dm["seconds"]
    ten_gb = dm["seconds"] * (10 << 30) / size
    out.append("")
    if "eta_error" in dm:
        out.append(
            f"datamill's own bar: ETA after 5% of the work off the real end by "
            f"{dm['eta_error']:.1%} (goal <= 10%); the last 5% of its time did "
            f"{dm['tail_share']:.1%} of the work (goal >= 4.5%)"
        )
        out.append("")
    out.append(
        f"datamill vs datasets.map: **{vs_hf:.2f}x** (goal >= 2x: {goal_hf}); "
        f"vs the ceiling: **{vs_ceil:.2f}x** (goal >= 0.8x: {goal_ceil}); "
        f"datamill peak RSS {dm['rss_mb']:,.0f} MB; projected 10 GB: {ten_gb / 60:,.0f} min "
        f"({ten_gb / 3600:.1f} h) at this run's rate, every stage charged"
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=200.0, help="size of wiki.jsonl (skewed: half)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--work", default=None, help="folder for the inputs (default: a temporary one)")
    p.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, path, tok, out, workers = args.child
        child(kind, path, tok, out, int(workers))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-tokenize-"))
    work.mkdir(parents=True, exist_ok=True)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"# bench_tokenize --mb {args.mb:g} --workers {args.workers}: {now}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared machine)"
    )
    inputs = build_inputs(work, args.mb)
    lines: list[str] = []
    for name in ("wiki", "skewed"):
        rows = {
            k: measure(k, inputs[name], inputs["tokenizer"], work, args.workers) for k in RUNNERS
        }
        part = report(name, inputs[name].stat().st_size, rows)
        lines += [*part, ""]
        print("\n".join(part) + "\n", flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
