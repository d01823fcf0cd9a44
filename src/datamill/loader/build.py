"""The building half of :class:`~datamill.loader.service.BatchService`: batches built from a plan.

:class:`Builds` reads a build's shards through the service's
:class:`~datamill.loader.cache.ShardCache` (:class:`~datamill.loader.cache.BuildReader` schedules
them ahead and releases them behind), assembles each block of batches with one ``take`` per shard,
runs ``filter``/``transform``/``collate`` (in this thread or ``Workers(threads=)`` threads ahead)
and keeps the service's totals. The service holds the settings, orders, plans and resume rules and
inherits these methods; nothing here decides which samples a batch holds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.checks import check_int, check_rank
from datamill.core.errors import ConfigError, DataFileError, DatamillError
from datamill.core.parallel import ordered_map
from datamill.loader.accounting import BatchResult
from datamill.loader.cache import BuildReader, ahead_window
from datamill.loader.collate_lease import block_collate
from datamill.loader.order import Elastic, num_batches, replica_group, split_sizes
from datamill.loader.servicebase import ServiceBase
from datamill.loader.stages import EpochPlan, assemble, assemble_block, process_batch

__all__ = ["BLOCK_ROWS", "Builds"]

BLOCK_ROWS = 8192
"""Rows gathered per ``take`` (at most a mean shard's worth), then sliced per batch (zero-copy)."""


def _check_int(name: str, value: Any, low: int) -> int:
    return check_int(value, name=name, low=low, high=None)


def _check_rank(epoch: int, rank: int, world_size: int, replication: int = 1) -> tuple[int, int]:
    """``(data_rank, data_world_size)`` after checking the arguments."""
    _check_int("epoch", epoch, 0)
    _check_int("world_size", world_size, 1)
    _check_int("replication", replication, 1)
    check_rank(rank, world_size=world_size)
    if world_size % replication:
        raise ConfigError(
            f"replication={replication} must divide world_size={world_size}",
            hint="groups of `replication` consecutive ranks share batches",
        )
    return replica_group(int(rank), world_size=int(world_size), replication=int(replication))


class Builds(ServiceBase):
    """The build methods of :class:`~datamill.loader.service.BatchService` (a mixin: the service
    holds the attributes and the plans)."""

    def _read_shard(self, k: int) -> pa.Table:
        try:
            table = self.source.read_shard(k, columns=self.columns)
        except DatamillError:
            raise
        except Exception as exc:  # a source's own failure: name the shard
            raise DataFileError(
                f"reading shard {k} failed: {type(exc).__name__}: {exc}", shard=k
            ) from exc
        if table.num_rows != int(self.sizes[k]):
            raise DataFileError(
                f"expected {int(self.sizes[k])} rows (shard_sizes()), got {table.num_rows}",
                shard=k,
                hint="the source's shard_sizes() disagrees with read_shard()",
            )
        return table

    def build(
        self,
        epoch: int,
        rank: int,
        batch_numbers: Sequence[int],
        *,
        world_size: int = 1,
        elastic: Elastic | None = None,
        replication: int = 1,
    ) -> Generator[BatchResult, None, None]:
        """Build batches ``batch_numbers`` (ascending) of rank ``rank`` in ``epoch``, in order.

        ``elastic`` and ``replication`` select the plan as in :meth:`plan`.
        Thread-safe: builds of any ranks may run at once and share the shard cache. Close the
        iterator (or exhaust it) to release its shards. Failures of ``filter``/``transform`` are
        recorded on each result; apply the ``max_errors`` policy with :meth:`accounting`.

        Raises:
            ConfigError: a bad epoch/rank, or batch numbers not ascending within ``[0,
                num_batches)``.
        """
        plan = self.plan(epoch, rank, world_size, elastic=elastic, replication=replication)
        batches = np.asarray(batch_numbers, dtype=np.int64).reshape(-1)
        if len(batches) and (
            batches[0] < 0 or batches[-1] >= plan.total_batches or (np.diff(batches) <= 0).any()
        ):
            raise ConfigError(
                f"batch numbers must be ascending in [0, {plan.total_batches}) for rank {rank} of "
                f"epoch {epoch}, got {batches[:3].tolist()}...{batches[-3:].tolist()}"
            )
        return self._build(plan, int(epoch), int(rank), batches)

    def batch_samples(
        self, epoch: int, rank: int, batch_numbers: Sequence[int], *, world_size: int = 1
    ) -> NDArray[np.int64]:
        """Global sample indices of rank ``rank``'s batches ``batch_numbers`` (ascending),
        concatenated.

        Computed from :meth:`epoch_order` without the epoch's full order: equal to
        ``plan(epoch, rank, world_size).seq`` at those batches' positions.

        Examples:
            >>> from datamill.core.source import TableSource
            >>> from datamill.loader.service import BatchService
            >>> svc = BatchService(
            ...     TableSource(pa.table({"x": list(range(10))}), shard_size=3),
            ...     batch_size=2,
            ...     seed=4,
            ... )
            >>> plan = svc.plan(0, 1, 2)
            >>> svc.batch_samples(0, 1, [0, 2], world_size=2).tolist() == plan.seq[
            ...     [0, 1, 4]
            ... ].tolist()
            True
        """
        data_rank, data_world = _check_rank(epoch, rank, world_size)
        eo = self.epoch_order(epoch)
        batches = np.asarray(batch_numbers, dtype=np.int64).reshape(-1)
        if eo is None:
            plan = self.plan(epoch, rank, world_size)
            return (
                np.concatenate([plan.seq[plan.positions(int(b))] for b in batches])
                if len(batches)
                else np.zeros(0, dtype=np.int64)
            )
        parts = split_sizes(len(eo), world_size=data_world, drop_last=self.batching.drop_last)
        start = int(sum(parts[:data_rank]))
        length = self.rank_samples(rank, world_size)
        total = num_batches(
            parts[data_rank], batch_size=self.batch_size, drop_last=self.batching.drop_last
        )
        if len(batches) and (
            batches[0] < 0 or batches[-1] >= total or (np.diff(batches) <= 0).any()
        ):
            raise ConfigError(
                f"batch numbers must be ascending in [0, {total}) for rank {rank} of "
                f"epoch {epoch}, got {batches[:3].tolist()}...{batches[-3:].tolist()}"
            )
        out, i = [], 0
        while i < len(batches):  # one take per run of consecutive batches
            j = i + 1
            while j < len(batches) and batches[j] == batches[j - 1] + 1:
                j += 1
            a = int(batches[i]) * self.batch_size
            b = min(length, int(batches[j - 1] + 1) * self.batch_size)
            out.append(eo.take(start + a, start + b))
            i = j
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def build_samples(
        self, epoch: int, rank: int, batch_numbers: Sequence[int], *, world_size: int = 1
    ) -> Generator[BatchResult, None, None]:
        """:meth:`build` without the rank's epoch plan: memory O(shards + these batches' samples).

        The results equal :meth:`build`'s outputs; their ``batch`` counts from 0 within this call.
        """
        seq = self.batch_samples(epoch, rank, batch_numbers, world_size=world_size)
        plan = EpochPlan.from_sequence(seq, self.sizes, batch_size=self.batch_size, drop_last=False)
        return self._build(
            plan, int(epoch), int(rank), np.arange(plan.total_batches, dtype=np.int64)
        )

    def _tasks(self, batches: NDArray[np.int64]) -> Iterator[list[int]]:
        # one take per block of batches; a block spans at most about one shard, so memory stays
        # bounded by the shuffle window, not the block
        mean_shard = int(self.sizes.mean()) if len(self.sizes) else 1
        per = max(1, min(BLOCK_ROWS, mean_shard) // self.batch_size)
        for i in range(0, len(batches), per):
            yield batches[i : i + per].tolist()

    _place: Callable[[BuildReader, list[int]], list[BatchResult] | None] | None = None
    """Set in a worker process (:mod:`datamill.loader.procs_place`): builds a block straight into
    shared memory, or returns ``None`` (then built here)."""

    def _run(self, reader: BuildReader, task: list[int]) -> list[BatchResult]:
        if self._place is not None:
            placed = self._place(reader, task)
            if placed is not None:
                return placed
        plan = reader.plan
        block = block_collate(self.collate_fn)  # numpy/torch: each column once per block
        if block is not None and self.batching.filter is None and self.batching.transform is None:
            taken, rows = assemble_block(plan, reader.get, task)
            outputs = block(taken, rows)
            return [
                BatchResult(b, out, None, n, 0, [], n) for b, out, n in zip(task, outputs, rows)
            ]
        tables = assemble(plan, reader.get, task)
        return [
            process_batch(
                b,
                t,
                plan.seq[plan.positions(b)],
                filter=self.batching.filter,
                transform=self.batching.transform,
                collate=self.collate_fn,
            )
            for b, t in zip(task, tables)
        ]

    def _results(self, reader: BuildReader, batches: NDArray[np.int64]) -> Iterator[BatchResult]:
        """Results in batch order, built in this thread or ``num_workers`` threads ahead."""
        tasks = self._tasks(batches)
        if not self.workers.threads:
            for task in tasks:
                reader.schedule_upto(task[-1])
                yield from self._run(reader, task)
            return

        def scheduled() -> Iterator[
            list[int]
        ]:  # a task's shards are scheduled when it is submitted
            for task in tasks:
                reader.schedule_upto(task[-1])
                yield task

        with ThreadPoolExecutor(
            max_workers=self.workers.threads, thread_name_prefix="datamill-work"
        ) as workers:
            for results in ordered_map(
                functools.partial(self._run, reader),
                scheduled(),
                pool=workers,
                window=self.workers.threads * self.workers.prefetch,
            ):
                yield from results

    def _build(
        self, plan: EpochPlan, epoch: int, rank: int, batches: NDArray[np.int64]
    ) -> Generator[BatchResult, None, None]:
        if not len(batches):
            return
        with self._lock:
            self._builds += 1
            self._active += 1
        self._cache.open()
        reader = BuildReader(
            self._cache,
            plan,
            batches,
            prefetch=self.workers.prefetch,
            # the next shuffle window read while this one is built (in process and in a worker
            # process alike): each window's shards decode on the cores the build leaves idle
            ahead_window=ahead_window(self.window, self.workers.prefetch),
        )
        expect = getattr(self.source, "expect_reads", None)
        if callable(expect):  # a bounded local cache of remote files then evicts in plan order
            expect(reader.by_first.tolist())
        try:
            for res in self._results(reader, batches):
                res.epoch, res.rank, res.shards_read = epoch, rank, reader.shards_read
                res.shards_in_memory, res.peak_shards_in_memory = self._cache.in_memory, reader.peak
                with self._lock:
                    self._totals.add(res)
                yield res
                reader.release_upto(res.batch)
        finally:
            reader.close()
            self._cache.finish()
            with self._lock:
                self._active -= 1
