"""Demo section: the char corpus of The Time Machine and the word corpus of PTB, with LM batches."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["run"]


def run(data_dir: Path, work_dir: Path) -> None:
    """Build both corpora under ``work_dir`` and print sizes and one decoded batch of each kind."""
    from datamill.text import Corpus, build_corpus, random_batches, sequential_batches

    print("== text: corpora and LM minibatches ==")
    t = time.perf_counter()
    build_corpus(
        data_dir / "timemachine.txt",
        level="char",
        lowercase=True,
        collapse_whitespace=True,
        out=work_dir / "timemachine_char",
    )
    tm = Corpus.load(work_dir / "timemachine_char")
    print(
        f"timemachine.txt (char, lower-cased, whitespace collapsed): {len(tm):,} tokens, "
        f"vocab {len(tm.vocab) if tm.vocab else 0} (<unk> + {len(tm.vocab or []) - 1} characters), "
        f"{tm.tokens.dtype} ids, {time.perf_counter() - t:.2f} s"
    )
    t = time.perf_counter()
    build_corpus(
        f"{data_dir / 'ptb.zip'}:ptb/ptb.train.txt", level="word", out=work_dir / "ptb_word"
    )
    ptb = Corpus.load(work_dir / "ptb_word")
    print(
        f"ptb.train.txt (word): {len(ptb):,} tokens in {ptb.num_lines:,} lines, vocab "
        f"{len(ptb.vocab or []):,}, "
        f"{time.perf_counter() - t:.2f} s"
    )
    for name, corpus, steps in (("timemachine", tm, 24), ("ptb", ptb, 8)):
        rx, ry = next(iter(random_batches(corpus, 2, steps, seed=0)))
        seq = iter(sequential_batches(corpus, 2, steps, seed=0))
        s1, _ = next(seq)
        s2, _ = next(seq)
        print(f"{name} random batch (2 x {steps}), X row 0: {corpus.decode(rx[0])!r}")
        print(f"{name} random batch (2 x {steps}), Y row 0: {corpus.decode(ry[0])!r}")
        print(
            f"{name} sequential, row 0 of batches 1 and 2 (continuing): "
            f"{corpus.decode(s1[0])!r} | {corpus.decode(s2[0])!r}"
        )
