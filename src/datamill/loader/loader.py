"""The :class:`Loader`: deterministic, shard-aware, resumable batches over any :class:`Source`."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.checks import WORLD_SIZE, check_int, check_rank
from datamill.core.errors import ConfigError
from datamill.core.progress import progress as progress_bar
from datamill.core.source import Source
from datamill.loader.accounting import Accounting, BatchResult
from datamill.loader.balance import Balance
from datamill.loader.collate import resolve_collate
from datamill.loader.nodes import COUNTED, Positions, WeakMethod, compose
from datamill.loader.options import Batching, Workers, checked_groups
from datamill.loader.order import Elastic
from datamill.loader.packing import Packing
from datamill.loader.procs import ProcessBuilds
from datamill.loader.record import run_record as _run_record
from datamill.loader.schedule import wants_lm
from datamill.loader.service import BLOCK_ROWS, BatchService
from datamill.loader.stages import EpochPlan
from datamill.loader.state import validate_state

if TYPE_CHECKING:
    from datamill.loader.lm import LMLoader

__all__ = ["BLOCK_ROWS", "COUNTED", "Loader", "per_sample"]


class Loader:
    """Iterate a :class:`~datamill.core.source.Source` in deterministic, resumable batches.

    The order is a pure function of ``(seed, epoch, shard sizes, window)`` (see
    :mod:`datamill.loader.order`); ``rank``/``world_size`` take a contiguous slice of it and batch
    ``b`` is always positions ``[b * batch_size, (b + 1) * batch_size)`` of the rank's slice,
    whatever ``num_workers``. Iterating yields the rest of the current epoch; when an epoch is
    exhausted the loader moves on to the next one (``set_epoch`` also works, torch style).

    Samples dropped by ``Batching(filter=...)`` (or failing ``transform``) leave their batch smaller
    than ``batch_size`` (positions, not outputs, define batches: that keeps order and resumption
    pure); a batch left empty is skipped (``Batching(refill=True)`` cuts the passing samples into
    full batches instead). ``stats()`` counts the whole current epoch; the resume state carries the
    counts, so a resumed loader continues them and the epoch's ``max_errors`` budget.

    Args:
        source: what to read (any object with the Source protocol).
        batch_size: samples per batch.
        seed: the run's seed. Defaults to ``0``.
        epoch: the first epoch. Defaults to ``0``.
        columns: column(s) to read (all when ``None``). Defaults to ``None``.
        collate: ``"numpy"`` (dict of arrays, ragged lists padded with ``<col>_mask``), ``"torch"``,
            ``"arrow"`` (the ``pa.Table``) or a callable receiving the batch ``pa.Table``.
            Defaults to ``"numpy"``.
        rank: this process's rank. Defaults to ``0``.
        world_size: number of ranks. Defaults to ``1``.
        batching: how batches are formed: shuffle on/off and window, ``drop_last``, length
            buckets, filter, transform, ``max_errors``, refill, replication, warmup
            (:class:`~datamill.loader.options.Batching`; :attr:`batching` keeps it with the window
            and warmup resolved). Defaults to ``Batching()``.
        workers: how batches are built: threads, prefetch, pinned memory, progress bar; never
            changes the batches (:class:`~datamill.loader.options.Workers`). Defaults to
            ``Workers()``.
        packing: pack documents into sequences (:class:`~datamill.loader.packing.Packing`); the
            loader is then an :class:`~datamill.loader.lm.LMLoader` of global steps. Defaults to
            ``None``.
        balance: deal each global step's units to ranks by cost (``"tokens"``,
            ``"tokens_squared"`` or a callable of lengths; :mod:`datamill.loader.balance`); also
            makes an :class:`~datamill.loader.lm.LMLoader`. Defaults to ``None``.

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

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """``packing=``/``balance=`` or a Mix with a schedule: an
        :class:`~datamill.loader.lm.LMLoader` (language-model batches) instead."""
        source = args[0] if args else kwargs.get("source")
        if cls is Loader and wants_lm(source, kwargs.get("packing"), kwargs.get("balance")):
            from datamill.loader.lm import LMLoader

            return LMLoader(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        seed: int = 0,
        epoch: int = 0,
        columns: Sequence[str] | str | None = None,
        collate: str | Callable[[pa.Table], Any] = "numpy",
        rank: int = 0,
        world_size: int = 1,
        batching: Batching | None = None,
        workers: Workers | None = None,
        packing: Packing | None = None,
        balance: Balance | None = None,
    ) -> None:
        if packing is not None or balance is not None:  # Loader(...) made an LMLoader instead
            raise ConfigError(f"{type(self).__name__} does not pack or balance; use Loader(...)")
        b, w = _checked_options(batching, workers, epoch=epoch, rank=rank, world_size=world_size)
        self.service = BatchService(
            source,
            batch_size=batch_size,
            seed=seed,
            columns=columns,
            collate="arrow" if b.refill else resolve_collate(collate, pin_memory=w.pin_memory),
            batching=b,
            workers=w,
            plan_epochs=1,
        )
        self.batching, self.workers = self.service.batching, w
        self.rank, self.world_size, self.progress = int(rank), int(world_size), bool(w.progress)
        self.epoch, self.replication = int(epoch), int(b.replication)
        self._elastic: Elastic = ()
        self.refill = bool(b.refill)
        self._final_collate = resolve_collate(collate, pin_memory=w.pin_memory)
        # weakly: a Loader the user dropped goes at once, its worker processes with it
        self._positions = Positions(WeakMethod(self.iter_batches), self.service.accounting)
        self._stream = compose(
            self._positions,
            refill=self.refill,
            batch_size=self.service.batch_size,
            drop_last=b.drop_last,
            collate=self._final_collate,
        )
        self._procs = ProcessBuilds(self.service, w.processes) if w.processes else None
        self._new_epoch_stats()
        self._trace_start: tuple[int, int, Elastic] = (
            self.epoch,
            0,
            (),
        )  # where this run began (run_record)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_last"] = None  # the latest batch stays here (spawned workers pickle the loader)
        state["_procs"] = None  # so do worker processes: a copy builds in its own process
        return state

    # ----------------------------------------------------------------- the service's settings
    @property
    def source(self) -> Source:
        """The source read."""
        return self.service.source

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return self.service.batch_size

    @property
    def seed(self) -> int:
        """The run's seed."""
        return self.service.seed

    @property
    def columns(self) -> list[str] | None:
        """Columns read (``None``: all)."""
        return self.service.columns

    @property
    def _batches_seen(self) -> int:
        """Position batches of the epoch consumed (refill: where the rows not emitted start)."""
        return int(self._stream.state_dict()["batches_seen"])

    @property
    def _acc(self) -> Accounting:
        return self._positions.acc

    @property
    def collate_fn(self) -> Callable[[pa.Table], Any]:
        """The collate function."""
        return self._final_collate if self.refill else self.service.collate_fn

    @property
    def sizes(self) -> NDArray[np.int64]:
        """Rows per shard of the source."""
        return self.service.sizes

    # ----------------------------------------------------------------- order and state
    @property
    def config(self) -> dict[str, Any]:
        """The order-relevant settings (saved in the resume state)."""
        return self.service.config(
            rank=self.rank, world_size=self.world_size, replication=self.replication
        )

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The rank's :class:`~datamill.loader.stages.EpochPlan` for ``epoch`` (current by
        default)."""
        if epoch is None or epoch == self.epoch:
            return self.service.plan(
                self.epoch,
                self.rank,
                self.world_size,
                elastic=self._elastic,
                replication=self.replication,
            )
        return self.service.plan(epoch, self.rank, self.world_size, replication=self.replication)

    def __len__(self) -> int:
        """Batches per epoch on this rank (some may be skipped if a filter empties them)."""
        return self.service.num_batches(
            self.epoch,
            self.rank,
            self.world_size,
            elastic=self._elastic,
            replication=self.replication,
        )

    def run_record(self, *, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The run's tiny JSON record for ``datamill trace``
        (:func:`datamill.loader.record.run_record`)."""
        return _run_record(self, previous=previous)

    def dataset_fingerprint(self) -> str:
        """The source's fingerprint (computed once)."""
        return self.service.fingerprint()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning on the next iteration."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self.epoch, self._elastic = int(epoch), ()
        self._stream.rewind()

    def state_dict(self) -> dict[str, Any]:
        """Tiny JSON-able resume state (see :mod:`datamill.loader.state`).

        Besides the position it records the epoch's ``counts`` so far (read, filtered, failed,
        yielded: a resumed loader keeps counting the epoch and its ``max_errors`` budget), and with
        ``refill`` the ``skip`` of rows already emitted from batch ``batches_seen``.
        """
        position = self._stream.state_dict()  # batches_seen, counts and each stage's own fields
        state = self.service.resume_state(
            epoch=self.epoch,
            batches_seen=position.pop("batches_seen"),
            rank=self.rank,
            world_size=self.world_size,
            elastic=self._elastic,
            replication=self.replication,
        )
        state["config"].update(position.pop("config", {}))
        state.update(position)
        return state

    def load_state_dict(
        self,
        state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        allow_mismatch: Sequence[str] = (),
    ) -> None:
        """Continue where ``state`` was taken; raises ResumeStateError listing every mismatch.

        ``state`` is this rank's state, or (an *elastic* resume) one rank's state of a run whose
        ranks stepped in lockstep, or the list of every rank's states, saved with any world size,
        replication or (with ``allow_mismatch=["batch_size"]``) batch size: the samples consumed are
        known exactly from the pure order and the rest of the epoch is re-split over this run's
        ranks, so every sample is still seen exactly once in that epoch
        (:mod:`datamill.loader.elastic`). The dataset, seed, columns, shuffle, window and
        ``drop_last`` must match.

        Examples:
            >>> from datamill.core.source import TableSource
            >>> src = TableSource(pa.table({"x": list(range(12))}), shard_size=4)
            >>> old = [Loader(src, 2, seed=3, rank=r, world_size=2) for r in range(2)]
            >>> seen = [next(iter(ld))["x"].tolist() for ld in old]  # one batch on each of 2 ranks
            >>> new = [Loader(src, 2, seed=3, rank=r, world_size=3) for r in range(3)]
            >>> for ld in new:
            ...     ld.load_state_dict([o.state_dict() for o in old])
            >>> rest = [x for ld in new for b in ld for x in b["x"].tolist()]
            >>> sorted(sum(seen, []) + rest) == list(range(12))
            True
        """
        for st in [state] if isinstance(state, Mapping) else list(state):
            self._stream.check(st, allow_mismatch=allow_mismatch)  # each stage's own settings
        point, carried = self.service.resume(
            state,
            rank=self.rank,
            world_size=self.world_size,
            replication=self.replication,
            allow_mismatch=allow_mismatch,
        )
        self.epoch, self._elastic = point.epoch, point.elastic
        self._trace_start = (point.epoch, point.batches_seen, point.elastic)
        # the saved rank's position fields when its plan goes on; a re-split starts counting again
        self._stream.load_state_dict(
            {**carried, "batches_seen": point.batches_seen}
            if carried is not None
            else {"batches_seen": point.batches_seen}
        )
        self._new_epoch_stats(keep_counts=True)

    @classmethod
    def from_state(
        cls,
        source: Source,
        state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        /,
        *,
        allow_mismatch: Sequence[str] = (),
        **kwargs: Any,
    ) -> Loader | LMLoader:
        """A loader resuming ``state`` (or every rank's states); order settings default to the saved
        ones. A language-model loader's state gives an :class:`~datamill.loader.lm.LMLoader`
        (:meth:`~datamill.loader.lm.LMLoader.from_state`).

        The fields of a given ``batching=`` left at their defaults (shuffle, window, drop_last,
        buckets, refill, replication, warmup) take the saved values too.

        Examples:
            >>> from datamill.core.source import TableSource
            >>> src = TableSource(pa.table({"x": list(range(10))}), shard_size=3)
            >>> a = Loader(src, 3, seed=5); it = iter(a); _ = next(it)
            >>> b = Loader.from_state(src, a.state_dict())
            >>> [x["x"].tolist() for x in it] == [x["x"].tolist() for x in b]
            True
        """
        from datamill.loader.lm import LM_STATE_FORMAT, LMLoader

        first: Any = state if isinstance(state, Mapping) else next(iter(state), None)
        if isinstance(first, Mapping) and first.get("format") == LM_STATE_FORMAT:
            return LMLoader.from_state(source, state, allow_mismatch=allow_mismatch, **kwargs)
        st = validate_state(first)
        cfg = dict(st["config"])
        saved = {
            "window": cfg["window"],
            "replication": cfg.get("replication", 1),
            "bucket_by": cfg.get("bucket_by"),
            "buckets": cfg.get("buckets", 8),
            "refill": bool(cfg.get("refill", False)),
            "warmup": bool(cfg.get("warmup", False)),
            "shuffle": cfg["shuffle"],
            "drop_last": cfg["drop_last"],
        }
        given = kwargs.pop("batching", None) or Batching()
        default = Batching()
        batching = dataclasses.replace(
            given, **{k: v for k, v in saved.items() if getattr(given, k) == getattr(default, k)}
        )
        defaults = {
            "batch_size": cfg["batch_size"],
            "seed": st["seed"],
            "columns": cfg["columns"],
            "rank": cfg["rank"],
            "world_size": cfg["world_size"],
            "batching": batching,
        }
        defaults.update(kwargs)
        batch_size = defaults.pop("batch_size")
        loader = cls(source, batch_size, **defaults)
        loader.load_state_dict(state, allow_mismatch=allow_mismatch)
        return loader

    # ----------------------------------------------------------------- accounting
    def _new_epoch_stats(self, *, keep_counts: bool = False) -> None:
        if not keep_counts:
            self._positions.new_counts()
        self._stats: dict[str, Any] = {
            "epoch": self.epoch,
            "elapsed_s": 0.0,
            "first_batch_s": None,
            "resumed_yielded": self._acc.yielded,
        }
        self._last: BatchResult | None = None

    def stats(self) -> dict[str, Any]:
        """Counts of the current (or just finished) epoch: read, filtered, failed, yielded,
        samples/s, position.

        The counts cover the whole epoch, also when the loader resumed part-way (the state carries
        them); ``elapsed_s`` and ``samples_per_s`` cover this loader's own iteration.
        """
        s = dict(self._stats)
        s.update(
            (k, v)
            for k, v in self._acc.as_dict().items()
            if k not in ("shards_read", "peak_shards_in_memory")
        )
        done = s["yielded"] - s.pop("resumed_yielded")  # samples/s of this loader's own iteration
        s["samples_per_s"] = done / s["elapsed_s"] if s["elapsed_s"] > 0 else 0.0
        s["position"] = {
            "epoch": self.epoch,
            "batches_seen": self._batches_seen,
            "total_batches": len(self),
        }
        if (
            self._last is not None
        ):  # of the latest iteration: shards read, most held in memory at once
            s["shards_read"], s["peak_shards_in_memory"] = (
                self._last.shards_read,
                self._last.peak_shards_in_memory,
            )
        return s

    # ----------------------------------------------------------------- iteration
    def iter_batches(self, batches: Sequence[int]) -> Generator[BatchResult, None, None]:
        """Build the given batch numbers of the current epoch (ascending), in order.

        :meth:`BatchService.build <datamill.loader.service.BatchService.build>` for this rank;
        does not touch the position or stats. With ``Workers(processes=N)`` the batches are built
        in worker processes (:mod:`datamill.loader.procs`).
        """
        build = self.service.build if self._procs is None else self._procs.build
        return build(
            self.epoch,
            self.rank,
            batches,
            world_size=self.world_size,
            elastic=self._elastic,
            replication=self.replication,
        )

    def __iter__(self) -> Generator[Any, None, None]:
        # a state saved after the epoch's last batch resumes with an empty rest of that epoch,
        # exactly like the uninterrupted run (whose loop ended there), then moves on
        position, total = self._stream.state_dict(), len(self)
        if (position["batches_seen"] == 0 and not position.get("skip")) or self._stats[
            "epoch"
        ] != self.epoch:
            self._new_epoch_stats()
        t0 = time.perf_counter() - self._stats["elapsed_s"]
        bar = progress_bar(
            total=total,
            initial=position["batches_seen"],
            desc=f"epoch {self.epoch}",
            unit="batch",
            disable=not self.progress or None,
        )

        def observe(res: BatchResult) -> None:
            self._last = res
            self._stats["elapsed_s"] = time.perf_counter() - t0
            bar.update(1)

        self._positions.observe = observe
        self._stream.begin(total)
        try:
            with bar, contextlib.closing(self._stream):
                for out in self._stream:
                    if self._stats["first_batch_s"] is None:
                        self._stats["first_batch_s"] = self._stats["elapsed_s"]
                    yield out
        finally:
            if self._positions.observe is observe:  # it refers to this Loader: no cycle is left
                self._positions.observe = None
        self._stats["elapsed_s"] = time.perf_counter() - t0
        self.epoch, self._elastic = self.epoch + 1, ()
        self._stream.rewind()


def _checked_options(
    batching: Batching | None, workers: Workers | None, *, epoch: int, rank: int, world_size: int
) -> tuple[Batching, Workers]:
    """The option groups (defaults for ``None``), checked with the position options."""
    b, w = checked_groups(batching, workers)
    check_int(epoch, name="epoch", low=0, high=None)
    check_int(w.processes, name="Workers(processes=)", low=0, high=256)
    WORLD_SIZE(world_size)
    check_rank(rank, world_size=world_size)
    if (
        check_int(b.replication, name="replication", low=1, high=world_size)
        and world_size % b.replication
    ):
        raise ConfigError(
            f"replication must be an int >= 1 dividing world_size={world_size}, "
            f"got {b.replication!r}"
        )
    if b.window is not None:
        check_int(b.window, name="Batching(window=) (shards)", low=1)
    return b, w


def per_sample(predicate: Callable[[dict[str, Any]], bool]) -> Callable[[pa.Table], np.ndarray]:
    """Turn a row predicate ``fn(row_dict) -> bool`` into a batch filter (slow: one call per row).

    Examples:
        >>> per_sample(lambda r: r["x"] > 1)(pa.table({"x": [1, 2, 3]})).tolist()
        [False, True, True]
    """

    def batch_filter(table: pa.Table) -> np.ndarray:
        return np.array([bool(predicate(row)) for row in table.to_pylist()], dtype=bool)

    return batch_filter
