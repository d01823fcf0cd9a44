"""The :class:`Loader`: deterministic, shard-aware, resumable batches over any :class:`Source`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.constants import LOADER_STATE_FORMAT
from datamill.core.errors import ConfigError, DataFileError, SchemaError
from datamill.core.progress import progress as progress_bar
from datamill.core.source import Source
from datamill.loader.collate import resolve_collate
from datamill.loader.order import default_window
from datamill.loader.stages import BatchResult, EpochPlan, ShardReader, assemble, process_batch
from datamill.loader.state import (
    ORDER_FIELDS,
    check_resume_compat,
    config_fingerprint,
    validate_state,
)

__all__ = ["BLOCK_ROWS", "Loader", "per_sample"]

BLOCK_ROWS = 8192
"""Rows gathered per ``take`` (at most a mean shard's worth), then sliced per batch (zero-copy)."""


class Loader:
    """Iterate a :class:`~datamill.core.source.Source` in deterministic, resumable batches.

    The order is a pure function of ``(seed, epoch, shard sizes, shuffle_buffer)`` (see
    :mod:`datamill.loader.order`); ``rank``/``world_size`` take a contiguous slice of it and batch
    ``b`` is always positions ``[b * batch_size, (b + 1) * batch_size)`` of the rank's slice, whatever
    ``num_workers``. Iterating yields the rest of the current epoch; when an epoch is exhausted the
    loader moves on to the next one (``set_epoch`` also works, torch style).

    Samples dropped by ``filter`` (or failing ``transform``) leave their batch smaller than
    ``batch_size`` (positions, not outputs, define batches: that keeps order and resumption pure);
    a batch left empty is skipped. ``stats()`` counts the current epoch from where this loader
    started it (a resumed loader counts from the resume point).

    Args:
        source: what to read (any object with the Source protocol).
        batch_size: samples per batch.
        shuffle: shard-aware shuffle; ``False`` keeps source order. Defaults to ``True``.
        seed: the run's seed. Defaults to ``0``.
        epoch: the first epoch. Defaults to ``0``.
        columns: column(s) to read (all when ``None``). Defaults to ``None``.
        drop_last: give every rank ``n // world_size`` samples and drop the incomplete last batch;
            otherwise every sample is used exactly once and the first ``n % world_size`` ranks get one
            sample more. Defaults to ``False``.
        collate: ``"numpy"`` (dict of arrays, ragged lists padded with ``<col>_mask``), ``"torch"``,
            ``"arrow"`` (the ``pa.Table``) or a callable receiving the batch ``pa.Table``.
            Defaults to ``"numpy"``.
        rank: this process's rank. Defaults to ``0``.
        world_size: number of ranks. Defaults to ``1``.
        num_workers: threads assembling/filtering/transforming/collating batches (``0``: in the
            consuming thread). Threads, not processes: arrow and numpy release the GIL; for
            GIL-bound Python transforms use the torch adapter with ``DataLoader(num_workers=N)``
            worker processes. ``filter``/``transform`` must then be thread-safe. Defaults to ``0``.
        prefetch: shards read ahead in a background thread pool (and batches in flight per worker).
            Defaults to ``2``.
        filter: ``fn(batch: pa.Table) -> bool mask`` (see :func:`per_sample` for row predicates).
            Defaults to ``None``.
        transform: ``fn(batch: pa.Table) -> pa.Table`` run in the worker. Defaults to ``None``.
        shuffle_buffer: shards per shuffle window (memory holds about one window).
            Defaults to ``None`` (:func:`~datamill.loader.order.default_window`).
        max_errors: samples that may fail ``filter``/``transform`` per epoch (skipped, counted)
            before the loader raises. Defaults to ``0``.
        pin_memory: with ``collate="torch"``, pin tensors (when CUDA is available). Defaults to ``False``.
        progress: show a tqdm bar. Defaults to ``False``.

    Raises:
        ConfigError: invalid arguments. SchemaError: unknown columns.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> src = TableSource(pa.table({"x": list(range(10))}), shard_size=4)
        >>> loader = Loader(src, 4, seed=1)
        >>> batches = [b["x"].tolist() for b in loader]
        >>> [len(b) for b in batches], sorted(sum(batches, []))  == list(range(10))
        ([4, 4, 2], True)
        >>> loader.stats()["yielded"], loader.state_dict()["epoch"]
        (10, 1)
    """

    def __init__(
        self, source: Source, batch_size: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0,
        columns: Sequence[str] | str | None = None, drop_last: bool = False,
        collate: str | Callable[[pa.Table], Any] = "numpy", rank: int = 0, world_size: int = 1,
        num_workers: int = 0, prefetch: int = 2, filter: Callable[[pa.Table], Any] | None = None,
        transform: Callable[[pa.Table], pa.Table] | None = None, shuffle_buffer: int | None = None,
        max_errors: int = 0, pin_memory: bool = False, progress: bool = False,
    ) -> None:
        for name, value, low in [("batch_size", batch_size, 1), ("seed", seed, 0), ("epoch", epoch, 0),
                                 ("world_size", world_size, 1), ("num_workers", num_workers, 0),
                                 ("prefetch", prefetch, 1), ("max_errors", max_errors, 0)]:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        if shuffle_buffer is not None and (not isinstance(shuffle_buffer, int) or shuffle_buffer < 1):
            raise ConfigError(f"shuffle_buffer must be a number of shards >= 1, got {shuffle_buffer!r}")
        if not isinstance(source, Source):
            missing = [a for a in ("columns", "num_shards", "shard_sizes", "read_shard", "fingerprint")
                       if not hasattr(source, a)]
            raise ConfigError(f"source must follow the Source protocol; {type(source).__name__} lacks {missing}",
                              hint="wrap the data in a datamill source (TableSource, ParquetSource, HDF5Source, ...)")
        cols = [columns] if isinstance(columns, str) else None if columns is None else list(columns)
        if cols is not None:
            unknown = [c for c in cols if c not in source.columns]
            if unknown:
                raise SchemaError(f"unknown column(s) {unknown}; the source has {source.columns}",
                                  column=unknown[0])
        self.source, self.batch_size, self.shuffle, self.seed = source, int(batch_size), bool(shuffle), int(seed)
        self.columns, self.drop_last, self.rank, self.world_size = cols, bool(drop_last), int(rank), int(world_size)
        self.num_workers, self.prefetch, self.max_errors = int(num_workers), int(prefetch), int(max_errors)
        self.filter, self.transform, self.progress = filter, transform, bool(progress)
        self.collate_fn = resolve_collate(collate, pin_memory=pin_memory)
        self.sizes = np.asarray(source.shard_sizes(), dtype=np.int64)
        self.window = int(shuffle_buffer) if shuffle_buffer is not None else default_window(self.sizes)
        self.epoch = int(epoch)
        self._batches_seen = 0
        self._plan: EpochPlan | None = None
        self._plan_epoch = -1
        self._reader: ShardReader | None = None
        self._fingerprint: str | None = None
        self._stats = self._new_stats()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"] = None  # threads and locks stay in this process (spawned workers pickle the loader)
        return state

    # ----------------------------------------------------------------- order and state
    @property
    def config(self) -> dict[str, Any]:
        """The order-relevant settings (saved in the resume state)."""
        return {"batch_size": self.batch_size, "columns": self.columns, "drop_last": self.drop_last,
                "rank": self.rank, "shuffle": self.shuffle, "window": self.window, "world_size": self.world_size}

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The rank's :class:`~datamill.loader.stages.EpochPlan` for ``epoch`` (current by default)."""
        e = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan_epoch != e:
            self._plan = EpochPlan.make(self.sizes, seed=self.seed, epoch=e, shuffle=self.shuffle,
                                        window=self.window, rank=self.rank, world_size=self.world_size,
                                        drop_last=self.drop_last, batch_size=self.batch_size)
            self._plan_epoch = e
        return self._plan

    def __len__(self) -> int:
        """Batches per epoch on this rank (some may be skipped if a filter empties them)."""
        return self.plan().total_batches

    def dataset_fingerprint(self) -> str:
        """The source's fingerprint (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = self.source.fingerprint()
        return self._fingerprint

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning on the next iteration."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self.epoch, self._batches_seen = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """Tiny JSON-able resume state (see :mod:`datamill.loader.state`)."""
        plan = self.plan()
        return {"format": LOADER_STATE_FORMAT, "epoch": self.epoch, "batches_seen": self._batches_seen,
                "samples_seen": min(len(plan.seq), self._batches_seen * self.batch_size), "seed": self.seed,
                "dataset_fingerprint": self.dataset_fingerprint(),
                "config_fingerprint": config_fingerprint(self.config), "config": self.config}

    def load_state_dict(self, state: Mapping[str, Any], *, allow_mismatch: Sequence[str] = ()) -> None:
        """Continue where ``state`` was taken; raises ResumeStateError listing every mismatch."""
        st = validate_state(state)
        current = {"seed": self.seed, "dataset_fingerprint": self.dataset_fingerprint(), **self.config}
        saved = {"seed": st["seed"], "dataset_fingerprint": st["dataset_fingerprint"], **dict(st["config"])}
        check_resume_compat(saved, current, fields=("dataset_fingerprint", "seed", *ORDER_FIELDS),
                            allow_mismatch=allow_mismatch)
        self.epoch, self._batches_seen = st["epoch"], st["batches_seen"]

    @classmethod
    def from_state(cls, source: Source, state: Mapping[str, Any], /, **kwargs: Any) -> Loader:
        """A loader resuming ``state``; order settings default to the saved ones.

        Examples:
            >>> from datamill.core.source import TableSource
            >>> src = TableSource(pa.table({"x": list(range(10))}), shard_size=3)
            >>> a = Loader(src, 3, seed=5); it = iter(a); _ = next(it)
            >>> b = Loader.from_state(src, a.state_dict())
            >>> [x["x"].tolist() for x in it] == [x["x"].tolist() for x in b]
            True
        """
        st = validate_state(state)
        cfg = dict(st["config"])
        defaults = {"batch_size": cfg["batch_size"], "shuffle": cfg["shuffle"], "seed": st["seed"],
                    "columns": cfg["columns"], "drop_last": cfg["drop_last"], "rank": cfg["rank"],
                    "world_size": cfg["world_size"], "shuffle_buffer": cfg["window"]}
        defaults.update(kwargs)
        batch_size = defaults.pop("batch_size")
        loader = cls(source, batch_size, **defaults)
        loader.load_state_dict(st)
        return loader

    # ----------------------------------------------------------------- accounting
    def _new_stats(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "read": 0, "filtered": 0, "failed": 0, "yielded": 0, "batches": 0,
                "elapsed_s": 0.0, "first_batch_s": None}

    def stats(self) -> dict[str, Any]:
        """Counts of the current (or just finished) epoch: read, filtered, failed, yielded, samples/s, position."""
        s = dict(self._stats)
        s["samples_per_s"] = s["yielded"] / s["elapsed_s"] if s["elapsed_s"] > 0 else 0.0
        s["position"] = {"epoch": self.epoch, "batches_seen": self._batches_seen, "total_batches": len(self)}
        if self._reader is not None:  # of the latest iteration: shards read, most held in memory at once
            s["shards_read"], s["peak_shards_in_memory"] = self._reader.shards_read, self._reader.peak_resident
        return s

    def _account(self, res: BatchResult) -> None:
        s = self._stats
        s["read"] += res.read
        s["filtered"] += res.filtered
        s["yielded"] += res.yielded
        for uid, index, exc in res.failed:
            s["failed"] += 1
            if s["failed"] > self.max_errors:
                raise DataFileError(
                    f"sample {index} failed in filter/transform ({type(exc).__name__}: {exc}); "
                    f"{s['failed']} failures this epoch exceed max_errors={self.max_errors}",
                    uid=uid, hint="fix the transform or raise max_errors to skip such samples") from exc

    # ----------------------------------------------------------------- iteration
    def _tasks(self, batches: Sequence[int]) -> Iterator[list[int]]:
        # one take per block of batches (a worker builds whole blocks); a block spans at most about
        # one shard, so memory stays bounded by the shuffle window, not the block
        mean_shard = int(self.sizes.mean()) if len(self.sizes) else 1
        per = max(1, min(BLOCK_ROWS, mean_shard) // self.batch_size)
        for i in range(0, len(batches), per):
            yield list(batches[i:i + per])

    def _run(self, reader: ShardReader, task: list[int]) -> list[BatchResult]:
        plan = reader.plan
        tables = assemble(reader, task)
        return [process_batch(b, t, plan.seq[plan.positions(b)], filter=self.filter, transform=self.transform,
                              collate=self.collate_fn) for b, t in zip(task, tables)]

    def iter_batches(self, batches: Sequence[int]) -> Iterator[BatchResult]:
        """Build the given batch numbers of the current epoch (ascending), in order.

        The building block of iteration and of the torch adapter (a worker builds every
        ``num_workers``-th batch); does not touch the position or stats.
        """
        plan = self.plan()
        if not len(batches):
            return
        with ThreadPoolExecutor(max_workers=min(self.prefetch, 8), thread_name_prefix="datamill-read") as pool:
            reader = ShardReader(self.source, plan, columns=self.columns, prefetch=self.prefetch, pool=pool,
                                 start=int(batches[0]))
            self._reader = reader
            workers = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="datamill-work") \
                if self.num_workers else None
            inflight: deque[Future[list[BatchResult]]] = deque()
            try:
                tasks = self._tasks(batches)
                if workers is None:
                    for task in tasks:
                        reader.schedule_upto(task[-1])
                        for res in self._run(reader, task):
                            yield res
                            reader.release_upto(res.batch)
                    return
                limit = self.num_workers * self.prefetch
                pending = True
                while pending or inflight:
                    while pending and len(inflight) < limit:
                        nxt = next(tasks, None)
                        if nxt is None:
                            pending = False
                            break
                        reader.schedule_upto(nxt[-1])
                        inflight.append(workers.submit(self._run, reader, nxt))
                    if inflight:
                        for res in inflight.popleft().result():
                            yield res
                            reader.release_upto(res.batch)
            finally:
                for fut in inflight:
                    fut.cancel()
                if workers is not None:
                    workers.shutdown(wait=True, cancel_futures=True)
                reader.close()

    def to_torch(self) -> Any:
        """This loader as a ``torch.utils.data.IterableDataset`` (see :mod:`datamill.loader.torch`)."""
        from datamill.loader.torch import TorchLoaderDataset

        return TorchLoaderDataset(self)

    def __iter__(self) -> Generator[Any, None, None]:
        plan = self.plan()
        # a state saved after the epoch's last batch resumes with an empty rest of that epoch,
        # exactly like the uninterrupted run (whose loop ended there), then moves on
        start = self._batches_seen
        if start == 0 or self._stats["epoch"] != self.epoch:
            self._stats = self._new_stats()
        t0 = time.perf_counter() - self._stats["elapsed_s"]
        bar = progress_bar(total=plan.total_batches, initial=start, desc=f"epoch {self.epoch}", unit="batch",
                           disable=not self.progress or None)
        try:
            for res in self.iter_batches(range(start, plan.total_batches)):
                self._account(res)
                self._batches_seen = res.batch + 1
                self._stats["elapsed_s"] = time.perf_counter() - t0
                bar.update(1)
                if res.output is None:
                    continue
                self._stats["batches"] += 1
                if self._stats["first_batch_s"] is None:
                    self._stats["first_batch_s"] = self._stats["elapsed_s"]
                yield res.output
        finally:
            bar.close()
        self._stats["elapsed_s"] = time.perf_counter() - t0
        self.epoch, self._batches_seen = self.epoch + 1, 0


def per_sample(predicate: Callable[[dict[str, Any]], bool]) -> Callable[[pa.Table], np.ndarray]:
    """Turn a row predicate ``fn(row_dict) -> bool`` into a batch filter (slow: one call per row).

    Examples:
        >>> per_sample(lambda r: r["x"] > 1)(pa.table({"x": [1, 2, 3]})).tolist()
        [False, True, True]
    """

    def batch_filter(table: pa.Table) -> np.ndarray:
        return np.array([bool(predicate(row)) for row in table.to_pylist()], dtype=bool)

    return batch_filter
