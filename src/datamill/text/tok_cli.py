"""``datamill tokenize INPUTS... --tokenizer T --out DIR``: files of documents -> a token shardset
dataset."""

from __future__ import annotations

import argparse
from typing import Any

from datamill.core.cliargs import add_engine, add_overwrite, add_processes

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from datamill.text.tok_build import tokenize
    from datamill.text.tok_read import ReadOptions

    res = tokenize(
        args.inputs,
        out=args.out,
        tokenizer=args.tokenizer,
        train_vocab=args.train_vocab,
        read=ReadOptions(
            text_field=args.text_field,
            keep=tuple(k for k in args.keep.split(",") if k) if args.keep else (),
            text_unit=args.text_unit,
            skip_bad=args.skip_bad,
        ),
        bos=args.bos,
        eos=args.eos,
        workers=args.workers,
        engine=args.engine,
        address=args.address,
        task_bytes=args.task_mb << 20 if args.task_mb else None,
        overwrite=args.overwrite,
    )
    rate = res.tokens / max(res.seconds, 1e-9)
    print(
        f"{res.documents:,} documents, {res.tokens:,} tokens from {len(res.files)} files in "
        f"{res.tasks} tasks ({res.resumed_tasks} resumed) -> {res.path} "
        f"({res.seconds:.2f} s, {rate:,.0f} tokens/s)"
    )
    if res.bad:
        first = res.bad_examples[0]["reason"] if res.bad_examples else ""
        print(f"skipped {res.bad:,} bad records (first: {first})")
    return 0


def register(sub: Any) -> None:
    """Add ``datamill tokenize``."""
    p = sub.add_parser(
        "tokenize",
        help="tokenize files of documents (JSONL, Parquet, text; .gz/.zst; local or s3://) into "
        "a token shardset dataset",
    )
    p.add_argument("inputs", nargs="+", help="files, folders or globs of documents")
    p.add_argument(
        "--out",
        required=True,
        help="output dataset folder (a previous one is replaced when the new one is complete)",
    )
    p.add_argument("--tokenizer", default=None, help="a Hugging Face tokenizers JSON file")
    p.add_argument(
        "--train-vocab",
        type=int,
        default=None,
        metavar="N",
        help="train a BPE vocabulary of N tokens on a sample of the inputs instead",
    )
    p.add_argument(
        "--text-field",
        default="text",
        help="JSONL field / Parquet column of the text (default text)",
    )
    p.add_argument("--keep", default="", help="comma-separated fields kept as metadata columns")
    p.add_argument(
        "--text-unit",
        choices=["block", "file"],
        default="block",
        help="plain text: a document per blank-line-separated block (default) or per file",
    )
    p.add_argument("--bos", default=None, help="a token put before every document (e.g. <s>)")
    p.add_argument("--eos", default=None, help="a token put after every document (e.g. </s>)")
    add_processes(p)
    add_engine(p, output="the same bytes")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip and count bad records instead of failing at the first",
    )
    p.add_argument(
        "--task-mb",
        type=int,
        default=None,
        help="MiB of input per task (= shard); default 1/256 of the input within [0.25, 64]",
    )
    add_overwrite(p)
    p.set_defaults(func=_cmd)
