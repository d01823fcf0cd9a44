"""The loader's stages, each with one job: plan an epoch, read shards ahead, assemble, filter/transform.

* :class:`EpochPlan` - the rank's sample sequence for one epoch as index arrays (which shard and row
  each position reads, which batches need which shard): pure numpy, no per-sample Python.
* :class:`ShardReader` - reads shards in a background thread pool in the order they are first needed,
  at most ``prefetch`` shards ahead, and drops each shard once the last batch needing it is consumed
  (memory stays bounded by the shuffle window plus the prefetch).
* :func:`assemble` - the rows of several batches gathered with one ``pa.Table.take`` over the
  (zero-copy) concatenation of the shards involved, then sliced per batch (zero-copy).
* :func:`process_batch` - filter and transform one batch with failures isolated per sample and counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, DatamillError
from datamill.core.source import Source
from datamill.loader.order import num_batches, rank_sequence

__all__ = ["BatchResult", "EpochPlan", "ShardReader", "assemble", "process_batch"]

UID_COLUMN = "uid"


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: positions -> (global index, shard, row), and per-shard batch ranges."""

    seq: NDArray[np.int64]
    shard: NDArray[np.int64]
    row: NDArray[np.int64]
    batch_size: int
    total_batches: int
    first_batch: NDArray[np.int64]  # per shard; total_batches when unused
    last_batch: NDArray[np.int64]  # per shard; -1 when unused
    by_first: NDArray[np.int64] = field(repr=False)  # used shards sorted by first_batch
    by_last: NDArray[np.int64] = field(repr=False)  # used shards sorted by last_batch

    @classmethod
    def make(cls, sizes: NDArray[np.int64], *, seed: int, epoch: int, shuffle: bool, window: int | None,
             rank: int, world_size: int, drop_last: bool, batch_size: int) -> EpochPlan:
        """Compute the plan (about 50 ms per million samples)."""
        seq = rank_sequence(sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=window, rank=rank,
                            world_size=world_size, drop_last=drop_last)
        total = num_batches(len(seq), batch_size=batch_size, drop_last=drop_last)
        seq = seq[:min(len(seq), total * batch_size)]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        shard = (np.searchsorted(offsets, seq, side="right") - 1).astype(np.int64)
        row = seq - offsets[shard]
        batch_of = np.arange(len(seq), dtype=np.int64) // batch_size
        first = np.full(len(sizes), total, dtype=np.int64)
        last = np.full(len(sizes), -1, dtype=np.int64)
        np.minimum.at(first, shard, batch_of)
        np.maximum.at(last, shard, batch_of)
        used = np.flatnonzero(last >= 0)
        return cls(seq, shard, row, batch_size, total, first, last,
                   used[np.argsort(first[used], kind="stable")], used[np.argsort(last[used], kind="stable")])

    def positions(self, batch: int) -> slice:
        """Positions of batch ``batch`` in ``seq``."""
        return slice(batch * self.batch_size, min((batch + 1) * self.batch_size, len(self.seq)))


class ShardReader:
    """Reads shards in background threads, ahead of need, and forgets them once consumed."""

    def __init__(self, source: Source, plan: EpochPlan, *, columns: Sequence[str] | None, prefetch: int,
                 pool: ThreadPoolExecutor, start: int = 0) -> None:
        self.source, self.plan, self.columns = source, plan, None if columns is None else list(columns)
        # resuming at batch ``start``: shards used only before it are never read
        self._by_first = plan.by_first[plan.last_batch[plan.by_first] >= start]
        self._by_last = plan.by_last[plan.last_batch[plan.by_last] >= start]
        self.prefetch, self.pool = prefetch, pool
        self.sizes = source.shard_sizes()
        self._futures: dict[int, Future[pa.Table]] = {}
        self._next_first = 0  # pointer into plan.by_first: shards scheduled
        self._needed = 0  # pointer into plan.by_first: shards needed by the batches scheduled so far
        self._next_last = 0  # pointer into plan.by_last
        self._lock = threading.Lock()
        self.shards_read = 0
        self.peak_resident = 0  # most shards held (read or being read) at once

    def _read(self, k: int) -> pa.Table:
        try:
            table = self.source.read_shard(k, columns=self.columns)
        except DatamillError:
            raise
        except Exception as exc:  # a source's own failure: name the shard
            raise DataFileError(f"reading shard {k} failed: {type(exc).__name__}: {exc}", shard=k) from exc
        if table.num_rows != int(self.sizes[k]):
            raise DataFileError(f"expected {int(self.sizes[k])} rows (shard_sizes()), got {table.num_rows}",
                                shard=k, hint="the source's shard_sizes() disagrees with read_shard()")
        return table

    def schedule_upto(self, batch: int) -> None:
        """Start reading every shard needed up to ``batch``, plus ``prefetch`` more."""
        by_first, first = self._by_first, self.plan.first_batch
        with self._lock:
            while self._needed < len(by_first) and first[by_first[self._needed]] <= batch:
                self._needed += 1
            target = min(len(by_first), self._needed + self.prefetch)
            while self._next_first < target:
                k = int(by_first[self._next_first])
                self._futures[k] = self.pool.submit(self._read, k)
                self._next_first += 1
                self.shards_read += 1
            self.peak_resident = max(self.peak_resident, len(self._futures))

    def get(self, k: int) -> pa.Table:
        """Shard ``k`` (blocking until read); it must have been scheduled."""
        with self._lock:
            fut = self._futures[k]
        return fut.result()

    def release_upto(self, batch: int) -> None:
        """Forget shards whose last batch is ``<= batch`` (that batch has been consumed)."""
        by_last, last = self._by_last, self.plan.last_batch
        with self._lock:
            while self._next_last < len(by_last) and last[by_last[self._next_last]] <= batch:
                self._futures.pop(int(by_last[self._next_last]), None)
                self._next_last += 1

    def close(self) -> None:
        """Cancel pending reads and drop every shard."""
        with self._lock:
            for fut in self._futures.values():
                fut.cancel()
            self._futures.clear()


def assemble(reader: ShardReader, batches: Sequence[int]) -> list[pa.Table]:
    """The tables of ``batches`` (consecutive or not), gathered with one take."""
    plan = reader.plan
    parts = [plan.positions(b) for b in batches]
    shard = np.concatenate([plan.shard[p] for p in parts])
    row = np.concatenate([plan.row[p] for p in parts])
    needed = np.unique(shard)
    tables = [reader.get(int(k)) for k in needed]
    base = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64)
    where = base[np.searchsorted(needed, shard)] + row
    combined = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    taken = combined.take(pa.array(where))
    out, start = [], 0
    for p in parts:
        n = p.stop - p.start
        out.append(taken.slice(start, n))
        start += n
    return out


@dataclass
class BatchResult:
    """One batch after filter/transform/collate, with its accounting."""

    batch: int
    output: Any  # collated batch, or None when every sample was dropped
    empty: pa.Table | None
    read: int
    filtered: int
    failed: list[tuple[Any, int, BaseException]]  # (uid, global index, error)
    yielded: int


def _uid(table: pa.Table, i: int, index: int) -> Any:
    if UID_COLUMN in table.column_names:
        return table.column(UID_COLUMN)[i].as_py()
    return index


def _mask_of(fn: Callable[[pa.Table], Any], table: pa.Table) -> NDArray[np.bool_]:
    raw = fn(table)
    if isinstance(raw, (pa.Array, pa.ChunkedArray)):
        mask = np.asarray(raw.to_numpy(zero_copy_only=False))
    else:
        mask = np.asarray(raw)
    if mask.shape != (table.num_rows,):
        raise ConfigError(f"filter must return one bool per row ({table.num_rows}), got shape {mask.shape}")
    return mask.astype(bool)


def process_batch(
    batch: int, table: pa.Table, index: NDArray[np.int64], *,
    filter: Callable[[pa.Table], Any] | None, transform: Callable[[pa.Table], pa.Table] | None,
    collate: Callable[[pa.Table], Any],
) -> BatchResult:
    """Filter, transform and collate one batch; a failing sample is isolated, skipped and recorded."""
    read = table.num_rows
    failed: list[tuple[Any, int, BaseException]] = []
    filtered = 0
    if filter is not None:
        try:
            keep = _mask_of(filter, table)
        except ConfigError:
            raise
        except Exception:  # noqa: BLE001 - user code: isolate by evaluating each sample alone
            keep = np.zeros(read, dtype=bool)
            bad = np.zeros(read, dtype=bool)
            for i in range(read):
                try:
                    keep[i] = bool(_mask_of(filter, table.slice(i, 1))[0])
                except ConfigError:
                    raise
                except Exception as exc:  # noqa: BLE001 - recorded, counted against max_errors
                    bad[i] = True
                    failed.append((_uid(table, i, int(index[i])), int(index[i]), exc))
            filtered = int((~keep & ~bad).sum())
        else:
            filtered = int((~keep).sum())
        if not keep.all():
            sel = np.flatnonzero(keep)
            table, index = table.take(pa.array(sel)), index[sel]
    if transform is not None and table.num_rows:
        try:
            table = transform(table)
        except Exception:  # noqa: BLE001 - user code: isolate by re-running each sample alone
            good = []
            for i in range(table.num_rows):
                try:
                    good.append(transform(table.slice(i, 1)))
                except Exception as exc:  # noqa: BLE001 - recorded, counted against max_errors
                    failed.append((_uid(table, i, int(index[i])), int(index[i]), exc))
            table = pa.concat_tables(good) if good else table.slice(0, 0)
        if not isinstance(table, pa.Table):
            raise ConfigError(f"transform must return a pyarrow Table, got {type(table).__name__}")
    yielded = table.num_rows
    output = collate(table) if yielded else None
    return BatchResult(batch, output, None if yielded else table, read, filtered, failed, yielded)
