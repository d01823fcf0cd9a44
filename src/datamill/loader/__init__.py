"""Deterministic, shard-aware, resumable batches over any datamill output.

``Loader(source, batch_size, ...)`` iterates a :class:`~datamill.core.source.Source`: a shardset
dataset, a preprocessed HDF5 (:class:`~datamill.preprocess.hdf5_source.HDF5Source`), a Parquet file of
BERT/word2vec samples (:class:`~datamill.core.parquet.ParquetSource`), an LM corpus; any output path
opens with :func:`datamill.sources.open_source`. The pure order
functions live in :mod:`datamill.loader.order`; the torch adapter in :mod:`datamill.loader.torch`.
"""

from __future__ import annotations

from datamill.loader.collate import collate_numpy, collate_torch
from datamill.loader.loader import Loader, per_sample
from datamill.loader.order import epoch_order, split_for_rank
from datamill.loader.state import check_resume_compat

__all__ = [
    "Loader",
    "check_resume_compat",
    "collate_numpy",
    "collate_torch",
    "epoch_order",
    "per_sample",
    "split_for_rank",
]
assert sorted(__all__) == __all__
