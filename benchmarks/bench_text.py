"""Text corpora and LM batches: datamill vs the seed's pure-Python code, side by side in one
process.

Run: ``.venv/bin/python benchmarks/bench_text.py [--quick] [--data DIR] [--mb 50]``

1. vocab build + encode, char level: The Time Machine repeated to >= ``--mb`` MB, with the seed's
   normalisation (``' '.join(' '.join(lines).lower().split())``). Seed: ``Counter`` over the
   characters, d2l ``Vocab`` (sorted by frequency, ``token_to_idx`` dict), ``[vocab[t] for t in
   tokens]``.
   datamill: ``build_corpus(lines, level="char", lowercase=True, collapse_whitespace=True)``.
2. vocab build + encode, word level: ptb.train.txt repeated to >= ``--mb`` MB. Seed:
   ``line.split()`` per line, ``Counter``, d2l ``Vocab``, nested list comprehension. datamill:
   ``build_corpus(level="word")``.
3. LM batch iteration over the char corpus (d2l's batch_size=32, num_steps=35): the seed's
   ``seq_data_iter_random`` / ``seq_data_iter_sequential`` (torch, ``random``) over a Python list vs
   ``random_batches`` / ``sequential_batches`` (int32 numpy). Tokens/s counts the X tokens.

The seed gets the lines already in memory (reading not timed); datamill reads the same text from a
temporary file (reading, UTF-8 check and line splitting timed), as ``datamill corpus`` does. Memory:
the process's peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) after each phase (monotonic,
so it shows the largest phase so far) and, for datamill's build, the peak of Python-tracked + numpy
allocations via ``tracemalloc`` (numpy reports its buffers to tracemalloc; pyarrow's pool does not,
so ``pyarrow.total_allocated_bytes`` peak is not included).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from datamill.text import build_corpus, random_batches, sequential_batches


# ---------------------------------------------------------------------------------------------
# The seed (d2l "Text Preprocessing" / "Language Models"), pure Python
class SeedVocab:
    """d2l's Vocab: <unk> first, reserved tokens, then tokens by descending frequency."""

    def __init__(
        self, tokens: list[Any], min_freq: int = 0, reserved_tokens: list[str] | None = None
    ) -> None:
        reserved_tokens = reserved_tokens or []
        if tokens and isinstance(tokens[0], list):
            tokens = [token for line in tokens for token in line]
        counter = Counter(tokens)
        self.token_freqs = sorted(counter.items(), key=lambda x: x[1], reverse=True)
        self.idx_to_token = ["<unk>", *reserved_tokens]
        self.token_to_idx = {token: idx for idx, token in enumerate(self.idx_to_token)}
        for token, freq in self.token_freqs:
            if freq < min_freq:
                break
            if token not in self.token_to_idx:
                self.idx_to_token.append(token)
                self.token_to_idx[token] = len(self.idx_to_token) - 1

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, tokens: Any) -> Any:
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, 0)
        return [self.__getitem__(token) for token in tokens]


def seed_char_corpus(lines: list[str]) -> tuple[list[int], SeedVocab]:
    text = " ".join(" ".join(lines).lower().split())
    tokens = list(text)
    vocab = SeedVocab(tokens)
    return [vocab[t] for t in tokens], vocab


def seed_word_corpus(lines: list[str]) -> tuple[list[list[int]], SeedVocab]:
    tokens = [line.split() for line in lines]
    vocab = SeedVocab(tokens)
    return [[vocab[t] for t in line] for line in tokens], vocab


def seq_data_iter_random(corpus: list[int], batch_size: int, num_steps: int) -> Iterator[Any]:
    import torch

    corpus = corpus[random.randint(0, num_steps - 1) :]
    num_subseqs = (len(corpus) - 1) // num_steps
    initial_indices = list(range(0, num_subseqs * num_steps, num_steps))
    random.shuffle(initial_indices)

    def data(pos: int) -> list[int]:
        return corpus[pos : pos + num_steps]

    num_batches = num_subseqs // batch_size
    for i in range(0, batch_size * num_batches, batch_size):
        initial_indices_per_batch = initial_indices[i : i + batch_size]
        X = [data(j) for j in initial_indices_per_batch]
        Y = [data(j + 1) for j in initial_indices_per_batch]
        yield torch.tensor(X), torch.tensor(Y)


def seq_data_iter_sequential(corpus: list[int], batch_size: int, num_steps: int) -> Iterator[Any]:
    import torch

    offset = random.randint(0, num_steps)
    num_tokens = ((len(corpus) - offset - 1) // batch_size) * batch_size
    Xs = torch.tensor(corpus[offset : offset + num_tokens])
    Ys = torch.tensor(corpus[offset + 1 : offset + 1 + num_tokens])
    Xs, Ys = Xs.reshape(batch_size, -1), Ys.reshape(batch_size, -1)
    num_batches = Xs.shape[1] // num_steps
    for i in range(0, num_steps * num_batches, num_steps):
        X = Xs[:, i : i + num_steps]
        Y = Ys[:, i : i + num_steps]
        yield X, Y


# ---------------------------------------------------------------------------------------------
def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    gc.collect()
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def traced(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float, float]:
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    t = time.perf_counter()
    out = fn(*args, **kw)
    dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out, dt, peak


def repeat_lines(lines: list[str], mb: float) -> list[str]:
    size = sum(len(x) + 1 for x in lines)
    reps = max(1, int(np.ceil(mb * 1e6 / size)))
    return lines * reps


def drain(it: Any) -> int:
    n = 0
    for x, _ in it:
        n += x.numel() if hasattr(x, "numel") else x.size
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 MB instead of 50 MB")
    ap.add_argument("--mb", type=float, default=50.0, help="text size per level in MB (default 50)")
    ap.add_argument(
        "--data", default=str(Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
    )
    args = ap.parse_args()
    mb = 5.0 if args.quick else args.mb
    data = Path(args.data)
    print(
        f"machine: {platform.platform()}, python {sys.version.split()[0]}, "
        f"cpu_count={os.cpu_count()}"
    )
    print(f"text size per level: >= {mb:g} MB")
    results: list[tuple[str, float, float, int]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench_text_"))
    warm = (
        tmp / "warm.txt"
    )  # first calls pay one-off imports/kernel set-up on both sides: warm both up
    warm.write_text("The Time Machine\nby H. G. Wells\n", encoding="utf-8")
    for lvl in ("char", "word"):
        build_corpus(warm, level=lvl, lowercase=True, collapse_whitespace=True)
    seed_char_corpus(["The Time Machine"])
    seed_word_corpus(["The Time Machine"])

    # 1. char level ---------------------------------------------------------------------------
    tm = repeat_lines((data / "timemachine.txt").read_text(encoding="utf-8").splitlines(), mb)
    chars = sum(len(x) + 1 for x in tm)
    (seed_ids, seed_vocab), t_seed = timed(seed_char_corpus, tm)
    print(
        f"[char] seed:     {len(seed_ids):,} tokens, vocab {len(seed_vocab)}, {t_seed:.2f} s "
        f"({len(seed_ids) / t_seed / 1e6:.1f} M tokens/s); peak RSS so far {rss_mb():,.0f} MB"
    )
    tm_file = tmp / "timemachine_rep.txt"
    tm_file.write_text("\n".join(tm) + "\n", encoding="utf-8")
    corpus, t_dm = timed(
        build_corpus, tm_file, level="char", lowercase=True, collapse_whitespace=True
    )
    t_best = min(
        timed(build_corpus, tm_file, level="char", lowercase=True, collapse_whitespace=True)[1]
        for _ in range(2)
    )
    print(
        f"[char] datamill repeated: best of 2 more runs {t_best:.2f} s (ratio "
        f"{t_seed / t_best:.1f}x); "
        "the first run below also pays the page faults of fresh memory"
    )
    _, _, peak = traced(
        build_corpus, tm_file, level="char", lowercase=True, collapse_whitespace=True
    )
    print(
        f"[char] datamill: {len(corpus):,} tokens, vocab {len(corpus.vocab)}, {t_dm:.2f} s "
        f"({len(corpus) / t_dm / 1e6:.1f} M tokens/s); tracemalloc peak {peak:,.0f} MB; ratio "
        f"{t_seed / t_dm:.1f}x"
    )
    ok = len(corpus) == len(seed_ids) and sorted(corpus.vocab.idx2str) == sorted(
        seed_vocab.idx_to_token
    )
    # same ids up to the tie order (none here): compare decoded prefixes
    ok = ok and corpus.decode(corpus.tokens[:1000]) == "".join(
        seed_vocab.idx_to_token[i] for i in seed_ids[:1000]
    )
    print(f"[char] same tokens and vocabulary as the seed: {ok}   ({chars / 1e6:.1f} MB text)")
    results.append(("vocab build + encode, char", t_seed, t_dm, len(corpus)))
    seed_list = seed_ids
    del seed_ids

    # 2. word level ---------------------------------------------------------------------------
    with zipfile.ZipFile(data / "ptb.zip") as zf:
        ptb = zf.read("ptb/ptb.train.txt").decode("utf-8").split("\n")
    ptb = repeat_lines(ptb, mb)
    (seed_w, seed_wv), t_seed = timed(seed_word_corpus, ptb)
    n_w = sum(len(x) for x in seed_w)
    print(
        f"[word] seed:     {n_w:,} tokens, vocab {len(seed_wv)}, {t_seed:.2f} s "
        f"({n_w / t_seed / 1e6:.1f} M tokens/s); peak RSS so far {rss_mb():,.0f} MB"
    )
    ptb_file = tmp / "ptb_rep.txt"
    ptb_file.write_text("\n".join(ptb), encoding="utf-8")
    wc, t_dm = timed(build_corpus, ptb_file, level="word")
    t_best = min(timed(build_corpus, ptb_file, level="word")[1] for _ in range(2))
    print(
        f"[word] datamill repeated: best of 2 more runs {t_best:.2f} s (ratio "
        f"{t_seed / t_best:.1f}x)"
    )
    _, _, peak = traced(build_corpus, ptb_file, level="word")
    print(
        f"[word] datamill: {len(wc):,} tokens, vocab {len(wc.vocab)}, {t_dm:.2f} s "
        f"({len(wc) / t_dm / 1e6:.1f} M tokens/s); tracemalloc peak {peak:,.0f} MB; ratio "
        f"{t_seed / t_dm:.1f}x"
    )
    print(f"[word] same counts as the seed: {len(wc) == n_w and len(wc.vocab) == len(seed_wv)}")
    results.append(("vocab build + encode, word", t_seed, t_dm, len(wc)))
    del seed_w, ptb

    # 3. LM batches ---------------------------------------------------------------------------
    bs, ns = 32, 35
    random.seed(0)
    for name, seed_fn, dm_fn in (
        ("random", seq_data_iter_random, random_batches),
        ("sequential", seq_data_iter_sequential, sequential_batches),
    ):
        n_seed, t_seed = timed(drain, seed_fn(seed_list, bs, ns))
        n_dm, t_dm = timed(drain, dm_fn(corpus, bs, ns, seed=0))
        print(
            f"[batches {name}] seed: {n_seed:,} X tokens in {t_seed:.2f} s "
            f"({n_seed / t_seed / 1e6:.1f} M/s); "
            f"datamill: {n_dm:,} in {t_dm:.3f} s ({n_dm / t_dm / 1e6:.0f} M/s int32); ratio "
            f"{t_seed / t_dm:.1f}x"
        )
        results.append((f"LM batches {name} ({bs}x{ns})", t_seed, t_dm, n_dm))
    n_dm, t_dm = timed(drain, random_batches(corpus, 256, 256, seed=0))
    print(f"[batches random 256x256] datamill: {n_dm / t_dm / 1e6:.0f} M tokens/s")
    print(f"peak RSS of the process: {rss_mb():,.0f} MB")
    shutil.rmtree(tmp, ignore_errors=True)
    print("\n| step | seed s | datamill s | datamill M tokens/s | ratio |\n|---|---|---|---|---|")
    for name, ts, td, n in results:
        print(f"| {name} | {ts:.2f} | {td:.3f} | {n / td / 1e6:.1f} | {ts / td:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
