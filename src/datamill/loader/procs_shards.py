"""Shards decoded once across the worker processes of :mod:`datamill.loader.procs`.

With ``Workers(processes=N)``, ``N >= 2``, every worker builds batches from the same shuffle
windows, so each would read and decode every shard of the epoch: ``N`` times the decoding of one
process. Here shard ``k`` is read by worker ``k % N`` only, which writes it once as an Arrow IPC
stream into a ``memfd`` and passes that file (its descriptor, over a ``SOCK_SEQPACKET`` socket
between the two workers) to any other worker asking for it; each maps it read-only, so the decoded
shard is one copy in memory, shared. A worker keeps the files it wrote for its ``keep`` most
recently used shards; a shard asked for after that is read again (the same bytes).
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

__all__: list[str] = []


def _ipc_file(table: pa.Table) -> tuple[int, int]:
    """``table`` as an Arrow IPC stream in a new ``memfd``: ``(fd, size)``. Written with
    ``write`` calls, not through a mapping, whose first touch of each new page faults: 2.3-2.4 ms
    of CPU for a 6 MB shard against 4.2-4.9 ms (``benchmarks/RESULTS.md``)."""
    fd = os.memfd_create("datamill-shard", os.MFD_CLOEXEC)
    try:
        with pa.OSFile(f"/proc/self/fd/{fd}", "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            size = int(sink.tell())
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def _mapped(fd: int, size: int) -> pa.Table:
    """The table in ``fd`` (a read-only shared mapping, its pages mapped at once; ``fd`` may be
    closed afterwards)."""
    m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
    return pa.ipc.open_stream(pa.py_buffer(m)).read_all()


class SharedShards:
    """In worker ``me`` of ``n``: ``read(k)`` for the worker's shard cache (see the module).

    Args:
        me: this worker's index.
        n: workers.
        peers: the socket to each other worker, by index.
        read: the service's own ``read(k)`` (for the shards this worker owns).
        keep: shards whose files this worker keeps for the others.
    """

    def __init__(
        self,
        me: int,
        n: int,
        peers: dict[int, socket.socket],
        read: Callable[[int], pa.Table],
        keep: int,
    ) -> None:
        self.me, self.n, self._read, self.keep = me, n, read, max(1, keep)
        self.peers = peers
        self._send_locks = {w: threading.Lock() for w in peers}
        self._lock = threading.Lock()
        self._made: OrderedDict[int, Future[tuple[int, int]]] = OrderedDict()
        self._asked: dict[int, tuple[int, Future[tuple[int, int]]]] = {}  # request: owner, file
        self._gone: dict[int, str] = {}  # peers whose listener ended: why
        self._ids = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="datamill-share")
        for w, sock in peers.items():
            threading.Thread(target=self._listen, args=(w, sock), daemon=True).start()

    def read(self, k: int) -> pa.Table:
        """Shard ``k``: read here when this worker owns it, else the owner's file."""
        owner = k % self.n
        fd, size = self._dup(k) if owner == self.me else self._ask(owner, k)
        try:
            return _mapped(fd, size)
        finally:
            os.close(fd)

    def _make(self, k: int) -> Future[tuple[int, int]]:
        """The future file of shard ``k`` (made by the first caller; least recent ones closed)."""
        with self._lock:
            fut = self._made.get(k)
            if fut is not None:
                self._made.move_to_end(k)
                return fut
            fut = self._made[k] = Future()
            old = [j for j, f in self._made.items() if f.done()][
                : max(0, len(self._made) - self.keep)
            ]
            for j in old:
                f = self._made.pop(j)
                if f.exception() is None:
                    os.close(f.result()[0])
        try:
            fut.set_result(_ipc_file(self._read(k)))
        except BaseException as exc:  # noqa: BLE001 - raised again in every reader waiting
            with self._lock:
                self._made.pop(k, None)
            fut.set_exception(exc)
        return fut

    def _dup(self, k: int) -> tuple[int, int]:
        """A descriptor of shard ``k``'s file the caller closes (not closed by an eviction)."""
        while True:
            fut = self._make(k)
            fd, size = fut.result()
            with self._lock:
                if self._made.get(k) is fut:
                    return os.dup(fd), size

    def _ask(self, owner: int, k: int) -> tuple[int, int]:
        fut: Future[tuple[int, int]] = Future()
        req = next(self._ids)
        with self._lock:
            if owner in self._gone:  # nobody reads its answers any more
                raise RuntimeError(f"loader worker {owner} {self._gone[owner]}")
            self._asked[req] = (owner, fut)
        self._send(owner, ("get", req, k))
        return fut.result()

    def _send(self, w: int, msg: tuple[object, ...], fds: list[int] | None = None) -> None:
        with self._send_locks[w]:
            socket.send_fds(self.peers[w], [pickle.dumps(msg)], fds or [])

    def _serve(self, w: int, req: int, k: int) -> None:
        """Worker ``w`` asked for shard ``k``: send it its file (or the error)."""
        try:
            fd, size = self._dup(k)
        except Exception as exc:  # noqa: BLE001 - raised again in the worker that asked
            self._send(w, ("error", req, f"{type(exc).__name__}: {exc}"))
            return
        try:
            self._send(w, ("shard", req, size), [fd])
        finally:
            os.close(fd)

    def _listen(self, w: int, sock: socket.socket) -> None:
        """Requests from worker ``w`` and its answers to ours, until it is gone (then what was
        asked of it, and what is asked later, fails: nobody reads its answers any more)."""
        why = "exited"
        try:
            while True:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
                if not data:
                    break
                msg = pickle.loads(data)
                if msg[0] == "get":
                    self._pool.submit(self._serve, w, msg[1], msg[2])
                    continue
                with self._lock:
                    fut = self._asked.pop(msg[1])[1]
                if msg[0] == "shard":
                    fut.set_result((fds[0], msg[2]))
                else:
                    fut.set_exception(RuntimeError(f"worker {w} reading a shard: {msg[2]}"))
        except OSError:
            pass
        except Exception as exc:  # noqa: BLE001 - a message not understood: the peer is lost too
            why = f"sent a message that cannot be read ({type(exc).__name__}: {exc})"
        with self._lock:  # the other worker is gone: what we asked of it never comes
            self._gone[w] = why
            waiting = [req for req, (owner, _) in self._asked.items() if owner == w]
            futs = [self._asked.pop(req)[1] for req in waiting]
        for fut in futs:
            if not fut.done():
                fut.set_exception(RuntimeError(f"loader worker {w} {why}"))
