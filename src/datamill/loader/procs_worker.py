"""The worker-process side of :mod:`datamill.loader.procs`: a worker builds the batches asked for
with its own copy of the service and writes each into one of its shared-memory slots (a ``memfd``)
as numpy arrays or an Arrow IPC stream, or builds a block of them straight into one slot
(:mod:`datamill.loader.procs_place`; a slot is free again once the trainer let go of all its
batches), then sends ``(batch, slot, length, counts)``; it watches
the trainer and exits when the trainer is gone. The trainer side (starting workers, mapping their
slots, taking batches back in order) stays in :mod:`datamill.loader.procs`.

The trainer hands out views of a slot (no copy), so a slot stays the trainer's until every view of
its batch is gone; it then tells the worker, together with how many batches it has taken, in one
``("ack", taken, [slots freed])`` message every few batches, or at once after a batch that filled
the worker's batches in flight. A worker keeps at most ``_INFLIGHT`` batches handed over and not
yet taken (``_INFLIGHT_PLACED`` of placed blocks); it writes into a free slot, or a new one while
it has fewer than ``_MAX_SLOTS`` (the trainer keeping batches), else through the pipe.
"""

from __future__ import annotations

import functools
import os
import select
import socket
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.workproc import Slots, exec_args, picklable, send, worker_setup
from datamill.loader.accounting import BatchResult
from datamill.loader.collate import collate_numpy
from datamill.loader.order import Elastic
from datamill.loader.procs_place import Placed, place_block, prepared_read
from datamill.loader.procs_shards import SharedShards

__all__: list[str] = []

_INFLIGHT = 16  # batches a worker has handed over and the trainer has not taken yet
# the same for placed blocks (> a block: its batches go at once; built already)
_INFLIGHT_PLACED = 48
_MAX_SLOTS = 64  # shared-memory slots of a worker (beyond: batches the trainer keeps, by the pipe)
_WATCH_S = 0.2  # how often a worker checks that its trainer still runs


def _ipc_size(table: pa.Table) -> int:
    sink = pa.MockOutputStream()
    _write_ipc(sink, table)
    return int(sink.size())


def _write_ipc(sink: Any, table: pa.Table) -> None:
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _meta(res: BatchResult) -> tuple[Any, ...]:
    failed = [(uid, int(i), picklable(e)) for uid, i, e in res.failed]
    return (
        res.output is not None,
        res.read,
        res.filtered,
        failed,
        res.yielded,
        res.shards_read,
        res.shards_in_memory,
        res.peak_shards_in_memory,
    )


class _Worker:
    """In a worker process: builds the batches asked for and hands them over (see the module)."""

    def __init__(self, conn: Any, svc: Any, mode: str | None) -> None:
        self.conn, self.svc, self.mode = conn, svc, mode
        self.slots = Slots("datamill-batch", limit=_MAX_SLOTS)
        self.open: set[int] = set()  # slots of the block being handed over (placed batches)
        self.outbox: list[tuple[Any, ...]] = []  # placed batches not sent yet (their block's rest)
        self.inflight = 0  # batches sent and not yet taken (acknowledged) by the trainer
        self.cancelled = 0  # builds up to this generation are abandoned by the trainer
        self.pending: tuple[Any, ...] | None = None  # a build or stop that came during a build
        self.poller = select.poll()  # whether the trainer wrote: one syscall, no selector made
        self.poller.register(conn.fileno(), select.POLLIN)

    def send(self, msg: tuple[Any, ...]) -> None:
        """One message to the trainer."""
        send(self.conn, msg)

    def run(self) -> None:
        self.send(self.slots.ready())
        while True:
            try:
                msg = self.pending or self.conn.recv()
            except (EOFError, OSError):  # the trainer closed its end (or exited)
                return
            self.pending = None
            if msg[0] == "stop":
                return
            if msg[0] == "build":
                self.build(*msg[1:])
            else:
                self.handle(msg)

    def handle(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "ack":  # batches taken, slots whose views are all gone (once per batch)
            self.inflight -= msg[1]
            for k in msg[2]:
                self.slots.release(k, keep=k in self.open)
        elif msg[0] == "cancel":
            self.cancelled = max(self.cancelled, msg[1])
        elif msg[0] == "pipe":  # the trainer cannot map the slots
            self.slots.drop()
            self.open = set()
        else:  # a new build, or stop: after this one
            self.pending = msg

    def stale(self, gen: int) -> bool:
        return self.cancelled >= gen or self.pending is not None

    def build(
        self,
        gen: int,
        epoch: int,
        rank: int,
        batches: list[int],
        world_size: int,
        elastic: Elastic,
        replication: int,
    ) -> None:
        if not batches:
            return
        it = self.svc.build(
            epoch, rank, batches, world_size=world_size, elastic=elastic, replication=replication
        )
        try:
            for res in it:
                while self.poller.poll(0):
                    self.handle(self.conn.recv())
                if self.stale(gen) or not self.hand(gen, res):
                    return
        except Exception as exc:  # noqa: BLE001 - raised again in the trainer
            self.flush()  # the batches before it first
            self.send(("error", gen, picklable(exc)))
        finally:
            self.flush()
            it.close()
            self.close_blocks()

    def close_blocks(self) -> None:
        """Every placed block is handed over (or abandoned): its slot frees with its batches."""
        for k in self.open:
            self.slots.settle(k)
        self.open = set()

    def reserve(self, n: int) -> tuple[int, np.ndarray] | None:
        """A slot for a block of ``n`` bytes (:mod:`datamill.loader.procs_place`), or ``None``."""
        self.close_blocks()  # the blocks before were handed over whole (one thread builds)
        k = self.slots.take() if n <= (1 << 31) else None
        if k is None:
            return None
        self.slots.use(k, 0)
        self.open.add(k)
        return k, self.slots.region(k, n)

    def hand(self, gen: int, res: BatchResult) -> bool:
        """Send ``res`` (its arrays, or its table as Arrow IPC, in a slot); ``False`` when the
        build was abandoned."""
        limit = _INFLIGHT_PLACED if isinstance(res.output, Placed) else _INFLIGHT
        while self.inflight >= limit:  # the trainer is behind: wait for it
            self.handle(self.conn.recv())
            if self.stale(gen):
                return False
        if isinstance(res.output, Placed):  # built in its slot already
            self.hand_placed(gen, res, res.output)
            return True
        table = res.output if res.output is not None else res.empty
        arrays = _collated(table, self.mode) if res.output is not None else None
        layout = None if arrays is None else _layout(arrays)
        n = _ipc_size(table) if layout is None else layout[1]
        k = self.slots.take() if n <= (1 << 31) else None
        self.inflight += 1
        if k is None:  # no slot: the bytes through the pipe
            out = np.zeros(n, dtype=np.uint8)
            _write(out, table, arrays, layout)
            self.send(("batch", gen, res.batch, None, out.tobytes(), _meta(res), layout, self.full))
            return True
        slot = self.slots.slots[k]
        _write(slot.region(n), table, arrays, layout)  # grown when too small
        self.slots.use(k)
        at = (k, slot.fd)
        msg = ("batch", gen, res.batch, at, (n, slot.size), _meta(res), layout, self.full)
        self.send(msg)
        return True

    def hand_placed(self, gen: int, res: BatchResult, placed: Placed) -> None:
        """Send batch ``res``, built in slot ``placed.token``: the batches of a block go together,
        in one message once its last one is there (the trainer wakes once a block)."""
        k = int(placed.token)
        self.slots.users[k] += 1
        self.inflight += 1
        slot = self.slots.slots[k]
        size = (placed.layout[1], slot.size)
        msg = ("batch", gen, res.batch, (k, slot.fd), size, _meta(res), placed.layout, self.full)
        self.outbox.append(msg)
        if placed.last or self.inflight >= _INFLIGHT_PLACED:  # (the next batch would wait)
            self.flush()

    def flush(self) -> None:
        """Send the batches held back (:meth:`hand_placed`)."""
        if len(self.outbox) == 1:
            self.send(self.outbox[0])
        elif self.outbox:
            self.send(("batches", self.outbox))
        self.outbox = []

    @property
    def full(self) -> bool:
        """Whether the trainer acknowledges this batch at once (else every few batches): past
        ``_INFLIGHT`` in flight, the smaller limit, so that a worker waiting at either limit was
        always sent a batch asking for it (a wait for an acknowledgement never asked is a hang)."""
        return self.inflight >= _INFLIGHT


_Layout = tuple[list[tuple[str, str, tuple[int, ...], int]], int]


def _collated(table: pa.Table, mode: str | None) -> dict[str, np.ndarray] | None:
    """In the worker: the batch's numpy arrays (``mode`` ``"numpy"``, or ``"torch"`` with signed
    ids already int64 as :func:`~datamill.loader.collate.to_torch` makes them); ``None``: the
    trainer collates the table (another collate, or an object array such as strings)."""
    if mode is None:
        return None
    arrays = collate_numpy(table)
    if any(a.dtype == object for a in arrays.values()):
        return None
    if mode == "torch":
        arrays = {
            k: a.astype(np.int64) if a.dtype.kind == "i" and a.dtype.itemsize < 8 else a
            for k, a in arrays.items()
        }
    return arrays


def _layout(arrays: dict[str, np.ndarray]) -> _Layout:
    """Where each array goes in a slot (64-byte aligned): ``([(name, dtype, shape, offset)],
    bytes)``."""
    out, at = [], 0
    for name, a in arrays.items():
        out.append((name, a.dtype.str, tuple(a.shape), at))
        at += -(-a.nbytes // 64) * 64
    return out, at


def _write(
    dst: np.ndarray, table: pa.Table, arrays: dict[str, np.ndarray] | None, layout: _Layout | None
) -> None:
    """Write the arrays (or the table as Arrow IPC) into ``dst`` (uint8)."""
    if arrays is None or layout is None:
        _write_ipc(pa.FixedSizeBufferWriter(pa.py_buffer(dst)), table)
        return
    for name, dtype, shape, at in layout[0]:
        np.copyto(np.ndarray(shape, arrays[name].dtype, buffer=dst, offset=at), arrays[name])


def placing(batching: Any, mode: str | None) -> bool:
    """Whether a worker builds its batches straight into its slots
    (:mod:`datamill.loader.procs_place`): the built-in collates, no filter or transform."""
    return mode is not None and batching.filter is None and batching.transform is None


def _place(worker: _Worker, mode: str, reader: Any, task: list[int]) -> list[BatchResult] | None:
    return place_block(reader.plan, reader.get, task, mode=mode, alloc=worker.reserve)


def _memory_pool() -> None:
    """jemalloc as Arrow's pool: a worker is the loader's own process, and jemalloc keeps freed
    pages for the next batch where the default pool hands them back to the system, so the batch
    buffers kept landing on fresh pages the kernel zeroes first (as in
    :func:`datamill.loader.torch._worker_memory_pool`)."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):  # a build without jemalloc
        pass


def _serve(
    fd: int,
    parent: int,
    started: str | None,
    threads: int,
    blob: bytes | None,
    peers: tuple[int, int, dict[int, socket.socket]] | None = None,
) -> None:
    """A worker's body: its share of the cores, the trainer's watch, then the requests on ``fd``
    (the service's pickle is ``blob``, or the first message). ``peers``: ``(me, n, sockets)``,
    the shards shared with the other workers (:mod:`datamill.loader.procs_shards`)."""
    _memory_pool()
    try:
        conn, (svc, mode) = worker_setup(fd, parent, started, threads, blob, watch_s=_WATCH_S)
        if peers is not None:
            me, n, socks = peers
            # the shards two windows span (a build reads the next window ahead)
            keep = 2 * int(svc.window) + 2 * int(svc.workers.prefetch) + 2
            cache = svc._cache  # the worker's own copy of the service
            cache._read = SharedShards(me, n, socks, cache._read, keep).read
        worker = _Worker(conn, svc, mode)
        if placing(svc.batching, mode) and worker.slots.slots:
            svc._place = functools.partial(_place, worker, mode)
            svc._cache._read = functools.partial(prepared_read, svc._cache._read)
        worker.run()
    except (EOFError, OSError):  # the trainer is gone (its end of the pipe closed): quietly
        os._exit(0)


def _main() -> None:
    """A started worker: ``python -c ... FD PARENT STARTED THREADS`` (a fresh interpreter: a
    trainer's ``__main__`` is never imported again, unlike multiprocessing's spawn)."""
    _serve(*exec_args(), None)
