"""word2vec skip-gram data: the d2l seed's pure-Python pipeline vs datamill, PTB train, zip -> ready
batches.

    .venv/bin/python benchmarks/bench_word2vec.py [--quick] [--data ../shared/data]
        [--batch-size 512]

The reference is the seed's code as the chapter has it (read_ptb, the frequency-ordered d2l
``Vocab(min_freq=10)`` with ``<unk>`` at 0, subsample, get_centers_and_contexts, RandomGenerator +
get_negatives, batchify), written below with ``random`` and lists; its batches are made like its
DataLoader(shuffle=True, collate_fn=batchify) would (indices shuffled, batchify per batch -> torch
tensors), without DataLoader's own overhead. datamill runs ``build_skipgram`` then iterates
``datamill.loader.read_batches(samples.source(), ..., as_torch=True)`` (the Loader). Both are timed
end to end, in this one process, on the same input. ``--quick`` uses the first 10% of the lines
(written to a temp file both read). The reference drops every ``<unk>`` before subsampling (later
d2l code), so datamill runs with ``drop_unk=True`` here (its default subsamples ``<unk>`` like any
word, as the seed article does; the cost is the same).

Memory: peak resident set size (VmRSS from /proc/self/statm, polled every 5 ms in a thread) during
each pipeline, minus the RSS just before it; the data both keep alive is included.
"""

from __future__ import annotations

import argparse
import collections
import gc
import math
import os
import platform
import random
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from datamill.core.progress import set_quiet
from datamill.loader import read_batches
from datamill.pretrain.word2vec import build_skipgram

MEMBER = "ptb/ptb.train.txt"


# ----------------------------------------------------------------------------- memory
class PeakRSS:
    """Peak VmRSS above the value at entry, sampled every 5 ms."""

    def __enter__(self) -> Self:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self._rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


# ----------------------------------------------------------------------------- the seed (d2l)
class SeedVocab:
    """d2l's Vocab (frequency order, '<unk>' at 0)."""

    def __init__(self, tokens: list[list[str]], min_freq: int = 0) -> None:
        counter = collections.Counter([t for line in tokens for t in line])
        self._token_freqs = sorted(counter.items(), key=lambda x: x[1], reverse=True)
        self.idx_to_token = ["<unk>"]
        self.token_to_idx = {t: i for i, t in enumerate(self.idx_to_token)}
        for token, freq in self._token_freqs:
            if freq < min_freq:
                break
            if token not in self.token_to_idx:
                self.idx_to_token.append(token)
                self.token_to_idx[token] = len(self.idx_to_token) - 1

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, tokens: Any) -> Any:
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self.__getitem__(token) for token in tokens]

    def to_tokens(self, indices: Any) -> Any:
        if isinstance(indices, (list, tuple)):
            return [self.idx_to_token[index] for index in indices]
        return self.idx_to_token[indices]

    @property
    def unk(self) -> int:
        return 0


def seed_subsample(
    sentences: list[list[str]], vocab: SeedVocab
) -> tuple[list[list[str]], collections.Counter[str]]:
    sentences = [[token for token in line if vocab[token] != vocab.unk] for line in sentences]
    counter = collections.Counter([token for line in sentences for token in line])
    num_tokens = sum(counter.values())

    def keep(token: str) -> bool:
        return random.uniform(0, 1) < math.sqrt(1e-4 / counter[token] * num_tokens)

    return ([[token for token in line if keep(token)] for line in sentences], counter)


def seed_centers_and_contexts(
    corpus: list[list[int]], max_window_size: int
) -> tuple[list[int], list[list[int]]]:
    centers, contexts = [], []
    for line in corpus:
        if len(line) < 2:
            continue
        centers += line
        for i in range(len(line)):
            window_size = random.randint(1, max_window_size)
            indices = list(range(max(0, i - window_size), min(len(line), i + 1 + window_size)))
            indices.remove(i)
            contexts.append([line[idx] for idx in indices])
    return centers, contexts


class RandomGenerator:
    def __init__(self, sampling_weights: list[float]) -> None:
        self.population = list(range(1, len(sampling_weights) + 1))
        self.sampling_weights = sampling_weights
        self.candidates: list[int] = []
        self.i = 0

    def draw(self) -> int:
        if self.i == len(self.candidates):
            self.candidates = random.choices(self.population, self.sampling_weights, k=10000)
            self.i = 0
        self.i += 1
        return self.candidates[self.i - 1]


def seed_get_negatives(
    all_contexts: list[list[int]], vocab: SeedVocab, counter: collections.Counter[str], K: int
) -> list[list[int]]:
    sampling_weights = [counter[vocab.to_tokens(i)] ** 0.75 for i in range(1, len(vocab))]
    all_negatives, generator = [], RandomGenerator(sampling_weights)
    for contexts in all_contexts:
        negatives: list[int] = []
        while len(negatives) < len(contexts) * K:
            neg = generator.draw()
            if neg not in contexts:
                negatives.append(neg)
        all_negatives.append(negatives)
    return all_negatives


def seed_batchify(data: list[tuple[int, list[int], list[int]]], torch: Any) -> tuple[Any, ...]:
    max_len = max(len(c) + len(n) for _, c, n in data)
    centers, contexts_negatives, masks, labels = [], [], [], []
    for center, context, negative in data:
        cur_len = len(context) + len(negative)
        centers += [center]
        contexts_negatives += [context + negative + [0] * (max_len - cur_len)]
        masks += [[1] * cur_len + [0] * (max_len - cur_len)]
        labels += [[1] * len(context) + [0] * (max_len - len(context))]
    return (
        torch.tensor(centers).reshape((-1, 1)),
        torch.tensor(contexts_negatives),
        torch.tensor(masks),
        torch.tensor(labels),
    )


def run_seed(src: str, batch_size: int, torch: Any) -> tuple[dict[str, float], dict[str, int]]:
    random.seed(0)
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    path, _, member = src.partition(".zip:")
    if member:
        with zipfile.ZipFile(path + ".zip") as z:
            raw_text = z.read(member).decode("utf-8")
    else:
        raw_text = Path(src).read_text(encoding="utf-8")
    sentences = [line.split() for line in raw_text.split("\n")]
    t["read"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    vocab = SeedVocab(sentences, min_freq=10)
    t["vocab"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    subsampled, counter = seed_subsample(sentences, vocab)
    corpus = [vocab[line] for line in subsampled]
    t["subsample"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    all_centers, all_contexts = seed_centers_and_contexts(corpus, 5)
    t["contexts"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    all_negatives = seed_get_negatives(all_contexts, vocab, counter, 5)
    t["negatives"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    order = list(range(len(all_centers)))
    random.shuffle(order)
    n_batches = 0
    for b in range(0, len(order), batch_size):
        seed_batchify(
            [
                (all_centers[i], all_contexts[i], all_negatives[i])
                for i in order[b : b + batch_size]
            ],
            torch,
        )
        n_batches += 1
    t["batches"] = time.perf_counter() - t0
    counts = {
        "vocab": len(vocab),
        "tokens_after": sum(len(line) for line in subsampled),
        "centers": len(all_centers),
        "pairs": sum(len(c) for c in all_contexts),
        "batches": n_batches,
    }
    return t, counts


def run_datamill(src: str, batch_size: int) -> tuple[dict[str, float], dict[str, int], float]:
    t0 = time.perf_counter()
    s = build_skipgram(src, seed=0, drop_unk=True, progress=False)  # like the reference above
    build = time.perf_counter() - t0
    t: dict[str, float] = dict(s.info["seconds"])
    t["(build overhead)"] = build - sum(t.values())
    t0 = time.perf_counter()
    n_batches = sum(1 for _ in read_batches(s.source(), batch_size, seed=0, as_torch=True))
    t["batches"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        s.save(d)
        save = time.perf_counter() - t0
    counts = {
        "vocab": s.info["vocab_size"],
        "tokens_after": s.info["tokens_after_subsampling"],
        "centers": len(s),
        "pairs": s.info["pairs"],
        "batches": n_batches,
    }
    return t, counts, save


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="first 10%% of the lines")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--batch-size", type=int, default=512)
    args = ap.parse_args()
    set_quiet(True)
    import torch

    torch.set_num_threads(1)
    zpath = Path(args.data) / "ptb.zip"
    tmp = tempfile.TemporaryDirectory()
    if args.quick:
        with zipfile.ZipFile(zpath) as z:
            lines = z.read(MEMBER).decode("utf-8").split("\n")
        src = str(Path(tmp.name) / "ptb.train.10pct.txt")
        Path(src).write_text("\n".join(lines[: len(lines) // 10]), encoding="utf-8")
    else:
        src = f"{zpath}:{MEMBER}"
    print(
        f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"os.cpu_count()={os.cpu_count()}, python {platform.python_version()}"
    )
    print(f"input: {src}  batch_size {args.batch_size}  (window 5, K 5, min_freq 10, t 1e-4)")
    run_datamill(src, args.batch_size)  # warm-up (imports, page cache); not timed
    gc.collect()
    with PeakRSS() as mem_d:
        td, cd, save = run_datamill(src, args.batch_size)
    gc.collect()
    with PeakRSS() as mem_s:
        ts, cs = run_seed(src, args.batch_size, torch)
    stages = ["read", "vocab", "subsample", "contexts", "negatives", "batches"]
    print(f"\n{'stage':<18}{'seed (s)':>10}{'datamill (s)':>14}{'ratio':>9}")
    for st in stages:
        print(f"{st:<18}{ts[st]:>10.3f}{td[st]:>14.4f}{ts[st] / max(td[st], 1e-9):>8.1f}x")
    print(f"{'(build overhead)':<18}{'':>10}{td['(build overhead)']:>14.4f}")
    tot_s, tot_d = sum(ts.values()), sum(td.values())
    print(f"{'end to end':<18}{tot_s:>10.3f}{tot_d:>14.4f}{tot_s / tot_d:>8.1f}x")
    b_s, b_d = tot_s - ts["batches"], tot_d - td["batches"]
    print(
        f"{'build only':<18}{b_s:>10.3f}{b_d:>14.4f}{b_s / b_d:>8.1f}x   (zip -> examples, no "
        "batches)"
    )
    print(f"\npeak RSS increase: seed {mem_s.mb:,.0f} MB, datamill {mem_d.mb:,.0f} MB")
    print(f"datamill save (5 .npy + vocab.json + skipgram.json, not in the total): {save:.3f} s")
    print(f"counts seed     {cs}\ncounts datamill {cd}")
    print(
        f"center/context pairs per second end to end: seed {cs['pairs'] / tot_s:,.0f}, "
        f"datamill {cd['pairs'] / tot_d:,.0f}"
    )
    tmp.cleanup()


if __name__ == "__main__":
    main()
