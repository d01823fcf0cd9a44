"""The BERT output as a loader Source (:class:`BertParquetSource`), importable without the
builder."""

from __future__ import annotations

from datamill.pretrain.bert._io import BertParquetSource, is_bert_parquet

__all__ = ["BertParquetSource", "is_bert_parquet"]
