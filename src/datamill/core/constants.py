"""Names, suffixes and format versions used across datamill, kept in one place."""

from __future__ import annotations

__all__ = [
    "BERT_FORMAT",
    "CORPUS_FORMAT",
    "DATASET_MANIFEST",
    "HDF5_SUFFIX",
    "LOADER_STATE_FORMAT",
    "META_FORMAT",
    "META_SUFFIX",
    "OUTPUT_MARKERS",
    "PAD",
    "ROW_HASHES_KEY",
    "SAMPLES_FILE",
    "SHARDS_FORMAT",
    "SHARD_PATTERN",
    "UNK",
    "VERSION",
    "VOCAB_FILE",
    "WORD2VEC_FORMAT",
]

VERSION = "0.1.0"
"""datamill's version (``datamill.__version__``; modules import it from here, not from the
package)."""

PAD = "<PAD>"
UNK = "<UNK>"

HDF5_SUFFIX = ".hdf5"
META_SUFFIX = ".meta.json"
META_FORMAT = "datamill.preprocess/1"

VOCAB_FILE = "vocab.json"
CORPUS_FORMAT = "datamill.corpus/1"
WORD2VEC_FORMAT = "datamill.word2vec/1"
BERT_FORMAT = "datamill.bert/1"

DATASET_MANIFEST = "dataset.json"
SAMPLES_FILE = "samples.parquet"
SHARD_PATTERN = "shard.{index:05d}.{ext}"
SHARDS_FORMAT = "datamill.shards/1"

ROW_HASHES_KEY = "row_hashes"
"""The key of ``dataset.json`` (and of ``meta.json``'s ``datamill`` header) that points at the
build's cached row hashes (``datamill diff``); not part of the build's fingerprint."""

OUTPUT_MARKERS = ("corpus.json", "skipgram.json", DATASET_MANIFEST)
"""Files whose presence makes a folder a datamill output (corpus, word2vec, shardset dataset)."""

LOADER_STATE_FORMAT = "datamill.loader/1"
assert sorted(__all__) == __all__
