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

from datamill.client.direct import DirectBuilds
from datamill.client.feed import END, HeldLease, LeaseFeed, ack_ranges
from datamill.client.http import Client, Http
from datamill.client.options import Leases, Transport, served_batching
from datamill.core.errors import ConfigError, ResumeStateError
from datamill.core.wire import SESSION_HEADER
from datamill.loader.collate import resolve_collate
from datamill.loader.collate_lease import collate_numpy_batches, collate_torch_batches
from datamill.loader.options import Batching
from datamill.loader.runs import close_iterator

__all__ = ["SERVE_STATE_FORMAT", "RemoteLoader"]

SERVE_STATE_FORMAT = "datamill.serve/1"

_LEASE_COLLATE: dict[str, Callable[[list[pa.RecordBatch]], list[Any]]] = {
    "numpy": collate_numpy_batches,
    "torch": collate_torch_batches,
}
"""Server-built mode: the collates a lease is collated with as a whole, in the fetch thread (each
column converted once per lease; the same arrays as the collate per batch)."""


def _groups(
    leases: Leases | None, transport: Transport | None, *, rank: int, batch_size: int = 1
) -> tuple[Leases, Transport]:
    """The option groups of a :class:`RemoteLoader` (defaults for ``None``; the leases sized for
    the transport, as the loader creates its iteration with them), and ``rank`` within them."""
    t = Transport() if transport is None else transport
    if not isinstance(leases, (Leases, type(None))) or not isinstance(t, Transport):
        raise ConfigError(
            f"leases must be a Leases and transport a Transport, got "
            f"{type(leases).__name__} and {type(t).__name__}",
            hint="from datamill.client import Leases, Transport",
        )
    sized = (Leases() if leases is None else leases).sized_for(
        t.kind, ack_window=t.ack_window, batch_size=batch_size
    )
    if not 0 <= rank < sized.world_size:
        raise ConfigError(f"rank must be in [0, world_size={sized.world_size}), got {rank}")
    return sized, t


def _same(batch: Any) -> Any:
    return batch


def _client_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:24] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def _last_ack(lease_id: str, lease: HeldLease) -> tuple[str, str, int]:
    """The ack of ``lease``'s last batch: ``(lease, fence, position)``."""
    return (lease_id, lease.fence, lease.start + len(lease.units) - 1)


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
        collate: ``"numpy"``, ``"torch"``, ``"arrow"`` or a callable on the batch ``pa.Table``.
            Defaults to ``"numpy"``.
        rank: this process's rank in a static iteration (``0 <= rank < leases.world_size``).
            Defaults to ``0``.
        batching: what a batch holds, as for the Loader: a served iteration applies its
            ``shuffle``, ``drop_last`` and shuffle ``window`` and refuses its other settings
            (:func:`~datamill.client.options.served_batching`). Defaults to ``Batching()``.
        leases: how the server deals the iteration: mode, world size, name, lease size and
            timeout (:class:`~datamill.client.options.Leases`). Defaults to ``Leases()`` (static,
            one rank; leases of :data:`~datamill.client.options.LEASE_BYTES` server-built,
            :data:`~datamill.client.options.LEASE_SIZE` batches direct).
        transport: how the batches reach this process: built by the server or by this process
            (direct), prefetch, ack window, reconnection, TLS, the direct shard cache, the
            DataLoader worker slot, a commit callback (:class:`~datamill.client.options.Transport`).
            Defaults to ``Transport()``.

    Raises:
        ConfigError: invalid arguments. RemoteError: the server refused or is unreachable.

    Examples:
        >>> from datamill.client import Leases, Transport
        >>> loader = RemoteLoader("http://127.0.0.1:8470", None, "cifar", batch_size=32, rank=1,
        ...                       leases=Leases(world_size=2), transport=Transport("direct"))
        >>> loader.mode, loader.leases.world_size, loader.transport.kind
        ('static', 2, 'direct')
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
        collate: str | Callable[[pa.Table], Any] = "numpy",
        rank: int = 0,
        batching: Batching | None = None,
        leases: Leases | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.leases, self.transport = _groups(leases, transport, rank=rank, batch_size=batch_size)
        self.batching = Batching() if batching is None else batching
        self.url, self.key, self.dataset = url, key, dataset
        # the iteration this loader creates or joins (with its epoch)
        self._spec: dict[str, Any] = {
            "batch_size": int(batch_size),
            "seed": int(seed),
            "columns": [columns] if isinstance(columns, str) else columns,
            "batching": self.batching,
            "leases": self.leases,
            "transport": self.transport.kind,
        }
        self._served = served_batching(self.batching)  # refused now when the server cannot apply it
        t = self.transport
        self.epoch, self.rank, self.mode = int(epoch), int(rank), self.leases.mode
        self.collate_fn = resolve_collate(collate)
        self.lease_collate = _LEASE_COLLATE.get(collate) if isinstance(collate, str) else None
        # numpy/torch arrays are the same however a batch's columns were cut: a direct client
        # collates its batches as it builds them, a block at a time (a callable or "arrow" gets the
        # server-built form)
        self._direct = (
            DirectBuilds(
                cache_dir=t.cache_dir,
                cache_limit=t.cache_limit,
                collate=collate if isinstance(collate, str) else None,
            )
            if t.kind == "direct"
            else None
        )
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
            "slot": self.transport.slot,
            "slots": self.transport.slots,
            "mode": self.mode,
            "consumed": 0 if between else consumed,
            "world_size": self.leases.world_size,
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
            self.leases.world_size,
            1,
        ):
            raise ResumeStateError(
                f"state of rank {state['rank']}/{state['world_size']} (slots {state['slots']}) "
                f"does not fit rank {self.rank}/{self.leases.world_size}"
            )
        self.epoch = int(state["epoch"])
        self._resume = dict(state) if state.get("iteration") else None

    # ------------------------------------------------------------------ iteration
    def _join(self, client: Client) -> dict[str, Any]:
        return client.iteration(self.dataset, epoch=self.epoch, **self._spec)

    def _resume_at(self, client: Client, it_id: str, resume: Mapping[str, Any]) -> None:
        """Put the iteration back where the saved state was: a static rank's prefix; a dynamic
        state's unflushed batches acknowledged, then what its session consumed after it served
        again."""
        if self.mode == "static":
            client.resume(it_id, rank=self.rank, consumed=int(resume["consumed"]))
        elif resume.get("unflushed"):  # acknowledged in the saved session, as its flush would have
            t = self.transport
            old = Http(self.url, self.key, retry_s=min(t.reconnect_s, 10.0), verify=t.verify)
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
        client = Client(self.url, self.key, verify=self.transport.verify)
        client.http.retry_s = self.transport.reconnect_s
        client.http.headers[SESSION_HEADER] = self.session
        try:
            if self._resume is None and self._plans_early():
                info = self._join_while_planning(client)
            elif self._resume is None and self._opens_early():
                info = self._join_while_opening(client)
            else:
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
            if self._direct is not None:
                self._direct.open(client, self._cfg, name=self.dataset)
        finally:
            client.close()
        self._in_epoch = True
        yield from self._run(it_id, timeout)
        self._in_epoch = False  # the epoch ended: the state is the start of the next one
        self.epoch += 1
        self._consumed = 0

    def _run(self, it_id: str, lease_timeout: float) -> Iterator[Any]:
        """The epoch's batches, from the leases the background threads fetch."""
        if self._direct is not None:
            self._direct.start_epoch(self._cfg, follow=self.mode == "static")
        feed = LeaseFeed(
            self,
            it_id,
            lease_timeout,
            direct=self._direct is not None,
            ack_window=self.transport.ack_window,
            lease_size=int(self._cfg.get("lease_size", 16)),
        )
        feed.start()
        try:
            if self._direct is not None and self.mode == "static" and self.transport.slots == 1:
                # the first batch is built while the first lease's round trip is in flight
                self._direct.prime(
                    self._cfg, rank=self.rank, world=self.leases.world_size, batch=self._consumed
                )
            while True:
                t0 = time.perf_counter()
                lease = feed.take()
                self.stall_s += time.perf_counter() - t0
                if lease is END:
                    feed.raise_error()
                    return
                yield from self._yield_lease(lease, feed)
                if self._rank_done() and not feed.errors and feed.flush_all():
                    self.stats["ended_by_acks"] += 1  # the rank's batches taken and journaled
                    return
        finally:
            feed.close()
            if self._direct is not None:
                self._direct.end_epoch()

    def _rank_done(self) -> bool:
        """Static mode: every batch of the rank was yielded (here or by a predecessor) and the loop
        came back, so once its acks are journaled the epoch ends without waiting for the server's
        204 (a request more, after a 409 and a wait). With slots, the others' batches are not
        counted here: the 204 ends it."""
        with self._state_lock:
            total, consumed = self._queue_total, self._consumed
        return self.mode == "static" and total is not None and consumed >= total

    def _plans_early(self) -> bool:
        """Direct static mode, the dataset open: whether this rank's plan of the epoch about to
        start is made while its join is in flight (the plan is pure: a join answering another
        epoch only leaves it unused). It is not planned ahead during the previous epoch: planning
        holds the GIL, so that epoch's batches would pay for it, as the in-process Loader's
        epochs pay each for its own plan."""
        if self._direct is None or self.mode != "static" or not self._cfg:
            return False
        world = int(self._cfg["plan_world"])
        return world == self.leases.world_size and self._direct.is_open()

    def _opens_early(self) -> bool:
        """Direct mode, the dataset not open yet (a loader's first epoch): whether the copy is
        opened while the join is in flight (:meth:`_join_while_opening`)."""
        return self._direct is not None and not self._direct.is_open()

    def _join_aside(self, client: Client, here: Callable[[], None]) -> dict[str, Any]:
        """The join (:meth:`_join`) sent from a helper thread while this thread runs ``here()``:
        the join's answer, or its error raised here."""
        out: dict[str, Any] = {}

        def join() -> None:
            try:
                out["info"] = self._join(client)
            except BaseException as exc:  # noqa: BLE001 - raised in the loop's thread below
                out["error"] = exc

        thread = threading.Thread(target=join, name="datamill-join", daemon=True)
        thread.start()
        try:
            here()
        finally:
            thread.join()
        if "error" in out:
            raise out["error"]
        return dict(out["info"])

    def _join_while_planning(self, client: Client) -> dict[str, Any]:
        """The join sent from a helper thread while this thread plans the epoch
        (:meth:`DirectBuilds.plan_ahead <datamill.client.direct.DirectBuilds.plan_ahead>`); its
        answer. (The copy's identity check stays after both: run in the helper beside the plan,
        its footer reads slowed the plan by about what they took, 8-12 ms for 300 files.)"""
        direct = self._direct
        assert direct is not None
        world = int(self._cfg["plan_world"])
        return self._join_aside(client, lambda: direct.plan_ahead(self.epoch, self.rank, world))

    def _join_while_opening(self, client: Client) -> dict[str, Any]:
        """A loader's first epoch in direct mode: the join sent from a helper thread while this
        thread asks for the dataset's location on a second connection, checks the copy there and
        opens it (:meth:`DirectBuilds.preopen <datamill.client.direct.DirectBuilds.preopen>`:
        the open, 0.15 s for 300 shards, no longer waits for the join's round trips). The join's
        answer."""
        direct = self._direct
        assert direct is not None
        here = Client(self.url, self.key, verify=self.transport.verify)
        here.http.headers[SESSION_HEADER] = self.session

        def preopen() -> None:
            try:
                info = here.location_info(self.dataset)
            except Exception:  # noqa: BLE001 - the join asks again, and raises there
                return
            direct.preopen(info, name=self.dataset)

        try:
            return self._join_aside(client, preopen)
        finally:
            here.close()

    def _yield_lease(self, lease: HeldLease, feed: LeaseFeed) -> Iterator[Any]:
        """A lease's batches not yielded before (static) and not lost (dynamic); each acknowledged
        as it is handed out, and handed out only once the previous one's acknowledgement was
        answered and before the lease's deadline (:meth:`LeaseFeed.wait_yieldable`)."""
        self.stats["leases"] += 1
        with self._state_lock:
            if self.mode == "static" and lease.done_before > self._consumed:
                self._yielded.update(range(self._consumed, lease.done_before))
            self._consumed = max(self._consumed, lease.done_before)
        if self._direct is not None:  # collated as built (numpy, torch), or tables
            tables = self._direct.batches(lease.runs)
            collate = self.collate_fn if self._direct.block is None else _same
        else:  # server-built: per-batch tables, or batches collated with the lease
            tables, collate = iter(lease.batches), _same if lease.collated else self.collate_fn
        dynamic, clock = self.mode == "dynamic", time.perf_counter  # read once a lease
        try:
            for i in range(len(lease.units)):
                pos = lease.start + i
                if dynamic and self._dropped(lease, feed, i):
                    break
                t0 = clock()
                table = next(tables)
                self.stats["build_s"] += clock() - t0
                if not dynamic and pos in self._yielded:
                    self.stats["skipped_duplicates"] += 1
                    with self._state_lock:
                        self._unflushed.append((lease.id, lease.fence, pos))
                    feed.taken()
                    continue
                batch = collate(table)  # built and collated while the previous ack is in flight
                waited = feed.wait_yieldable(lease)
                self.stats["ack_wait_s"] += waited
                self.stall_s += waited
                if dynamic and self._dropped(lease, feed, i):
                    break
                self._take(lease, pos)
                feed.taken()
                yield batch
        finally:
            close_iterator(tables)
        with self._state_lock:
            if not any(x[0] == lease.id for x in self._unflushed):
                feed.held.pop(lease.id, None)
        feed.lease_done()  # a fetch waiting for the others' leases (409) asks again with these acks

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
        gone = set(done)  # made before the lock: the loop takes it at each batch
        with self._state_lock:
            self._unflushed = [x for x in self._unflushed if x not in gone]
            counts = self.stats["acks"]
            for lease_id, status in statuses.items():
                counts[status] = counts.get(status, 0) + 1
                if self._loses(status):
                    lost.add(lease_id)
            leases = {lid: held.get(lid) for lid in statuses}
            left = {x[0] for x in self._unflushed}
            for lid, lease in leases.items():  # a lease whose last batch is answered is done
                if lease is not None and lid not in left and _last_ack(lid, lease) in gone:
                    held.pop(lid, None)
        self._report_commits(statuses, leases, done)

    def _loses(self, status: str) -> bool:
        """Whether an ack answered ``status`` means the rest of its lease is not this client's:
        expired or refused; in dynamic mode also ``"already"``, which answers a batch sent once,
        so the lease may have been finished by another client (after an expiry)."""
        return status in ("expired", "refused") or (status == "already" and self.mode == "dynamic")

    def _report_commits(
        self,
        statuses: dict[str, str],
        leases: dict[str, HeldLease | None],
        done: Sequence[tuple[str, str, int]],
    ) -> None:
        """``on_commit`` with the units of each lease whose acks the server journaled (``ok``)."""
        if self.transport.on_commit is None:
            return
        for lid, lease in leases.items():
            if statuses[lid] == "ok" and lease is not None:
                self.transport.on_commit(
                    [lease.units[p - lease.start] for x, _, p in done if x == lid]
                )
