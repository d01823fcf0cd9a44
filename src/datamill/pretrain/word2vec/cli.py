"""``datamill word2vec CORPUS --out DIR``: skip-gram examples (subsampling, windows, negatives) to a
folder."""

from __future__ import annotations

import argparse
import time
from typing import Any

from datamill.core.cliargs import add_overwrite, add_seed
from datamill.pretrain.word2vec.limits import NUM_NEGATIVES, SUBSAMPLE_T, W2V_MIN_FREQ, W2V_WINDOW

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from datamill.core.io import check_output
    from datamill.pretrain.word2vec import build_skipgram, is_skipgram_folder

    t0 = time.perf_counter()
    check_output(
        args.out,
        is_own=is_skipgram_folder,
        inputs=[args.corpus],
        what="word2vec folder",
        overwrite=args.overwrite,
    )  # before the work; save() checks again
    s = build_skipgram(
        args.corpus,
        window=args.window,
        num_negatives=args.num_negatives,
        min_freq=args.min_freq,
        subsample_t=args.subsample_t,
        seed=args.seed,
        negative_counts=args.negative_counts,
        drop_unk=args.drop_unk,
    )
    out = s.save(args.out, overwrite=args.overwrite, inputs=[args.corpus])
    info = s.info
    kept = f"{info['tokens_known']:,} known -> " if args.drop_unk else ""
    print(
        f"vocab size {info['vocab_size']:,}  tokens {info['tokens']:,} -> {kept}"
        f"{info['tokens_after_subsampling']:,} after subsampling"
    )
    print(
        f"centers {info['examples']:,}  center/context pairs {info['pairs']:,}  "
        f"negatives {info['num_negative_ids']:,}"
    )
    print(f"wrote {out} in {time.perf_counter() - t0:.2f} s")
    return 0


def register(sub: Any) -> None:
    """Add ``datamill word2vec``."""
    p = sub.add_parser(
        "word2vec",
        help="word2vec skip-gram examples (subsampling, windows, negatives)",
        description="Sentences (one per line, whitespace-separated) -> vocabulary (min_freq, "
        "<unk>), subsampling, centers/contexts, negatives -> .npy CSR folder.",
    )
    p.add_argument("corpus", help="text file or archive.zip:member, e.g. ptb.zip:ptb/ptb.train.txt")
    p.add_argument(
        "--out",
        required=True,
        help="output folder (an earlier word2vec folder there is replaced atomically; anything "
        "else is refused)",
    )
    add_overwrite(p)
    p.add_argument(
        "--window", type=W2V_WINDOW.arg, default=5, help="largest context window (default 5)"
    )
    p.add_argument(
        "--num-negatives",
        "--negatives",
        dest="num_negatives",
        type=NUM_NEGATIVES.arg,
        default=5,
        help="negatives per context word K (default 5; --negatives is an alias)",
    )
    p.add_argument(
        "--min-freq",
        type=W2V_MIN_FREQ.arg,
        default=10,
        help="rarer words become <unk> (default 10)",
    )
    p.add_argument(
        "--subsample-t",
        "--t",
        dest="subsample_t",
        type=SUBSAMPLE_T.arg,
        default=1e-4,
        help="subsampling threshold t (default 1e-4; --t is an alias)",
    )
    add_seed(p, what="seeds the subsampling and negatives")
    p.add_argument(
        "--negative-counts",
        choices=("subsampled", "before_subsampling", "seed"),
        default="subsampled",
        help="negatives ~ count**0.75 of the subsampled corpus (default, the seed's) or of the "
        "corpus "
        "before subsampling (later d2l code); 'seed' is a deprecated alias of before_subsampling",
    )
    p.add_argument(
        "--drop-unk",
        action="store_true",
        help="drop every <unk> token before subsampling (later d2l code) instead of subsampling it "
        "like any word (the seed's default)",
    )
    p.set_defaults(func=_cmd)
