"""``RemoteLoader``: the in-process Loader's batches, served by ``datamill serve``.

A background thread keeps ``prefetch`` leases (each ``lease_size`` batches in one Arrow IPC
response) ahead of the training loop. Every batch is **acknowledged on its own** as it is handed to
the loop (the ack is in flight while the loop trains on the batch), and the next batch is handed out
only once that acknowledgement is journaled (``ack_window`` batches in doubt, default 1) and only
before the lease's deadline by this process's clock: a client cut off from the server, paused or
killed repeats or loses at most the one batch in doubt. A heartbeat thread extends the leases held
(reporting the **stall time**, how long the loop waited for data) and, after a server restart,
reclaims them with their fences within the grace period.

Each loader has a random **session** secret (sent as ``X-Datamill-Session``); its leases can be
acknowledged or extended by no other session. A lease the server reports lost (expired, or not
reclaimed after a restart) is dropped in dynamic mode: the server hands its batches to someone else.

In static mode the batches are rank ``rank``'s batches of the in-process Loader, in order; a lease
re-issued after a server restart or an expiry whose positions were already yielded is acknowledged
without being yielded again. See ``docs/serving-delivery.md`` for the delivery contract.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.loader.collate import resolve_collate
from datamill.loader.collate_lease import collate_numpy_batches, collate_torch_batches
from datamill.serve.client import Client, Http
from datamill.serve.data.direct import TRANSPORTS, RunStream, close_iterator
from datamill.serve.feed import (
    ACK_FLUSH_S,
    END,
    SESSION_HEADER,
    HeldLease,
    LeaseFeed,
    ack_ranges,
)

__all__ = [
    "ACK_FLUSH_S",
    "DIRECT_CACHE_LIMIT",
    "DIRECT_LEASE_SIZE",
    "LEASE_BYTES",
    "LEASE_SIZE",
    "SERVE_STATE_FORMAT",
    "RemoteLoader",
    "default_lease_size",
]

DIRECT_CACHE_LIMIT = 8 << 30
"""Bytes of ``s3://`` shards a direct-mode client keeps in its local cache at most (8 GiB)."""

SERVE_STATE_FORMAT = "datamill.serve/1"
LEASE_SIZE = 64
"""Batches per lease of a direct-mode iteration by default. A lease round trip (a journal commit on
the server) costs about what building 10-20k samples does; the next lease is built by the client
while this one is consumed, so a lease must carry more work than a round trip. Each lease's batches
are held in memory (``prefetch`` + 1 leases): lower it for large samples."""
DIRECT_LEASE_SIZE = LEASE_SIZE
"""The direct-mode default, :data:`LEASE_SIZE` (kept for code that imports it)."""
LEASE_BYTES = 8 << 20
"""Bytes per lease a server-built iteration is sized for by default (8 MiB): the server picks
16-256 batches from the dataset's stored bytes per sample (64 when it cannot tell). A server-built
lease's round trip (the journal commit, the lease's bytes handed from a build worker to the HTTP
process and sent) costs the server and the client per lease, whatever the lease holds: small rows
take 256 batches a lease, large ones (images) 16, so a client holds ``prefetch`` + 1 leases of
about 8 MiB either way."""


def default_lease_size(transport: str) -> int | None:
    """Batches per lease when the loader creates the iteration and ``lease_size`` is not given:
    :data:`LEASE_SIZE` in direct mode; ``None`` in server-built mode (the server sizes leases to
    :data:`LEASE_BYTES`).

    Examples:
        >>> default_lease_size("built"), default_lease_size("direct")
        (None, 64)
    """
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}"
        )
    return LEASE_SIZE if transport == "direct" else None


def _lease_args(transport: str, lease_size: int | None) -> dict[str, int | None]:
    """The iteration's ``lease_size`` and ``lease_bytes`` when the loader creates it: the size
    given, else :func:`default_lease_size` (server-built: leases of :data:`LEASE_BYTES`)."""
    if lease_size is not None:
        return {"lease_size": lease_size, "lease_bytes": None}
    size = default_lease_size(transport)
    return {"lease_size": size, "lease_bytes": LEASE_BYTES if size is None else None}


_LEASE_COLLATE: dict[str, Callable[[list[pa.RecordBatch]], list[Any]]] = {
    "numpy": collate_numpy_batches,
    "torch": collate_torch_batches,
}
"""Server-built mode: the collates a lease is collated with as a whole, in the fetch thread (each
column converted once per lease; the same arrays as the collate per batch)."""


def _check_args(
    transport: str, rank: int, world: int, prefetch: int, window: int, slot: int, slots: int
) -> None:
    """Refuse a ``RemoteLoader``'s invalid arguments with a :class:`ConfigError`."""
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}"
        )
    if not 0 <= rank < world:
        raise ConfigError(f"rank must be in [0, world_size={world}), got {rank}")
    if prefetch < 1 or window < 1 or not 0 <= slot < slots:
        raise ConfigError(
            "need prefetch >= 1, ack_window >= 1 and 0 <= slot < slots, got "
            f"{prefetch}, {window}, {slot}, {slots}"
        )


def _same(batch: Any) -> Any:
    return batch


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
        lease_size: batches per lease when this call creates the iteration. Defaults to ``None``:
            in server-built mode leases of about :data:`LEASE_BYTES` (8 MiB: 16 to 256 batches,
            from the dataset's bytes per sample), in direct mode :data:`LEASE_SIZE` (``64``), so
            that a lease carries more work than the round trip for the next one (``prefetch`` + 1
            leases are held).
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
        ack_window: batches handed to the loop whose acknowledgements may be unanswered at once:
            the batches a client cut off from the server may have trained on that the server
            hands to another client (see ``docs/serving-delivery.md``). Defaults to ``1`` (the
            next batch waits for the previous one's acknowledgement, which is sent as the batch
            is handed out: free when a training step is longer than a round trip).

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
        lease_size: int | None = None,
        lease_timeout: float | None = None,
        slot: int = 0,
        slots: int = 1,
        reconnect_s: float = 120.0,
        on_commit: Callable[[list[int]], None] | None = None,
        verify: str | os.PathLike[str] | None = None,
        transport: str = "built",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int = DIRECT_CACHE_LIMIT,
        ack_window: int = 1,
    ) -> None:
        _check_args(transport, rank, world_size, prefetch, ack_window, slot, slots)
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
            **_lease_args(transport, lease_size),
            "lease_timeout": lease_timeout,
        }
        self.epoch, self.rank, self.slot, self.slots = int(epoch), int(rank), int(slot), int(slots)
        self.mode, self.prefetch, self.reconnect_s = mode, int(prefetch), float(reconnect_s)
        self.ack_window = int(ack_window)
        self.collate_fn = resolve_collate(collate)
        # numpy/torch arrays are the same however a batch's columns were cut: a direct client hands
        # the built table to them as it is (a callable or "arrow" gets the server-built form)
        self._values_only = isinstance(collate, str) and collate in ("numpy", "torch")
        self.lease_collate = _LEASE_COLLATE.get(collate) if isinstance(collate, str) else None
        self.on_commit = on_commit
        self.transport, self.cache_dir, self.cache_limit = transport, cache_dir, int(cache_limit)
        self._direct: tuple[str, Any] | None = None  # (service key, BatchService) of direct mode
        self._stream: RunStream | None = None  # direct mode: this epoch's builds
        self._planner: threading.Thread | None = None  # direct mode: plans the next epoch
        self._cfg: dict[str, Any] = {}
        self.client_id = _client_id()
        self.session = secrets.token_hex(16)
        self.iteration_id: str | None = None
        self._queue_total: int | None = None
        self._in_epoch = False
        # (lease, fence, position) handed to the loop (or skipped), acknowledgement unanswered
        self._unflushed: list[tuple[str, str, int]] = []
        self._resume: dict[str, Any] | None = None
        self._yielded: set[int] = set()  # positions of the rank's queue already yielded (static)
        self._consumed = 0
        self._state_lock = threading.Lock()
        self.stall_s = 0.0
        self.stats: dict[str, Any] = {
            "leases": 0,
            "batches": 0,
            "skipped_duplicates": 0,
            "dropped_lost": 0,
            "acks": {},
            "build_s": 0.0,  # seconds the loop waited for a batch of a lease held (direct: built)
            "ended_by_acks": 0,  # static epochs ended once their last acks were journaled (no 204)
            "ack_wait_s": 0.0,  # seconds the loop waited for an ack (or a lease's extension)
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
            unflushed = [list(x) for x in self._unflushed]
            consumed = self._consumed
        done = (
            self._queue_total is not None
            and self.mode == "static"
            and consumed >= self._queue_total
        )
        between = not self._in_epoch or done  # between epochs: no iteration, nothing consumed
        state: dict[str, Any] = {
            "format": SERVE_STATE_FORMAT,
            "iteration": None if between else self.iteration_id,
            "epoch": self.epoch + (1 if done else 0),
            "rank": self.rank,
            "slot": self.slot,
            "slots": self.slots,
            "mode": self.mode,
            "consumed": 0 if between else consumed,
            "world_size": self.iter_args["world_size"],
        }
        if not between and self.mode == "dynamic":
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

    def _resume_at(self, client: Client, it_id: str, resume: Mapping[str, Any]) -> None:
        """Put the iteration back where the saved state was: a static rank's prefix; a dynamic
        state's unflushed batches acknowledged, then what its session consumed after it served
        again."""
        if self.mode == "static":
            client.resume(it_id, rank=self.rank, consumed=int(resume["consumed"]))
        elif resume.get("unflushed"):  # acknowledged in the saved session, as its flush would have
            old = Http(self.url, self.key, retry_s=min(self.reconnect_s, 10.0), verify=self.verify)
            old.headers[SESSION_HEADER] = str(resume.get("session", ""))
            try:
                old.request(
                    "POST",
                    f"/api/v1/iterations/{it_id}/ack",
                    ok=(200, 409, 410),
                    body={
                        "client": self.client_id,
                        "acks": ack_ranges(tuple(x) for x in resume["unflushed"]),
                    },
                )
            finally:
                old.close()
        if self.mode == "dynamic" and resume.get("session"):  # back to the checkpoint
            client.resume(
                it_id,
                rank=self.rank,
                consumed=int(resume["consumed"]),
                session=str(resume["session"]),
            )

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
                self._resume_at(client, it_id, resume)
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
        from datamill.serve.data.direct import service_for
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
            self._direct = (key, service_for(source, cfg, ranks=1))
        return self._direct[1]

    def _direct_tables(self, lease: HeldLease) -> Iterator[pa.Table]:
        """A direct lease's batches, built here as the loop asks for them, as the server builds them
        (one contiguous record batch each, of the lease's first batch's schema; for a numpy or torch
        collate only the schema matters)."""
        from datamill.serve.data.direct import as_table, parse_runs

        assert self._stream is not None
        schema = None
        for table in self._stream.batches(parse_runs(lease.runs)):
            schema = table.schema if schema is None else schema
            if not self._values_only or not table.schema.equals(schema):
                table = as_table(table, schema)
            yield table

    def _run(self, it_id: str, lease_timeout: float) -> Iterator[Any]:
        """The epoch's batches, from the leases the background threads fetch."""
        if self.transport == "direct":
            assert self._direct is not None
            self._stream = RunStream(self._direct[1], self._cfg, follow=self.mode == "static")
        feed = LeaseFeed(
            self, it_id, lease_timeout, direct=self._stream is not None, ack_window=self.ack_window
        )
        feed.start()
        planned = self._stream is None
        try:
            while True:
                t0 = time.perf_counter()
                lease = feed.ready.get()
                self.stall_s += time.perf_counter() - t0
                if lease is END:
                    feed.raise_error()
                    return
                yield from self._yield_lease(lease, feed)
                if not planned:  # after the first lease: the epoch's own start has priority
                    planned = True
                    self._plan_next_epoch()
                if self._rank_done() and not feed.errors and feed.flush_all():
                    self.stats["ended_by_acks"] += 1  # the rank's batches taken and journaled
                    return
        finally:
            feed.close()
            if self._stream is not None:
                self._stream.close()
                self._stream = None

    def _rank_done(self) -> bool:
        """Static mode: every batch of the rank was yielded (here or by a predecessor) and the loop
        came back, so once its acks are journaled the epoch ends without waiting for the server's
        204 (a request more, after a 409 and a wait). With slots, the others' batches are not
        counted here: the 204 ends it."""
        with self._state_lock:
            total, consumed = self._queue_total, self._consumed
        return self.mode == "static" and total is not None and consumed >= total

    def _plan_next_epoch(self) -> None:
        """Direct static mode: this rank's plan of the next epoch, computed by a background thread
        while this epoch runs (the batch service keeps two epochs' plans), so that the next epoch's
        first batch does not wait for it (the in-process Loader plans when its epoch starts)."""
        assert self._direct is not None
        svc, world = self._direct[1], int(self._cfg["plan_world"])
        if self.mode != "static" or world != int(self.iter_args["world_size"]):
            return
        epoch, rank = int(self._cfg["epoch"]) + 1, self.rank

        def plan() -> None:
            try:
                svc.plan(epoch, rank, world)
            except Exception:  # noqa: BLE001 - the next epoch plans again, and raises there
                return

        self._planner = threading.Thread(target=plan, name="datamill-plan-ahead", daemon=True)
        self._planner.start()

    def _yield_lease(self, lease: HeldLease, feed: LeaseFeed) -> Iterator[Any]:
        """A lease's batches not yielded before (static) and not lost (dynamic); each acknowledged
        as it is handed out, and handed out only once the previous one's acknowledgement was
        answered and before the lease's deadline (:meth:`LeaseFeed.wait_yieldable`)."""
        self.stats["leases"] += 1
        with self._state_lock:
            if self.mode == "static" and lease.done_before > self._consumed:
                self._yielded.update(range(self._consumed, lease.done_before))
            self._consumed = max(self._consumed, lease.done_before)
        if self._stream is not None:
            tables, collate = self._direct_tables(lease), self.collate_fn
        else:  # server-built: per-batch tables, or batches collated with the lease
            tables, collate = iter(lease.batches), _same if lease.collated else self.collate_fn
        try:
            for i in range(len(lease.units)):
                pos = lease.start + i
                if self._dropped(lease, feed, i):
                    break
                t0 = time.perf_counter()
                table = next(tables)
                self.stats["build_s"] += time.perf_counter() - t0
                if self.mode == "static" and pos in self._yielded:
                    self.stats["skipped_duplicates"] += 1
                    with self._state_lock:
                        self._unflushed.append((lease.id, lease.fence, pos))
                    feed.taken()
                    continue
                batch = collate(table)  # built and collated while the previous ack is in flight
                waited = feed.wait_yieldable(lease)
                self.stats["ack_wait_s"] += waited
                self.stall_s += waited
                if self._dropped(lease, feed, i):
                    break
                self._take(lease, pos)
                feed.taken()
                yield batch
        finally:
            close_iterator(tables)
        with self._state_lock:
            if not any(x[0] == lease.id for x in self._unflushed):
                feed.held.pop(lease.id, None)
        feed.acked.set()  # a fetch waiting for the others' leases (409) asks again with these acks

    def _dropped(self, lease: HeldLease, feed: LeaseFeed, i: int) -> bool:
        """Dynamic mode: whether ``lease`` was lost (its rest, from batch ``i``, goes to someone
        else; a set's ``in`` is atomic)."""
        if self.mode != "dynamic" or lease.id not in feed.lost:
            return False
        self.stats["dropped_lost"] += len(lease.units) - i
        with self._state_lock:
            feed.held.pop(lease.id, None)
        return True

    def _take(self, lease: HeldLease, pos: int) -> None:
        """Position ``pos`` of ``lease`` is handed to the loop now: its acknowledgement is
        pending from now on."""
        with self._state_lock:
            self._unflushed.append((lease.id, lease.fence, pos))
            if self.mode == "static":
                self._yielded.add(pos)
                while self._consumed in self._yielded:
                    self._consumed += 1
            else:
                self._consumed += 1
        self.stats["batches"] += 1

    def _pending(self) -> list[tuple[str, str, int]]:
        with self._state_lock:
            return list(self._unflushed)

    def _unanswered(self) -> int:
        """Acknowledgements sent or to send, not answered yet (call under ``_state_lock``)."""
        return len(self._unflushed)

    def _record_acks(
        self,
        header: str,
        sent: Sequence[tuple[str, str, int]],
        held: dict[str, HeldLease],
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
                # dynamic mode: "already" answers a batch sent once, so the lease may have been
                # finished by another client (after an expiry): its rest is not this client's
                if status in ("expired", "refused") or (
                    status == "already" and self.mode == "dynamic"
                ):
                    lost.add(lease_id)
            leases = {lid: held.get(lid) for lid in statuses}
            left = {x[0] for x in self._unflushed}
            for lid, lease in leases.items():
                if (
                    lease is not None
                    and lid not in left
                    and lease.start + len(lease.units) - 1 in {p for x, _, p in done if x == lid}
                ):
                    held.pop(lid, None)
        if self.on_commit is not None:
            for lid, lease in leases.items():
                if statuses[lid] == "ok" and lease is not None:
                    self.on_commit([lease.units[p - lease.start] for x, _, p in done if x == lid])
