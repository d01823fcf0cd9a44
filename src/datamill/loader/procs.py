"""Batches built in worker processes and handed to the trainer through shared memory.

``Loader(..., workers=Workers(processes=N))`` builds its batches in ``N`` worker processes instead
of the trainer's own threads, so the trainer spends almost no CPU on loading (SPDL measured threads
inside a trainer halving its training speed). Each worker holds a copy of the loader's
:class:`~datamill.loader.service.BatchService` (its own shard cache, plans and Arrow pool, Arrow
decoding with its share of the cores) and builds batch ``k`` of an iteration when
``k ≡ w (mod N)`` (counted from the iteration's first batch), exactly as the server builds any
rank's batch independently; the trainer takes them back in order, so the batches are the same
bytes, in the same order, as in process, and the resume state keeps its meaning.

The hand-off follows ``datamill serve``'s build workers: a worker writes each batch (the collated
numpy arrays, or an Arrow IPC stream) into one of its shared-memory slots (a ``memfd``, mapped by
the trainer through ``/proc/PID/fd``), or with the numpy/torch collates builds a whole block of
batches straight into one slot (:mod:`datamill.loader.procs_place`), and sends
``(batch, slot, length, counts)`` through its pipe (a block's batches in one message); the
trainer hands out views of the slot (writable, no copy: the batch's arrays, tensors or table live
in the slot) and the slot goes back to the worker once every view of it is gone, in one message
every few batches (:mod:`datamill.loader.procs_worker`). Where a slot cannot be mapped (not
Linux), the bytes go through the pipe.

Workers never outlive the trainer: each watches the trainer's pid (and its start time, so a reused
pid does not count) and exits when it is gone, also after ``kill -9``; a worker that dies (killed,
out of memory) makes the trainer raise :class:`WorkerError` naming the worker, its pid, exit code,
the batch and epoch, instead of hanging.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import pickle
import socket
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.errors import ConfigError
from datamill.core.parallel import usable_cores
from datamill.core.workproc import START, WorkerError, WorkerProc
from datamill.loader.accounting import BatchResult
from datamill.loader.collate import builtin_collate, to_torch
from datamill.loader.order import Elastic
from datamill.loader.procs_worker import _Layout, _serve, placing

__all__ = ["ProcessBuilds", "WorkerError"]

_ACK = 4  # the trainer acknowledges the batches it took (and the slots freed) every _ACK batches

# how a worker starts: forked from the trainer (milliseconds; Linux, like torch's DataLoader), or a
# fresh interpreter (seconds: imports)
_START = START


def _unpack(buf: pa.Buffer, layout: _Layout) -> dict[str, np.ndarray]:
    """In the trainer: the arrays written by :func:`_write` (views of ``buf``, whose lifetime
    they keep)."""
    return {
        name: np.ndarray(shape, _dtype(dtype), buffer=buf, offset=at)
        for name, dtype, shape, at in layout[0]
    }


_dtype = functools.lru_cache(maxsize=64)(np.dtype)  # np.dtype("<i8") costs a few us per call


class _Handle(WorkerProc):
    """In the trainer: one worker process (:class:`~datamill.core.workproc.WorkerProc`), with the
    batches it sent and the trainer has not taken or acknowledged yet."""

    def __init__(
        self,
        index: int,
        blob: bytes,
        arrow_threads: int,
        others: list[int | socket.socket],
        peers: tuple[int, int, dict[int, socket.socket]] | None = None,
    ) -> None:
        super().__init__(
            index,
            body=_serve,
            main="datamill.loader.procs_worker:_main",
            blob=blob,
            threads=arrow_threads,
            start=_START,
            others=others,
            extra=(peers,),
        )
        self.taken = 0  # batches received and not yet acknowledged to the worker
        self.queue: collections.deque[tuple[Any, ...]] = collections.deque()  # received, not taken

    def acknowledge(self) -> None:
        """Tell the worker the batches taken and the slots freed since the last time."""
        freed = self.take_freed()
        if self.taken or freed:
            self.send(("ack", self.taken, freed))
            self.taken = 0


def _peer_sockets(n: int) -> dict[tuple[int, int], tuple[socket.socket, socket.socket]]:
    """A socket pair between each two of ``n`` forked workers, which share their shards through
    them (:mod:`datamill.loader.procs_shards`); none when workers are not forked or cannot pass
    ``memfd`` descriptors."""
    if n < 2 or _START != "fork" or not hasattr(os, "memfd_create"):
        return {}
    return {
        (i, j): socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for i in range(n)
        for j in range(i + 1, n)
    }


def _shutdown(handles: list[_Handle]) -> None:
    for h in handles:
        h.close()
    handles.clear()


def _assemblers(service: Any, mode: str | None) -> int:
    """A worker's assembling threads: none when it builds batches straight into its slots (one
    thread: a block is built, then handed over), else at least one, so the next batch is assembled
    while the worker collates and hands over this one."""
    if placing(service.batching, mode):
        return 0
    return max(1, int(service.workers.threads))


def _worker_options(service: Any, mode: str | None) -> Any:
    """The workers' :class:`~datamill.loader.options.Workers`: their assembling threads, and when
    they build in one thread, shards read at least 4 ahead (reading then overlaps building). Like
    every build, a worker also reads the next shuffle window while it builds this one
    (:func:`~datamill.loader.cache.read_target`)."""
    threads = _assemblers(service, mode)
    w = service.workers
    prefetch = w.prefetch if threads else max(4, int(w.prefetch))
    return dataclasses.replace(w, threads=threads, prefetch=prefetch)


class ProcessBuilds:
    """``processes`` worker processes building ``service``'s batches (see the module docstring).

    The workers start on the first :meth:`build` and stop with :meth:`close` (or when this object
    is collected, or the trainer exits).

    Args:
        service: the loader's service; the workers build with a copy collating to Arrow, the
            trainer applies ``service.collate_fn`` to each batch (``filter``, ``transform`` and the
            source must pickle).
        processes: worker processes (>= 1).

    Examples:
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader.service import BatchService
        >>> svc = BatchService(TableSource(pa.table({"x": list(range(10))}), shard_size=3),
        ...                    batch_size=4, seed=1)
        >>> builds = ProcessBuilds(svc, 2)
        >>> [r.output["x"].tolist() for r in builds.build(0, 0, [0, 1, 2])] == [
        ...     r.output["x"].tolist() for r in svc.build(0, 0, [0, 1, 2])]
        True
        >>> builds.close()
    """

    def __init__(self, service: Any, processes: int) -> None:
        self.processes = int(processes)
        self.collate: Callable[[pa.Table], Any] = service.collate_fn
        # the workers collate (the built-in collates, whose arrays cross as they are) or the
        # trainer does (mode None), and whether to pin
        self.mode, self.pin = builtin_collate(self.collate)
        try:
            self._blob = pickle.dumps(
                (
                    service.replace(
                        collate="arrow",
                        workers=_worker_options(service, self.mode),
                    ),
                    self.mode,
                )
            )
        except Exception as exc:
            raise ConfigError(
                f"Workers(processes={processes}) sends the source, filter and transform to its "
                f"worker processes, but they do not pickle: {type(exc).__name__}: {exc}",
                hint="use module-level functions for filter/transform, or Workers(threads=N)",
            ) from exc
        self._handles: list[_Handle] = []
        self._gen = 0
        self._finalizer = weakref.finalize(self, _shutdown, self._handles)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("ProcessBuilds does not pickle (its worker processes stay here)")

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty before the first build)."""
        return [h.pid for h in self._handles]

    def _start(self) -> None:
        threads = max(1, usable_cores() // self.processes)
        pairs = _peer_sockets(self.processes)
        try:
            for w in range(self.processes):
                others: list[int | socket.socket] = [h.conn.fileno() for h in self._handles]
                mine = (
                    {v: pairs[min(v, w), max(v, w)][w > v] for v in range(self.processes) if v != w}
                    if pairs
                    else {}
                )
                peers = (w, self.processes, mine) if pairs else None
                others += [s for pair in pairs.values() for s in pair if s not in mine.values()]
                self._handles.append(_Handle(w, self._blob, threads, others, peers))
        finally:
            for pair in pairs.values():  # the workers hold them
                for s in pair:
                    s.close()
        for h in self._handles:
            try:
                h.ready()
            except (EOFError, OSError):
                raise self._died(h, None, None) from None

    def _recv(self, h: _Handle, batch: int | None, epoch: int | None) -> tuple[Any, ...]:
        """Worker ``h``'s next message (a ``("batches", [...])`` group is taken one at a time)."""
        if h.queue:
            return h.queue.popleft()
        try:
            msg = tuple(h.conn.recv())
        except (EOFError, OSError):
            raise self._died(h, batch, epoch) from None
        if msg[0] == "batches":  # a block's batches, sent at once (one wake-up)
            h.queue.extend(msg[1])
            return h.queue.popleft()
        return msg

    def _send(self, h: _Handle, msg: tuple[Any, ...], batch: int, epoch: int) -> None:
        """``msg`` to worker ``h``; a worker gone (a broken pipe) is its :class:`WorkerError`."""
        try:
            h.send(msg)
        except OSError:
            raise self._died(h, batch, epoch) from None

    def _died(self, h: _Handle, batch: int | None, epoch: int | None) -> WorkerError:
        """The located error of worker ``h``, which exited (its exit code waited for a second)."""
        gone = h.died(of=self.processes)
        what = "starting" if batch is None else f"building batch {batch} of epoch {epoch}"
        return WorkerError(
            f"loader worker {gone} while {what}",
            hint="a worker was killed (kill -9, out of memory?): create the Loader again and "
            "resume from its last state_dict()",
        )

    def build(
        self,
        epoch: int,
        rank: int,
        batches: Sequence[int],
        *,
        world_size: int = 1,
        elastic: Elastic = (),
        replication: int = 1,
    ) -> Generator[BatchResult, None, None]:
        """:meth:`BatchService.build <datamill.loader.service.BatchService.build>` in the workers:
        the same results, in order, collated here."""
        if not self._handles:
            self._start()
        self._gen += 1
        gen, todo, n = self._gen, [int(b) for b in batches], len(self._handles)
        for w, h in enumerate(self._handles):
            self._ack(h, todo[w] if w < len(todo) else -1, int(epoch))  # slots freed since
            msg = (
                "build",
                gen,
                int(epoch),
                int(rank),
                todo[w::n],
                world_size,
                elastic,
                replication,
            )
            self._send(h, msg, todo[w] if w < len(todo) else -1, int(epoch))
        done = False
        try:
            for i, b in enumerate(todo):
                yield self._take(self._handles[i % n], gen, b, int(epoch), int(rank))
            done = True
        finally:
            if not done:
                for h in self._handles:
                    try:
                        h.send(("cancel", gen))
                    except OSError:
                        pass

    def _ack(self, h: _Handle, batch: int, epoch: int) -> None:
        try:
            h.acknowledge()
        except OSError:
            raise self._died(h, batch, epoch) from None

    def _message(self, h: _Handle, gen: int, batch: int, epoch: int) -> tuple[Any, ...]:
        """Worker ``h``'s next batch message of build ``gen`` (older builds' batches are dropped,
        their slots freed); a worker's error raised here."""
        while True:
            msg = self._recv(h, batch, epoch)
            if msg[0] == "batch":
                h.taken += 1
                if h.taken >= _ACK or msg[7]:  # msg[7]: the worker waits for this ack
                    self._ack(h, batch, epoch)
                if msg[1] != gen and msg[3] is not None:  # an abandoned build's: free its slot
                    h.freed.append(msg[3][0])
            if msg[1] != gen:
                continue
            if msg[0] == "error":
                for other in self._handles:  # a worker gone made the others fail: name it
                    if other.proc.poll() is not None:
                        raise self._died(other, batch, epoch)
                raise msg[2]
            return msg

    def _take(self, h: _Handle, gen: int, batch: int, epoch: int, rank: int) -> BatchResult:
        """Worker ``h``'s next batch of build ``gen``, its arrays views of the slot."""
        _, _, got, slot, data, meta, layout, _ = self._message(h, gen, batch, epoch)
        if slot is None:
            buf = pa.py_buffer(data)
        else:
            k, fd = slot
            if not h.open_slot(k, fd):
                raise self._died(h, batch, epoch)
            buf = pa.py_buffer(h.view(k, *data))
        has_output, read, filtered, failed, yielded, shards, in_memory, peak = meta
        table = None if layout is not None else pa.ipc.open_stream(buf).read_all()
        output: Any
        if layout is not None:  # collated in the worker
            arrays = _unpack(buf, layout)
            output = arrays if self.mode == "numpy" else to_torch(arrays, pin_memory=self.pin)
        else:
            output = self.collate(table) if has_output else None
        return BatchResult(
            got,
            output,
            None if has_output else table,
            read,
            filtered,
            failed,
            yielded,
            epoch=epoch,
            rank=rank,
            shards_read=shards,
            shards_in_memory=in_memory,
            peak_shards_in_memory=peak,
        )

    def close(self) -> None:
        """Stop the workers (they start again on the next build)."""
        _shutdown(self._handles)
