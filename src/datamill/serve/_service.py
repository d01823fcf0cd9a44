"""Stand-in for ``datamill.loader.service.BatchService`` (being written in parallel).

The server imports the batch service ONLY from here, so the merge replaces one import. This class has
exactly that API, built on today's public :class:`~datamill.loader.Loader`: one Loader per
``(rank, world_size)`` (``collate="arrow"``), all reading through one :class:`SharedShardCache`, so every
rank's batches come from the same shard reads and equal the in-process Loader's byte for byte.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from datamill.core.source import Source
from datamill.loader.collate import resolve_collate
from datamill.loader.loader import Loader
from datamill.loader.stages import BatchResult, EpochPlan

__all__ = ["BatchService", "SharedShardCache"]


class SharedShardCache:
    """A Source wrapper keeping the last ``capacity`` shards read (per column selection) in memory.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> src = SharedShardCache(TableSource(pa.table({"x": list(range(6))}), shard_size=2), capacity=2)
        >>> src.read_shard(1)["x"].to_pylist(), src.read_shard(1)["x"].to_pylist(), src.hits
        ([2, 3], [2, 3], 1)
    """

    def __init__(self, source: Source, *, capacity: int = 16) -> None:
        self.source, self.capacity = source, max(1, int(capacity))
        self._cache: OrderedDict[tuple[int, tuple[str, ...] | None], pa.Table] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.uid_column = getattr(source, "uid_column", None)

    @property
    def columns(self) -> list[str]:
        """The wrapped source's columns."""
        return list(self.source.columns)

    @property
    def num_shards(self) -> int:
        """The wrapped source's shard count."""
        return int(self.source.num_shards)

    def shard_sizes(self) -> Any:
        """The wrapped source's shard sizes."""
        return self.source.shard_sizes()

    def fingerprint(self) -> str:
        """The wrapped source's fingerprint."""
        return self.source.fingerprint()

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        """Shard ``index`` from the cache, or read (outside the lock) and cached."""
        key = (int(index), None if columns is None else tuple(columns))
        with self._lock:
            table = self._cache.get(key)
            if table is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return table
            self.misses += 1
        table = self.source.read_shard(index, columns=columns)
        with self._lock:
            self._cache[key] = table
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return table


class BatchService:
    """Build any rank's batch ``k`` of any epoch, in the Loader's order (see the module docstring).

    Examples:
        >>> from datamill.core.source import TableSource
        >>> svc = BatchService(TableSource(pa.table({"x": list(range(10))}), shard_size=4), batch_size=4, seed=1)
        >>> [r.output.num_rows for r in svc.build(0, 0, [0, 1, 2])], svc.num_batches(0)
        ([4, 4, 2], 3)
    """

    def __init__(self, source: Source, *, batch_size: int, seed: int = 0, shuffle: bool = True,
                 window: int | None = None, drop_last: bool = False, columns: Sequence[str] | str | None = None,
                 collate: str | Callable[[pa.Table], Any] = "numpy", filter: Callable[[pa.Table], Any] | None = None,
                 transform: Callable[[pa.Table], pa.Table] | None = None, max_errors: int = 0, prefetch: int = 2,
                 num_workers: int = 0, cache_shards: int | None = None) -> None:
        self.source = SharedShardCache(source, capacity=cache_shards or 16)
        self._kwargs: dict[str, Any] = {
            "seed": int(seed), "shuffle": shuffle, "shuffle_buffer": window, "drop_last": drop_last,
            "columns": columns, "collate": "arrow", "filter": filter, "transform": transform,
            "max_errors": max_errors, "prefetch": prefetch, "num_workers": num_workers}
        self.batch_size = int(batch_size)
        self.collate_fn = resolve_collate(collate)
        self._loaders: dict[tuple[int, int], Loader] = {}
        self._lock = threading.Lock()
        self._fingerprint: str | None = None

    def _loader(self, epoch: int, rank: int, world_size: int) -> Loader:
        with self._lock:
            loader = self._loaders.get((rank, world_size))
            if loader is None:
                loader = Loader(self.source, self.batch_size, rank=rank, world_size=world_size,
                                epoch=epoch, **self._kwargs)
                self._loaders[(rank, world_size)] = loader
            return loader

    def plan(self, epoch: int, rank: int = 0, world_size: int = 1) -> EpochPlan:
        """The rank's plan of ``epoch`` (``.total_batches``, ``.seq`` global sample ids)."""
        loader = self._loader(epoch, rank, world_size)
        with self._lock:
            return loader.plan(epoch)

    def num_batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> int:
        """Batches of ``rank`` in ``epoch``."""
        return int(self.plan(epoch, rank, world_size).total_batches)

    def build(self, epoch: int, rank: int, batch_numbers: Sequence[int], *,
              world_size: int = 1) -> Iterator[BatchResult]:
        """Build the given batch numbers (ascending) of ``rank`` in ``epoch``."""
        base = self._loader(epoch, rank, world_size)
        with self._lock:  # a private Loader view per call: iter_batches keeps per-call reader state
            loader = Loader.__new__(Loader)
            loader.__dict__.update(base.__getstate__())
            loader.epoch = epoch
            loader._plan, loader._plan_epoch = base.plan(epoch), epoch
        for res in loader.iter_batches(list(batch_numbers)):
            if res.output is not None and self.collate_fn is not _arrow_identity():
                res.output = self.collate_fn(res.output)
            yield res

    def fingerprint(self) -> str:
        """The source's fingerprint (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = self.source.fingerprint()
        return self._fingerprint

    def config(self, *, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
        """The order-relevant config of ``rank`` (what a Loader state records)."""
        return dict(self._loader(0, rank, world_size).config)

    def close(self) -> None:
        """Drop the loaders and the shard cache."""
        with self._lock:
            self._loaders.clear()
        with self.source._lock:
            self.source._cache.clear()


def _arrow_identity() -> Callable[[pa.Table], Any]:
    return resolve_collate("arrow")
