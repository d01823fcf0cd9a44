"""The public batch service: plans, a shared shard cache and batch builds for every rank of a run.

A :class:`BatchService` holds what a run's batches depend on (source, batch size, seed, shuffle
window, ``drop_last``, columns) and what they go through (filter, transform, collate). It builds
any rank's batches on request: :meth:`~BatchService.plan` is the rank's epoch as index arrays (a
pure function of ``(shard sizes, seed, epoch, settings, rank, world_size)``), and
:meth:`~BatchService.build` yields :class:`~datamill.loader.accounting.BatchResult` objects for
ascending batch numbers. Builds may run at the same time from many threads (one per rank, say):
shards go through one :class:`~datamill.loader.cache.ShardCache`, so a shard read for one rank is
reused by another rank's build that needs it, and dropped once no active build does.

The :class:`~datamill.loader.Loader` is a thin per-rank iterator over a service; the torch adapter
and a server use the same service, and the same :class:`~datamill.loader.accounting.Accounting`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Self

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import (
    ConfigError,
    DatamillError,
    SchemaError,
)
from datamill.core.rng import rng_for
from datamill.core.source import Source
from datamill.loader.accounting import Accounting
from datamill.loader.buckets import bucket_arrange, bucket_boundaries, sample_lengths
from datamill.loader.build import BLOCK_ROWS, Builds, _check_int, _check_rank
from datamill.loader.cache import KeptBytes, ShardCache
from datamill.loader.collate import resolve_collate
from datamill.loader.elastic import (
    norm_elastic,
)
from datamill.loader.options import Batching, Workers, checked_groups
from datamill.loader.order import (
    Elastic,
    EpochOrder,
    default_window,
    global_order,
    num_batches,
    remaining_positions,
    split_for_rank,
)
from datamill.loader.resumes import Resumes
from datamill.loader.stages import EpochPlan

__all__ = [
    "BLOCK_ROWS",
    "READ_AHEAD_BYTES",
    "REMOTE_READS",
    "BatchService",
    "reads_remotely",
    "remote_reads",
    "shard_nbytes_of",
]

REMOTE_READS = 6
"""Shards read at once by a warming-up service whose source does not tell its shards' bytes
(downloads in flight, each decoded in its thread; see :func:`remote_reads` for the others).

Six, not four: a reader thread also checks and decodes its shard, so four threads kept 2.9 GETs in
flight on average and a cold S3 epoch read 57-76k samples/s, against 67-85k with six (issue #41,
benchmarks/RESULTS.md)."""

READ_AHEAD_BYTES = 32 << 20
"""About how many bytes of shard downloads a service reading from object storage keeps in flight
(:func:`remote_reads`): six reads of the 6 MB objects of the benchmark's binary dataset, the
store's own best on loopback (4-8 whole-object GETs at once, ``bench_s3_ceiling.py``)."""

MAX_READS = 8
"""Shards read at once at most (small objects: a GET's latency, not its bytes, is the cost)."""


def remote_reads(nbytes: NDArray[np.int64] | None, *, window: int) -> int:
    """Shards a service reading from object storage reads at once: about :data:`READ_AHEAD_BYTES`
    in flight by the median shard's bytes, at least 2 and at most :data:`MAX_READS`, and never more
    than the two windows of shards a build holds; :data:`REMOTE_READS` when the bytes are unknown.

    Examples:
        >>> remote_reads(np.full(100, 6_183_580), window=33)
        6
        >>> small, large = np.full(9, 100_000), np.full(4, 1 << 30)
        >>> remote_reads(small, window=33), remote_reads(large, window=4)
        (8, 2)
        >>> remote_reads(small, window=1), remote_reads(None, window=4)
        (2, 6)
    """
    known = None if nbytes is None else np.asarray(nbytes, dtype=np.int64)
    if known is None or not len(known) or int(np.median(known)) <= 0:
        return REMOTE_READS
    reads = -(-READ_AHEAD_BYTES // int(np.median(known)))
    return int(max(2, min(reads, MAX_READS, 2 * window)))


def shard_nbytes_of(source: object) -> NDArray[np.int64] | None:
    """The source's bytes per shard, or ``None`` when it does not tell them (or cannot now)."""
    nbytes = getattr(source, "shard_nbytes", None)
    if not callable(nbytes):
        return None
    try:
        return np.asarray(nbytes(), dtype=np.int64)
    except (OSError, DatamillError, ValueError, TypeError):
        return None


def reads_remotely(source: object) -> bool:
    """Whether ``source`` reads from object storage (its ``remote`` attribute is set).

    :class:`~datamill.loader.remote.RemoteParquetSource` and a
    :class:`~datamill.shards.ShardsetDataset` on ``s3://`` do; a Loader warms up by default over
    them.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> reads_remotely(TableSource(pa.table({"x": [1]})))
        False
    """
    return bool(getattr(source, "remote", False))


def _checked_budget(cache_bytes: int | KeptBytes) -> int | KeptBytes:
    """``cache_bytes`` checked: a shared budget, or an int >= 0."""
    if isinstance(cache_bytes, KeptBytes):
        return cache_bytes
    return _check_int("cache_bytes", cache_bytes, 0)


def _resolved(b: Batching, source: Source, sizes: NDArray[np.int64]) -> Batching:
    """``b`` checked against ``source``, with its window and warmup resolved."""
    if b.window is not None:
        _check_int("window", b.window, 1)
    if b.bucket_by is not None and b.bucket_by not in source.columns:
        raise SchemaError(
            f"bucket_by column {b.bucket_by!r} is not a column of the source ({source.columns})",
            column=b.bucket_by,
        )
    buckets = b.buckets
    if isinstance(buckets, (int, np.integer)):
        if buckets < 1:
            raise ConfigError(f"buckets must be >= 1, got {buckets}")
        buckets = int(buckets)
    else:
        buckets = tuple(int(x) for x in buckets)
    return dataclasses.replace(
        b,
        window=b.window if b.window is not None else default_window(sizes, shard_nbytes_of(source)),
        warmup=reads_remotely(source) if b.warmup is None else bool(b.warmup),
        shuffle=bool(b.shuffle),
        drop_last=bool(b.drop_last),
        buckets=buckets,
    )


class BatchService(Resumes, Builds):
    """Plans and builds the batches of every rank over one :class:`~datamill.core.source.Source`.

    Args:
        source: what to read (any object with the Source protocol).
        batch_size: samples per batch.
        seed: the run's seed. Defaults to ``0``.
        columns: column(s) to read (all when ``None``). Defaults to ``None``.
        collate: ``"numpy"``, ``"torch"``, ``"arrow"`` (the ``pa.Table``) or a callable receiving
            the batch table. Defaults to ``"numpy"``.
        batching: what a batch holds, the Loader's :class:`~datamill.loader.options.Batching`:
            ``shuffle``, ``window``, ``drop_last``, length buckets (``bucket_by``/``buckets``:
            lengths are read once; not combined with elastic resumption), ``filter``,
            ``transform``, ``max_errors`` (the budget :meth:`accounting` gives; the service itself
            only records failures on each :class:`BatchResult`) and ``warmup`` (``None``: on for a
            source on object storage, :func:`reads_remotely`). ``refill`` and ``replication`` are
            the Loader's (a service builds any rank's position batches). Kept as :attr:`batching`
            with ``window`` and ``warmup`` resolved. Defaults to ``Batching()``.
        workers: how batches are built, the Loader's :class:`~datamill.loader.options.Workers`:
            ``threads`` per build assembling/filtering/transforming/collating (``0``: in the
            consuming thread) and ``prefetch`` (shards loaded ahead per build, task blocks in
            flight per thread). Defaults to ``Workers()``.
        cache_shards: shards kept in memory after no active build needs them, for later builds
            (a server building one batch per request wants about ``window``). Defaults to ``None``
            (none kept: memory holds only what active builds need).
        cache_bytes: bytes of released shards kept beyond ``cache_shards``, the most recently
            released first, or a :class:`~datamill.loader.cache.KeptBytes` budget shared with
            other services (a server's build worker keeps a dataset that fits, so that a new
            epoch's order reads no shard again). Defaults to ``0``.
        plan_epochs: epochs whose global order and rank plans stay cached (a server: the current
            one and the one before, for stragglers; a single-rank Loader: ``1``). Defaults to ``2``.

    Raises:
        ConfigError: invalid arguments. SchemaError: unknown columns.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> svc = BatchService(
        ...     TableSource(pa.table({"x": list(range(10))}), shard_size=4), batch_size=4, seed=1
        ... )
        >>> svc.batching.window == svc.window, svc.workers.prefetch
        (True, 2)
        >>> (
        ...     svc.num_batches(0, rank=0, world_size=2),
        ...     svc.plan(0, 1, 2).seq.tolist() == svc.plan(0, 1, 2).seq.tolist(),
        ... )
        (2, True)
        >>> [r.output["x"].tolist() for r in svc.build(0, 1, [1], world_size=2)] == \\
        ...     [svc.plan(0, 1, 2).seq[4:].tolist()]
        True
        >>> svc.stats()["yielded"]
        1
        >>> svc.close()
    """

    def __init__(
        self,
        source: Source,
        *,
        batch_size: int,
        seed: int = 0,
        columns: Sequence[str] | str | None = None,
        collate: str | Callable[[pa.Table], Any] = "numpy",
        batching: Batching | None = None,
        workers: Workers | None = None,
        cache_shards: int | None = None,
        plan_epochs: int = 2,
        cache_bytes: int | KeptBytes = 0,
    ) -> None:
        if not isinstance(source, Source):
            missing = [
                a
                for a in ("columns", "num_shards", "shard_sizes", "read_shard", "fingerprint")
                if not hasattr(source, a)
            ]
            raise ConfigError(
                f"source must follow the Source protocol; {type(source).__name__} lacks {missing}",
                hint="wrap the data in a datamill source (TableSource, ParquetSource, "
                "HDF5Source, ...)",
            )
        b, w = checked_groups(batching, workers)
        self.batch_size, self.seed = (
            _check_int("batch_size", batch_size, 1),
            _check_int("seed", seed, 0),
        )
        _check_int("max_errors", b.max_errors, 0)
        _check_int("prefetch", w.prefetch, 1)
        _check_int("threads", w.threads, 0)
        self.plan_epochs = _check_int("plan_epochs", plan_epochs, 1)
        self.cache_shards = (
            0 if cache_shards is None else _check_int("cache_shards", cache_shards, 0)
        )
        self.cache_bytes = _checked_budget(cache_bytes)
        cols = [columns] if isinstance(columns, str) else None if columns is None else list(columns)
        if cols is not None:
            unknown = [c for c in cols if c not in source.columns]
            if unknown:
                raise SchemaError(
                    f"unknown column(s) {unknown}; the source has {source.columns}",
                    column=unknown[0],
                )
        self.source, self.columns = source, cols
        self.collate_fn = resolve_collate(collate)
        self.sizes: NDArray[np.int64] = np.asarray(source.shard_sizes(), dtype=np.int64)
        self.batching = _resolved(b, source, self.sizes)
        """The batching options, ``window`` and ``warmup`` resolved."""
        self.window: int = self.batching.window or 1
        """Shards per shuffle window (resolved: ``batching.window``)."""
        self.warmup = bool(self.batching.warmup)
        """Whether the epoch's first windows grow (resolved: ``batching.warmup``)."""
        self.workers = w
        """The worker options."""
        self.reads = REMOTE_READS if self.warmup else 2
        """Shards read at once (at least; ``workers.prefetch`` when more): with warm-up from object
        storage, as many as keep :data:`READ_AHEAD_BYTES` in flight (:func:`remote_reads`)."""
        if self.warmup and reads_remotely(source):
            self.reads = remote_reads(shard_nbytes_of(source), window=self.window)
        self._fingerprint: str | None = None
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._orders: OrderedDict[int, NDArray[np.int64]] = OrderedDict()
        self._lazy: OrderedDict[int, EpochOrder] = OrderedDict()
        self._plans: dict[tuple[int, int, int, Elastic], EpochPlan] = {}
        # warmup reads the next window while one is consumed: more reads in flight (parallel GETs)
        threads = min(MAX_READS, max(self.reads, self.workers.prefetch))
        self._cache = ShardCache(
            self._read_shard, threads=threads, keep=self.cache_shards, keep_bytes=self.cache_bytes
        )
        self._totals = Accounting(max_errors=None)
        self._builds = self._active = 0
        self._bounds: tuple[NDArray[np.int64], NDArray[np.int64]] | None = (
            None  # lengths, boundaries
        )

    def __getstate__(self) -> dict[str, Any]:
        # threads, locks and cached arrays stay in this process (spawned DataLoader workers pickle
        # us)
        keep = (
            "_lock",
            "_orders",
            "_lazy",
            "_plans",
            "_cache",
            "_totals",
            "_builds",
            "_active",
            "_bounds",
        )
        return {k: v for k, v in self.__dict__.items() if k not in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replace(self, **changes: Any) -> BatchService:
        """A new service with the same settings except ``changes`` (the fingerprint is reused).

        Examples:
            >>> from datamill.core.source import TableSource
            >>> svc = BatchService(TableSource(pa.table({"x": [1, 2, 3]})), batch_size=2)
            >>> svc.replace(collate="arrow").collate_fn(pa.table({"x": [1]})).num_rows
            1
            >>> svc.replace(workers=Workers(threads=2)).workers.threads
            2
        """
        kept = (
            "batch_size",
            "seed",
            "columns",
            "batching",
            "workers",
            "cache_shards",
            "plan_epochs",
            "cache_bytes",
        )
        kwargs: dict[str, Any] = {k: getattr(self, k) for k in kept}
        kwargs.update({"collate": self.collate_fn, **changes})
        other = BatchService(kwargs.pop("source", self.source), **kwargs)
        if other.source is self.source:
            other._fingerprint = self._fingerprint
        return other

    # ----------------------------------------------------------------- order, plans, state
    def fingerprint(self) -> str:
        """The source's fingerprint (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = self.source.fingerprint()
        return self._fingerprint

    def config(self, *, rank: int = 0, world_size: int = 1, replication: int = 1) -> dict[str, Any]:
        """The order-relevant settings of one rank (what a resume state records)."""
        cfg: dict[str, Any] = {
            "batch_size": self.batch_size,
            "columns": self.columns,
            "drop_last": self.batching.drop_last,
            "rank": int(rank),
            "shuffle": self.batching.shuffle,
            "window": self.window,
            "world_size": int(world_size),
        }
        if replication != 1:
            cfg["replication"] = int(replication)
        if self.batching.bucket_by is not None:
            buckets = self.batching.buckets
            cfg["bucket_by"] = self.batching.bucket_by
            cfg["buckets"] = buckets if isinstance(buckets, int) else list(buckets)
        if self.warmup:
            cfg["warmup"] = True
        return cfg

    def _order(self, epoch: int) -> NDArray[np.int64]:
        with self._lock:
            order = self._orders.get(epoch)
        if order is None:
            order = self._compute_order(epoch)
            with self._lock:
                order = self._orders.setdefault(epoch, order)
                self._orders.move_to_end(epoch)
                while len(self._orders) > self.plan_epochs:
                    old, _ = self._orders.popitem(last=False)
                    self._plans = {k: v for k, v in self._plans.items() if k[0] != old}
        return order

    def _compute_order(self, epoch: int) -> NDArray[np.int64]:
        custom = getattr(self.source, "epoch_sequence", None)  # e.g. a Mix: its own pure schedule
        if callable(custom):
            return np.asarray(
                custom(
                    seed=self.seed,
                    epoch=epoch,
                    shuffle=self.batching.shuffle,
                    window=self.window,
                ),
                dtype=np.int64,
            )
        return global_order(
            self.sizes,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.batching.shuffle,
            window=self.window,
            warmup=self.warmup,
        )

    def epoch_samples(self, epoch: int = 0) -> int:
        """Positions in ``epoch``'s global order (the dataset size, or a mix's epoch size)."""
        length = getattr(self.source, "epoch_length", None)
        if callable(length):
            return int(length())
        return int(self.sizes.sum())

    def plan(
        self,
        epoch: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        elastic: Elastic | None = None,
        replication: int = 1,
    ) -> EpochPlan:
        """Rank ``rank``'s :class:`~datamill.loader.stages.EpochPlan` of ``epoch`` (cached, pure).

        Args:
            epoch: the epoch.
            rank: the rank. Defaults to ``0``.
            world_size: the number of ranks. Defaults to ``1``.
            elastic: the epoch's elastic history (from :meth:`resume_point`): the rank splits only
                the positions those segments left
                (:func:`~datamill.loader.order.remaining_positions`). Defaults to ``None`` (the
                whole epoch).
            replication: ranks per replication group; the ``replication`` consecutive ranks of a
                group get the same plan (data rank ``rank // replication`` of ``world_size //
                replication``). Defaults to ``1``.

        Raises:
            ConfigError: a negative epoch, a rank outside ``[0, world_size)``, a replication not
                dividing the world size, or an elastic history that does not fit the epoch.

        Examples:
            >>> from datamill.core.source import TableSource
            >>> svc = BatchService(
            ...     TableSource(pa.table({"x": list(range(10))})),
            ...     batch_size=2,
            ...     batching=Batching(shuffle=False),
            ... )
            >>> svc.plan(0, 1, 2).seq.tolist(), svc.plan(0, 3, 4, replication=2).seq.tolist()
            ([5, 6, 7, 8, 9], [5, 6, 7, 8, 9])
            >>> # 2 ranks consumed 2 and 1 samples; what is left is re-split over 3 ranks
            >>> [svc.plan(0, r, 3, elastic=((2, (2, 1)),)).seq.tolist() for r in range(3)]
            [[2, 3, 4], [6, 7], [8, 9]]
        """
        data_rank, data_world = _check_rank(epoch, rank, world_size, replication)
        hist = norm_elastic(elastic)
        key = (int(epoch), data_rank, data_world, hist)
        with self._lock:
            plan = self._plans.get(key)
        if plan is None:
            order = self._order(key[0])
            if hist and self.batching.bucket_by is not None:
                raise ConfigError(
                    "elastic resumption is not supported with bucket_by",
                    hint="resume with the saved world size, or without bucket_by",
                )
            if hist:
                try:
                    order = order[
                        remaining_positions(
                            len(order), history=hist, drop_last=self.batching.drop_last
                        )
                    ]
                except ValueError as exc:
                    raise ConfigError(f"elastic history does not fit epoch {epoch}: {exc}") from exc
            seq = split_for_rank(
                order, rank=data_rank, world_size=data_world, drop_last=self.batching.drop_last
            )
            if self.batching.bucket_by is not None:
                seq = self._bucketed(seq, key)
            plan = EpochPlan.from_sequence(
                seq, self.sizes, batch_size=self.batch_size, drop_last=self.batching.drop_last
            )
            with self._lock:
                if key[0] in self._orders:
                    plan = self._plans.setdefault(key, plan)
        return plan

    def lengths(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(length of every sample, bucket boundaries)`` of ``bucket_by`` (read once)."""
        if self.batching.bucket_by is None:
            raise ConfigError("this service has no bucket_by column")
        if self._bounds is None:
            lengths = sample_lengths(self.source, self.batching.bucket_by)
            self._bounds = (lengths, bucket_boundaries(lengths, self.batching.buckets))
        return self._bounds

    def _bucketed(
        self, seq: NDArray[np.int64], key: tuple[int, int, int, Elastic]
    ) -> NDArray[np.int64]:
        lengths, bounds = self.lengths()
        chunk = self.window * max(1, int(self.sizes.mean()) if len(self.sizes) else 1)
        rng = rng_for(self.seed, "loader.buckets", key[0], key[1], key[2])
        return seq[
            bucket_arrange(
                lengths[seq], batch_size=self.batch_size, chunk=chunk, boundaries=bounds, rng=rng
            )
        ]

    def rank_samples(self, rank: int = 0, world_size: int = 1, *, replication: int = 1) -> int:
        """Samples rank ``rank`` visits per epoch (positions of its batches)."""
        data_rank, data_world = _check_rank(0, rank, world_size, replication)
        base, extra = divmod(
            self.epoch_samples(), data_world
        )  # split_sizes(...)[data_rank], in O(1)
        count = base if self.batching.drop_last else base + (1 if data_rank < extra else 0)
        return min(
            count,
            num_batches(count, batch_size=self.batch_size, drop_last=self.batching.drop_last)
            * self.batch_size,
        )

    def num_batches(
        self,
        epoch: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        elastic: Elastic | None = None,
        replication: int = 1,
    ) -> int:
        """Batches of rank ``rank`` in ``epoch`` (some may be empty if a filter drops every
        sample)."""
        _check_rank(epoch, rank, world_size, replication)
        if elastic:
            return self.plan(
                epoch, rank, world_size, elastic=elastic, replication=replication
            ).total_batches
        return num_batches(
            self.rank_samples(rank, world_size, replication=replication),
            batch_size=self.batch_size,
            drop_last=self.batching.drop_last,
        )

    def epoch_order(self, epoch: int) -> EpochOrder | None:
        """``epoch``'s order held per shard (O(shards), cached), or ``None`` when batches need the
        full order (a source with its own ``epoch_sequence``, or ``bucket_by``)."""
        if (
            callable(getattr(self.source, "epoch_sequence", None))
            or self.batching.bucket_by is not None
        ):
            return None
        with self._lock:
            eo = self._lazy.get(int(epoch))
            if eo is None:
                eo = self._lazy[int(epoch)] = EpochOrder(
                    self.sizes,
                    seed=self.seed,
                    epoch=int(epoch),
                    shuffle=self.batching.shuffle,
                    window=self.window,
                    warmup=self.warmup,
                )
                while len(self._lazy) > self.plan_epochs:
                    self._lazy.popitem(last=False)
            return eo

    # ----------------------------------------------------------------- accounting
    def accounting(self) -> Accounting:
        """A fresh :class:`Accounting` with this service's ``max_errors`` (one per epoch and
        rank)."""
        return Accounting(max_errors=self.batching.max_errors)

    def stats(self) -> dict[str, Any]:
        """Totals over every build so far: samples, shards read and reused, shards in memory now and
        at peak."""
        with self._lock:
            out: dict[str, Any] = self._totals.as_dict()
            out.update(
                builds=self._builds,
                active_builds=self._active,
                shards_read=self._cache.reads,
                shards_reused=self._cache.reused,
                shards_in_memory=self._cache.in_memory,
                peak_shards_in_memory=self._cache.peak,
                shards_kept_bytes=self._cache.kept_bytes,
                plans_cached=len(self._plans),
            )
        return out

    def close(self) -> None:
        """Drop the cached plans, orders and kept shards (builds still running keep what they
        need)."""
        self._cache.close()
        with self._lock:
            self._orders.clear()
            self._lazy.clear()
            self._plans.clear()
