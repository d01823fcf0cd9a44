"""Deterministic, shard-aware, resumable batches over any datamill output.

``Loader(source, batch_size, ..., batching=Batching(...), workers=Workers(...))`` iterates a
:class:`~datamill.core.source.Source`: a shardset
dataset, a preprocessed HDF5 (:class:`~datamill.preprocessing.hdf5.HDF5Source`), a Parquet file of
BERT/word2vec samples (:class:`~datamill.core.parquet.ParquetSource`), an LM corpus; any output path
opens with :func:`datamill.loader.sources.open_source`. A Loader is a thin per-rank iterator over a
:class:`BatchService`, which plans every rank's epoch, shares one shard cache between concurrent
builds and yields :class:`BatchResult` objects; :class:`Accounting` adds them up and applies the
``max_errors`` policy (the Loader, the torch adapter and the server all use it). The pure order
functions live in :mod:`datamill.loader.order`; the torch adapter in :mod:`datamill.loader.torch`
(:class:`~datamill.loader.torch.TorchLoaderDataset`). :class:`Mix` mixes
several sources with exact per-epoch proportions and is itself a source. ``Loader(...,
packing=Packing(...), balance=...)`` (or a Mix with a :class:`Schedule`) yields language-model
global steps instead (:mod:`datamill.loader.lm`). :func:`trace` answers which
steps read a sample and which samples a step read, from ``Loader.run_record()``.
"""

from __future__ import annotations

from datamill.core.state import check_resume_compat
from datamill.loader.accounting import Accounting, BatchResult
from datamill.loader.collate import collate_numpy, collate_torch
from datamill.loader.loader import Loader, per_sample
from datamill.loader.mix import Mix
from datamill.loader.options import Batching, Workers
from datamill.loader.order import epoch_order, split_for_rank
from datamill.loader.packing import Packing
from datamill.loader.schedule import Schedule
from datamill.loader.service import BatchService
from datamill.loader.sources import open_source, read_batches
from datamill.loader.stages import EpochPlan

__all__ = [
    "Accounting",
    "BatchResult",
    "BatchService",
    "Batching",
    "EpochPlan",
    "Loader",
    "Mix",
    "Packing",
    "Schedule",
    "Workers",
    "check_resume_compat",
    "collate_numpy",
    "collate_torch",
    "epoch_order",
    "open_source",
    "per_sample",
    "read_batches",
    "split_for_rank",
]
assert sorted(__all__) == __all__
