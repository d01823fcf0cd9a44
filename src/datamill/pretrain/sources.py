"""Register the pretraining outputs as sources: BERT Parquet files and word2vec skip-gram
folders."""

from __future__ import annotations

from pathlib import Path

from datamill.core.source import Source, register_source
from datamill.pretrain.bert.source import BertParquetSource, is_bert_parquet

__all__ = ["BertParquetSource", "open_skipgram"]


def open_skipgram(path: Path) -> Source:
    """A word2vec output folder (``skipgram.json``) as its examples' Source."""
    from datamill.pretrain.word2vec import SkipGramSamples

    return SkipGramSamples.load(path).source()


register_source("bert", marker=is_bert_parquet, opener=BertParquetSource, priority=10)
register_source(
    "word2vec",
    marker=lambda p: p.is_dir() and (p / "skipgram.json").is_file(),
    opener=open_skipgram,
    priority=10,
)
