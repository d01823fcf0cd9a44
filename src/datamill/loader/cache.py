"""The shard cache a :class:`~datamill.loader.service.BatchService` shares between concurrent
builds.

* :class:`ShardCache` - shards read in a background thread pool, reference-counted by the builds
  that need them. A build *claims* every shard its batches read when it starts, *loads* each one a
  little before its first batch needs it (``prefetch`` ahead), and *releases* it after its last
  batch needing it. A shard loaded by one build is reused by any other active build that claimed it
  (another rank of the same epoch, another worker of the same rank); once no active build claims
  it, it is dropped, or kept among the ``keep`` most recently released shards (or more, while
  they fit ``keep_bytes``: a :class:`KeptBytes` budget, which several caches may share) for a
  later build.
* :class:`BuildReader` - one build's view: which shards its batches need, in which order, and when
  to load and release them. With ``ahead_window`` (the shuffle window) a build reads the next
  window while the current one is consumed, and holds at most two windows (:func:`read_target`).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.loader.stages import EpochPlan

__all__ = ["BuildReader", "KeptBytes", "ShardCache", "ahead_window", "read_target"]


def ahead_window(window: int, prefetch: int) -> int:
    """The ``window`` a build reads ahead by (:func:`read_target`): the shuffle window, so the next
    window is read while this one is built, unless ``prefetch`` already reads a whole window ahead
    (``0``: by ``prefetch`` alone). A direct client's and a build worker's services read a window
    ahead by ``prefetch`` (:func:`~datamill.loader.runs.service_for`); the two-window cap made a
    direct client 10-15% slower on a joined shardset (``benchmarks/RESULTS.md``).

    Examples:
        >>> ahead_window(8, 2), ahead_window(8, 8)
        (8, 0)
    """
    return window if prefetch < window else 0


def read_target(shards: int, needed: int, released: int, *, prefetch: int, window: int) -> int:
    """How many of a build's ``shards`` (in first-use order) are loaded once ``needed`` of them are
    needed by the batches scheduled and ``released`` of them are done with.

    ``prefetch`` more than needed; with ``window`` (shards per shuffle window, ``0``: off) up to
    twice the shards in use, at most ``window``, so the next window is read while this one is
    consumed; never more than two windows held (loaded, not yet released), even while a batch
    straddles two windows. :class:`BuildReader` loads by it and
    :func:`~datamill.loader.planner.build_schedule` plans by it.

    Examples:
        >>> read_target(100, 10, 0, prefetch=2, window=0)
        12
        >>> read_target(100, 10, 0, prefetch=2, window=10)  # the next window read ahead
        20
        >>> read_target(100, 25, 0, prefetch=2, window=10)  # two windows held at most
        25
    """
    target = min(shards, needed + prefetch)
    if window:
        ahead = max(prefetch, min(window, 2 * (needed - released)))
        cap = max(needed, released + 2 * window)
        target = min(shards, needed + ahead, cap)
    return target


def _read_contiguous(read: Callable[[int], pa.Table], k: int) -> pa.Table:
    """Shard ``k`` with one chunk per column, combined here in the reader thread, once per read.

    A take from a column of many chunks combines them first (for binary and list columns), which
    would copy the whole shard on every gather; combining once at read time makes every later
    take touch only the rows it returns. A column too large for one chunk stays as it is.
    """
    table = read(k)
    if any(col.num_chunks > 1 for col in table.columns):
        try:
            table = table.combine_chunks()
        except (
            pa.ArrowInvalid,
            pa.ArrowCapacityError,
        ):  # e.g. > 2 GiB in a 32-bit-offset binary column
            pass
    return table


_TOKENS = itertools.count()  # one per shard kept beyond ``keep`` (a stale eviction is ignored)


class KeptBytes:
    """A budget of bytes for the released shards that :class:`ShardCache` instances keep beyond
    their ``keep`` most recent ones, shared by every cache given it: past ``limit``, the shard kept
    longest ago goes first, whichever cache keeps it (a build worker's batch services share one,
    so a service that no client uses any more gives its shards up to the others). A copy in
    another process (pickled) is a budget of its own.

    Examples:
        >>> budget = KeptBytes(128)
        >>> a, b = (ShardCache(lambda k: pa.table({"k": [k] * 8}), keep_bytes=budget) for _ in "ab")
        >>> for cache in (a, b):
        ...     cache.open(); cache.claim([0, 1])
        ...     for k in (0, 1):
        ...         _ = cache.load(k).result(); cache.release(k)
        >>> a.in_memory, b.in_memory, budget.used  # a's two shards went first
        (0, 2, 128)
        >>> a.finish(); b.finish()
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(0, int(limit))
        self._reset()

    def _reset(self) -> None:
        self.used = 0  # bytes of the shards kept under this budget
        self._lock = threading.Lock()
        # (cache id, shard) -> (cache, token, bytes), kept longest ago first
        self._order: OrderedDict[tuple[int, int], tuple[ShardCache, int, int]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.limit = int(state["limit"])
        self._reset()  # a budget of its own in this process

    def _add(
        self, cache: ShardCache, k: int, token: int, size: int
    ) -> list[tuple[ShardCache, int, int]]:
        """Shard ``k`` of ``cache`` kept (``size`` bytes): ``(cache, shard, token)`` of the shards
        to drop so that the kept ones fit, longest kept first (this one too, when it does not
        fit)."""
        with self._lock:
            old = self._order.pop((id(cache), k), None)
            self.used += size - (0 if old is None else old[2])
            self._order[(id(cache), k)] = (cache, token, size)
            out = []
            while self.used > self.limit and self._order:
                (_, j), (c, t, n) = self._order.popitem(last=False)
                self.used -= n
                out.append((c, j, t))
            return out

    def _remove(self, cache: ShardCache, k: int) -> None:
        """Shard ``k`` of ``cache`` is no longer kept (loaded again, or dropped)."""
        with self._lock:
            got = self._order.pop((id(cache), k), None)
            if got is not None:
                self.used -= got[2]


class ShardCache:
    """Reference-counted shards, read by a thread pool that lives while some build is active.

    Args:
        read: ``read(k) -> pa.Table`` (runs in the pool; its errors reach every build waiting).
        threads: reader threads. Defaults to ``2``.
        keep: released shards kept for later builds (most recent first). Defaults to ``0``.
        keep_bytes: bytes of released shards (their Arrow buffers) kept beyond ``keep``, or a
            :class:`KeptBytes` budget shared with other caches: the most recently released shards
            stay while they fit (a server's build worker keeps every shard of a dataset that fits,
            so a new epoch's order reads nothing again). Defaults to ``0``.

    Examples:
        >>> cache = ShardCache(lambda k: pa.table({"k": [k]}))
        >>> cache.open(); cache.claim([3]); _ = cache.load(3); cache.get(3).to_pydict()
        {'k': [3]}
        >>> cache.release(3); cache.in_memory, cache.reads
        (0, 1)
        >>> cache.finish()
        >>> kept = ShardCache(lambda k: pa.table({"k": [k] * 8}), keep=1, keep_bytes=128)
        >>> kept.open(); kept.claim(range(4))
        >>> for k in range(4):
        ...     _ = kept.load(k).result(); kept.release(k)
        >>> kept.in_memory, kept.kept_bytes  # the last, and 2 shards of 64 bytes in 128 beyond it
        (3, 128)
        >>> kept.finish(); kept.close()
    """

    def __init__(
        self,
        read: Callable[[int], pa.Table],
        *,
        threads: int = 2,
        keep: int = 0,
        keep_bytes: int | KeptBytes = 0,
    ) -> None:
        self._read, self._threads, self._keep = read, max(1, int(threads)), max(0, int(keep))
        self._budget = (
            keep_bytes
            if isinstance(keep_bytes, KeptBytes)
            else KeptBytes(keep_bytes)
            if keep_bytes > 0
            else None
        )
        self._lock = threading.Lock()
        self._refs: dict[int, int] = {}
        self._loaded: dict[int, Future[pa.Table]] = {}  # claimed and loaded (or loading)
        # released, kept for reuse (oldest first): the ``keep`` most recent, then those beyond
        # them under the budget, with their token and bytes
        self._kept: OrderedDict[int, Future[pa.Table]] = OrderedDict()
        self._extra: OrderedDict[int, tuple[Future[pa.Table], int, int]] = OrderedDict()
        self.kept_bytes = 0  # bytes of the shards kept beyond ``keep``
        self._pool: ThreadPoolExecutor | None = None
        self._active = 0
        self.reads = 0  # shards actually read
        self.reused = 0  # loads served by a shard already in memory
        self.peak = 0  # most shards in memory at once

    @property
    def in_memory(self) -> int:
        """Shards held now (loaded, loading or kept)."""
        return len(self._loaded) + len(self._kept) + len(self._extra)

    def open(self) -> None:
        """A build starts (the pool is created for the first active build)."""
        with self._lock:
            self._active += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._threads, thread_name_prefix="datamill-read"
                )

    def finish(self) -> None:
        """A build ended (it released its claims); the pool stops with the last active build."""
        with self._lock:
            self._active -= 1
            pool = self._pool if self._active == 0 else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def claim(self, shards: Iterable[int]) -> None:
        """Register one more build needing each of ``shards``."""
        with self._lock:
            for k in shards:
                self._refs[k] = self._refs.get(k, 0) + 1

    def load(self, k: int) -> Future[pa.Table]:
        """Shard ``k`` (claimed) in memory, read now unless another build already has it."""
        with self._lock:
            fut = self._loaded.get(k)
            if fut is None:
                fut = self._kept.pop(k, None) or self._unkeep(k)
                if fut is None:
                    if self._pool is None:
                        raise RuntimeError("ShardCache.load outside an open build")
                    fut = self._pool.submit(_read_contiguous, self._read, k)
                    self.reads += 1
                else:
                    self.reused += 1
                self._loaded[k] = fut
            else:
                self.reused += 1
            self.peak = max(self.peak, self.in_memory)
            return fut

    def _unkeep(self, k: int) -> Future[pa.Table] | None:
        """Shard ``k`` taken from those kept under the budget (``None``: not there); holding
        ``_lock``."""
        extra = self._extra.pop(k, None)
        if extra is None:
            return None
        self.kept_bytes -= extra[2]
        if self._budget is not None:
            self._budget._remove(self, k)
        return extra[0]

    def get(self, k: int) -> pa.Table:
        """Shard ``k`` (loaded), blocking until it is read."""
        with self._lock:
            fut = self._loaded[k]
        return fut.result()

    def release(self, k: int) -> None:
        """One build no longer needs shard ``k``; dropped (or kept) when none does."""
        drop: list[tuple[ShardCache, int, int]] = []
        with self._lock:
            left = self._refs[k] - 1
            if left:
                self._refs[k] = left
                return
            del self._refs[k]
            fut = self._loaded.pop(k, None)
            if fut is None:
                return
            keep = self._keep or self._budget is not None
            if not keep or not fut.done() or fut.cancelled() or fut.exception() is not None:
                fut.cancel()
                return
            self._kept[k] = fut
            if len(self._kept) > self._keep:  # the oldest of the ``keep`` most recent goes on
                j, old = self._kept.popitem(last=False)
                if self._budget is not None:  # ... to the budget's shards (the budget locks after)
                    token, size = next(_TOKENS), old.result().get_total_buffer_size()
                    self._extra[j] = (old, token, size)
                    self.kept_bytes += size
                    drop = self._budget._add(self, j, token, size)
        for cache, j, token in drop:  # outside this lock: another cache's shard may go
            cache._drop(j, token)

    def _drop(self, k: int, token: int) -> None:
        """Shard ``k`` kept under the budget is dropped (unless it was kept again since: another
        ``token``, or taken back by a build)."""
        with self._lock:
            extra = self._extra.get(k)
            if extra is not None and extra[1] == token:
                del self._extra[k]
                self.kept_bytes -= extra[2]

    def close(self) -> None:
        """Drop the kept shards; the pool stops now unless a build is active (it stops with the last
        one)."""
        with self._lock:
            self._kept.clear()
            for k in list(self._extra):
                self._unkeep(k)
            pool = self._pool if self._active == 0 else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class BuildReader:
    """One build's shards: claimed at the start, loaded ahead of need, released after last use."""

    def __init__(
        self,
        cache: ShardCache,
        plan: EpochPlan,
        batches: NDArray[np.int64],
        *,
        prefetch: int,
        ahead_window: int = 0,
    ) -> None:
        self.cache, self.plan, self.prefetch, self.ahead_window = (
            cache,
            plan,
            int(prefetch),
            int(ahead_window),
        )
        total = plan.total_batches
        if len(batches) == total and (not total or (batches[0] == 0 and batches[-1] == total - 1)):
            # every batch of the plan (ascending): the plan's own per-shard figures (an epoch's
            # build; computing them again over every position costs a plan's time)
            self.first, self.last = plan.first_batch, plan.last_batch
            self.by_first, self.by_last = plan.by_first, plan.by_last
        else:
            self._shards_of(plan, batches)
        self._next_first = 0  # into by_first: shards loaded
        self._needed = 0  # into by_first: shards the batches scheduled so far need
        self._next_last = 0  # into by_last: shards released
        self._lock = threading.Lock()
        self._closed = False
        self.shards_read = 0
        self.peak = 0
        cache.claim(self.by_first.tolist())

    def _shards_of(self, plan: EpochPlan, batches: NDArray[np.int64]) -> None:
        """Per shard, the first and last of ``batches`` that reads it; the shards they read, by
        first and by last batch."""
        bs = plan.batch_size
        starts = batches * bs
        lengths = np.minimum(starts + bs, len(plan.seq)) - starts
        pos = np.repeat(
            starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths
        ) + np.arange(int(lengths.sum()), dtype=np.int64)
        batch_of = np.repeat(batches, lengths)
        shard = plan.shard[pos]
        n = len(plan.first_batch)
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        last = np.full(n, -1, dtype=np.int64)
        np.minimum.at(first, shard, batch_of)
        np.maximum.at(last, shard, batch_of)
        used = np.flatnonzero(last >= 0)
        self.first, self.last = first, last
        self.by_first = used[np.argsort(first[used], kind="stable")]
        self.by_last = used[np.argsort(last[used], kind="stable")]

    def schedule_upto(self, batch: int) -> None:
        """Load every shard needed up to ``batch``, plus ``prefetch`` more.

        With ``ahead_window`` (the shuffle window; a warming-up order's windows grow,
        :func:`~datamill.loader.order.window_bounds`) it loads up to twice the shards in use ahead,
        at most ``ahead_window``: while one window is consumed the next one is read, so reading
        overlaps iteration; the build then holds at most ``2 * ahead_window`` shards (or what its
        batches need at once). :func:`read_target` says how many.
        """
        by_first, first = self.by_first, self.first
        with self._lock:
            while self._needed < len(by_first) and first[by_first[self._needed]] <= batch:
                self._needed += 1
            target = read_target(
                len(by_first),
                self._needed,
                self._next_last,
                prefetch=self.prefetch,
                window=self.ahead_window,
            )
            while self._next_first < target:
                self.cache.load(int(by_first[self._next_first]))
                self._next_first += 1
                self.shards_read += 1
            self.peak = max(self.peak, self.cache.in_memory)

    def get(self, k: int) -> pa.Table:
        """Shard ``k`` (scheduled), blocking until read."""
        return self.cache.get(k)

    def release_upto(self, batch: int) -> None:
        """Release shards whose last batch is ``<= batch`` (that batch has been consumed)."""
        by_last, last = self.by_last, self.last
        with self._lock:
            while self._next_last < len(by_last) and last[by_last[self._next_last]] <= batch:
                self.cache.release(int(by_last[self._next_last]))
                self._next_last += 1

    def close(self) -> None:
        """Release every claim not released yet (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for k in self.by_last[self._next_last :].tolist():
                self.cache.release(k)
            self._next_last = len(self.by_last)
