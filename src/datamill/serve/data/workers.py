"""Build workers (``datamill serve --build-workers N``): server-built leases built in worker
processes (:mod:`datamill.core.workproc`), past the HTTP process's GIL, handed over in shared
memory. Which worker builds a lease, how a rank is split over workers and built ahead, and the
hand-over are ``docs/serving-scale.md`` (*Build workers*).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from datamill.core.arrow import joined
from datamill.core.errors import ConfigError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.parallel import usable_cores
from datamill.core.workpool import CallPool, answer_calls, hand
from datamill.core.workproc import Slots, exec_args, worker_setup
from datamill.loader.runs import (
    SERVICE_FIELDS,
    RunAhead,
    RunStream,
    Split,
    as_batch,
    as_batches,
    build_runs,
    service_for,
    service_key,
    worker_budget,
)

__all__ = ["BuildPool", "default_build_workers", "ipc_stream"]

_SERVICES: dict[str, Any] = {}  # in a worker: service key -> BatchService
_CACHE_SHARDS: int | None = None
_MAX_CLIENTS = 4096
_STREAMS: dict[str, Any] = {}  # in a worker: (service, epoch, plan, mode) -> RunStream
_MAX_ITERATIONS = 8  # iterations (service and epoch) a worker follows at once
_STREAMS_PER_ITERATION = 16  # plan ranks a worker follows at once in one iteration
# batches one build of a followed rank covers (its plan holds 24 bytes a sample): 4 leases, or as
# many as make 1M samples (each build starts with a wait for its first shards)
_HORIZON_LEASES, _HORIZON_SAMPLES = 4, 1 << 20
# in a worker: each followed static rank's batches built ahead ((stream key, plan rank) ->
# RunAhead, most recently asked last), the bytes they hold, and the one thread building every batch
_RANKS: OrderedDict[tuple[str, int], RunAhead] = OrderedDict()
_AHEAD_LEASES = 2  # leases (of ``lease_size`` batches) of a rank built ahead of the batches asked
_HELD = [0]
_BUILDER: ThreadPoolExecutor | None = None
_Runs = tuple[tuple[int, int, int], ...]


def default_build_workers() -> int:
    """The default ``--build-workers``: the usable cores, at most 4.

    Examples:
        >>> 1 <= default_build_workers() <= 4
        True
    """
    return max(1, min(4, usable_cores()))


_WATCH_S = 1.0  # how often a worker checks that its server still runs


def _main() -> None:
    """A build worker (``python -c ... FD PARENT STARTED THREADS``, see
    :class:`~datamill.core.workpool.CallPool`): its cache bound, the imports of a lease's build,
    then the calls."""
    global _CACHE_SHARDS
    conn, _CACHE_SHARDS = worker_setup(*exec_args(), None, watch_s=_WATCH_S)
    import datamill.sources  # noqa: F401 - imported now: a worker is warm before the first lease

    answer_calls(conn, Slots("datamill-lease", limit=_SLOT_COUNT))


def ipc_stream(tables: Sequence[pa.Table]) -> pa.Buffer:
    """Tables as one Arrow IPC stream, exactly one record batch per table (a lease's bytes)."""
    batches = as_batches(tables)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue()


_SLOT_COUNT = 4  # shared-memory slots of a worker (leases the HTTP process sends at once)
_SLOT_MAX = 64 << 20  # larger leases go through the pipe
_EOS = pa.py_buffer(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # an Arrow IPC stream's end
_Built = tuple[pa.Table, pa.Buffer | None]  # a batch, and its IPC message (None: a dictionary)


def _serialized(tables: Iterable[pa.Table]) -> list[tuple[_Built, int]]:
    """Batches with their Arrow IPC messages (made in the build thread, not on the lease's way),
    and the bytes of both."""
    out = []
    for t in tables:
        m = None if _dictionary(t.schema) else as_batch(t, t.schema).serialize()
        out.append(((t, m), t.get_total_buffer_size() + (0 if m is None else m.size)))
    return out


_LAST_SCHEMA: list[tuple[pa.Schema | None, bool]] = [(None, False)]


def _dictionary(schema: pa.Schema) -> bool:
    """Whether ``schema`` has a dictionary type (asked for every batch: the last schema's answer is
    remembered, a rank's batches share theirs)."""
    last = _LAST_SCHEMA[0]
    if last[0] is not schema:
        last = _LAST_SCHEMA[0] = (schema, "dictionary<" in str(schema))
    return last[1]


def _body(built: Sequence[_Built]) -> list[pa.Buffer]:
    """A lease's Arrow IPC stream (the bytes of :func:`ipc_stream`), as parts: the schema, each
    batch's message, the end; one :func:`ipc_stream` when a batch has no message or another
    schema than the first one."""
    schema = built[0][0].schema
    if all(m is not None and t.schema.equals(schema, check_metadata=True) for t, m in built):
        return [schema.serialize(), *(m for _, m in built if m is not None), _EOS]
    return [ipc_stream([t for t, _ in built])]


def _builder() -> ThreadPoolExecutor:
    """The worker's one build thread: every batch is built there, one rank's turn after another."""
    global _BUILDER
    if _BUILDER is None:
        _BUILDER = ThreadPoolExecutor(1, thread_name_prefix="datamill-build")
    return _BUILDER


def _tables(skey: str, stream: Any, cfg: Mapping[str, Any], runs: _Runs) -> list[_Built]:
    """A lease's batches: a static rank's from its RunAhead (started at the lease's first
    batch when the lease does not continue it), others built alone in the build thread. With a
    split, ``runs`` are this part's pieces of one lease: one run of the part's batches."""
    local = _local(stream, runs)
    if local is None:
        alone = build_runs if stream.split is not None else None
        made = stream.batches(runs) if alone is None else alone(stream.svc, stream.cfg, runs)
        return [x for x, _ in _builder().submit(_serialized, made).result()]
    r, a, b = local
    return _rank_at(skey, stream, r, a).take(a, b, ahead=_AHEAD_LEASES * cfg.get("lease_size", 16))


def _local(stream: Any, runs: _Runs) -> tuple[int, int, int] | None:
    """``runs`` as one run of ``stream``'s batches (of its part, with a split), or ``None`` when
    they are not one (or ``stream`` does not follow ranks)."""
    if not stream.follow or not runs or any(r != runs[0][0] for r, _, _ in runs):
        return None
    r = runs[0][0]
    if stream.split is None:
        return (r, runs[0][1], runs[0][2]) if len(runs) == 1 else None
    a, b = stream.split.local(r, runs[0][1], runs[-1][2])
    return (r, a, b) if b - a == sum(y - x for _, x, y in runs) else None


def _rank_at(skey: str, stream: Any, r: int, a: int) -> RunAhead:
    """The RunAhead of plan rank ``r`` that holds or builds batch ``a`` next (a new one started
    there when none does; the least recently asked beyond the bound stopped)."""
    rank = _RANKS.pop((skey, r), None)
    if rank is not None and (rank.stream is not stream or not rank.base <= a <= rank.pos):
        rank.stop()
        rank = None
    if rank is None:
        rank = RunAhead(stream, r, a, pool=_builder(), convert=_serialized, held=_HELD)
    _RANKS[(skey, r)] = rank
    while len(_RANKS) > _MAX_ITERATIONS * _STREAMS_PER_ITERATION:
        _RANKS.popitem(last=False)[1].stop()
    return rank


def _retire(stream: Any) -> None:
    """Stop ``stream``'s ranks and close it (in the build thread, after the turns queued)."""
    for key in [k for k, v in _RANKS.items() if v.stream is stream]:
        _RANKS.pop(key).stop()
    _builder().submit(stream.close)


def _stream_for(
    skey: str, svc: Any, cfg: Mapping[str, Any], *, fresh: bool = False, split: Split | None = None
) -> Any:
    """The RunStream of ``skey`` (created when new or ``fresh``; the least recently used beyond
    :data:`_MAX_ITERATIONS` retired)."""
    stream = _STREAMS.pop(skey, None)
    if stream is not None and fresh:
        _retire(stream)
        stream = None
    if stream is None:
        batch = int(cfg["batch_size"])
        horizon = max(_HORIZON_LEASES * cfg.get("lease_size", 16), _HORIZON_SAMPLES // batch)
        follow = cfg.get("mode", "static") == "static"
        stream = RunStream(
            svc, cfg, follow=follow, horizon=horizon, streams=_STREAMS_PER_ITERATION, split=split
        )
    _STREAMS[skey] = stream  # most recently used last
    while len(_STREAMS) > _MAX_ITERATIONS:
        _retire(_STREAMS.pop(next(iter(_STREAMS))))
    return stream


def _build(
    path: str, cfg: dict[str, Any], runs: list[tuple[int, int, int]], *, shared: bool = False
) -> Any:
    """In a worker: the Arrow IPC stream of a lease's batches, as
    :func:`~datamill.core.workpool.hand` gives it (see the module docstring); a build that failed
    is tried once more in a fresh stream, whose error is the lease's."""
    return hand(_body(_built(path, cfg, runs, None)), shared=shared, limit=_SLOT_MAX)


def _build_part(
    path: str,
    cfg: dict[str, Any],
    runs: list[tuple[int, int, int]],
    split: tuple[int, int, int],
    *,
    shared: bool = False,
) -> tuple[Any, list[int] | None]:
    """In a worker: :func:`_build` of part ``split`` (``(part, parts, chunk)``, a
    :class:`~datamill.loader.runs.Split`) of a lease, ``runs`` its pieces; with the sizes of the
    stream's parts (its schema, each batch's message, its end), ``None`` when it is one
    :func:`ipc_stream` (a dictionary, or batches of several schemas)."""
    parts = _body(_built(path, cfg, runs, Split(*split)))
    layout = [p.size for p in parts] if len(parts) > 1 else None
    return hand(parts, shared=shared, limit=_SLOT_MAX), layout


def _built(
    path: str, cfg: dict[str, Any], runs: list[tuple[int, int, int]], split: Split | None
) -> list[_Built]:
    from datamill.sources import open_source

    key = service_key(cfg, path)
    svc = _SERVICES.get(key)
    if svc is None:
        svc = _SERVICES[key] = service_for(
            open_source(path), cfg, cache_shards=_CACHE_SHARDS, cache_bytes=worker_budget()
        )
    skey = _skey(key, cfg, split)
    want: _Runs = tuple((int(r), int(a), int(b)) for r, a, b in runs)
    try:
        tables = _tables(skey, _stream_for(skey, svc, cfg, split=split), cfg, want)
    except Exception:  # noqa: BLE001 - once more, in a fresh stream: its error is the lease's
        tables = _tables(skey, _stream_for(skey, svc, cfg, fresh=True, split=split), cfg, want)
    stream = _STREAMS[skey]
    local = _local(stream, want)
    rank = None if local is None else _RANKS.get((skey, local[0]))
    if local is not None and rank is not None and local[2] == rank.total:
        # the rank's last lease of the epoch: its build stops (its shards freed for the next one's
        # reads), and its next epoch's first batches are built now (the client's next epoch then
        # does not wait for a build's start; unused, they are dropped)
        _RANKS.pop((skey, local[0])).stop()
        _builder().submit(stream.close_rank, local[0])
        nxt = {**cfg, "epoch": int(cfg["epoch"]) + 1}
        nkey = _skey(key, nxt, split)
        nstream = _stream_for(nkey, svc, nxt, split=split)
        _rank_at(nkey, nstream, local[0], 0).take(0, 0, ahead=RunAhead.CHUNK)
    return tables


def _skey(key: str, cfg: Mapping[str, Any], split: Split | None = None) -> str:
    """The key of an iteration's RunStream: service, epoch, plan world size, mode, split."""
    parts = None if split is None else dataclasses.astuple(split)
    return fingerprint_obj([key, cfg["epoch"], cfg["plan_world"], cfg.get("mode", "static"), parts])


async def lease_body(catalog: Any, it: Any, p: Any) -> tuple[bytes | pa.Buffer, Exception | None]:
    """A planned lease ``p`` of iteration ``it`` as one Arrow IPC stream, or the error of its build:
    built in a thread, in a build worker of ``catalog.pool`` (the thread waits without the GIL),
    else in this process. Built when asked, not ahead: building the next lease ahead in a pool
    (tried) made the builds of several clients compete for the GIL: 190k instead of 420k
    samples/s (4 clients)."""
    from anyio import to_thread

    try:
        return await to_thread.run_sync(_lease_body, catalog, it, p), None
    except Exception as exc:  # noqa: BLE001 - raised by the round trip once settled
        return b"", exc


def _lease_body(catalog: Any, it: Any, p: Any) -> bytes | pa.Buffer:
    if catalog.pool is None:
        return ipc_stream(build_runs(catalog.service(it.config), it.config, p.runs))
    held = p.lease.queue if it.mode == "static" else p.lease.client
    path = catalog.dataset(str(it.config["dataset"]))["path"]
    built: bytes | pa.Buffer = catalog.pool.build(held, path, it.config, p.runs)
    return built


SPLIT_CHUNK = 32
"""Batches of a rank in a row built by one worker when a lease is built in parts (each worker
builds every other chunk with 2 workers)."""


def _stitch(
    pieces: Sequence[tuple[int, int, int]],
    bodies: Mapping[int, memoryview],
    layouts: Mapping[int, list[int] | None],
) -> bytes | pa.Buffer:
    """The one stream of a lease built in parts: ``pieces`` ``(start, stop, part)`` in order,
    ``bodies`` each part's stream of its pieces' batches (``layouts``: its sizes, see
    :func:`_build_part`). Re-encoded (:func:`ipc_stream`) when a part's stream has no layout or
    another schema than the first part's."""
    first = bodies[pieces[0][2]]
    head = layouts[pieces[0][2]]
    schema = None if head is None else bytes(first[: head[0]])
    plain = schema is not None and all(
        lay is not None and bytes(bodies[p][: lay[0]]) == schema for p, lay in layouts.items()
    )
    if not plain:
        return _restitch(pieces, bodies)
    at = {p: lay[0] for p, lay in layouts.items() if lay is not None}  # past each schema
    sizes = {p: iter(lay[1:-1]) for p, lay in layouts.items() if lay is not None}
    out = [first[: at[pieces[0][2]]]]
    for a, b, p in pieces:
        n = sum(next(sizes[p]) for _ in range(b - a))
        out.append(bodies[p][at[p] : at[p] + n])
        at[p] += n
    out.append(memoryview(_EOS))
    return joined(out)


def _restitch(
    pieces: Sequence[tuple[int, int, int]], bodies: Mapping[int, memoryview]
) -> bytes | pa.Buffer:
    """:func:`_stitch`'s fallback: the parts' batches read and written again as one stream."""
    batches = {p: list(pa.ipc.open_stream(pa.py_buffer(bytes(v)))) for p, v in bodies.items()}
    got = dict.fromkeys(bodies, 0)
    tables = []
    for a, b, p in pieces:
        tables += [pa.Table.from_batches([x]) for x in batches[p][got[p] : got[p] + b - a]]
        got[p] += b - a
    return ipc_stream(tables)


class BuildPool:
    """``workers`` build processes (see the module docstring), each a
    :class:`~datamill.core.workproc.WorkerProc` started as a fresh interpreter. Each decodes with
    its share of the cores (Arrow's thread pool of ``cores // workers`` threads, at least 1).

    Args:
        workers: processes (>= 1).
        cache_shards: released shards each worker's services keep. Defaults to ``None`` (two shuffle
            windows per plan rank, as in the HTTP process, and more while they fit the worker's
            :func:`~datamill.loader.runs.worker_budget`: a dataset that fits is decoded once).

    Raises:
        ConfigError: ``workers`` < 1.
    """

    def __init__(self, workers: int, *, cache_shards: int | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"build workers must be an int >= 1, got {workers!r}")
        # each worker decodes with its share of the cores: N workers each with Arrow's default
        # (a thread per core) ran N times as many decoding threads as cores (measured with 2
        # workers on 2 cores: 2 clients together 1.58-1.67M samples/s, 1.69-1.78M with one each)
        self.arrow_threads = max(1, usable_cores() // workers)
        self._lock = threading.Lock()
        self._pinned: OrderedDict[str, int] = OrderedDict()
        self._next = 0
        self.workers = CallPool(
            workers,
            main="datamill.serve.data.workers:_main",
            blob=pickle.dumps(cache_shards),
            threads=self.arrow_threads,
            name="build worker",
        )
        self.shared = self.workers.shared  # whether leases are handed over in shared memory

    def warm(self) -> list[int]:
        """The workers' process ids (started warm: a server starts serving with warm workers, so a
        restart's grace period is not spent starting processes)."""
        return [p.pid for p in self.workers.procs]

    def _worker(self, client: str) -> int:
        with self._lock:
            w = self._pinned.get(client)
            if w is None:
                w = self._pinned[client] = self._next % len(self.workers.procs)
                self._next += 1
                while len(self._pinned) > _MAX_CLIENTS:
                    self._pinned.popitem(last=False)
            else:
                self._pinned.move_to_end(client)
            return w

    def build(
        self,
        client: str | int,
        path: str,
        cfg: Mapping[str, Any],
        runs: Sequence[tuple[int, int, int]],
    ) -> bytes | pa.Buffer:
        """The Arrow IPC stream of a lease's batches, built in ``client``'s worker (waits for it);
        an int ``client`` (a static iteration's rank) is worker ``client % workers``, or, with more
        workers than the iteration's plan ranks, its lease is built in parts, one per worker
        (:meth:`_split`).

        The worker hands the bytes over in a shared-memory slot of its own when it can (one copy
        out here), else through the pipe."""
        small = {k: cfg[k] for k in (*SERVICE_FIELDS, "epoch", "plan_world")}
        small.update(mode=cfg.get("mode", "static"), lease_size=cfg.get("lease_size", 16))
        want = [(int(r), int(a), int(b)) for r, a, b in runs]
        n = len(self.workers.procs)
        parts = n // max(1, int(small["plan_world"])) if isinstance(client, int) else 1
        if parts > 1 and len(want) == 1 and small["mode"] == "static":
            return self._split(client, str(path), small, want[0], parts)  # type: ignore[arg-type]
        w = client % n if isinstance(client, int) else self._worker(client)
        build = functools.partial(_build, shared=self.shared)
        h, out = self.workers.calls([(w, build, (str(path), small, want))])[0]
        if isinstance(out, bytes):  # through the pipe: already this process's own copy
            self.workers.handed["pipe"] += 1
            return out
        with self.workers.held(h, out) as body:
            return joined([body])

    def _split(
        self, rank: int, path: str, cfg: dict[str, Any], run: tuple[int, int, int], parts: int
    ) -> bytes | pa.Buffer:
        """A static rank's lease built by ``parts`` workers at once, each its part of the rank's
        batches (:class:`~datamill.loader.runs.Split`: chunks of :data:`SPLIT_CHUNK` batches,
        each worker following its part with its own builds ahead), stitched here into the stream
        one worker would have made: the same bytes (the schema once, every batch's message in
        order, the end)."""
        r, a, b = run
        split = Split(0, parts, chunk=SPLIT_CHUNK)
        pieces = split.pieces(r, a, b)
        asked = sorted({p for _, _, p in pieces})
        pool, build = self.workers, functools.partial(_build_part, shared=self.shared)
        mine = {p: [(r, x, y) for x, y, q in pieces if q == p] for p in asked}
        asks = [(p, (path, cfg, mine[p], (p, parts, SPLIT_CHUNK))) for p in asked]
        got = pool.calls([((rank * parts + p) % len(pool.procs), build, x) for p, x in asks])
        outs = dict(zip(asked, got))
        with contextlib.ExitStack() as stack:
            held = {p: stack.enter_context(pool.held(h, o[0])) for p, (h, o) in outs.items()}
            return _stitch(pieces, held, {p: o[1] for p, (_, o) in outs.items()})

    def close(self) -> None:
        """Stop the workers."""
        self.workers.close()
