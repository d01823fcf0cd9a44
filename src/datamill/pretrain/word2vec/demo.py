"""Demo section: PTB -> skip-gram examples -> first padded batch and one decoded example."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["run"]


def run(data_dir: Path, work_dir: Path) -> None:
    """Build PTB's skip-gram data, save and memory-map it, print the first batch and one example."""
    from datamill.pretrain.word2vec import SkipGramSamples, build_skipgram

    t0 = time.perf_counter()
    built = build_skipgram(f"{data_dir / 'ptb.zip'}:ptb/ptb.train.txt", seed=0, progress=False)
    s = SkipGramSamples.load(built.save(work_dir / "word2vec_ptb"))
    info = s.info
    print(
        f"PTB train: vocab {info['vocab_size']:,}, tokens {info['tokens']:,} -> "
        f"{info['tokens_after_subsampling']:,} after subsampling, {info['pairs']:,} "
        "center/context pairs "
        f"({time.perf_counter() - t0:.2f} s, saved to {work_dir / 'word2vec_ptb'})"
    )
    src = s.source()  # shuffled, resumable batches: datamill.loader.read_batches(src, 512, seed=0)
    batch = src.padded_collate()(src.read_shard(0).slice(0, 512))
    for name, arr in batch.items():
        print(f"  {name:<19} {tuple(arr.shape)}")
    row = 0
    n_ctx = int(batch["labels"][row].sum())
    n_all = int(batch["masks"][row].sum())
    ids = batch["contexts_negatives"][row]
    print(f"  example: center {s.vocab.to_tokens(int(batch['centers'][row, 0]))!r}")
    print(f"    contexts  {s.vocab.to_tokens(ids[:n_ctx])}")
    print(
        "    negatives "
        f"{s.vocab.to_tokens(ids[n_ctx:n_all])[:10]}{' ...' if n_all - n_ctx > 10 else ''}"
    )
