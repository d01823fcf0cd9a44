"""A lease's batches, built with a :class:`~datamill.loader.BatchService` the same way wherever
they are built: by a server's build worker (``datamill serve``, server-built leases) or by a
direct-mode client (:mod:`datamill.client`), so that both hand out byte-identical batches.

A lease's units are runs ``(plan rank, first batch, stop batch)`` of one plan rank's batches
(:func:`datamill.core.wire.parse_runs`); :func:`service_for` opens the batch service of an
iteration's config, :class:`RunStream` keeps one continuous build per plan rank across leases,
:class:`RunAhead` builds a rank's batches in a thread ahead of the leases asked (a build worker's),
and :func:`as_batch` cuts every batch into one contiguous record batch whose Arrow IPC bytes do not
depend on where it was sliced from.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.errors import BuildError, DatamillError
from datamill.loader.accounting import BatchResult
from datamill.loader.cache import KeptBytes
from datamill.loader.options import Batching
from datamill.loader.order import default_window
from datamill.loader.service import BatchService, shard_nbytes_of

__all__ = [
    "SERVICE_FIELDS",
    "RunAhead",
    "RunStream",
    "Split",
    "as_batch",
    "as_batches",
    "as_table",
    "build_runs",
    "close_iterator",
    "iteration_window",
    "service_for",
    "service_key",
    "worker_budget",
    "worker_cache_bytes",
]

_SLICED: dict[pa.DataType, bool] = {}  # type -> _sliced_children(type), asked once per type
_MAX_SLICED = 1024


def _sliced_children(typ: pa.DataType) -> bool:
    """Whether an array of ``typ`` shares a variable-size buffer or child with its slices (strings,
    binaries, lists): how such a slice is written to Arrow IPC depends on where it was cut from,
    not only on its values. Remembered per type (asked for every column of every batch)."""
    known = _SLICED.get(typ)
    if known is None:
        if len(_SLICED) >= _MAX_SLICED:
            _SLICED.clear()
        known = _SLICED[typ] = _sliced_type(typ)
    return known


def _sliced_type(typ: pa.DataType) -> bool:
    if (
        pat.is_list(typ)
        or pat.is_large_list(typ)
        or pat.is_map(typ)
        or pat.is_string(typ)
        or pat.is_large_string(typ)
        or pat.is_binary(typ)
        or pat.is_large_binary(typ)
        or pat.is_dictionary(typ)
    ):
        return True
    if pat.is_struct(typ) or pat.is_fixed_size_list(typ):
        return any(_sliced_type(typ.field(i).type) for i in range(typ.num_fields))
    return False


def _canonical(arr: pa.Array) -> bool:
    """Whether ``arr``'s Arrow IPC bytes depend only on its values: a fixed-width array of a
    multiple of 64 rows (a slice of another length is written with its neighbours' bytes as
    padding)."""
    return len(arr) % 64 == 0 and not _sliced_children(arr.type)


_LAST_SCHEMA: list[tuple[pa.Schema | None, bool]] = [(None, True)]  # [(schema, its answer)]


def _sliced_schema(schema: pa.Schema) -> bool:
    """Whether a column of ``schema`` has a type of :func:`_sliced_children` (the last schema asked
    about is remembered: a lease's batches share theirs)."""
    last = _LAST_SCHEMA[0]
    if last[0] is not schema:
        last = _LAST_SCHEMA[0] = (schema, any(_sliced_children(t) for t in schema.types))
    return last[1]


def _whole(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch | None:
    """The table's one record batch when it is already what :func:`as_batch` makes (``schema``,
    one chunk per column, each :func:`_canonical`), else ``None``: checked per table, not per
    column (a direct client asks for every batch)."""
    if (
        table.num_rows % 64
        or not table.schema.equals(schema, check_metadata=True)
        or _sliced_schema(schema)
    ):
        return None
    batches = table.to_batches()
    return batches[0] if len(batches) == 1 else None


def _column(col: pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return arr if _canonical(arr) else pa.concat_arrays([arr])


def as_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    """A table as one contiguous record batch of ``schema`` (cast when it differs).

    Columns of strings, binaries or lists, and columns whose length is not a multiple of 64, are
    copied into their own buffers, so that the batch's Arrow IPC bytes are the same however it was
    sliced (a direct client's or a build worker's builds are cut from other blocks than a build per
    lease).

    Examples:
        >>> def ipc(batch: pa.RecordBatch) -> bytes:
        ...     sink = pa.BufferOutputStream()
        ...     with pa.ipc.new_stream(sink, batch.schema) as writer:
        ...         writer.write_batch(batch)
        ...     return sink.getvalue().to_pybytes()
        >>> t = pa.table({"ids": [[1], [2, 3], [4, 5, 6], [7]]})
        >>> small = pa.table({"ids": [[1], [2, 3]]})
        >>> ipc(as_batch(t.slice(0, 2), t.schema)) == ipc(as_batch(small, t.schema))
        True
    """
    whole = _whole(table, schema)
    if whole is not None:
        return whole
    t = table.cast(schema) if table.schema != schema else table
    return pa.RecordBatch.from_arrays([_column(c) for c in t.columns], schema=schema)


def as_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A table of one chunk per column and ``schema``: what :func:`as_batch` gives, as a table.

    Examples:
        >>> t = pa.table({"x": list(range(128))})
        >>> as_table(t, t.schema).equals(t)
        True
        >>> as_table(pa.concat_tables([t, t]), t.schema).column(0).num_chunks
        1
    """
    return pa.Table.from_batches([as_batch(table, schema)])


def as_batches(tables: Sequence[pa.Table]) -> list[pa.RecordBatch]:
    """Tables as record batches of the first one's schema, one contiguous batch per table (what goes
    into a lease's Arrow IPC stream, so that direct and server-built batches are the same)."""
    schema = tables[0].schema
    return [as_batch(t, schema) for t in tables]


SERVICE_FIELDS = ("dataset", "batch_size", "seed", "shuffle", "columns", "drop_last", "window")
"""An iteration config's fields that decide its batch service (:func:`service_for`): one service
serves every epoch of them, wherever it is built (the server's catalog and build workers, a direct
client)."""


def service_key(cfg: Mapping[str, Any], *more: Any) -> str:
    """The key of the batch service of ``cfg`` (its :data:`SERVICE_FIELDS`), with ``more`` values
    that also tell services apart where it is kept (a build worker's dataset path, a direct
    client's plan world size).

    Examples:
        >>> cfg = dict(dataset="d", batch_size=4, seed=0, shuffle=True, columns=None,
        ...            drop_last=False, window=8, epoch=3)
        >>> service_key(cfg) == service_key({**cfg, "epoch": 4}) != service_key(cfg, "/data/d")
        True
    """
    from datamill.core.fingerprint import fingerprint_obj

    return fingerprint_obj([cfg[k] for k in SERVICE_FIELDS] + list(more))


def iteration_window(source: Any, states: Sequence[Mapping[str, Any]] | None = None) -> int:
    """The shuffle window a served iteration fixes when it is created without one: the window of
    the loader states it resumes from when they agree on one, else the source's default
    (:func:`~datamill.loader.order.default_window`, bounded by its shards' bytes). An iteration
    resumed from another keeps that one's (``None`` for one journaled before windows were fixed
    at creation: :func:`service_for` then applies the samples-only rule of its time).

    Examples:
        >>> from datamill.core.source import TableSource
        >>> src = TableSource(pa.table({"x": list(range(10))}), shard_size=2)
        >>> iteration_window(src, [{"config": {"window": 2}}])  # the states' window
        2
        >>> iteration_window(src) == default_window(src.shard_sizes())  # no bytes told: samples
        True
    """
    windows = {
        s["config"].get("window") if isinstance(s.get("config"), Mapping) else None
        for s in states or ()
        if isinstance(s, Mapping)
    }
    if len(windows) == 1 and isinstance(window := next(iter(windows)), int):
        return window
    return default_window(source.shard_sizes(), shard_nbytes_of(source))


def service_for(
    source: Any,
    cfg: Mapping[str, Any],
    *,
    cache_shards: int | None = None,
    ranks: int | None = None,
    collate: str | Callable[[pa.Table], Any] = "arrow",
    cache_bytes: int | KeptBytes = 0,
) -> BatchService:
    """The batch service of an iteration's config (the one the server builds with,
    ``collate="arrow"``; a direct client whose loop takes numpy or torch batches builds them with
    that collate, applied to each block of batches at once:
    :func:`~datamill.loader.collate_lease.block_collate`).

    ``cache_shards`` defaults to two shuffle windows of released shards per rank served: ``ranks``
    (defaults to the plan's world size; a direct client serves one); with that default, released
    shards are also kept while they fit ``cache_bytes`` (a build worker's services share
    :func:`worker_budget`: each epoch's order reads every shard, so a worker that kept two windows
    read and decoded again, in every epoch, nearly every shard; a ``cache_shards`` given is kept
    exactly). Shards are read one shuffle window ahead (``prefetch``: the window's shard
    count), so that a direct client's or a build worker's gathers seldom wait for a read; the
    batches are the same.
    """
    window = cfg["window"]
    if window is None:  # an iteration journaled before windows were fixed at its creation
        window = default_window(source.shard_sizes())
    svc = BatchService(
        source,
        batch_size=int(cfg["batch_size"]),
        seed=int(cfg["seed"]),
        columns=cfg["columns"],
        collate=collate,
        batching=Batching(
            window=window,
            shuffle=bool(cfg["shuffle"]),
            drop_last=bool(cfg["drop_last"]),
            warmup=False,
        ),
        cache_shards=cache_shards,
    )
    # read a shuffle window of shards ahead from a build's start (``prefetch``; the in-process
    # Loader's is 2, and every build reads the next window once this one is in use:
    # cache.read_target), so that a lease's first gathers seldom wait for a read
    changes: dict[str, Any] = {
        "workers": dataclasses.replace(svc.workers, prefetch=max(svc.workers.prefetch, svc.window))
    }
    if cache_shards is None:
        served = max(1, int(cfg.get("plan_world", 1)) if ranks is None else ranks)
        changes["cache_shards"] = 2 * svc.window * served
        changes["cache_bytes"] = cache_bytes
    return svc.replace(**changes)


WORKER_CACHE_BYTES = 1 << 30
"""The most a build worker keeps of released shards (:func:`worker_cache_bytes`)."""
_BUDGET: list[KeptBytes] = []  # this process's worker_budget()
_BUDGET_LOCK = threading.Lock()


def worker_budget() -> KeptBytes:
    """The budget every batch service of this process (a server's build worker) keeps released
    shards under, across epochs and services: :func:`worker_cache_bytes` (created on the first
    call).

    Examples:
        >>> worker_budget() is worker_budget(), worker_budget().limit == worker_cache_bytes() > 0
        (True, True)
    """
    with _BUDGET_LOCK:
        if not _BUDGET:
            _BUDGET.append(KeptBytes(worker_cache_bytes()))
        return _BUDGET[0]


def worker_cache_bytes() -> int:
    """Bytes of released shards a server's build worker keeps across epochs:
    :data:`WORKER_CACHE_BYTES`, or an eighth of the memory available now when that is less (at
    most four workers: half of it).

    Examples:
        >>> 0 < worker_cache_bytes() <= WORKER_CACHE_BYTES
        True
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            free = next(
                int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:")
            )
    except (OSError, StopIteration, ValueError):  # not Linux: the pages free
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return WORKER_CACHE_BYTES
    return max(1, min(WORKER_CACHE_BYTES, free // 8))


def build_runs(
    svc: BatchService, cfg: Mapping[str, Any], runs: Sequence[tuple[int, int, int]]
) -> list[pa.Table]:
    """The batches of a lease's runs, as the server builds them."""
    tables: list[pa.Table] = []
    for r, a, b in runs:
        tables.extend(
            res.output
            for res in svc.build_samples(
                int(cfg["epoch"]), r, list(range(a, b)), world_size=int(cfg["plan_world"])
            )
        )
    return tables


@dataclasses.dataclass(frozen=True)
class Split:
    """Part ``part`` of ``parts`` of every plan rank's batches: the chunks of ``chunk`` consecutive
    batches whose number ``c`` has ``(c + rank) % parts == part`` (a build worker builds its part
    of a rank while the others build theirs). A lease ``[a, b)`` of a rank is, in each part, one
    run of that part's batches (:meth:`local`).

    Examples:
        >>> s = Split(1, 2, chunk=2)
        >>> s.batches(0, 9).tolist(), s.batches(1, 9).tolist()
        ([2, 3, 6, 7], [0, 1, 4, 5, 8])
        >>> s.local(1, 1, 8), s.pieces(0, 1, 8)
        ((1, 4), [(1, 2, 0), (2, 4, 1), (4, 6, 0), (6, 8, 1)])
    """

    part: int = 0
    parts: int = 1
    chunk: int = 32

    def batches(self, rank: int, total: int) -> NDArray[np.int64]:
        """The batches of this part of plan rank ``rank`` (of ``total``), ascending."""
        b = np.arange(total, dtype=np.int64)
        out: NDArray[np.int64] = b[(b // self.chunk + rank) % self.parts == self.part]
        return out

    def local(self, rank: int, a: int, b: int) -> tuple[int, int]:
        """Batches ``[a, b)`` of plan rank ``rank``: this part's run of them, as positions in
        :meth:`batches`."""
        return self._below(rank, a), self._below(rank, b)

    def _below(self, rank: int, x: int) -> int:
        """This part's batches of plan rank ``rank`` below batch ``x``."""
        q, rem = divmod(x, self.chunk)
        first = (self.part - rank) % self.parts  # this part's first chunk
        full = 0 if q <= first else (q - 1 - first) // self.parts + 1
        return full * self.chunk + (rem if (q + rank) % self.parts == self.part else 0)

    def pieces(self, rank: int, a: int, b: int) -> list[tuple[int, int, int]]:
        """Batches ``[a, b)`` of plan rank ``rank`` as ``(start, stop, part)`` pieces, in order."""
        out = []
        while a < b:
            c = a // self.chunk
            stop = min(b, (c + 1) * self.chunk)
            out.append((a, stop, (c + rank) % self.parts))
            a = stop
        return out


class RunStream:
    """A direct client's builds: one continuous build per plan rank, as the in-process Loader's.

    Building each lease on its own starts a build per lease: its shards are read when it starts
    (nothing was read ahead) and released when it ends. A client of a static iteration receives its
    rank's batches in order, lease after lease, so this keeps **one** build of the plan rank running
    from the first batch leased to the rank's end and takes each lease's batches from it, one at a
    time as the training loop asks: shards are read ahead across leases, exactly as the in-process
    Loader reads them (the same :meth:`BatchService.build <datamill.loader.BatchService.build>`, the
    same bytes, built in the consuming thread or the service's ``num_workers`` threads). A lease
    that does not continue the stream (a re-issued lease, a resumed rank, another slot's turn)
    restarts it there. In dynamic mode (``follow=False``) a client's leases are not consecutive:
    each is built alone, without the epoch's plan (as :func:`build_runs`).

    A server's build worker follows the ranks it serves with ``horizon`` (a build covers the next
    ``horizon`` batches, without the rank's plan, so memory stays O(shards + horizon)) and at most
    ``streams`` builds open; with a ``split``, its part of each rank only (a batch number ``i`` is
    then the ``i``-th batch of the part: :meth:`total` of them).

    Examples:
        >>> from datamill.core.source import TableSource
        >>> svc = service_for(TableSource(pa.table({"x": list(range(20))}), shard_size=5),
        ...                   {"batch_size": 4, "seed": 1, "shuffle": True, "window": None,
        ...                    "drop_last": False, "columns": None})
        >>> cfg = {"epoch": 0, "plan_world": 2}
        >>> stream = RunStream(svc, cfg)
        >>> got = [*stream.batches([(1, 0, 2)]), *stream.batches([(1, 2, 3)])]
        >>> want = build_runs(svc, cfg, [(1, 0, 3)])
        >>> [t["x"].to_pylist() for t in got] == [t["x"].to_pylist() for t in want]
        True
        >>> stream.restarts
        1
        >>> ahead = RunStream(svc, cfg, horizon=2)
        >>> got = [*ahead.batches([(1, 0, 2)]), *ahead.batches([(1, 2, 3)])]
        >>> [t["x"].to_pylist() for t in got] == [t["x"].to_pylist() for t in want], ahead.restarts
        (True, 2)
        >>> stream.close(); ahead.close()
    """

    def __init__(
        self,
        svc: BatchService,
        cfg: Mapping[str, Any],
        *,
        follow: bool = True,
        horizon: int | None = None,
        streams: int = 2,
        split: Split | None = None,
    ) -> None:
        self.svc, self.cfg, self.follow, self.split = svc, cfg, follow, split
        self._owned: dict[int, NDArray[np.int64]] = {}  # with a split: plan rank -> its batches
        self.horizon, self.max_streams = horizon, max(1, int(streams))
        self.epoch, self.world = int(cfg["epoch"]), int(cfg["plan_world"])
        # plan rank -> (next batch, stop batch, its build's results)
        self._streams: dict[int, tuple[int, int, Iterator[BatchResult]]] = {}
        self.restarts = 0  # builds started (the first one included)
        self._primed: tuple[int, int, Any] | None = None  # (plan rank, batch, output) built ahead

    def prime(self, rank: int, batch: int) -> None:
        """Build batch ``batch`` of plan rank ``rank`` now, before a lease asks for it (a static
        rank's first lease of an epoch, while its round trip is in flight): the lease that starts
        there takes it (and the build continues from it); any other drops it. A failure is left
        to the lease that builds the batch."""
        if not self.follow:
            return
        try:
            stop, results = self._at(rank, batch)
            res = next(results, None)
        except Exception:  # noqa: BLE001 - the lease's own build raises it where it belongs
            self.close()
            return
        if res is not None:
            self._streams[rank] = (batch + 1, stop, results)
            self._primed = (rank, batch, res.output)

    def batches(self, runs: Sequence[tuple[int, int, int]]) -> Iterator[Any]:
        """The batches of a lease's runs, in order, each built when it is asked for."""
        for r, a, b in runs:
            if not self.follow:
                alone = self.svc.build_samples(self.epoch, r, range(a, b), world_size=self.world)
                try:
                    yield from (res.output for res in alone)
                finally:
                    alone.close()
                continue
            for batch in range(a, b):
                primed, self._primed = self._primed, None
                if primed is not None and primed[:2] == (r, batch):
                    yield primed[2]
                    continue
                stop, results = self._at(r, batch)
                res = next(results)
                self._streams[r] = (batch + 1, stop, results)
                yield res.output

    def total(self, rank: int) -> int:
        """Batches of plan rank ``rank`` this stream builds (its part's, with a split)."""
        total = self.svc.num_batches(self.epoch, rank, self.world)
        if self.split is None:
            return total
        owned = self._owned.get(rank)
        if owned is None:
            owned = self._owned[rank] = self.split.batches(rank, total)
        return len(owned)

    def _at(self, rank: int, batch: int) -> tuple[int, Iterator[BatchResult]]:
        """The build of plan rank ``rank`` whose next batch is ``batch`` (started there if need
        be), with the batch it stops at."""
        current = self._streams.pop(rank, None)
        if current is not None and current[0] == batch < current[1]:
            self._streams[rank] = current
            return current[1], current[2]
        if current is not None:
            close_iterator(current[2])
        while len(self._streams) >= self.max_streams:  # the least recently used build stops
            close_iterator(self._streams.pop(next(iter(self._streams)))[2])
        total = self.total(rank)
        results: Iterator[BatchResult]
        if self.split is not None:  # the part's next ``horizon`` batches, as below
            stop = min(total, batch + (self.horizon or total))
            results = self.svc.build_samples(
                self.epoch, rank, self._owned[rank][batch:stop].tolist(), world_size=self.world
            )
        elif self.horizon is None:  # to the rank's end, with the rank's plan (the Loader's way)
            stop = total
            results = self.svc.build(self.epoch, rank, range(batch, stop), world_size=self.world)
        else:  # the next ``horizon`` batches, without the rank's plan (memory O(horizon))
            stop = min(total, batch + self.horizon)
            results = self.svc.build_samples(
                self.epoch, rank, range(batch, stop), world_size=self.world
            )  # its results count from 0 (the build releases shards by that count: never renumber)
        self._streams[rank] = (batch, stop, results)
        self.restarts += 1
        return stop, results

    def close_rank(self, rank: int) -> None:
        """Stop plan rank ``rank``'s open build (its shards are released; a later batch of the rank
        starts a new one)."""
        current = self._streams.pop(rank, None)
        if current is not None:
            close_iterator(current[2])

    def close(self) -> None:
        """Stop the open builds (their shards are released)."""
        self._primed = None
        for *_, results in self._streams.values():
            close_iterator(results)
        self._streams.clear()


class RunAhead:
    """One plan rank's batches, built in order by ``pool``'s one thread ahead of the runs asked,
    whatever their bounds (a server-built client's first leases of an epoch are sized by its rate):
    batches ``[base, pos)`` are held, ``[pos, want)`` to build, :data:`CHUNK` at a time (the
    ranks sharing ``pool`` take turns). ``convert`` makes what is held of the built tables, with
    the bytes of each; past the batches asked, a turn builds only while ``held`` (every rank's
    bytes, shared) is within ``budget``. ``stream`` is used by ``pool``'s thread only.

    A :meth:`take` always ends: a build that fails, ends short, is stopped (:meth:`stop`), whose
    turn cannot run (``pool`` shut down, a turn cancelled or ended by a ``BaseException``) or that
    builds nothing for :data:`STALL_S` seconds fails it with a
    :class:`~datamill.core.errors.BuildError` naming the plan rank, the epoch and the batches (a
    server answers it with 503).

    Examples:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> from datamill.core.source import TableSource
        >>> svc = service_for(TableSource(pa.table({"x": list(range(20))}), shard_size=5),
        ...                   {"batch_size": 4, "seed": 1, "shuffle": False, "window": None,
        ...                    "drop_last": False, "columns": None})
        >>> pool = ThreadPoolExecutor(1)
        >>> ahead = RunAhead(RunStream(svc, {"epoch": 0, "plan_world": 1}), 0, 1, pool=pool,
        ...                  convert=lambda ts: [(t, t.nbytes) for t in ts], held=[0])
        >>> [t["x"].to_pylist() for t in ahead.take(1, 3, ahead=2)]
        [[4, 5, 6, 7], [8, 9, 10, 11]]
        >>> ahead.stop(); pool.shutdown()
        >>> try:
        ...     ahead.take(3, 4, ahead=0)
        ... except DatamillError as exc:
        ...     print(exc)
        plan rank 0 of epoch 0, batches [3, 4): its build was stopped
    """

    CHUNK: ClassVar[int] = 32
    STALL_S: ClassVar[float] = 600.0  # a take fails once no batch was built for this long
    stats: ClassVar[dict[str, int]] = {"asked": 0, "ready": 0, "follows": 0}  # batches; RunAheads

    def __init__(
        self,
        stream: RunStream,
        rank: int,
        start: int,
        *,
        pool: Executor,
        convert: Callable[[Iterable[pa.Table]], list[tuple[Any, int]]],
        held: list[int],
        budget: int = 256 << 20,
    ) -> None:
        self.stream, self.rank, self.pool, self.convert = stream, rank, pool, convert
        self.held, self.budget = held, budget
        self.total = stream.total(rank)
        self.base = self.pos = self.want = self.asked = start
        self.items: deque[tuple[Any, int]] = deque()
        self.error: Exception | None = None
        self.busy = self.dead = False  # a turn is queued or running / stopped
        self.cond = threading.Condition(_HELD_LOCK)  # one lock: ``held`` is shared
        RunAhead.stats["follows"] += 1

    def turn(self) -> None:
        """In ``pool``'s thread: the next :data:`CHUNK` batches, then the next turn is queued."""
        with self.cond:
            a, b = self.pos, min(self.want, self.pos + self.CHUNK)
            full = a >= self.asked and self.held[0] > self.budget
            if self.dead or self.error is not None or a >= b or full:
                self.busy = False
                self.cond.notify_all()
                return
        got, error = self._built(a, b)
        with self.cond:
            if error is not None and self.error is None:
                self.error = error
            if not self.dead:
                self.items.extend(got)
                self.held[0] += sum(n for _, n in got)
                self.pos += len(got)
            self.cond.notify_all()
        self._submit()

    def _built(self, a: int, b: int) -> tuple[list[tuple[Any, int]], Exception | None]:
        """Batches ``[a, b)`` converted, and the error of their build (``None``: none)."""
        try:
            got = self.convert(self.stream.batches([(self.rank, a, b)]))
        except DatamillError as exc:  # located already
            return [], exc
        except Exception as exc:  # noqa: BLE001 - raised by the take that waits for it
            error = self._failure(a, b, f"its build failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return [], error
        if len(got) < b - a:
            return got, self._failure(a, b, f"its build ended after {len(got)} batches")
        return got, None

    def take(self, a: int, b: int, *, ahead: int) -> list[Any]:
        """Batches ``[a, b)`` (``base <= a <= pos``) once built; ``ahead`` more are built on.

        Raises:
            BuildError: one of them cannot be built (its build failed, ended short or was
                stopped, its turn could not run, or nothing was built for :data:`STALL_S`
                seconds); an error of the build itself is the ``__cause__``.
        """
        with self.cond:
            if self.dead:
                raise self._failure(a, b, "its build was stopped")
            if b > self.total:
                raise self._failure(a, b, f"the rank has {self.total} batches")
            self._drop(a - self.base)
            RunAhead.stats["asked"] += b - a
            RunAhead.stats["ready"] += max(0, min(self.pos, b) - a)
            self.asked, self.want = b, max(self.want, min(self.total, b + ahead))
            self._kick()
            self._wait(a, b)
            if self.pos < b:
                raise self.error or self._failure(a, b, "its build was stopped")
            out = [x for x, _ in itertools.islice(self.items, b - a)]
            self._drop(b - a)
            self._kick()  # (the budget may have stopped it)
            return out

    def _wait(self, a: int, b: int) -> None:
        """Wait (holding ``cond``) until batch ``b - 1`` is built, the build failed or was
        stopped; after :data:`STALL_S` seconds without a batch built, it has failed."""
        pos, since = self.pos, time.monotonic()
        while self.pos < b and self.error is None and not self.dead:
            now = time.monotonic()
            if self.pos != pos:
                pos, since = self.pos, now
            elif now - since >= self.STALL_S:
                self.error = self._failure(
                    a, b, f"no batch was built for {self.STALL_S:g} s (the build thread is stuck)"
                )
                return
            self.cond.wait(since + self.STALL_S - now)

    def _kick(self) -> None:
        if not self.busy and self.pos < self.want:
            self.busy = True
            self._submit()

    def _submit(self) -> None:
        """Queue the next turn; a turn that cannot be queued or does not run to its end fails."""
        try:
            future = self.pool.submit(self.turn)
        except Exception as exc:  # noqa: BLE001 - the pool was shut down (RuntimeError) or broken
            self._fail(exc, f"its build thread's pool was shut down ({type(exc).__name__}: {exc})")
            return
        future.add_done_callback(self._ended)

    def _ended(self, future: Future[None]) -> None:
        """A turn's end: one cancelled (its pool shut down) or raising out of :meth:`turn` (a
        ``BaseException`` of the build) fails the waiters."""
        if future.cancelled():
            self._fail(None, "its turn was cancelled (the build thread's pool was shut down)")
            return
        exc = future.exception()
        if exc is not None:
            self._fail(exc, f"its build thread's turn ended with {type(exc).__name__}: {exc}")

    def _fail(self, cause: BaseException | None, what: str) -> None:
        with self.cond:  # (reentrant: a take may hold it)
            self.busy = False
            if self.error is None:
                self.error = self._failure(self.pos, self.want, what)
                self.error.__cause__ = cause
            self.cond.notify_all()

    def _failure(self, a: int, b: int, what: str) -> BuildError:
        dataset = self.stream.cfg.get("dataset")
        return BuildError(
            f"plan rank {self.rank} of epoch {self.stream.epoch}, batches [{a}, {b}): {what}",
            path=dataset if isinstance(dataset, str) else None,
        )

    def _drop(self, n: int) -> None:
        self.held[0] -= sum(self.items.popleft()[1] for _ in range(n))
        self.base += n

    def stop(self) -> None:
        """No more turns; nothing held (a take waiting fails)."""
        with self.cond:
            self.dead = True
            self._drop(len(self.items))
            self.cond.notify_all()


_HELD_LOCK = threading.RLock()  # the lock of every RunAhead (their ``held`` may be shared)


def close_iterator(results: Iterator[Any]) -> None:
    """Close a generator (releasing what it holds); other iterators have nothing to close."""
    close = getattr(results, "close", None)
    if close is not None:
        close()
