"""BERT pretraining data: the seed's pure-Python generator vs HF ``Dataset.from_generator`` + ``to_parquet``
vs datamill, on WikiText-2 (test) repeated, same WordPiece tokenizer, max_seq_length 512.

    .venv/bin/python benchmarks/bench_bert.py [--quick] [--data ../shared/data] [--repeat N]

The pure-Python reference is Google's ``create_pretraining_data.py`` algorithm (documents ->
create_instances_from_document -> truncate_seq_pair -> create_masked_lm_predictions), written here
on token ids with ``random.Random``, each line tokenised with the same (Rust) tokenizer, samples
padded to 512 as the seed's writer does; it writes nothing. The HF path feeds that generator to
``datasets.Dataset.from_generator`` and writes ``to_parquet``. datamill runs ``build_bert_samples``
with ``pairing="google"`` (the reference's pair loop; the default ``"seed"`` loop costs the same)
(2 worker processes on this 2-core machine). Memory: peak RSS of this process plus its children,
polled every 20 ms from /proc/<pid>/smaps_rollup as PSS (minus the value before the step).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from datamill.core.io import read_text
from datamill.core.progress import set_quiet
from datamill.pretrain import bert as dm_bert
from datamill.pretrain.bert._tok import train_wordpiece

MAX_SEQ = 512
WIKITEXT103_SAMPLES = 4_270_000  # the seed's WikiText-103 run: 11 h 42 min
WIKITEXT103_BYTES = 540_000_000  # wiki.train.raw of WikiText-103, about 540 MB


# ----------------------------------------------------------------------------- memory
def _rss(pid: int) -> int:
    """Proportional set size (shared pages split between processes, so forked workers add up right)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


class PeakRSS:
    """Peak memory (PSS of self + children) over a block, polled in a thread."""

    def __enter__(self) -> Self:
        self.base = _rss(os.getpid())
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.02):
            total = _rss(me) + sum(_rss(c) for c in _children(me))
            self.peak = max(self.peak, total)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.base) / 1e6


# ----------------------------------------------------------------------------- the seed, in Python
def seed_documents(lines: list[str], tok: Any) -> list[list[list[int]]]:
    """Blank or '=' title lines end a document; each other line is tokenised on its own (the seed)."""
    docs: list[list[list[int]]] = [[]]
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("="):
            docs.append([])
            continue
        ids = tok.encode(line, add_special_tokens=False).ids
        if ids:
            docs[-1].append(ids)
    return [d for d in docs if d]


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    while True:
        if len(tokens_a) + len(tokens_b) <= max_num_tokens:
            break
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def create_masked_lm_predictions(tokens: list[int], n_content: int, sp: dict[str, int], masked_lm_prob: float,
                                 max_predictions: int, vocab_words: list[int], rng: random.Random
                                 ) -> tuple[list[int], list[int], list[int]]:
    specials = set(sp.values())
    cand = [i for i, t in enumerate(tokens) if t not in specials]
    rng.shuffle(cand)
    output = list(tokens)
    num_to_predict = min(max_predictions, max(1, int(round(n_content * masked_lm_prob))))  # noqa: RUF046 - verbatim
    masked: list[tuple[int, int]] = []
    for index in cand:
        if len(masked) >= num_to_predict:
            break
        if rng.random() < 0.8:
            new = sp["mask"]
        elif rng.random() < 0.5:
            new = tokens[index]
        else:
            new = vocab_words[rng.randint(0, len(vocab_words) - 1)]
        output[index] = new
        masked.append((index, tokens[index]))
    masked.sort()
    return output, [p for p, _ in masked], [lab for _, lab in masked]


def create_instances_from_document(all_documents: list[list[list[int]]], document_index: int, max_seq_length: int,
                                   short_seq_prob: float, masked_lm_prob: float, max_predictions: int,
                                   vocab_words: list[int], sp: dict[str, int], rng: random.Random
                                   ) -> list[dict[str, Any]]:
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a: list[int] = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b: list[int] = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                tokens = [sp["cls"], *tokens_a, sp["sep"], *tokens_b, sp["sep"]]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                tokens, positions, labels = create_masked_lm_predictions(
                    tokens, len(tokens_a) + len(tokens_b), sp, masked_lm_prob, max_predictions, vocab_words, rng)
                pad = max_seq_length - len(tokens)  # the seed's writer pads to max_seq_length
                instances.append({"tokens": tokens + [sp["pad"]] * pad, "segment_ids": segment_ids + [-1] * pad,
                                  "is_random_next": is_random_next, "masked_positions": positions,
                                  "masked_labels": labels})
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def seed_generator(all_documents: list[list[list[int]]], vocab_words: list[int], sp: dict[str, int], *,
                   dupe_factor: int, seed: int = 12345) -> Any:
    rng = random.Random(seed)
    for _ in range(dupe_factor):
        for d in range(len(all_documents)):
            yield from create_instances_from_document(all_documents, d, MAX_SEQ, 0.1, 0.15, 20, vocab_words, sp, rng)


# ----------------------------------------------------------------------------- runs
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one copy, dupe_factor 2, HF path on a slice")
    ap.add_argument("--data", default=str(ROOT / ".." / "shared" / "data"))
    ap.add_argument("--repeat", type=int, default=None, help="copies of the corpus (default: baseline >= 20 s)")
    ap.add_argument("--hf-max-samples", type=int, default=None,
                    help="cap the HF from_generator run (rate measured on that many samples)")
    args = ap.parse_args()
    set_quiet(True)
    dupe = 2 if args.quick else 10
    print(f"machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}")
    lines = (Path(args.data) / "wikitext2_test.raw").read_text(encoding="utf-8").splitlines()
    tmp = Path(tempfile.mkdtemp(prefix="bench-bert-"))
    t = time.perf_counter()
    tok = train_wordpiece([ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("=")],
                          vocab_size=30000)
    tok_path = tmp / "tokenizer.json"
    tok_path.write_text(tok.to_json(), encoding="utf-8")
    print(f"tokenizer: WordPiece, vocab {tok.vocab_size:,} (trained in {time.perf_counter() - t:.2f} s, "
          "used by all three)")
    sp = {"pad": tok.pad, "cls": tok.cls, "sep": tok.sep, "mask": tok.mask, "unk": tok.unk}
    vocab_words = tok.non_special_ids().tolist()

    # calibrate the repeat count on one copy so that the pure-Python baseline takes >= 20 s
    t = time.perf_counter()
    docs1 = seed_documents(lines, tok.inner)
    tok1 = time.perf_counter() - t
    t = time.perf_counter()
    n1 = sum(1 for _ in seed_generator(docs1, vocab_words, sp, dupe_factor=dupe))
    gen1 = time.perf_counter() - t
    repeat = args.repeat or (1 if args.quick else max(1, math.ceil(20.0 / (gen1 + tok1))))
    print(f"calibration on one copy: per-line tokenising {tok1:.2f} s, generating {n1:,} samples {gen1:.2f} s")
    print(f"corpus: wikitext2_test.raw x {repeat} (repeated in memory / on disk for scale), "
          f"dupe_factor {dupe}, max_seq_length {MAX_SEQ}")
    all_lines = lines * repeat
    raw = tmp / "wiki_x.raw"
    raw.write_text("\n".join(all_lines) + "\n", encoding="utf-8")
    results: dict[str, dict[str, float]] = {}

    # 1. pure Python generator (the seed), writes nothing
    with PeakRSS() as mem:
        t = time.perf_counter()
        docs = seed_documents(all_lines, tok.inner)
        t_tok = time.perf_counter() - t
        n_py = sum(1 for _ in seed_generator(docs, vocab_words, sp, dupe_factor=dupe))
        t_all = time.perf_counter() - t
    results["pure-Python generator"] = {"samples": n_py, "seconds": t_all, "gen_seconds": t_all - t_tok,
                                        "tok_seconds": t_tok, "mem": mem.extra_mb}

    # 2. HF datasets from_generator + to_parquet (same generator)
    import datasets

    datasets.disable_progress_bars()
    features = datasets.Features({
        "tokens": datasets.Sequence(datasets.Value("int32")), "segment_ids": datasets.Sequence(datasets.Value("int8")),
        "is_random_next": datasets.Value("bool"), "masked_positions": datasets.Sequence(datasets.Value("int32")),
        "masked_labels": datasets.Sequence(datasets.Value("int32"))})
    hf_cap = args.hf_max_samples or (2000 if args.quick else None)

    def hf_gen(cap: int | None) -> Any:
        for i, s in enumerate(seed_generator(docs, vocab_words, sp, dupe_factor=dupe)):
            if cap is not None and i >= cap:
                return
            yield s

    with PeakRSS() as mem:
        t = time.perf_counter()
        ds = datasets.Dataset.from_generator(hf_gen, gen_kwargs={"cap": hf_cap}, features=features,
                                             cache_dir=str(tmp / "hf_cache"))
        ds.to_parquet(str(tmp / "hf.parquet"))
        t_hf = time.perf_counter() - t
    results["HF from_generator+to_parquet"] = {"samples": ds.num_rows, "seconds": t_hf + t_tok * ds.num_rows / n_py,
                                              "gen_seconds": t_hf, "tok_seconds": t_tok * ds.num_rows / n_py,
                                              "mem": mem.extra_mb, "bytes": (tmp / "hf.parquet").stat().st_size}
    del ds

    # 3. datamill (padded, 2 workers), then single process, then compact
    dm_runs = [("datamill (padded, default)", {}),
               ("datamill (padded, 2 worker procs)", {"workers": 2}),
               ("datamill (compact, default)", {"layout": "compact"})]
    timings: dict[str, dict[str, float]] = {}
    for name, kw in dm_runs:
        with PeakRSS() as mem:
            res = dm_bert.build_bert_samples(raw, out=tmp / f"dm_{len(timings)}.parquet", tokenizer=tok_path,
                                             max_seq_length=MAX_SEQ, dupe_factor=dupe, seed=0,
                                             pairing="google", **kw)  # the reference above is Google's loop
        prep = res.timings.get("read_split", 0) + res.timings.get("tokenize", 0)
        md = pq.read_metadata(res.path)
        raw_bytes = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
        results[name] = {"samples": res.samples, "seconds": res.seconds, "gen_seconds": res.seconds - prep,
                         "tok_seconds": prep, "read_seconds": res.timings.get("read_split", 0.0),
                         "mem": mem.extra_mb, "bytes": res.path.stat().st_size,
                         "raw_bytes": raw_bytes,
                         # tokens int32 (+ segment ids int8 when padded), values only
                         "arrow_bytes": res.samples * MAX_SEQ * 5 if res.layout == "padded"
                         else res.tokens * 4 + res.samples * 4}
        timings[name] = res.timings

    # ----------------------------------------------------------------------------- report
    print(f"\n{'method':34} {'samples':>9} {'total s':>8} {'tok s':>6} {'gen+write s':>11} "
          f"{'samples/s':>10} {'gen+write/s':>11} {'+PSS MB':>8} {'file MB':>8}")
    for name, r in results.items():
        print(f"{name:34} {int(r['samples']):>9,} {r['seconds']:>8.2f} {r['tok_seconds']:>6.2f} "
              f"{r['gen_seconds']:>11.2f} {r['samples'] / r['seconds']:>10,.0f} "
              f"{r['samples'] / r['gen_seconds']:>11,.0f} {r['mem']:>8.0f} "
              f"{r.get('bytes', 0) / 1e6:>8.1f}")
    dm = results["datamill (padded, default)"]
    py = results["pure-Python generator"]
    hf = results["HF from_generator+to_parquet"]

    def rate(r: dict[str, float], key: str = "seconds") -> float:
        return r["samples"] / r[key]

    print("\nratios (datamill padded, default = 1 producer thread + writer):")
    print(f"  vs pure-Python generator: {rate(dm) / rate(py):5.1f}x end to end, "
          f"{rate(dm, 'gen_seconds') / rate(py, 'gen_seconds'):5.1f}x sampling(+writing) only   goal >= 5x")
    print(f"  vs HF from_generator:     {rate(dm) / rate(hf):5.1f}x end to end, "
          f"{rate(dm, 'gen_seconds') / rate(hf, 'gen_seconds'):5.1f}x sampling+writing only   goal >= 10x")
    print(f"  samples/s to Parquet:     {rate(dm):,.0f} end to end, {rate(dm, 'gen_seconds'):,.0f} "
          "sampling+writing   goal >= 50,000")
    comp = results["datamill (compact, default)"]
    print(f"  compact layout: file {comp['bytes'] / dm['bytes']:.2f} of the padded one "
          f"({comp['bytes'] / 1e6:.1f} MB vs {dm['bytes'] / 1e6:.1f} MB, zstd: the padding compresses away); "
          f"as Arrow in memory {comp['arrow_bytes'] / dm['arrow_bytes']:.2f} "
          f"({comp['arrow_bytes'] / 1e6:.0f} MB vs {dm['arrow_bytes'] / 1e6:.0f} MB of token + segment values)")
    print("\nwhere datamill's time goes (seconds; worker stages run in the worker processes):")
    for name, tm in timings.items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in tm.items()))
    # the repeated corpus flatters datamill's tokenizer (each distinct word reaches the library once
    # per run, and every copy here holds the same words): time unrepeated text instead, the 6.4 MB
    # of every shared text file (PTB train, The Time Machine, WikiText-2 test), with the same tokenizer
    mix = [ln.strip() for src in ("ptb.zip:ptb/ptb.train.txt", "timemachine.txt", "wikitext2_test.raw")
           for ln in read_text(f"{args.data}/{src}").splitlines() if ln.strip()]
    mix_arr = pa.array(mix, pa.large_string())
    mix_bytes = sum(len(x.encode()) for x in mix)
    t = time.perf_counter()
    tok.encode(mix_arr)
    tok_fast_mix = time.perf_counter() - t
    t = time.perf_counter()
    tok.encode_library(mix_arr)
    tok_lib_mix = time.perf_counter() - t
    t = time.perf_counter()
    for ln in mix:
        tok.inner.encode(ln, add_special_tokens=False)
    tok_py_mix = time.perf_counter() - t
    corpus_bytes = raw.stat().st_size
    unrep_tok = corpus_bytes / mix_bytes * tok_fast_mix
    honest = dm["samples"] / (dm["gen_seconds"] + dm["read_seconds"] + unrep_tok)
    print(f"\ntokenising {mix_bytes / 1e6:.1f} MB of unrepeated text (all shared text files): datamill "
          f"{tok_fast_mix:.2f} s, library batch encode {tok_lib_mix:.2f} s, per-line encode (the seed's way) "
          f"{tok_py_mix:.2f} s")
    print(f"  end-to-end rate if the {corpus_bytes / 1e6:.0f} MB corpus were unrepeated text "
          f"(tokenising at that rate, {unrep_tok:.2f} s): {honest:,.0f} samples/s = {honest / rate(py):.1f}x pure Python,"
          f" {honest / rate(hf):.1f}x HF")
    tok_fast1 = tok_fast_mix / mix_bytes * (Path(args.data) / "wikitext2_test.raw").stat().st_size
    wt103_tok = WIKITEXT103_BYTES / (Path(args.data) / "wikitext2_test.raw").stat().st_size * tok_fast1
    proj = WIKITEXT103_SAMPLES / rate(dm, "gen_seconds") + wt103_tok
    print(f"projected WikiText-103 (4.27M samples, ~{WIKITEXT103_BYTES / 1e6:.0f} MB raw): "
          f"{WIKITEXT103_SAMPLES / rate(dm, 'gen_seconds') / 60:.1f} min sampling+writing + "
          f"{wt103_tok / 60:.1f} min tokenising (unrepeated rate) = {proj / 60:.1f} min "
          f"(the seed reports 11 h 42 min); the pure-Python generator here: "
          f"{WIKITEXT103_SAMPLES / rate(py) / 3600:.2f} h")
    print(f"(outputs in {tmp})")


if __name__ == "__main__":
    main()
