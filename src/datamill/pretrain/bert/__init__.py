"""BERT pretraining samples: raw text -> NSP pairs + masked LM -> Parquet, and padded batches back.

The builder is :func:`build_bert_samples` (pairing rules, truncation and masking are described in
:mod:`datamill.pretrain.bert._build`); :func:`read_bert_batches` reads a file back through the
loader; ``datamill bert`` is :mod:`datamill.pretrain.bert.cli`.

Examples:
    >>> from datamill.pretrain.bert import build_bert_samples, read_bert_batches
    >>> callable(build_bert_samples) and callable(read_bert_batches)
    True
"""

from __future__ import annotations

from datamill.pretrain.bert._build import (
    BERT_SPECIALS,
    BertParquetSource,
    BertSamples,
    build_bert_samples,
    collate_bert,
    is_bert_parquet,
    load_tokenizer,
    read_bert_batches,
    read_metadata,
)

__all__ = ["BERT_SPECIALS", "BertParquetSource", "BertSamples", "build_bert_samples", "collate_bert",
           "is_bert_parquet", "load_tokenizer", "read_bert_batches", "read_metadata"]
assert sorted(__all__) == __all__
