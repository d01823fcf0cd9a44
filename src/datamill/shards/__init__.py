"""UID-keyed shardset datasets: create, add features as new shardsets, validate, read by UID.

A dataset is a folder with ``dataset.json`` (the manifest, written last), ``samples.parquet``
(UID → shard index, shared by every shardset) and one folder per shardset of
``shard.00000.parquet`` (or ``.csv``) files. See :class:`ShardsetDataset`.

* ``ShardsetDataset.create(root, files_or_table, uid=..., shardset=..., shard_size=...)``: the first
  shardset defines the mapping (file order = shard index; rows keep their order).
* ``ds.add(name, shard_files)`` (each file must respect the mapping) or ``ds.add(name, table,
  route=True)`` (rows routed to their shards). UIDs unknown to the mapping are an **error naming
  them**: new samples would change what shard ``k`` means for every existing shardset and for saved
  loader states, so they belong in a new dataset (no "append new shards" mode).
* ``read_shard(k, columns=..., join="left"|"inner")``, ``get(uid)``, ``check_dataset(root)``.
* Writes are atomic: shards go to a hidden ``.tmp-…`` folder, are checked, renamed; ``dataset.json``
  is replaced last. A killed ``add`` leaves every existing file as it was (at most a hidden
  ``.tmp-…`` folder remains, which readers and ``check`` ignore).
"""

from __future__ import annotations

from datamill.shards.check import check_dataset
from datamill.shards.dataset import ShardsetDataset

__all__ = ["ShardsetDataset", "check_dataset"]

assert sorted(__all__) == __all__
