"""Demo section: WordPiece tokenizer on WikiText-2 (test), BERT Parquet, one decoded sample."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["run"]


def run(data_dir: Path, work_dir: Path) -> None:
    """Train a small tokenizer, write BERT samples, print one sample with its masks."""
    import pyarrow.parquet as pq

    from datamill.core.progress import quiet
    from datamill.pretrain.bert import BertParquetSource, build_bert_samples
    from datamill.pretrain.bert._tok import resolve_tokenizer

    print("\n== BERT pretraining data (NSP pairs, 15% masking at 80/10/10) ==")
    raw = work_dir / "bert" / "wikitext2_test.raw"
    raw.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(data_dir / "wikitext2_test.raw", raw)
    with quiet():
        res = build_bert_samples(
            raw,
            out=work_dir / "bert" / "bert.parquet",
            vocab_size=8000,
            max_seq_length=128,
            dupe_factor=2,
            seed=0,
        )
    print(
        f"documents {res.documents:,}, samples {res.samples:,}, tokens {res.tokens:,}, "
        f"{res.samples_per_s:,.0f} samples/s (incl. tokenizer training, {res.seconds:.2f} s)"
    )
    md = pq.read_metadata(res.path)
    print(
        f"{res.path.name}: {md.num_rows:,} rows in {md.num_row_groups} row groups, "
        f"{res.path.stat().st_size / 1e6:.1f} MB; tokenizer {res.tokenizer_path.name}"
    )
    tok = resolve_tokenizer(res.tokenizer_path)
    assert tok is not None
    src = BertParquetSource(
        res.path
    )  # the loader reads it the same way: datamill.loader.read_batches(path, ...)
    batch = src.padded_collate()(src.read_shard(0).slice(0, 2))
    i = 0
    n = int(batch["attention_mask"][i].sum())
    words = tok.decode_tokens(batch["tokens"][i][:n])
    k = int(batch["masked_weights"][i].sum())
    positions = batch["masked_positions"][i][:k].tolist()
    labels = tok.decode_tokens(batch["masked_labels"][i][:k])
    print(
        f"sample 0 of the first row group: is_random_next={bool(batch['is_random_next'][i])}, "
        f"{n} tokens, segment ids {batch['segment_ids'][i][:n].tolist().count(0)}x0 + "
        f"{batch['segment_ids'][i][:n].tolist().count(1)}x1"
    )
    shown = " ".join(f"<{w}>" if p in positions else w for p, w in enumerate(words))
    print("  " + shown[:600] + (" ..." if len(shown) > 600 else ""))
    print(
        "  masked (position: shown -> original): "
        + ", ".join(f"{p}: {words[p]} -> {lab}" for p, lab in zip(positions, labels, strict=True))
    )
