"""``datamill corpus TEXTFILE --level ... --out DIR``: build an LM corpus folder."""

from __future__ import annotations

import argparse
import time
from typing import Any

from datamill.core.checks import MAX_SIZE, MIN_FREQ, TOKENIZER_VOCAB
from datamill.core.cliargs import add_overwrite

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from datamill.text.corpus_build import VocabLimits, build_corpus

    start = time.perf_counter()
    extra: dict[str, Any] = {}
    if args.level in ("bpe", "wordpiece"):
        extra = {"tokenizer": args.tokenizer, "vocab_size": args.vocab_size}
    else:
        extra = {
            "vocab": VocabLimits(
                min_freq=args.min_freq,
                max_size=args.max_size,
                reserved_tokens=args.reserved_tokens.split(",") if args.reserved_tokens else (),
                unk_token=args.unk_token,
            )
        }
    corpus = build_corpus(
        args.textfile,
        level=args.level,
        lowercase=args.lowercase,
        collapse_whitespace=args.collapse_whitespace,
        out=args.out,
        overwrite=args.overwrite,
        **extra,
    )
    vocab_size = len(corpus.vocab) if corpus.vocab is not None else 0
    print(
        f"{args.textfile}: {len(corpus):,} tokens ({args.level}), {corpus.num_lines:,} lines, "
        f"vocab size {vocab_size:,}, ids {corpus.tokens.dtype} -> {args.out} "
        f"({time.perf_counter() - start:.2f} s)"
    )
    return 0


def register(sub: Any) -> None:
    """Add ``datamill corpus``."""
    p = sub.add_parser(
        "corpus", help="tokenise a text file into an LM corpus folder (ids .npy + vocab)"
    )
    p.add_argument(
        "textfile", help="a UTF-8 text file, or archive.zip:member (e.g. ptb.zip:ptb/ptb.train.txt)"
    )
    p.add_argument(
        "--level",
        choices=["char", "word", "bpe", "wordpiece"],
        default="char",
        help="token level (default char)",
    )
    p.add_argument("--lowercase", action="store_true", help="lower-case the text first")
    p.add_argument(
        "--collapse-whitespace",
        action="store_true",
        help="collapse whitespace runs to one space (char level: the whole file becomes one "
        "document)",
    )
    p.add_argument(
        "--min-freq",
        type=MIN_FREQ.arg,
        default=0,
        help="rarer tokens map to <unk> (char/word; default 0)",
    )
    p.add_argument(
        "--max-size",
        type=MAX_SIZE.arg,
        default=None,
        help="keep at most this many tokens (char/word)",
    )
    p.add_argument(
        "--reserved-tokens",
        "--reserved",
        dest="reserved_tokens",
        default="",
        help="comma-separated reserved tokens after <unk> (char/word; --reserved is an alias)",
    )
    p.add_argument(
        "--unk-token", default="<unk>", help="the unknown token (char/word; default <unk>)"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="bpe/wordpiece: a tokenizer JSON to use instead of training",
    )
    p.add_argument(
        "--vocab-size",
        type=TOKENIZER_VOCAB.arg,
        default=8000,
        help="bpe/wordpiece training vocab size (default 8000)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output corpus folder (an earlier corpus there is replaced atomically; anything "
        "else is refused)",
    )
    add_overwrite(p)
    p.set_defaults(func=_cmd)
