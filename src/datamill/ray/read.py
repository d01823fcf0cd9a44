"""``read_dataset(path_or_url)``: a datamill output as a ``ray.data.Dataset`` (one block per shard).

Any output :func:`datamill.sources.open_source` opens (a shardset dataset, a Parquet file or
folder, BERT or word2vec samples, a preprocessed HDF5, local or ``s3://``) is read through a Ray
Data ``Datasource`` whose read tasks are the shards: task ``k`` opens the source in its worker (once
per worker process) and returns ``read_shard(k)`` as one Arrow block, so Ray Train's
``streaming_split`` consumers, ``map_batches`` and the rest of Ray Data see datamill's rows
unchanged. ``ray`` is imported when :func:`read_dataset` is called.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from datamill.ray._runtime import ray_module

__all__ = ["read_dataset"]

_OPENED: dict[
    tuple[str, str | None, int | None], Any
] = {}  # per worker process: path -> opened source
_LOCK = threading.Lock()


def _open(path: str, cache_dir: str | None, cache_limit: int | None) -> Any:
    from datamill.sources import open_source

    key = (path, cache_dir, cache_limit)
    with _LOCK:
        src = _OPENED.get(key)
        if src is None:
            src = _OPENED[key] = open_source(path, cache_dir=cache_dir, cache_limit=cache_limit)
    return src


def _read(
    path: str, cache_dir: str | None, cache_limit: int | None, k: int, columns: list[str] | None
) -> list[pa.Table]:
    return [_open(path, cache_dir, cache_limit).read_shard(k, columns=columns)]


def _datasource(
    path: str, cache_dir: str | None, cache_limit: int | None, columns: list[str] | None
) -> tuple[Any, int]:
    ray = ray_module()
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    src = _open(path, cache_dir, cache_limit)
    sizes = [int(s) for s in src.shard_sizes()]
    nbytes_of = getattr(src, "shard_nbytes", None)
    nbytes = [int(b) for b in nbytes_of()] if callable(nbytes_of) else [None] * len(sizes)
    schema = src.read_shard(0, columns=columns).schema if sizes else None

    class DatamillDatasource(Datasource):
        """The shards of a datamill output as read tasks (one block each)."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]  # ray is untyped

        def get_name(self) -> str:
            return "Datamill"

        def estimate_inmemory_data_size(self) -> int | None:
            return sum(b for b in nbytes if b is not None) or None

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list[Any]:
            tasks = []
            for k, rows in enumerate(sizes):
                meta = BlockMetadata(
                    num_rows=rows, size_bytes=nbytes[k], input_files=None, exec_stats=None
                )
                tasks.append(
                    ReadTask(
                        functools.partial(_read, path, cache_dir, cache_limit, k, columns),
                        meta,
                        schema=schema,
                    )
                )
            return tasks

    _ = ray
    return DatamillDatasource(), len(sizes)


def read_dataset(
    path_or_url: str | os.PathLike[str],
    /,
    *,
    columns: Sequence[str] | str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> Any:
    """A datamill output as a ``ray.data.Dataset`` whose blocks are its shards, in shard order.

    Args:
        path_or_url: a path or ``s3://`` URL :func:`~datamill.sources.open_source` opens.
        columns: column(s) to read. Defaults to ``None`` (all).
        cache_dir: the local shard cache of an ``s3://`` source (on each worker). Defaults to
            ``None``.
        cache_limit: bytes that cache keeps at most. Defaults to ``None`` (no limit).

    Returns:
        A :class:`ray.data.Dataset` (lazy: shards are read by Ray tasks when it executes).

    Raises:
        MissingExtraError: ``ray`` is not installed. DataFileNotFoundError: nothing at the path.

    Examples:
        >>> callable(read_dataset)
        True
    """
    ray = ray_module()
    cols = [columns] if isinstance(columns, str) else None if columns is None else list(columns)
    path = os.fspath(path_or_url)
    source, shards = _datasource(
        path, None if cache_dir is None else os.fspath(cache_dir), cache_limit, cols
    )
    # as many blocks as shards: Ray would otherwise split each shard's block to reach its
    # parallelism
    return ray.data.read_datasource(source, override_num_blocks=max(1, shards))
