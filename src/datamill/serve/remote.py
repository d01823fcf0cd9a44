"""``RemoteLoader``: the in-process Loader's batches, served by ``datamill serve``.

A background thread keeps ``prefetch`` leases (each ``lease_size`` batches in one Arrow IPC response)
ahead of the training loop and piggy-backs the acknowledgement of every consumed lease on its next
request; a second thread heartbeats (extending the leases, reporting the **stall time**: how long the
loop waited for data). A lease is acknowledged when the loop comes back for the batch after its last
one, so a killed process's lease goes to its replacement again.

In static mode the batches are rank ``rank``'s batches of the in-process Loader, in order; a lease
re-issued after a server restart or an expiry whose positions were already yielded is acknowledged
without being yielded again.
"""

from __future__ import annotations

import os
import queue
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.loader.collate import resolve_collate
from datamill.serve.client import Client, Http, RemoteError

__all__ = ["SERVE_STATE_FORMAT", "RemoteLoader"]

SERVE_STATE_FORMAT = "datamill.serve/1"
_END = object()


@dataclass
class _Lease:
    id: str
    fence: int
    queue: int
    start: int
    units: list[int]
    tables: list[pa.Table]


def _client_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:24] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class RemoteLoader:
    """Iterate a served dataset like :class:`~datamill.loader.Loader` (same batches in static mode).

    Args:
        url: the server, ``http://host:port``.
        key: an API key (``None`` for a ``--no-auth`` server).
        dataset: registered dataset id or name.
        batch_size: samples per batch.
        seed: the run's seed. Defaults to ``0``.
        epoch: the first epoch. Defaults to ``0``.
        columns: column(s) to read (all when ``None``). Defaults to ``None``.
        rank: this process's rank (static mode). Defaults to ``0``.
        world_size: ranks of the iteration (static mode). Defaults to ``1``.
        mode: ``"static"`` (DDP: per-rank batches, byte-identical to the Loader) or ``"dynamic"``
            (elastic: any client takes the next lease). Defaults to ``"static"``.
        name: the iteration's name; processes using the same name (and epoch) join one iteration.
            Defaults to ``None`` (joined by identical config).
        drop_last: as for the Loader. Defaults to ``False``.
        collate: ``"numpy"``, ``"torch"``, ``"arrow"`` or a callable on the batch ``pa.Table``.
            Defaults to ``"numpy"``.
        prefetch: leases fetched ahead (1 or 2 is plenty). Defaults to ``2``.
        shuffle: as for the Loader. Defaults to ``True``.
        lease_size: batches per lease when this call creates the iteration. Defaults to ``16``.
        lease_timeout: lease lifetime without heartbeat, seconds (server default when ``None``).
        slot: this process's slot within the rank (a DataLoader worker). Defaults to ``0``.
        slots: slots sharing the rank (leases dealt round-robin). Defaults to ``1``.
        reconnect_s: how long to keep retrying an unreachable server. Defaults to ``120.0``.
        on_commit: called with the unit ids of each lease the server confirmed committed. Defaults to ``None``.

    Raises:
        ConfigError: invalid arguments. RemoteError: the server refused or is unreachable.
    """

    def __init__(self, url: str, key: str | None, dataset: str, *, batch_size: int, seed: int = 0, epoch: int = 0,
                 columns: Sequence[str] | str | None = None, rank: int = 0, world_size: int = 1,
                 mode: str = "static", name: str | None = None, drop_last: bool = False,
                 collate: str | Callable[[pa.Table], Any] = "numpy", prefetch: int = 2, shuffle: bool = True,
                 lease_size: int = 16, lease_timeout: float | None = None, slot: int = 0, slots: int = 1,
                 reconnect_s: float = 120.0, on_commit: Callable[[list[int]], None] | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if prefetch < 1 or not 0 <= slot < slots:
            raise ConfigError(f"need prefetch >= 1 and 0 <= slot < slots, got {prefetch}, {slot}, {slots}")
        self.url, self.key, self.dataset = url, key, dataset
        self.iter_args: dict[str, Any] = {"batch_size": batch_size, "seed": seed, "shuffle": shuffle,
                                          "columns": columns, "drop_last": drop_last, "mode": mode,
                                          "world_size": world_size, "name": name, "lease_size": lease_size,
                                          "lease_timeout": lease_timeout}
        self.epoch, self.rank, self.slot, self.slots = int(epoch), int(rank), int(slot), int(slots)
        self.mode, self.prefetch, self.reconnect_s = mode, int(prefetch), float(reconnect_s)
        self.collate_fn = resolve_collate(collate)
        self.on_commit = on_commit
        self.client_id = _client_id()
        self.iteration_id: str | None = None
        self._resume: dict[str, Any] | None = None
        self._yielded: set[int] = set()  # positions of the rank's queue already yielded (static)
        self._consumed = 0
        self.stall_s = 0.0
        self.stats: dict[str, Any] = {"leases": 0, "batches": 0, "skipped_duplicates": 0, "dropped_lost": 0,
                                      "acks": {}}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Tiny JSON resume state: the iteration and how many of this rank's batches were consumed."""
        return {"format": SERVE_STATE_FORMAT, "iteration": self.iteration_id, "epoch": self.epoch,
                "rank": self.rank, "slot": self.slot, "slots": self.slots, "mode": self.mode,
                "consumed": self._consumed, "world_size": self.iter_args["world_size"]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration rewinds the server to it (static mode).

        Raises:
            ResumeStateError: another format, mode or rank.
        """
        if state.get("format") != SERVE_STATE_FORMAT:
            raise ResumeStateError(f"state has format {state.get('format')!r}, expected {SERVE_STATE_FORMAT!r}")
        if state.get("mode") != "static" or self.mode != "static":
            raise ResumeStateError("only static-mode states can be resumed by rewind; in dynamic mode the server "
                                   "keeps the done set (resume the same named iteration)")
        if (state["rank"], state["world_size"], state["slots"]) != (self.rank, self.iter_args["world_size"], 1):
            raise ResumeStateError(f"state of rank {state['rank']}/{state['world_size']} (slots {state['slots']}) "
                                   f"does not fit rank {self.rank}/{self.iter_args['world_size']}")
        self.epoch = int(state["epoch"])
        self._resume = dict(state)

    # ------------------------------------------------------------------ iteration
    def _join(self, client: Client) -> dict[str, Any]:
        args = {k: v for k, v in self.iter_args.items() if v is not None}
        return client.iteration(self.dataset, epoch=self.epoch, **args)

    def __iter__(self) -> Iterator[Any]:
        client = Client(self.url, self.key)
        client.http.retry_s = self.reconnect_s
        try:
            info = self._join(client)
            self.iteration_id = it_id = str(info["id"])
            if self._resume is not None:
                if self._resume["iteration"] != it_id:
                    raise ResumeStateError(f"state is of iteration {self._resume['iteration']}, the server "
                                           f"gives {it_id} for these settings")
                client.resume(it_id, rank=self.rank, consumed=int(self._resume["consumed"]))
                self._consumed = int(self._resume["consumed"])
                self._yielded = set(range(self._consumed))
                self._resume = None
            else:
                self._consumed, self._yielded = 0, set()
            timeout = float(info["config"]["lease_timeout"])
        finally:
            client.close()
        yield from self._run(it_id, timeout)
        self.epoch += 1

    def _run(self, it_id: str, lease_timeout: float) -> Iterator[Any]:
        buf: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        to_ack: list[_Lease] = []
        held: dict[str, _Lease] = {}
        lost: set[str] = set()
        lock = threading.Lock()
        stop = threading.Event()
        errors: list[BaseException] = []

        def fetch() -> None:
            http = Http(self.url, self.key, retry_s=self.reconnect_s)
            base = [("client", self.client_id), ("rank", self.rank), ("slot", self.slot), ("slots", self.slots)]
            try:
                while not stop.is_set():
                    with lock:
                        acks, to_ack[:] = list(to_ack), []
                    res = http.request("GET", f"/api/v1/iterations/{it_id}/next", ok=(200, 204, 409),
                                       query=base + [("ack", f"{x.id}:{x.fence}") for x in acks])
                    self._record_acks(res.headers.get("x-datamill-acks", ""), acks)
                    if res.status == 204:
                        buf.put(_END)
                        return
                    if res.status == 409:
                        stop.wait(0.02)
                        continue
                    h = res.headers
                    tables = [pa.Table.from_batches([b]) for b in pa.ipc.open_stream(res.body)]
                    q, _, span = h["x-datamill-positions"].partition(":")
                    lease = _Lease(h["x-datamill-lease"], int(h["x-datamill-fence"]), int(q),
                                   int(span.split("-")[0]), [int(u) for u in h["x-datamill-units"].split(",")], tables)
                    with lock:
                        held[lease.id] = lease
                    while not stop.is_set():
                        try:
                            buf.put(lease, timeout=0.1)
                            break
                        except queue.Full:
                            continue
            except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
                errors.append(exc)
                buf.put(_END)
            finally:
                http.close()

        def heartbeat() -> None:
            http = Http(self.url, self.key, retry_s=0)
            try:
                while not stop.wait(max(0.2, lease_timeout / 4)):
                    with lock:
                        ids = list(held)
                    try:
                        res = http.request("POST", f"/api/v1/iterations/{it_id}/heartbeat", body={
                            "client": self.client_id, "leases": ids, "stall_s": self.stall_s,
                            "batches": self.stats["batches"]})
                        with lock:
                            lost.update(res.json()["lost"])
                    except RemoteError:
                        continue  # the server may be restarting; the fetch thread reconnects
            finally:
                http.close()

        threads = [threading.Thread(target=fetch, name="datamill-serve-fetch", daemon=True),
                   threading.Thread(target=heartbeat, name="datamill-serve-heartbeat", daemon=True)]
        for t in threads:
            t.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = buf.get()
                self.stall_s += time.perf_counter() - t0
                if item is _END:
                    if errors:
                        raise errors[0]
                    return
                lease: _Lease = item
                self.stats["leases"] += 1
                with lock:
                    is_lost = lease.id in lost
                if is_lost and self.mode == "dynamic":
                    self.stats["dropped_lost"] += 1  # not yielded: the server gives it to someone again
                    with lock:
                        held.pop(lease.id, None)
                    continue
                for i, table in enumerate(lease.tables):
                    pos = lease.start + i
                    if self.mode == "static" and pos in self._yielded:
                        self.stats["skipped_duplicates"] += 1
                        continue
                    self._yielded.add(pos)
                    while self._consumed in self._yielded:
                        self._consumed += 1
                    self.stats["batches"] += 1
                    yield self.collate_fn(table)
                with lock:  # the loop came back: every batch of the lease is consumed
                    to_ack.append(lease)
                    held.pop(lease.id, None)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5)
            with lock:
                rest = list(to_ack)
            if rest and not errors:
                self._flush(it_id, rest)

    def _record_acks(self, header: str, sent: Sequence[_Lease]) -> None:
        by_id = {x.id: x for x in sent}
        for item in filter(None, header.split(",")):
            lease_id, _, status = item.rpartition("=")
            counts = self.stats["acks"]
            counts[status] = counts.get(status, 0) + 1
            if status == "ok" and self.on_commit is not None and lease_id in by_id:
                self.on_commit(by_id[lease_id].units)

    def _flush(self, it_id: str, leases: Sequence[_Lease]) -> None:
        http = Http(self.url, self.key, retry_s=min(self.reconnect_s, 10.0))
        try:
            res = http.request("POST", f"/api/v1/iterations/{it_id}/ack", ok=(200, 409, 410),
                               body={"client": self.client_id, "leases": [[x.id, x.fence] for x in leases]})
            self._record_acks(",".join(f"{k}={v}" for k, v in res.json()["acks"].items()), leases)
        except RemoteError:
            pass  # unacknowledged leases are re-issued: at-least-once, never lost
        finally:
            http.close()
