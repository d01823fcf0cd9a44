"""Build workers: server-built leases built in worker processes, past the HTTP process's GIL.

``datamill serve --build-workers N`` starts ``N`` single-process executors (``forkserver`` start
method, so a worker never inherits the server's threads or sockets). A worker opens each dataset
once and keeps one :class:`~datamill.loader.BatchService` (with its own shard cache) per dataset
and order config; a lease is sent as ``(dataset path, iteration config, runs)`` and comes back as
the Arrow IPC stream of its batches, the same bytes the HTTP process would have built. The bytes
are handed over in one of the worker's shared-memory slots (a ``memfd``, mapped by the HTTP process
through ``/proc/PID/fd``; copied out once, the slot is reused by the worker's next lease), or
pickled through the executor's pipe where that is not possible (not Linux, a lease over 64 MiB,
every slot in use, no memory for a slot): the pipe cost the HTTP process three copies of every
lease and the worker two.

The leases of a static iteration's rank ``r`` go to worker ``r % N``, and each client of a dynamic
iteration is pinned to one worker (round robin on first sight), so consecutive leases, which read
the same shuffle window, hit the same worker's cache. A worker builds every batch in one thread of
its own: it follows each static rank it serves with one build over the next 1M samples (a
:class:`~datamill.loader.runs.RunStream`) and builds the rank's batches ahead of the leases asked,
two leases' worth, whatever the leases' bounds (:class:`~datamill.loader.runs.RunAhead`), each with
its Arrow IPC message, so a request only copies messages into a slot; a rank's last lease of an
epoch starts its next epoch. The bytes are those of a build per lease. The HTTP process only routes
and journals.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pyarrow as pa

from datamill.core.errors import ConfigError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.parallel import exit_when_gone, process_start_time, usable_cores
from datamill.loader.runs import RunAhead, RunStream, as_batch, as_batches, service_for

__all__ = ["BuildPool", "default_build_workers", "ipc_stream"]

_SERVICES: dict[str, Any] = {}  # in a worker: service key -> BatchService
_CACHE_SHARDS: int | None = None
_ORDER = ("dataset", "batch_size", "seed", "shuffle", "columns", "drop_last", "window")
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


def _init(
    cache_shards: int | None,
    server: int | None = None,
    started: str | None = None,
    arrow_threads: int | None = None,
) -> None:
    """A worker's start: its cache bound, the watch of its server ``server`` (a pid; ``None``: not
    watched), its share of the cores for Arrow's decoding threads (``None``: Arrow's default, every
    core), the imports of a lease's build."""
    global _CACHE_SHARDS
    _CACHE_SHARDS = cache_shards
    if arrow_threads is not None:
        pa.set_cpu_count(arrow_threads)
    if server is not None:
        # A worker waits for leases on a queue it also holds the writing end of, so a server killed
        # with SIGKILL (or by the out-of-memory killer) would otherwise leave it, and its
        # forkserver, running for ever.
        watch = threading.Thread(
            target=exit_when_gone,
            args=(server, started),
            kwargs={"poll_seconds": _WATCH_S},
            daemon=True,
        )
        watch.start()
    import datamill.loader.runs
    import datamill.sources  # noqa: F401 - imported now: a worker is warm before the first lease


def _ping() -> int:
    return os.getpid()


def _probe() -> tuple[int, int] | None:
    """``(pid, fd)`` of a shared-memory slot of this worker (created now), for the HTTP process to
    check that it can map it; ``None`` without ``memfd_create``."""
    if not hasattr(os, "memfd_create"):
        return None
    if not _SLOTS:
        _new_slot()
    return os.getpid(), _SLOTS[0].fd


def ipc_stream(tables: Sequence[pa.Table]) -> pa.Buffer:
    """Tables as one Arrow IPC stream, exactly one record batch per table (a lease's bytes)."""
    batches = as_batches(tables)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue()


class _Slot:
    """In a worker: one shared-memory file (``memfd``) a lease's bytes are handed over in."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("datamill-lease", os.MFD_CLOEXEC)
        self.size = 0
        self.map: mmap.mmap | None = None

    def put(self, parts: Sequence[pa.Buffer]) -> int:
        """Copy ``parts`` in, one after another (growing the file when it is too small); returns
        the file's size."""
        n = sum(p.size for p in parts)
        if n > self.size:
            size = max(n, min(2 * self.size, _SLOT_MAX), 1 << 20)
            os.ftruncate(self.fd, size)
            if self.map is not None:
                self.map.close()
            self.map, self.size = mmap.mmap(self.fd, size), size
        assert self.map is not None
        writer = pa.FixedSizeBufferWriter(pa.py_buffer(self.map))
        for p in parts:
            writer.write(p)  # without the GIL
        return self.size


_SLOT_COUNT = 4  # shared-memory slots of a worker (leases the HTTP process sends at once)
_SLOT_MAX = 64 << 20  # larger leases go through the pipe
_SLOTS: list[_Slot] = []  # in a worker: its shared-memory slots ...
_FREE: set[int] = set()  # ... and those the HTTP process does not hold


def _new_slot() -> None:
    """One more slot of this worker, free."""
    _SLOTS.append(_Slot())
    _FREE.add(len(_SLOTS) - 1)


def _handed(parts: list[pa.Buffer], released: tuple[int, Sequence[int]], *, shared: bool) -> Any:
    """A lease's bytes (``parts``, one after another) as the HTTP process takes them: ``(pid, fd,
    slot, length, file size)`` of a shared-memory slot (``shared``, a slot free and the bytes at
    most :data:`_SLOT_MAX`), else ``bytes`` (through the executor's pipe). ``released``: ``(pid,
    slots)``, the slots the HTTP process is done with, meant for the worker of that pid (not a
    replacement of it)."""
    if released[0] == os.getpid():
        _FREE.update(released[1])
    n = sum(p.size for p in parts)
    if not shared or n > _SLOT_MAX or not hasattr(os, "memfd_create"):
        return b"".join(parts)
    try:
        if not _FREE:
            if len(_SLOTS) >= _SLOT_COUNT:
                return b"".join(parts)
            _new_slot()
        k = min(_FREE)
        size = _SLOTS[k].put(parts)
    except OSError:  # no memory for it (or a file size limit): through the pipe
        return b"".join(parts)
    _FREE.discard(k)
    return os.getpid(), _SLOTS[k].fd, k, n, size


_EOS = pa.py_buffer(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # an Arrow IPC stream's end
_Built = tuple[pa.Table, pa.Buffer | None]  # a batch, and its IPC message (None: a dictionary)


def _serialized(tables: Iterable[pa.Table]) -> list[tuple[_Built, int]]:
    """Batches with their Arrow IPC messages (made in the build thread, not on the lease's way),
    and the bytes of both."""
    out = []
    for t in tables:
        m = None if "dictionary<" in str(t.schema) else as_batch(t, t.schema).serialize()
        out.append(((t, m), t.nbytes + (0 if m is None else m.size)))
    return out


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
    batch when the lease does not continue it), others built alone in the build thread."""
    if not stream.follow or len(runs) != 1:
        return [x for x, _ in _builder().submit(_serialized, stream.batches(runs)).result()]
    r, a, b = runs[0]
    return _rank_at(skey, stream, r, a).take(a, b, ahead=_AHEAD_LEASES * cfg.get("lease_size", 16))


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


def _stream_for(skey: str, svc: Any, cfg: Mapping[str, Any], *, fresh: bool = False) -> Any:
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
        stream = RunStream(svc, cfg, follow=follow, horizon=horizon, streams=_STREAMS_PER_ITERATION)
    _STREAMS[skey] = stream  # most recently used last
    while len(_STREAMS) > _MAX_ITERATIONS:
        _retire(_STREAMS.pop(next(iter(_STREAMS))))
    return stream


def _build(
    path: str,
    cfg: dict[str, Any],
    runs: list[tuple[int, int, int]],
    released: tuple[int, Sequence[int]] = (0, ()),
    *,
    shared: bool = False,
) -> Any:
    """In a worker: the Arrow IPC stream of a lease's batches, as :func:`_handed` gives it (see the
    module docstring); a build that failed is tried once more in a fresh stream, whose error is the
    lease's."""
    from datamill.sources import open_source

    key = fingerprint_obj([path] + [cfg[k] for k in _ORDER])
    svc = _SERVICES.get(key)
    if svc is None:
        svc = _SERVICES[key] = service_for(open_source(path), cfg, cache_shards=_CACHE_SHARDS)
    skey = _skey(key, cfg)
    want: _Runs = tuple((int(r), int(a), int(b)) for r, a, b in runs)
    try:
        tables = _tables(skey, _stream_for(skey, svc, cfg), cfg, want)
    except Exception:  # noqa: BLE001 - once more, in a fresh stream: its error is the lease's
        tables = _tables(skey, _stream_for(skey, svc, cfg, fresh=True), cfg, want)
    rank = _RANKS.get((skey, want[0][0]))
    if len(want) == 1 and rank is not None and want[0][2] == rank.total:
        # the rank's last lease of the epoch: its next epoch's first batches are built now (the
        # client's next epoch then does not wait for a build's start; unused, they are dropped)
        nxt = {**cfg, "epoch": int(cfg["epoch"]) + 1}
        nkey = _skey(key, nxt)
        _rank_at(nkey, _stream_for(nkey, svc, nxt), want[0][0], 0).take(0, 0, ahead=RunAhead.CHUNK)
    return _handed(_body(tables), released, shared=shared)


def _skey(key: str, cfg: Mapping[str, Any]) -> str:
    """The key of an iteration's RunStream: service, epoch, plan world size, mode."""
    return fingerprint_obj([key, cfg["epoch"], cfg["plan_world"], cfg.get("mode", "static")])


class BuildPool:
    """``workers`` build processes (see the module docstring). Each decodes with its share of the
    cores (Arrow's thread pool of ``cores // workers`` threads, at least 1).

    Args:
        workers: processes (>= 1).
        cache_shards: released shards each worker's services keep. Defaults to ``None`` (two shuffle
            windows per plan rank, as in the HTTP process).

    Raises:
        ConfigError: ``workers`` < 1.
    """

    def __init__(self, workers: int, *, cache_shards: int | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"build workers must be an int >= 1, got {workers!r}")
        self._ctx = multiprocessing.get_context(
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        )
        self._cache_shards = cache_shards
        # each worker decodes with its share of the cores: N workers each with Arrow's default
        # (a thread per core) ran N times as many decoding threads as cores (measured with 2
        # workers on 2 cores: 2 clients together 1.58-1.67M samples/s, 1.69-1.78M with one each)
        self.arrow_threads = max(1, usable_cores() // workers)
        self.executors = [self._executor() for _ in range(workers)]
        self.warm()
        self._lock = threading.Lock()
        self._pinned: OrderedDict[str, int] = OrderedDict()
        self._next = 0
        # shared memory of the workers: their pids by worker index, the mapped slots by (pid, fd),
        # the slots released since each pid's last build
        self._pids: dict[int, int] = {}
        self._maps: dict[tuple[int, int], mmap.mmap] = {}
        self._released: dict[int, list[int]] = {}
        self.shared = self._check_shared()
        self.handed = {"shared": 0, "pipe": 0}  # leases handed over each way

    def _executor(self) -> ProcessPoolExecutor:
        server = os.getpid()
        return ProcessPoolExecutor(
            1,
            mp_context=self._ctx,
            initializer=_init,
            initargs=(self._cache_shards, server, process_start_time(server), self.arrow_threads),
        )

    def warm(self) -> list[int]:
        """Start every worker (imports done) and wait for it: a server starts serving with warm
        workers, so a restart's grace period is not spent starting processes. Returns the workers'
        process ids."""
        return [int(f.result()) for f in [ex.submit(_ping) for ex in self.executors]]

    def _worker(self, client: str) -> int:
        with self._lock:
            w = self._pinned.get(client)
            if w is None:
                w = self._pinned[client] = self._next % len(self.executors)
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
    ) -> bytes:
        """The Arrow IPC stream of a lease's batches, built in ``client``'s worker (waits for it);
        an int ``client`` (a static iteration's rank) is worker ``client % workers``.

        The worker hands the bytes over in a shared-memory slot of its own when it can (one copy
        out here), else through the executor's pipe (pickled: several copies on both sides)."""
        small = {k: cfg[k] for k in (*_ORDER, "epoch", "plan_world")}
        small.update(mode=cfg.get("mode", "static"), lease_size=cfg.get("lease_size", 16))
        args = (str(path), small, [(int(r), int(a), int(b)) for r, a, b in runs])
        w = client % len(self.executors) if isinstance(client, int) else self._worker(client)
        ex = self.executors[w]
        try:
            out = ex.submit(_build, *args, self._released_for(w), shared=self.shared).result()
        except BrokenProcessPool:  # the worker died (killed, out of memory): replace it, again
            with self._lock:
                if self.executors[w] is ex:
                    self.executors[w] = self._executor()
                    self.executors[w].submit(_ping).result()
                    gone = self._pids.pop(w, 0)  # its slots die with it (a pid may be reused)
                    self._released.pop(gone, None)
                    for key in [k for k in self._maps if k[0] == gone]:
                        del self._maps[key]
                ex = self.executors[w]
            out = ex.submit(_build, *args, self._released_for(w), shared=self.shared).result()
        if isinstance(out, bytes):
            self.handed["pipe"] += 1
            return out
        self.handed["shared"] += 1
        pid, fd, slot, n, size = out
        with memoryview(self._mapping(pid, fd, size)) as view:
            body = bytes(view[:n])
        with self._lock:
            self._pids[w] = pid
            self._released.setdefault(pid, []).append(slot)
        return body

    def _released_for(self, w: int) -> tuple[int, list[int]]:
        """The slots of worker ``w``'s process that were released since its last build."""
        with self._lock:
            pid = self._pids.get(w, 0)
            return pid, self._released.pop(pid, [])

    def _mapping(self, pid: int, fd: int, size: int) -> mmap.mmap:
        """A read-only mapping of a worker's slot (kept; mapped again once the slot grew)."""
        key = (pid, fd)
        with self._lock:
            m = self._maps.get(key)
        if m is None or len(m) < size:
            with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
            with self._lock:
                self._maps[key] = m
        return m

    def _check_shared(self) -> bool:
        """Whether this process can map its workers' shared memory (``/proc/PID/fd`` of a
        ``memfd``); without it every lease goes through the pipe."""
        try:
            for pid_fd in [ex.submit(_probe).result() for ex in self.executors]:
                if pid_fd is None:
                    return False
                with open(f"/proc/{pid_fd[0]}/fd/{pid_fd[1]}", "rb"):
                    pass
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Stop the workers."""
        for ex in self.executors:
            ex.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            maps, self._maps = list(self._maps.values()), {}
        for m in maps:
            m.close()
