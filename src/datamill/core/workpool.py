"""Worker processes answering calls, with their bytes handed over in shared memory: ``fn(*args)``
run in worker ``w`` (:class:`CallPool`, the build workers of ``datamill serve``).

Each worker is a :class:`~datamill.core.workproc.WorkerProc` started as a fresh interpreter (no
thread, lock or socket of the parent is inherited), which answers ``("call", fn, args, slots
freed)`` with ``("ok", result)`` or ``("error", exception)``, one call at a time
(:func:`answer_calls`). A call returning bytes hands them over in one of the worker's shared-memory
slots (:func:`hand`; the parent reads them through :meth:`CallPool.held`, and the slot goes back
with the worker's next call), or through the socket. A worker that died (killed, out of memory)
is replaced and its call asked once more of the new process.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from datamill.core.workproc import (
    Slots,
    WorkerError,
    WorkerProc,
    exec_args,
    picklable,
    send,
    worker_setup,
)

__all__ = ["CallPool", "answer_calls", "hand"]

_MINE: list[Slots] = []  # in a worker: its shared-memory slots (set by :func:`answer_calls`)
_Ask = tuple[int, Any, tuple[Any, ...]]  # (worker, fn, args)


def answer_calls(conn: Connection, slots: Slots) -> None:
    """A worker's loop: the calls on ``conn`` answered until ``("stop",)`` or the parent is gone;
    ``slots`` are the ones :func:`hand` writes into."""
    _MINE[:] = [slots]
    send(conn, slots.ready())
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent closed its end (or exited)
            return
        if msg[0] == "stop":
            return
        if msg[0] == "pipe":  # the parent cannot map the slots
            slots.drop()
            continue
        for k in msg[3]:
            slots.release(k)
        try:
            out: tuple[str, Any] = ("ok", msg[1](*msg[2]))
        except Exception as exc:  # noqa: BLE001 - raised again in the parent
            out = ("error", picklable(exc))
        send(conn, out)


def _main() -> None:
    """A worker that only answers calls (:class:`CallPool`'s default)."""
    conn, _ = worker_setup(*exec_args(), None, watch_s=1.0)
    answer_calls(conn, Slots("datamill-calls", limit=4))


def hand(parts: Sequence[Any], *, shared: bool, limit: int) -> Any:
    """In a worker: bytes (``parts``, buffers one after another) as a call returns them: ``(slot,
    fd, length, file size)`` of a shared-memory slot (``shared``, a slot free and at most ``limit``
    bytes), else ``bytes`` (through the socket; also out of memory for a slot)."""
    n = sum(p.size for p in parts)
    if not shared or n > limit or not _MINE:
        return b"".join(parts)
    slots = _MINE[0]
    try:
        k = slots.take()
        if k is None:
            return b"".join(parts)
        writer = pa.FixedSizeBufferWriter(pa.py_buffer(slots.region(k, n)))
        for p in parts:
            writer.write(p)  # without the GIL
    except OSError:  # no memory for it (or a file size limit): through the socket
        return b"".join(parts)
    slots.use(k)
    return k, slots.slots[k].fd, n, slots.slots[k].size


class CallPool:
    """``workers`` processes answering calls (see the module docstring); waits until each is
    started (its imports done).

    Args:
        workers: processes.
        blob: their start data (a pickle).
        threads: each one's Arrow threads.
        name: what a worker is called in errors.
        main: their entry point (``"module:function"``, see
            :class:`~datamill.core.workproc.WorkerProc`), which ends in :func:`answer_calls`.
            Defaults to a worker that only answers calls.

    Examples:
        >>> import operator, pickle
        >>> pool = CallPool(1, blob=pickle.dumps(None), threads=1, name="doc worker")
        >>> pool.call(0, operator.add, 2, 3)
        5
        >>> pool.close()
    """

    def __init__(
        self,
        workers: int,
        *,
        blob: bytes,
        threads: int,
        name: str,
        main: str = "datamill.core.workpool:_main",
    ) -> None:
        self.main, self.blob, self.threads, self.name = main, blob, threads, name
        self._lock = threading.Lock()
        self._locks = [threading.Lock() for _ in range(workers)]  # held from a call to its answer
        self.procs = [self._proc(w) for w in range(workers)]
        # whether this process can map its workers' shared memory (``/proc/PID/fd`` of a
        # ``memfd``); without it every result goes through the socket
        ready = [p.ready() for p in self.procs]  # every worker waited for
        self.shared = all(ready)
        self.handed = {"shared": 0, "pipe": 0}  # results handed over each way

    def _proc(self, w: int) -> WorkerProc:
        return WorkerProc(w, main=self.main, blob=self.blob, threads=self.threads, start="exec")

    def call(self, w: int, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in worker ``w`` (see :meth:`calls`)."""
        return self.calls([(w, fn, args)])[0][1]

    def calls(self, asks: Sequence[_Ask]) -> list[tuple[WorkerProc, Any]]:
        """``(worker process, fn(*args))`` of each ``(worker, fn, args)`` of ``asks``, run at once
        (each worker's lock held from its call to its answer: one call at a time per worker);
        asked once more of a new process when the worker died; a call's exception raised here."""
        got, gone = self._ask(asks)
        for i, h in gone:  # asked once more, of its replacement
            self._replace(h)
            again, still = self._ask([asks[i]])
            if still:
                raise WorkerError(f"{self.name} {h.died(of=len(self.procs))}, and its replacement")
            got[i] = again[0]
        out = []
        for i in range(len(asks)):
            h, (status, value) = got[i]
            if status == "error":
                raise value
            out.append((h, value))
        return out

    def _ask(
        self, asks: Sequence[_Ask]
    ) -> tuple[dict[int, tuple[WorkerProc, Any]], list[tuple[int, WorkerProc]]]:
        """:meth:`calls` once: the answers by ask, and the asks whose worker died."""
        got: dict[int, tuple[WorkerProc, Any]] = {}
        gone: list[tuple[int, WorkerProc]] = []
        with contextlib.ExitStack() as stack:
            for w in sorted({w for w, _, _ in asks}):  # in order: no two callers wait on each other
                stack.enter_context(self._locks[w])
            sent = []
            for i, (w, fn, args) in enumerate(asks):
                h = self.procs[w]
                try:
                    h.send(("call", fn, args, h.take_freed()))
                    sent.append((i, h))
                except OSError:  # it died before this call
                    gone.append((i, h))
            for i, h in sent:
                try:
                    got[i] = h, h.conn.recv()
                except (EOFError, OSError):  # it died before it answered
                    gone.append((i, h))
        return got, gone

    def _replace(self, h: WorkerProc) -> None:
        """A new process in place of worker ``h``, which died (unless replaced already)."""
        with self._lock:
            if self.procs[h.index] is h:
                h.close()
                new = self._proc(h.index)
                new.ready()
                self.procs[h.index] = new

    @contextlib.contextmanager
    def held(self, h: WorkerProc, out: Any) -> Iterator[memoryview]:
        """The bytes worker ``h`` handed over (``out`` of :func:`hand`), while they are read; its
        slot goes back to the worker after (with its next call)."""
        if isinstance(out, bytes):
            self.handed["pipe"] += 1
            yield memoryview(out)
            return
        self.handed["shared"] += 1
        slot, fd, n, size = out
        if not h.open_slot(slot, fd):
            raise OSError(f"cannot open the shared memory of {self.name} {h.index} (pid {h.pid})")
        with h.view(slot, n, size) as view:  # released on the way out: the slot can be freed
            yield view

    def close(self) -> None:
        """Stop the workers."""
        for h in self.procs:
            h.close()
