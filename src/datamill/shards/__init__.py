"""UID-keyed shardset datasets: create, add features as new shardsets, validate, describe, read by
UID.

A dataset is a folder with ``dataset.json`` (the manifest, written last), ``samples.parquet``
(UID → shard index, shared by every shardset) and one folder per shardset of
``shard.00000.parquet`` (or ``.csv``) files.

* :class:`ShardsetDataset` reads (``read_shard(k, columns=..., join="left"|"inner")``, ``get(uid)``,
  ``info()``, ``describe()``); it never writes.
* :class:`ShardsetWriter` writes one shardset: ``with ShardsetWriter(root, uid=..., shardset=...) as
  w``, then ``w.write_shard(k, table)`` here or ``w.sink.write_shard(k, table)`` in worker processes
  (the sink pickles); leaving the block commits (validate, rename, manifest last), an exception
  discards. The first shardset of a new dataset fixes the mapping; later ones must follow it.
* ``ShardsetDataset.create(root, files_or_table, uid=..., shardset=..., shard_size=...)`` and
  ``ds.add(name, shard_files)`` / ``ds.add(name, table, route=True)`` are thin wrappers of the
  writer (:mod:`datamill.shards.create`). UIDs unknown to the mapping are an **error naming them**:
  new samples would change what shard ``k`` means for every existing shardset and for saved loader
  states, so they belong in a new dataset (no "append new shards" mode).
* :func:`check_dataset` lists every violation as exceptions (the CLI prints them);
  :func:`check_report` gives the same as plain dicts (``kind``, ``message``, ``path``, ``shard``,
  ``uid``, ``column``, ``row``, ``hint``) for the web UI.
* Writes are atomic: shards go to a hidden ``.tmp-…`` folder, are checked, renamed; ``dataset.json``
  is replaced last. A killed write leaves every existing file as it was (at most a hidden
  ``.tmp-…`` folder remains, which readers and ``check`` ignore).
"""

from __future__ import annotations

from datamill.shards import (
    create as create,  # registers ShardsetDataset.create/.add (shards._verbs)
)
from datamill.shards.check import check_dataset, check_report
from datamill.shards.dataset import ShardsetDataset
from datamill.shards.writer import ShardsetWriter, ShardSink

__all__ = ["ShardSink", "ShardsetDataset", "ShardsetWriter", "check_dataset", "check_report"]

assert sorted(__all__) == __all__
