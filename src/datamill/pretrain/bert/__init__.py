"""BERT pretraining samples: raw text -> NSP pairs + masked LM -> Parquet, and padded batches back.

The builder is :func:`build_bert_samples` (pairing rules, truncation and masking are described in
:mod:`datamill.pretrain.bert._build`); :func:`datamill.loader.read_batches` reads a file back as
padded batches (``BertParquetSource.padded_collate``); ``datamill bert`` is
:mod:`datamill.pretrain.bert.cli`.

Examples:
    >>> from datamill.pretrain.bert import build_bert_samples
    >>> callable(build_bert_samples)
    True
"""

from __future__ import annotations

from datamill.pretrain.bert._build import (
    BERT_SPECIALS,
    BertConfig,
    BertParquetSource,
    BertSamples,
    build_bert_samples,
    collate_bert,
    is_bert_parquet,
    load_tokenizer,
    read_metadata,
)

__all__ = [
    "BERT_SPECIALS",
    "BertConfig",
    "BertParquetSource",
    "BertSamples",
    "build_bert_samples",
    "collate_bert",
    "is_bert_parquet",
    "load_tokenizer",
    "read_metadata",
]
assert sorted(__all__) == __all__
