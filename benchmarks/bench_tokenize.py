"""``datamill tokenize`` vs Hugging Face ``datasets.map`` vs the ceiling, same tokenizer, same
documents, one run.

Run: ``.venv/bin/python benchmarks/bench_tokenize.py [--mb 200] [--skewed-mb 100] [--only wiki]
[--workers 2]``

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

The three token counts must agree. Peak memory: the contender's whole process tree (its process and
every descendant, from ``/proc``) sampled every 0.2 s, as the sum of RSS (pages forked workers
share counted once per process: an upper bound) and of PSS (shared pages shared out). CPU seconds
of the timed part (the process and its children) beside the wall time: the machine is shared (2
cores, other sessions, whose ``nice 19`` does not hold across sessions when the kernel groups
processes by session, ``sched_autogroup``), so the load average is printed beside every figure.

Two more modes run datamill alone on ``wiki.jsonl``:

* ``--rss-gb 1``: a 1 GB input (deleted after), its process tree's peak memory against the goal
  (<= 1 GB), the ETA errors and the 10 GB projection.
* ``--burn-at 0.3 [--burn-until 0.7] [--burners 2]``: CPU burners start when that share of the work
  is done (and stop at ``--burn-until``): the load changes mid-run; the bar's ETA error after 5, 25,
  50, 75 and 90% of the work against the real finish is printed (``--save-history`` keeps the bar's
  updates as JSON).
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
import threading
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


def build_inputs(work: Path, mb: float, skewed_mb: float | None = None) -> dict[str, Path]:
    """``wiki.jsonl`` (>= mb MB), ``skewed.jsonl`` (>= ``skewed_mb``, default mb/2 MB) and
    ``tokenizer.json``."""
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
        while size < (mb / 2 if skewed_mb is None else skewed_mb) * MB:
            n = int(np.exp(rng.uniform(np.log(10), np.log(200_000))))
            at = int(rng.integers(0, len(text) - n))
            rec = json.dumps({"text": text[at : at + n]}) + "\n"
            f.write(rec)
            size += len(rec.encode("utf-8"))
    return {"wiki": wiki, "skewed": skewed, "tokenizer": tok}


# ----------------------------------------------------------------------------- the contenders
ETA_POINTS = (0.05, 0.25, 0.50, 0.75, 0.90)


def eta_check(
    history: list[tuple[float, int]], total: int, finish: float | None = None
) -> dict[str, Any]:
    """The run's own progress: the ETA the bar showed after 5/25/50/75/90% of the work vs the real
    finish (``finish``, seconds from the bar's start; default the last task's end), and the share
    of the work done in the last 5% of the time."""
    from datamill.text.tok_run import history_eta

    t = np.asarray([h[0] for h in history])
    done = np.asarray([h[1] for h in history], dtype=np.float64)
    end = float(t[-1]) if finish is None else finish
    errors = {}
    for share in ETA_POINTS:
        i = min(int(np.searchsorted(done, share * total)), len(t) - 1)
        left = history_eta(t[: i + 1], done[: i + 1], total) or 0.0
        errors[f"{share:.0%}"] = (float(t[i]) + left - end) / end
    j = int(np.searchsorted(t, 0.95 * end))
    before = float(done[j - 1]) if j else 0.0
    return {
        "eta_error": abs(errors["5%"]),
        "eta_errors": errors,
        "tail_share": (total - before) / total,
    }


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of its finished children."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _burn(seconds: float) -> subprocess.Popen[bytes]:
    """A CPU burner (a busy loop in its own process, bounded in time): the load change."""
    code = f"import time\nt = time.time() + {seconds}\nwhile time.time() < t: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def run_datamill(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    """``BURN_AT`` (env, a share of the work) starts ``BURNERS`` CPU burners when the run gets there
    and ``BURN_UNTIL`` stops them (the load changes mid-run); the bar's history and the real
    finish are returned."""
    from datamill.core.progress import set_quiet
    from datamill.text import tokenize
    from datamill.text.tok_run import TokenizeProgress

    set_quiet(True)
    bars: list[TokenizeProgress] = []
    burners: list[subprocess.Popen[bytes]] = []
    init, update = TokenizeProgress.__init__, TokenizeProgress.update
    burn_at = float(os.environ.get("BURN_AT", "2"))
    burn_until = float(os.environ.get("BURN_UNTIL", "2"))

    def keep(self: TokenizeProgress, total: int, done: int) -> None:
        init(self, total, done)
        bars.append(self)

    def upd(self: TokenizeProgress, nbytes: int, docs: int, tokens: int) -> None:
        update(self, nbytes, docs, tokens)
        if not burners and burn_at <= self.done / self.total < burn_until:
            burners.extend(_burn(600) for _ in range(int(os.environ.get("BURNERS", "2"))))
        if burners and self.done >= burn_until * self.total and burners[0].poll() is None:
            for b in burners:
                b.kill()

    TokenizeProgress.__init__ = keep  # type: ignore[method-assign]  # to read the bar's history
    TokenizeProgress.update = upd  # type: ignore[method-assign]
    t, cpu = time.perf_counter(), _cpu()
    try:
        res = tokenize(path, out=out, tokenizer=tok, workers=workers)
    finally:
        end, cpu = time.perf_counter(), _cpu() - cpu
        for b in burners:
            b.kill()
            b.wait()
    out_: dict[str, Any] = {
        "seconds": end - t,
        "cpu": cpu,
        "tokens": res.tokens,
        "documents": res.documents,
    }
    if bars and bars[0].history:
        bar = bars[0]
        out_ |= eta_check(bar.history, bar.total, end - bar.t0)
        out_ |= {"history": bar.history, "total": bar.total, "finish": end - bar.t0}
    return out_


def run_datasets(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    tokenizer = Tokenizer.from_file(tok)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        encs = tokenizer.encode_batch_fast(batch["text"], add_special_tokens=False)
        return {"input_ids": [e.ids for e in encs]}

    t, cpu = time.perf_counter(), _cpu()
    ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=out)
    loaded = time.perf_counter() - t
    mapped = ds.map(encode, batched=True, num_proc=2, remove_columns=["text"])
    seconds, cpu = time.perf_counter() - t, _cpu() - cpu
    tokens = sum(len(x) for b in mapped.iter(batch_size=10_000) for x in b["input_ids"])
    return {
        "seconds": seconds,
        "cpu": cpu,
        "load_seconds": loaded,
        "tokens": tokens,
        "documents": len(mapped),
    }


def run_ceiling(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tok)
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tokens = 0
    t, cpu = time.perf_counter(), _cpu()
    for lo in range(0, len(texts), 10_000):
        encs = tokenizer.encode_batch_fast(texts[lo : lo + 10_000], add_special_tokens=False)
        tokens += sum(len(e) for e in encs)
    seconds, cpu = time.perf_counter() - t, _cpu() - cpu
    return {"seconds": seconds, "cpu": cpu, "tokens": tokens, "documents": len(texts)}


def run_encode1(path: str, tok: str, out: str, workers: int) -> dict[str, Any]:
    """The tokenizer's own cost: :func:`run_ceiling` on one thread (its CPU seconds are the
    encoding's, without the idle spinning of the library's thread pool); on two cores of their own,
    no pipeline of the same encoding can take less wall time than half of them."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return run_ceiling(path, tok, out, workers)


RUNNERS = {
    "datamill": run_datamill,
    "datasets": run_datasets,
    "ceiling": run_ceiling,
    "encode1": run_encode1,
}


def child(kind: str, path: str, tok: str, out: str, workers: int) -> None:
    res = RUNNERS[kind](path, tok, out, workers)
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    res["rss_self_mb"], res["rss_child_mb"] = me.ru_maxrss / 1024, kids.ru_maxrss / 1024
    print("RESULT " + json.dumps(res))


def _proc_children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
    return kids


def tree_memory(root: int) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) in bytes over ``root`` and all its descendants, now (Linux
    ``/proc``): RSS counts the pages forked workers share once per process, PSS shares them out."""
    kids, todo, rss, pss = _proc_children(), [root], 0, 0
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss"):
                kb = int(value.split()[0]) * 1024
                rss, pss = (rss + kb, pss) if key == "Rss" else (rss, pss + kb)
    return rss, pss


def _run_polled(cmd: list[str], env: dict[str, str]) -> tuple[str, str, int, int, int]:
    """Run ``cmd``, sampling its process tree's memory every 0.2 s: (stdout, stderr, returncode,
    peak RSS sum, peak PSS sum)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0, 0]

    def poll() -> None:
        while proc.poll() is None:
            rss, pss = tree_memory(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            time.sleep(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    stdout, stderr = proc.communicate()
    poller.join()
    return stdout, stderr, proc.returncode, peak[0], peak[1]


def measure(
    kind: str, path: Path, tok: Path, work: Path, workers: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    out = work / f"out-{kind}-{path.stem}"
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    cmd = [sys.executable, __file__, "--child", kind, str(path), str(tok), str(out), str(workers)]
    stdout, stderr, code, rss, pss = _run_polled(cmd, {**os.environ, **(env or {})})
    if code:
        raise RuntimeError(f"{kind} failed:\n{stderr[-3000:]}")
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    res: dict[str, Any] = json.loads(line[len("RESULT ") :])
    res["rss_mb"], res["pss_mb"] = rss / MB, pss / MB
    res["load"] = (load, os.getloadavg()[0])
    shutil.rmtree(out, ignore_errors=True)
    out.with_name(out.name + ".tokenizer.json").unlink(missing_ok=True)  # datamill's copy
    return res


def _datamill_lines(dm: dict[str, Any], size: int) -> list[str]:
    """datamill's own figures: ETA errors, tail, memory of its process tree, 10 GB projection."""
    out = []
    if "eta_errors" in dm:
        errs = ", ".join(f"{k} {v:+.1%}" for k, v in dm["eta_errors"].items())
        out.append(
            f"datamill's own bar: ETA error against the real finish after {errs} of the work "
            f"(goal after 5%: within 10%); the last 5% of its time did {dm['tail_share']:.1%} of "
            f"the work (goal >= 4.5%)"
        )
    goal = "met" if dm["rss_mb"] <= 1024 else "NOT met"
    ten_gb = dm["seconds"] * (10 << 30) / size
    out.append(
        f"datamill peak memory of its process tree (parent + workers, sampled every 0.2 s): "
        f"RSS sum {dm['rss_mb']:,.0f} MB, PSS sum {dm['pss_mb']:,.0f} MB for "
        f"{size / MB:,.0f} MB of input (goal: a 1 GB input in <= 1 GB: {goal} at this size)"
    )
    out.append(
        f"projected time for 10 GB on this machine, every stage charged: {ten_gb / 60:,.0f} min "
        f"({ten_gb / 3600:.1f} h) at this run's rate ({size / MB / dm['seconds']:.2f} MB/s); "
        f"by its CPU seconds, {dm['cpu'] * (10 << 30) / size / 60 / (os.cpu_count() or 1):,.0f} "
        f"min with the {os.cpu_count()} cores to itself"
    )
    return out


def report(name: str, size: int, rows: dict[str, dict[str, Any]]) -> list[str]:
    dm = rows.get("datamill") or next(iter(rows.values()))
    counts = {k: v["tokens"] for k, v in rows.items()}
    assert len(set(counts.values())) == 1, counts
    out = [
        f"### {name}: {size / MB:,.1f} MB, {dm['documents']:,} documents, {dm['tokens']:,} tokens"
    ]
    out.append(
        "| | seconds | CPU s | MB/s | tokens/s | peak RSS / PSS (MB) | load avg (before, after) |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---|")
    for kind, r in rows.items():
        extra = f" (load_dataset {r['load_seconds']:.1f} s)" if "load_seconds" in r else ""
        out.append(
            f"| {kind}{extra} | {r['seconds']:.1f} | {r.get('cpu', 0):.1f} | "
            f"{size / MB / r['seconds']:.2f} | "
            f"{r['tokens'] / r['seconds']:,.0f} | {r['rss_mb']:,.0f} / {r['pss_mb']:,.0f} | "
            f"{r['load'][0]:.1f}, {r['load'][1]:.1f} |"
        )
    out += ["", *_datamill_lines(dm, size), ""] if "datamill" in rows else [""]
    if {"datamill", "datasets", "ceiling"} <= set(rows):
        vs_hf = rows["datasets"]["seconds"] / dm["seconds"]
        vs_ceil = rows["ceiling"]["seconds"] / dm["seconds"]
        hf_ceil = rows["ceiling"]["seconds"] / rows["datasets"]["seconds"]
        out.append(
            f"datamill vs datasets.map: **{vs_hf:.2f}x** (goal >= 2x: "
            f"{'met' if vs_hf >= 2 else 'NOT met'}); vs the ceiling: **{vs_ceil:.2f}x** (goal >= "
            f"0.8x: {'met' if vs_ceil >= 0.8 else 'NOT met'}); datasets.map itself runs at "
            f"{hf_ceil:.2f}x the ceiling, so 2x datasets.map would be {2 * hf_ceil:.2f}x it"
        )
        cpu = {k: r["cpu"] for k, r in rows.items()}
        out.append(
            "CPU seconds (process and children, the timed part): "
            + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            + f"; datamill used {cpu['datamill'] / cpu['datasets']:.2f}x datasets.map's CPU"
        )
    if {"datamill", "datasets", "encode1"} <= set(rows):
        enc, hf, own = rows["encode1"]["cpu"], rows["datasets"]["cpu"], rows["datamill"]["cpu"]
        out.append(
            f"The arithmetic: the encoding itself is {enc:.1f} CPU s (one thread), so on 2 cores "
            f"of their own no pipeline finishes in less than {enc / 2:.1f} s; datasets.map needs "
            f"{hf:.1f} CPU s ({hf / 2:.1f} s on 2 cores), so the most any pipeline can be is "
            f"**{hf / enc:.2f}x datasets.map** (the goal asks 2x); datamill needs {own:.1f} CPU s, "
            f"{enc / own:.2f}x the encoding's own (by CPU: {hf / own:.2f}x datasets.map)"
        )
    return out


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=200.0, help="size of wiki.jsonl (skewed: half)")
    p.add_argument("--skewed-mb", type=float, default=None, help="size of skewed.jsonl")
    p.add_argument("--only", choices=["wiki", "skewed"], default=None, help="one input only")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--contenders", default=",".join(RUNNERS), help="comma-separated, of " + ",".join(RUNNERS)
    )
    p.add_argument("--work", default=None, help="folder for the inputs (default: a temporary one)")
    p.add_argument(
        "--rss-gb",
        type=float,
        default=None,
        help="the memory run: datamill alone on a wiki.jsonl of this many GB (deleted after)",
    )
    p.add_argument(
        "--burn-at",
        type=float,
        default=None,
        help="datamill alone; start --burners CPU burners when this share of the work is done",
    )
    p.add_argument("--burn-until", type=float, default=2.0, help="stop the burners there")
    p.add_argument("--burners", type=int, default=2)
    p.add_argument("--save-history", default=None, help="write datamill's bar history (JSON)")
    p.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = _args()
    if args.child:
        kind, path, tok, out, workers = args.child
        child(kind, path, tok, out, int(workers))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-tokenize-"))
    work.mkdir(parents=True, exist_ok=True)
    alone = args.rss_gb is not None or args.burn_at is not None
    mb = args.mb if args.rss_gb is None else args.rss_gb * 1024
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"# bench_tokenize {' '.join(sys.argv[1:])}: {now}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} (shared machine; others at nice 19)"
    )
    inputs = build_inputs(work, mb, 0.01 if alone else args.skewed_mb)
    env = {"BURN_AT": str(args.burn_at), "BURN_UNTIL": str(args.burn_until)}
    env = {**env, "BURNERS": str(args.burners)} if args.burn_at is not None else {}
    kinds = ["datamill"] if alone else args.contenders.split(",")
    for name in ["wiki"] if alone else [args.only] if args.only else ["wiki", "skewed"]:
        rows = {
            k: measure(k, inputs[name], inputs["tokenizer"], work, args.workers, env) for k in kinds
        }
        print("\n".join(report(name, inputs[name].stat().st_size, rows)) + "\n", flush=True)
        if args.save_history:
            keep = ("history", "total", "finish", "seconds", "load")
            Path(args.save_history).write_text(json.dumps({k: rows["datamill"][k] for k in keep}))
    if args.rss_gb is not None:
        inputs["wiki"].unlink()  # the 1 GB input goes at once
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
