"""Worker processes that hand their results over in shared memory: the one mechanism of the
loader's ``Workers(processes=N)`` (:mod:`datamill.loader.procs`) and of ``datamill serve``'s build
workers (:mod:`datamill.serve.data.workers`).

A worker is started forked (milliseconds; it inherits the parent's memory: the loader's trainer) or
as a fresh interpreter (``python -c``: no thread, lock or socket of the parent is inherited; a
server) and talks to its parent over one socket pair (:class:`WorkerProc`). It watches its parent
(its pid and start time, so a reused pid does not count) and exits once the parent is gone, also
after ``kill -9`` (:func:`worker_setup`). It writes results into its shared-memory slots
(:class:`Slots` of :class:`~datamill.core.memslot.MemSlot`, a ``memfd`` each), which the parent maps
through ``/proc/PID/fd`` (:meth:`WorkerProc.view`); a slot goes back to the worker once every view
of it is gone, in the next ``("ack", taken, [slots])`` message or request. Where a slot cannot be
mapped (not Linux), the parent says ``("pipe",)`` and the bytes go through the socket. A worker
that dies is an EOF (or a broken pipe) at the parent, which names it with its exit code
(:meth:`WorkerProc.died`).
"""

from __future__ import annotations

import collections
import gc
import mmap
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.errors import DatamillError
from datamill.core.memslot import MemSlot
from datamill.core.parallel import exit_when_gone, process_start_time

__all__ = ["Slots", "WorkerError", "WorkerProc", "exec_args", "picklable", "send", "worker_setup"]

# how a worker starts by default: forked (Linux, like torch's DataLoader), or a fresh interpreter
START = "fork" if sys.platform.startswith("linux") else "exec"


class WorkerError(DatamillError, RuntimeError):
    """A worker process died (killed, out of memory) or could not start."""


def send(conn: Connection, msg: tuple[Any, ...]) -> None:
    """One message (plain pickle: no ForkingPickler made per message)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def picklable(exc: BaseException) -> BaseException:
    """``exc`` itself when it pickles, else a RuntimeError carrying its text.

    Examples:
        >>> type(picklable(ValueError("x"))).__name__
        'ValueError'
    """
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Forked:
    """A forked worker process, with the part of ``subprocess.Popen`` the parent uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (a SIGCHLD handler, os.wait())
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, 9)


def _fork(
    body: Callable[..., None],
    theirs: socket.socket,
    mine: socket.socket,
    others: Sequence[int | socket.socket],
    args: tuple[Any, ...],
) -> int:
    """Fork a worker running ``body(fd, *args)`` on ``theirs`` (closing what it inherited of the
    parent's: ``mine`` and ``others``, descriptors or sockets); returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:  # the child: never returns into the parent's code
        gc.freeze()  # the parent's objects: never traversed (nor their pages copied) by this GC
        mine.close()
        for other in others:
            other.close() if isinstance(other, socket.socket) else os.close(other)
        body(theirs.detach(), *args)
    except BaseException:  # noqa: BLE001 - a child must not run the parent's code
        code = 1
    os._exit(code)


class WorkerProc:
    """In the parent: one worker process, its socket and its mapped slots.

    The worker runs ``body(fd, parent, started, threads, blob, *extra)`` when forked, or the
    function ``main`` (``"module:function"``, which calls the same with :func:`exec_args` and
    ``blob=None``: the blob comes as the first message) in a fresh interpreter.

    Args:
        index: the worker's number (in its messages).
        main: the worker's entry point in a fresh interpreter.
        blob: the worker's start data (a pickle).
        threads: the worker's Arrow threads.
        start: ``"fork"`` or ``"exec"``. Defaults to forked on Linux.
        body: the worker's body when forked. Defaults to ``None`` (always a fresh interpreter).
        others: descriptors or sockets a forked worker closes (the parent's other workers').
        extra: more arguments of a forked ``body``.
    """

    def __init__(
        self,
        index: int,
        *,
        main: str,
        blob: bytes,
        threads: int,
        start: str = START,
        body: Callable[..., None] | None = None,
        others: Sequence[int | socket.socket] = (),
        extra: tuple[Any, ...] = (),
    ) -> None:
        self.index = index
        mine, theirs = socket.socketpair()
        me = os.getpid()
        self.proc: Any
        if start == "fork" and body is not None:
            args = (me, process_start_time(me), threads, blob, *extra)
            self.proc = _Forked(_fork(body, theirs, mine, others, args))
        else:
            module, fn = main.split(":")
            code = f"from {module} import {fn}; {fn}()"
            argv = [str(theirs.fileno()), str(me), process_start_time(me) or "", str(threads)]
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, *argv], pass_fds=[theirs.fileno()], close_fds=True
            )
        theirs.close()  # the worker holds the only other end: its death is an EOF here
        self.conn = Connection(mine.detach())
        if start != "fork":
            self.conn.send_bytes(blob)
        self.pid: int = self.proc.pid
        self.files: dict[int, Any] = {}
        self.maps: dict[int, mmap.mmap] = {}
        # slots whose views are all gone (appended by their finalizers, from any thread)
        self.freed: collections.deque[int] = collections.deque()

    def send(self, msg: tuple[Any, ...]) -> None:
        """One message to the worker."""
        send(self.conn, msg)

    def ready(self) -> bool:
        """Wait for the worker's ``("ready", pid, slot fds)`` and open its slots; ``False`` (and
        the worker told to use the pipe) when they cannot be opened. Raises ``EOFError`` or
        ``OSError`` when the worker died."""
        msg = self.conn.recv()
        if all(self.open_slot(k, fd) for k, fd in enumerate(msg[2])):
            return True
        self.send(("pipe",))
        return False

    def open_slot(self, slot: int, fd: int) -> bool:
        """Open the worker's slot ``slot`` (its ``fd``) through ``/proc/PID/fd``, kept open: a
        result handed over stays readable after the worker died; ``False`` when it cannot be."""
        if slot not in self.files:
            try:
                self.files[slot] = open(f"/proc/{self.pid}/fd/{fd}", "r+b")  # noqa: SIM115
            except OSError:
                return False
        return True

    def view(self, slot: int, n: int, size: int) -> memoryview:
        """The first ``n`` bytes of slot ``slot`` (``size`` bytes now), a writable shared mapping;
        the slot is freed (queued for the next message) once the view and everything made from it
        are gone."""
        m = self.maps.get(slot)
        if m is None or len(m) < size:
            if m is not None:
                _unmap(m)
            m = self.maps[slot] = mmap.mmap(self.files[slot].fileno(), size)
        out = memoryview(m)[:n]
        weakref.finalize(out, self.freed.append, slot)
        return out

    def take_freed(self) -> list[int]:
        """The slots freed since the last call."""
        return [self.freed.popleft() for _ in range(len(self.freed))]

    def died(self, *, of: int) -> str:
        """``"process INDEX of OF (pid PID) exited with code CODE"`` (the code waited for a
        second)."""
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        code = self.proc.returncode
        return f"process {self.index} of {of} (pid {self.pid}) exited with code {code}"

    def close(self) -> None:
        """Stop the worker (killed after 2 s) and unmap its slots."""
        try:
            self.send(("stop",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=2.0)
        self.conn.close()
        for m in self.maps.values():
            _unmap(m)
        self.maps.clear()
        for f in self.files.values():
            f.close()
        self.files.clear()


def _unmap(m: mmap.mmap) -> None:
    """Close ``m`` unless results still view it (then it closes when the last view is gone)."""
    try:
        m.close()
    except BufferError:
        pass


def exec_args() -> tuple[int, int, str | None, int]:
    """In a worker started as a fresh interpreter: ``(fd, parent, started, threads)`` from its
    command line (see :class:`WorkerProc`)."""
    fd, parent, started, threads = sys.argv[1:5]
    return int(fd), int(parent), started or None, int(threads)


def worker_setup(
    fd: int, parent: int, started: str | None, threads: int, blob: bytes | None, *, watch_s: float
) -> tuple[Connection, Any]:
    """A worker's start: its share of the cores for Arrow, the watch of its parent (checked every
    ``watch_s``), its connection and its start data (``blob``, or the first message)."""
    pa.set_cpu_count(threads)
    watch = {"poll_seconds": watch_s}
    threading.Thread(
        target=exit_when_gone, args=(parent, started), kwargs=watch, daemon=True
    ).start()
    conn = Connection(fd)
    return conn, pickle.loads(blob if blob is not None else conn.recv_bytes())


class Slots:
    """In a worker: its shared-memory slots, the free ones and, per slot in use, how many results
    the parent still holds of it (one ``memfd`` first, more made while fewer than ``limit``).

    Examples:
        >>> import sys
        >>> if sys.platform == "linux":
        ...     s = Slots("doc", limit=2); k = s.take(); s.region(k, 10)[:] = 1; s.use(k)
        ...     assert s.take() == 1 and s.release(k) is None and s.take() == 0
    """

    def __init__(self, name: str, *, limit: int) -> None:
        self.name, self.limit = name, limit
        self.slots = [MemSlot(name)] if hasattr(os, "memfd_create") else []
        self.free = set(range(len(self.slots)))
        self.users: dict[int, int] = {}

    def ready(self) -> tuple[str, int, list[int]]:
        """The worker's first message: its pid and slot descriptors."""
        return "ready", os.getpid(), [s.fd for s in self.slots]

    def take(self) -> int | None:
        """A free slot (the lowest: the parent keeps few mappings), a new one, or ``None``."""
        if self.free:
            return min(self.free)
        if not self.slots or len(self.slots) >= self.limit:
            return None
        self.slots.append(MemSlot(self.name))
        return len(self.slots) - 1

    def region(self, k: int, n: int) -> np.ndarray:
        """Slot ``k``'s first ``n`` bytes, writable (grown when too small)."""
        return self.slots[k].region(n)

    def use(self, k: int, users: int = 1) -> None:
        """Slot ``k`` is in use, by ``users`` results the parent will hold."""
        self.free.discard(k)
        self.users[k] = users

    def release(self, k: int, *, keep: bool = False) -> None:
        """The parent let go of one result of slot ``k``: free once none is left (unless
        ``keep``)."""
        self.users[k] = self.users.get(k, 1) - 1
        if not keep:
            self.settle(k)

    def settle(self, k: int) -> None:
        """Slot ``k`` is free again once the parent holds none of its results."""
        if self.users.get(k, 0) <= 0 and k < len(self.slots):
            self.free.add(k)

    def drop(self) -> None:
        """The parent cannot map the slots: none used from now on."""
        self.slots, self.free = [], set()
