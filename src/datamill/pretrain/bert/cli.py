"""``datamill bert RAW.txt --out FILE.parquet``: BERT pretraining samples from raw text."""

from __future__ import annotations

import argparse
from typing import Any

from datamill.core.cliargs import add_engine, add_overwrite, add_processes, add_seed
from datamill.pretrain.bert.limits import (
    DUPE_FACTOR,
    MASK_PROB,
    MAX_PREDICTIONS,
    MAX_SEQ_LENGTH,
    SHORT_SEQ_PROB,
    VOCAB_SIZE,
)

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from datamill.pretrain.bert import BertConfig, build_bert_samples

    names = set(BertConfig.model_fields) - {"engine_options"}
    config = BertConfig(
        **{k: v for k, v in vars(args).items() if k in names},
        engine_options={"address": args.address} if args.engine == "ray" else None,
    )
    res = build_bert_samples(args.raw, out=args.out, config=config)
    print(
        f"documents {res.documents:,}  samples {res.samples:,}  tokens {res.tokens:,}  "
        f"{res.samples_per_s:,.0f} samples/s ({res.seconds:.2f} s)"
    )
    print(f"wrote {res.url or res.path} ({res.layout}) and {res.tokenizer_path.name}")
    print("seconds per stage: " + ", ".join(f"{k} {v:.2f}" for k, v in res.timings.items()))
    return 0


# long (67 lines): argparse declarations, one add_argument call per option
def register(sub: Any) -> None:
    """Add ``datamill bert``."""
    p = sub.add_parser(
        "bert",
        help="BERT pretraining samples (NSP pairs + masked LM) to Parquet",
        description="Documents from WikiText-style raw text (blank or '= Title =' lines end a "
        "document, each other line is a sentence) -> NSP pairs, truncation, "
        "15% masking at 80/10/10 -> Parquet.",
    )
    p.add_argument("raw", nargs="+", help="raw text file(s)")
    p.add_argument(
        "--out",
        required=True,
        help="the Parquet file to write (an earlier BERT Parquet file is replaced atomically; "
        "anything "
        "else is refused; --engine ray: the shardset dataset folder)",
    )
    add_overwrite(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokenizer", help="a tokenizers JSON file with [PAD] [CLS] [SEP] [MASK] [UNK]")
    g.add_argument(
        "--vocab-size",
        type=VOCAB_SIZE.arg,
        default=30000,
        help="train a WordPiece tokenizer of this size (default 30000)",
    )
    p.add_argument("--max-seq-length", type=MAX_SEQ_LENGTH.arg, default=512, help="default 512")
    p.add_argument("--dupe-factor", type=DUPE_FACTOR.arg, default=10, help="default 10")
    p.add_argument("--mask-prob", type=MASK_PROB.arg, default=0.15, help="default 0.15")
    p.add_argument(
        "--max-predictions-per-seq",
        "--max-predictions",
        dest="max_predictions_per_seq",
        type=MAX_PREDICTIONS.arg,
        default=20,
        help="max masked positions per sample (default 20; --max-predictions is an alias)",
    )
    p.add_argument("--short-seq-prob", type=SHORT_SEQ_PROB.arg, default=0.1, help="default 0.1")
    add_seed(p, what="seeds the pairs and masks")
    add_processes(p, default="one per core for large inputs")
    p.add_argument(
        "--layout",
        choices=["padded", "compact"],
        default="padded",
        help="padded: the seed's columns; compact: unpadded tokens + segment_a_length",
    )
    p.add_argument(
        "--sentence-split",
        choices=["line", "period"],
        default="line",
        help="line: each line is a sentence (default); period: also cut after ' . '",
    )
    p.add_argument(
        "--pairing",
        choices=["chunk_past_target", "google", "seed"],
        default="chunk_past_target",
        help="chunk_past_target: a chunk grows one sentence past the target length, so it holds "
        "two "
        "sentences or more (default; 'seed' is its deprecated old name); google: Google BERT's "
        "create_instances_from_document (the chunk stops at the target)",
    )
    add_engine(p, output="samples as a shardset dataset")
    p.add_argument(
        "--format",
        choices=["parquet"],
        default="parquet",
        help="output format: Parquet (a file, or the shards of the Ray engine's dataset)",
    )
    p.set_defaults(func=_cmd)
