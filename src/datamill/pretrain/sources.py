"""Register the pretraining outputs as sources: BERT Parquet files and word2vec skip-gram folders."""

from __future__ import annotations

from pathlib import Path

from datamill.core.source import Source, register_source
from datamill.pretrain._bert_io import META_KEY, BertParquetSource

__all__ = ["BertParquetSource", "open_skipgram"]


def _is_bert(p: Path) -> bool:
    if not (p.is_file() and p.suffix in (".parquet", ".pq")):
        return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return META_KEY.encode() in (pq.read_metadata(p).metadata or {})
    except (OSError, pa.ArrowException):
        return False


def open_skipgram(path: Path) -> Source:
    """A word2vec output folder (``skipgram.json``) as its examples' Source."""
    from datamill.pretrain.word2vec import SkipGramSamples

    return SkipGramSamples.load(path).source()


register_source("bert", marker=_is_bert, opener=BertParquetSource, priority=10)
register_source("word2vec", marker=lambda p: p.is_dir() and (p / "skipgram.json").is_file(), opener=open_skipgram,
                priority=10)
