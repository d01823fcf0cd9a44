"""UID-keyed shardset datasets: create, add features as new shardsets, validate, read by UID.

A dataset is a folder with ``dataset.json`` (the manifest, written last), ``samples.parquet``
(UID → shard index, shared by every shardset) and one folder per shardset of
``shard.00000.parquet`` (or ``.csv``) files. See :class:`ShardsetDataset`.
"""

from __future__ import annotations

from datamill.shards.check import check_dataset
from datamill.shards.dataset import ShardsetDataset

__all__ = ["ShardsetDataset", "check_dataset"]

assert sorted(__all__) == __all__
