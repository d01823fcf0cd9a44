"""``RemoteLoader``: the in-process Loader's batches, served by ``datamill serve``.

A background thread keeps ``prefetch`` leases (each ``lease_size`` batches in one Arrow IPC
response) ahead of the training loop. Every batch is **acknowledged on its own** once the loop comes
back for the next one (it was consumed): the acks ride on the next request for a lease and are
flushed at least every :data:`ACK_FLUSH_S` seconds by the heartbeat thread (one journal transaction
per flush). The heartbeat thread also extends the leases held (reporting the **stall time**, how
long the loop waited for data) and, after a server restart, reclaims them with their fences within
the grace period.

Each loader has a random **session** secret (sent as ``X-Datamill-Session``); its leases can be
acknowledged or extended by no other session. A lease the server reports lost (expired, or not
reclaimed after a restart) is dropped in dynamic mode: the server hands its batches to someone else.

In static mode the batches are rank ``rank``'s batches of the in-process Loader, in order; a lease
re-issued after a server restart or an expiry whose positions were already yielded is acknowledged
without being yielded again. See ``docs/serving-delivery.md`` for the delivery contract.
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
from datamill.serve.direct import TRANSPORTS

__all__ = ["ACK_FLUSH_S", "DIRECT_CACHE_LIMIT", "SERVE_STATE_FORMAT", "RemoteLoader"]

DIRECT_CACHE_LIMIT = 8 << 30
"""Bytes of ``s3://`` shards a direct-mode client keeps in its local cache at most (8 GiB)."""

SERVE_STATE_FORMAT = "datamill.serve/1"
ACK_FLUSH_S = 0.02
"""Seconds between ack flushes of the heartbeat thread while acks are pending (the contract: at most
0.1 s)."""
SESSION_HEADER = "X-Datamill-Session"
_END = object()


@dataclass
class _Lease:
    id: str
    fence: str
    queue: int
    start: int
    units: list[int]
    tables: list[pa.Table]
    done_before: int = 0  # the queue's done prefix (static) or done batches (dynamic) at take time


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
        verify: for an ``https://`` url, a PEM file of the CA certificates to trust. Defaults to the
            system's.
        on_commit: called with the unit ids of each lease the server confirmed committed. Defaults
            to ``None``.
        transport: ``"built"`` (the server builds each lease's batches and sends them) or
            ``"direct"`` (leases carry only batch numbers and fences; this process builds the
            batches itself with the same :class:`~datamill.loader.BatchService` settings, from the
            location the server gives for a dataset registered with ``client_location``: the same
            batches, and the server's work per lease does not depend on the data). Defaults to
            ``"built"``.
        cache_dir: direct mode over ``s3://``: the local shard cache folder. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: direct mode over ``s3://``: bytes the local shard cache keeps at most. Defaults
            to :data:`DIRECT_CACHE_LIMIT`.

    Raises:
        ConfigError: invalid arguments. RemoteError: the server refused or is unreachable.
    """

    def __init__(
        self,
        url: str,
        key: str | None,
        dataset: str,
        *,
        batch_size: int,
        seed: int = 0,
        epoch: int = 0,
        columns: Sequence[str] | str | None = None,
        rank: int = 0,
        world_size: int = 1,
        mode: str = "static",
        name: str | None = None,
        drop_last: bool = False,
        collate: str | Callable[[pa.Table], Any] = "numpy",
        prefetch: int = 2,
        shuffle: bool = True,
        lease_size: int = 16,
        lease_timeout: float | None = None,
        slot: int = 0,
        slots: int = 1,
        reconnect_s: float = 120.0,
        on_commit: Callable[[list[int]], None] | None = None,
        verify: str | os.PathLike[str] | None = None,
        transport: str = "built",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int = DIRECT_CACHE_LIMIT,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}"
            )
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if prefetch < 1 or not 0 <= slot < slots:
            raise ConfigError(
                f"need prefetch >= 1 and 0 <= slot < slots, got {prefetch}, {slot}, {slots}"
            )
        self.url, self.key, self.dataset = url, key, dataset
        self.verify = verify
        self.iter_args: dict[str, Any] = {
            "batch_size": batch_size,
            "seed": seed,
            "shuffle": shuffle,
            "columns": columns,
            "drop_last": drop_last,
            "mode": mode,
            "world_size": world_size,
            "name": name,
            "lease_size": lease_size,
            "lease_timeout": lease_timeout,
        }
        self.epoch, self.rank, self.slot, self.slots = int(epoch), int(rank), int(slot), int(slots)
        self.mode, self.prefetch, self.reconnect_s = mode, int(prefetch), float(reconnect_s)
        self.collate_fn = resolve_collate(collate)
        self.on_commit = on_commit
        self.transport, self.cache_dir, self.cache_limit = transport, cache_dir, int(cache_limit)
        self._direct: tuple[str, Any] | None = None  # (service key, BatchService) of direct mode
        self._cfg: dict[str, Any] = {}
        self.client_id = _client_id()
        self.session = secrets.token_hex(16)
        self.iteration_id: str | None = None
        self._queue_total: int | None = None
        self._in_epoch = False
        self._unflushed: list[
            tuple[str, str, int]
        ] = []  # (lease, fence, position) consumed, not yet journaled
        self._resume: dict[str, Any] | None = None
        self._yielded: set[int] = set()  # positions of the rank's queue already yielded (static)
        self._consumed = 0
        self._current: tuple[str, str, int] | None = None  # the batch the loop holds now
        self._state_lock = threading.Lock()
        self.stall_s = 0.0
        self.stats: dict[str, Any] = {
            "leases": 0,
            "batches": 0,
            "skipped_duplicates": 0,
            "dropped_lost": 0,
            "acks": {},
        }

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Tiny JSON resume state.

        ``consumed`` counts the **rank's** progress (static: the prefix of the rank's batches done
        by any process, a replacement's predecessors included; dynamic: the iteration's batches done
        as last seen). At the end of an epoch the state is the start of the next one. A dynamic
        state carries the session and the batches consumed but not yet flushed, so that resuming
        from it acknowledges them instead of receiving them again.
        """
        with self._state_lock:
            unflushed = [list(x) for x in self._unflushed] + (
                [list(self._current)] if self._current else []
            )
            consumed = self._consumed
        done = (
            self._queue_total is not None
            and self.mode == "static"
            and consumed >= self._queue_total
        )
        if not self._in_epoch or done:
            return {
                "format": SERVE_STATE_FORMAT,
                "iteration": None,
                "epoch": self.epoch + (1 if done else 0),
                "rank": self.rank,
                "slot": self.slot,
                "slots": self.slots,
                "mode": self.mode,
                "consumed": 0,
                "world_size": self.iter_args["world_size"],
            }
        state: dict[str, Any] = {
            "format": SERVE_STATE_FORMAT,
            "iteration": self.iteration_id,
            "epoch": self.epoch,
            "rank": self.rank,
            "slot": self.slot,
            "slots": self.slots,
            "mode": self.mode,
            "consumed": consumed,
            "world_size": self.iter_args["world_size"],
        }
        if self.mode == "dynamic":
            state.update(session=self.session, unflushed=unflushed)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: static mode rewinds the rank to it; dynamic mode rejoins
        the iteration and acknowledges the batches the state consumed but had not flushed.

        Raises:
            ResumeStateError: another format, mode or rank.
        """
        if not isinstance(state, Mapping) or state.get("format") != SERVE_STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeStateError(f"state has format {got!r}, expected {SERVE_STATE_FORMAT!r}")
        if state.get("mode") != self.mode:
            raise ResumeStateError(
                f"state of a {state.get('mode')} iteration does not fit this {self.mode} loader"
            )
        if self.mode == "static" and (state["rank"], state["world_size"], state["slots"]) != (
            self.rank,
            self.iter_args["world_size"],
            1,
        ):
            raise ResumeStateError(
                f"state of rank {state['rank']}/{state['world_size']} (slots {state['slots']}) "
                f"does not fit rank {self.rank}/{self.iter_args['world_size']}"
            )
        self.epoch = int(state["epoch"])
        self._resume = dict(state) if state.get("iteration") else None

    # ------------------------------------------------------------------ iteration
    def _join(self, client: Client) -> dict[str, Any]:
        args = {k: v for k, v in self.iter_args.items() if v is not None}
        return client.iteration(self.dataset, epoch=self.epoch, **args)

    def _finished(self, client: Client, it_id: str) -> bool:
        prog = client.progress(it_id)
        if self.mode == "dynamic":
            return bool(prog["done"] >= prog["total"])
        queue = prog["queues"][self.rank]
        return bool(queue["done"] >= queue["total"])

    def __iter__(self) -> Iterator[Any]:
        client = Client(self.url, self.key, verify=self.verify)
        client.http.retry_s = self.reconnect_s
        client.http.headers[SESSION_HEADER] = self.session
        try:
            info = self._join(client)
            self.iteration_id = it_id = str(info["id"])
            resume, self._resume = self._resume, None
            with self._state_lock:
                self._unflushed = []
            if resume is not None:
                if resume["iteration"] != it_id:
                    raise ResumeStateError(
                        f"state is of iteration {resume['iteration']}, the server "
                        f"gives {it_id} for these settings"
                    )
                if self.mode == "static":
                    client.resume(it_id, rank=self.rank, consumed=int(resume["consumed"]))
                elif resume.get(
                    "unflushed"
                ):  # acknowledged in the saved session, as its flush would have
                    old = Http(
                        self.url, self.key, retry_s=min(self.reconnect_s, 10.0), verify=self.verify
                    )
                    old.headers[SESSION_HEADER] = str(resume.get("session", ""))
                    try:
                        old.request(
                            "POST",
                            f"/api/v1/iterations/{it_id}/ack",
                            ok=(200, 409, 410),
                            body={
                                "client": self.client_id,
                                "acks": _ranges(tuple(x) for x in resume["unflushed"]),
                            },
                        )
                    finally:
                        old.close()
                if self._finished(client, it_id):  # an end-of-epoch state: on to the next epoch
                    self.epoch += 1
                    info = self._join(client)
                    self.iteration_id = it_id = str(info["id"])
                    resume = None
            self._consumed = (
                int(resume["consumed"]) if resume is not None and self.mode == "static" else 0
            )
            self._yielded = set(range(self._consumed))
            self._queue_total = int(info["queues"][0 if self.mode == "dynamic" else self.rank])
            timeout = float(info["config"]["lease_timeout"])
            self._cfg = dict(info["config"])
            if self.transport == "direct":
                self._direct_service(client)
        finally:
            client.close()
        self._in_epoch = True
        yield from self._run(it_id, timeout)
        self._in_epoch = False  # the epoch ended: the state is the start of the next one
        self.epoch += 1
        self._consumed = 0

    def _direct_service(self, client: Client) -> Any:
        """The batch service this loader builds with in direct mode (opened once per dataset and
        order)."""
        from datamill.core.fingerprint import fingerprint_obj
        from datamill.core.objstore import is_remote
        from datamill.serve.direct import service_for
        from datamill.sources import open_source

        cfg = self._cfg
        key = fingerprint_obj(
            [
                cfg[k]
                for k in (
                    "dataset",
                    "batch_size",
                    "seed",
                    "shuffle",
                    "columns",
                    "drop_last",
                    "window",
                    "plan_world",
                )
            ]
        )
        if self._direct is None or self._direct[0] != key:
            location = client.location(str(cfg["dataset"]))
            if is_remote(location):
                source = open_source(
                    location, cache_dir=self.cache_dir, cache_limit=self.cache_limit
                )
            else:
                source = open_source(location)
            if self._direct is not None:
                self._direct[1].close()
            self._direct = (key, service_for(source, cfg))
        return self._direct[1]

    def _build_direct(self, runs_header: str) -> list[pa.Table]:
        """A direct lease's batches, built here exactly as the server builds them."""
        from datamill.serve.direct import as_batches, build_runs, parse_runs

        assert self._direct is not None
        tables = build_runs(self._direct[1], self._cfg, parse_runs(runs_header))
        return [pa.Table.from_batches([b]) for b in as_batches(tables)]

    def _run(self, it_id: str, lease_timeout: float) -> Iterator[Any]:
        buf: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        held: dict[
            str, _Lease
        ] = {}  # leases received whose batches are not all consumed and flushed
        lost: set[str] = set()
        stop = threading.Event()
        errors: list[BaseException] = []
        path = f"/api/v1/iterations/{it_id}"

        def http(retry_s: float) -> Http:
            h = Http(self.url, self.key, retry_s=retry_s, verify=self.verify)
            h.headers[SESSION_HEADER] = self.session
            return h

        direct = self.transport == "direct"
        # direct mode: a builder thread builds one lease while the fetch thread asks for the next
        # one
        builds: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch) if direct else buf

        def put(q: queue.Queue[Any], item: Any) -> None:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def builder() -> None:
            try:
                while not stop.is_set():
                    try:
                        item = builds.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if item is not _END:
                        lease, runs = item
                        lease.tables = self._build_direct(runs)
                        item = lease
                    put(buf, item)
                    if item is _END:
                        return
            except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
                errors.append(exc)
                buf.put(_END)

        def fetch() -> None:
            conn = http(self.reconnect_s)
            base = [
                ("client", self.client_id),
                ("rank", self.rank),
                ("slot", self.slot),
                ("slots", self.slots),
            ]
            if self.transport == "direct":
                base.append(("transport", "direct"))
            deadline_503 = time.monotonic() + self.reconnect_s
            try:
                while not stop.is_set():
                    sent = self._pending()[:64]
                    try:
                        res = conn.request(
                            "GET",
                            f"{path}/next",
                            ok=(200, 204, 409),
                            query=base
                            + [
                                ("ack", f"{lid}:{fence}:{a}-{b}")
                                for lid, fence, a, b in _ranges(sent)
                            ][:64],
                        )
                    except RemoteError as exc:
                        if exc.status != 503 or time.monotonic() > deadline_503:
                            raise
                        stop.wait(
                            1.0
                        )  # the journal cannot be written now (a full disk): wait and retry
                        continue
                    deadline_503 = time.monotonic() + self.reconnect_s
                    self._record_acks(res.headers.get("x-datamill-acks", ""), sent, held, lost)
                    if res.status == 204:
                        put(builds, _END)
                        return
                    if res.status == 409:
                        stop.wait(0.02)
                        continue
                    h = res.headers
                    tables = (
                        []
                        if direct
                        else [pa.Table.from_batches([b]) for b in pa.ipc.open_stream(res.body)]
                    )
                    q, _, span = h["x-datamill-positions"].partition(":")
                    lease = _Lease(
                        h["x-datamill-lease"],
                        h["x-datamill-fence"],
                        int(q),
                        int(span.split("-")[0]),
                        [int(u) for u in h["x-datamill-units"].split(",")],
                        tables,
                        int(h.get("x-datamill-done", "0")),
                    )
                    with self._state_lock:
                        held[lease.id] = lease  # heartbeats keep it while it is built (direct mode)
                    put(builds, (lease, h["x-datamill-runs"]) if direct else lease)
            except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
                errors.append(exc)
                put(builds, _END)
            finally:
                conn.close()

        def heartbeat() -> None:
            conn = http(0.0)
            every = max(0.1, min(1.0, lease_timeout / 4))
            last = time.monotonic()
            try:
                while not stop.wait(ACK_FLUSH_S):
                    try:
                        self._flush_once(conn, path, held, lost)
                        if time.monotonic() - last >= every:
                            last = time.monotonic()
                            with self._state_lock:
                                ids = [[x.id, x.fence] for x in held.values()]
                            res = conn.request(
                                "POST",
                                f"{path}/heartbeat",
                                ok=(200, 409, 410),
                                body={
                                    "client": self.client_id,
                                    "leases": ids,
                                    "stall_s": self.stall_s,
                                    "batches": self.stats["batches"],
                                },
                            )
                            with self._state_lock:
                                lost.update(res.json().get("lost", []))
                                lost.update(res.json().get("refused", []))
                    except RemoteError:
                        # the server may be restarting (or out of disk): try again next round
                        continue
            finally:
                conn.close()

        threads = (
            [threading.Thread(target=builder, name="datamill-serve-build", daemon=True)]
            if direct
            else []
        )
        threads += [
            threading.Thread(target=fetch, name="datamill-serve-fetch", daemon=True),
            threading.Thread(target=heartbeat, name="datamill-serve-heartbeat", daemon=True),
        ]
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
                with self._state_lock:
                    if self.mode == "static" and lease.done_before > self._consumed:
                        self._yielded.update(range(self._consumed, lease.done_before))
                    self._consumed = max(self._consumed, lease.done_before)
                for i, table in enumerate(lease.tables):
                    pos = lease.start + i
                    with self._state_lock:
                        is_lost = lease.id in lost
                    if (
                        is_lost and self.mode == "dynamic"
                    ):  # the server gives the rest to someone else
                        self.stats["dropped_lost"] += len(lease.tables) - i
                        with self._state_lock:
                            held.pop(lease.id, None)
                        break
                    if self.mode == "static" and pos in self._yielded:
                        self.stats["skipped_duplicates"] += 1
                    else:
                        with self._state_lock:
                            self._current = (lease.id, lease.fence, pos)
                            if self.mode == "static":
                                self._yielded.add(pos)
                                while self._consumed in self._yielded:
                                    self._consumed += 1
                            else:
                                self._consumed += 1
                        self.stats["batches"] += 1
                        yield self.collate_fn(table)
                    with self._state_lock:  # the loop came back: the batch is consumed
                        self._current = None
                        self._unflushed.append((lease.id, lease.fence, pos))
                with self._state_lock:
                    if not any(x[0] == lease.id for x in self._unflushed):
                        held.pop(lease.id, None)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5)
            if not errors and self._pending():
                conn = http(min(self.reconnect_s, 10.0))
                try:
                    deadline = time.monotonic() + min(self.reconnect_s, 10.0)
                    while self._pending() and time.monotonic() < deadline:
                        try:
                            self._flush_once(conn, path, held, lost)
                        except RemoteError:
                            time.sleep(
                                0.2
                            )  # unflushed batches are re-issued: at-least-once, never lost
                finally:
                    conn.close()

    def _pending(self) -> list[tuple[str, str, int]]:
        with self._state_lock:
            return list(self._unflushed)

    def _flush_once(self, conn: Http, path: str, held: dict[str, _Lease], lost: set[str]) -> None:
        """Send the consumed batches not yet journaled (one request, one journal transaction)."""
        sent = self._pending()
        if not sent:
            return
        res = conn.request(
            "POST",
            f"{path}/ack",
            ok=(200, 409, 410),
            body={"client": self.client_id, "acks": _ranges(sent)},
        )
        acks = res.json().get("acks", {})
        self._record_acks(",".join(f"{k}={v}" for k, v in acks.items()), sent, held, lost)

    def _record_acks(
        self,
        header: str,
        sent: Sequence[tuple[str, str, int]],
        held: dict[str, _Lease],
        lost: set[str],
    ) -> None:
        """Forget the acks the server answered; note lost leases; report commits to
        ``on_commit``."""
        statuses = dict(item.rpartition("=")[::2] for item in filter(None, header.split(",")))
        if not statuses:
            return
        done = [x for x in sent if x[0] in statuses]
        with self._state_lock:
            gone = set(done)
            self._unflushed = [x for x in self._unflushed if x not in gone]
            for lease_id, status in statuses.items():
                counts = self.stats["acks"]
                counts[status] = counts.get(status, 0) + 1
                if status in ("expired", "refused"):
                    lost.add(lease_id)
            leases = {lid: held.get(lid) for lid in statuses}
            left = {x[0] for x in self._unflushed} | (
                {self._current[0]} if self._current else set()
            )
            for lid, lease in leases.items():
                if (
                    lease is not None
                    and lid not in left
                    and lease.start + len(lease.tables) - 1 in {p for x, _, p in done if x == lid}
                ):
                    held.pop(lid, None)
        if self.on_commit is not None:
            for lid, lease in leases.items():
                if statuses[lid] == "ok" and lease is not None:
                    self.on_commit([lease.units[p - lease.start] for x, _, p in done if x == lid])


def _ranges(acks: Any) -> list[list[Any]]:
    """Consumed ``(lease, fence, position)`` as ``[lease, fence, start, stop]`` runs."""
    out: list[list[Any]] = []
    for lid, fence, pos in sorted(set(acks), key=lambda x: (x[0], x[2])):
        if out and out[-1][0] == lid and out[-1][3] == pos:
            out[-1][3] = pos + 1
        else:
            out.append([lid, fence, pos, pos + 1])
    return out
