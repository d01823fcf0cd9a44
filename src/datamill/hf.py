"""Hugging Face ``datasets`` over datamill outputs: ``to_dataset`` and ``to_iterable_dataset``.

Any datamill output that :func:`datamill.sources.open_source` opens (a shardset dataset, a Parquet
file or folder, BERT or word2vec samples, a preprocessed HDF5), or any
:class:`~datamill.core.source.Source`, becomes a :class:`datasets.Dataset` whose Arrow table is
the shards' tables concatenated without copying (an in-memory table: pyarrow buffers shared, no
per-row conversion), or a :class:`datasets.IterableDataset` with one HF shard per datamill shard.

``datasets`` is imported only here (``pip install 'datamill[hf]'``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from datamill.core.optional import require
from datamill.core.source import Source

__all__ = ["to_dataset", "to_iterable_dataset"]


def _source(data: Source | str | os.PathLike[str]) -> Source:
    if isinstance(data, Source):
        return data
    from datamill.sources import open_source

    return open_source(data)


def _table(src: Source, columns: Sequence[str] | str | None) -> pa.Table:
    cols = [columns] if isinstance(columns, str) else None if columns is None else list(columns)
    tables = [src.read_shard(k, columns=cols) for k in range(src.num_shards)]
    if not tables:
        raise ValueError("the source has no shards")
    return pa.concat_tables(tables)  # zero-copy: the shards' chunks side by side


def to_dataset(
    data: Source | str | os.PathLike[str], /, *, columns: Sequence[str] | str | None = None
) -> Any:
    """A datamill output (a path or a Source) as a ``datasets.Dataset`` (zero-copy from the Arrow
    shards).

    Args:
        data: a path :func:`~datamill.sources.open_source` opens (local or ``s3://``), or a Source.
        columns: column(s) to keep. Defaults to ``None`` (all).

    Returns:
        A :class:`datasets.Dataset` over the shards' rows in shard order.

    Raises:
        MissingExtraError: ``datasets`` is not installed.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> ds = to_dataset(
        ...     TableSource(pa.table({"uid": [0, 1, 2], "b": [b"x", b"yy", b"z"]}), shard_size=2)
        ... )
        >>> len(ds), ds[1]
        (3, {'uid': 1, 'b': b'yy'})
    """
    datasets = require("datasets", extra="hf")
    return datasets.Dataset(_table(_source(data), columns))


def to_iterable_dataset(
    data: Source | str | os.PathLike[str], /, *, columns: Sequence[str] | str | None = None
) -> Any:
    """A datamill output as a ``datasets.IterableDataset`` with one HF shard per datamill shard.

    Each shard is read when the iteration reaches it (``datasets`` splits the shards between
    DataLoader workers and ``split_dataset_by_node`` ranks; its ``shuffle`` permutes them).

    Examples:
        >>> from datamill.core.source import TableSource
        >>> it = to_iterable_dataset(TableSource(pa.table({"uid": [0, 1, 2]}), shard_size=2))
        >>> [r["uid"] for r in it], it.num_shards
        ([0, 1, 2], 2)
    """
    datasets = require("datasets", extra="hf")
    src = _source(data)
    cols = [columns] if isinstance(columns, str) else None if columns is None else list(columns)
    features = (
        datasets.Features.from_arrow_schema(src.read_shard(0, columns=cols).schema)
        if src.num_shards
        else None
    )

    def rows(shards: list[int]) -> Any:
        for k in shards:
            table = src.read_shard(k, columns=cols)
            for batch in table.to_batches(max_chunksize=1024):
                yield from batch.to_pylist()

    return datasets.IterableDataset.from_generator(
        rows, gen_kwargs={"shards": list(range(src.num_shards))}, features=features
    )
