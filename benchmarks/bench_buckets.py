"""Padding saved by length-bucketed batches on BERT compact samples (WikiText-2 test, real data).

Builds BERT pretraining samples in the compact layout (unpadded ``tokens``) from
``$DATAMILL_DATA/wikitext2_test.raw`` (dupe factor 5, max length 128 and 512), then compares, per
batch size, the cells a batch padded to its longest sample holds with and without
``bucket_by="tokens"``, and the loader's throughput both ways. Small: about half a minute.

    python benchmarks/bench_buckets.py [--out benchmarks/results/buckets.md]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from datamill.loader import Batching, Loader
from datamill.loader.buckets import padding_of, sample_lengths
from datamill.loader.sources import open_source
from datamill.pretrain.bert import build_bert_samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None, help="write the markdown table here too")
    args = ap.parse_args()
    raw = Path(os.environ.get("DATAMILL_DATA", "/work/shared/data")) / "wikitext2_test.raw"
    header = (
        "| max len | samples | batch | buckets | padding cells, plain | padding cells, bucketed | "
        "padded tokens saved | loader s plain / bucketed |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for max_len in (128, 512):
            out = Path(tmp) / f"bert{max_len}.parquet"
            build_bert_samples(
                raw,
                out=out,
                vocab_size=8000,
                max_seq_length=max_len,
                dupe_factor=5,
                seed=0,
                layout="compact",
                workers=1,
            )
            src = open_source(out)
            lengths = sample_lengths(src, "tokens")
            for bs in (32, 128):
                for nb in (8,):
                    timings, pads = [], []
                    for bucket in (None, "tokens"):
                        loader = Loader(
                            src,
                            bs,
                            seed=0,
                            collate="numpy",
                            batching=Batching(bucket_by=bucket, buckets=nb),
                        )
                        t0 = time.perf_counter()
                        for _ in loader:
                            pass
                        timings.append(time.perf_counter() - t0)
                        loader.set_epoch(0)
                        pads.append(padding_of(lengths[loader.plan().seq], batch_size=bs))
                    (p0, t0_), (p1, t1_) = pads
                    saved = 1 - (t1_ / t0_)
                    lines.append(
                        f"| {max_len} | {len(lengths):,} | {bs} | {nb} | {p0:,} of {t0_:,} "
                        f"({p0 / t0_:.1%}) | {p1:,} of {t1_:,} ({p1 / t1_:.1%}) | {saved:.1%} "
                        "of all cells "
                        f"| {timings[0]:.2f} / {timings[1]:.2f} |"
                    )
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(
            "# Length-bucketed batches on BERT compact samples\n\n"
            "`python benchmarks/bench_buckets.py` (WikiText-2 test, dupe factor 5, "
            f"seed 0; {np.__name__} {np.__version__})\n\n" + text + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
