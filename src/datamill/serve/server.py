"""The server's logic without HTTP: :class:`ServeState`, the protocol's driver (the round trip:
leases as Arrow IPC, acknowledgements, heartbeats, rewinds and rollbacks, the journal writes) over
the datasets and iterations of :class:`datamill.serve.catalog.Catalog`. The HTTP app exposes it; it
can be used (and is tested) directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from anyio import to_thread
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DatamillError, ResumeStateError
from datamill.serve.catalog import (
    Catalog,
    ConflictError,
    NotFoundError,
)
from datamill.serve.data.workers import lease_body
from datamill.serve.journal.leases import (
    UnavailableError,
    Write,
    leases_write,
    rewind_write,
)
from datamill.serve.protocol.iteration import Iteration, finish, plan
from datamill.serve.protocol.state import AckItem, Lease, Planned, Take, session_digest

__all__ = [
    "ARROW_STREAM",
    "CancelledError",
    "ConflictError",
    "LeasePayload",
    "NotFoundError",
    "ServeState",
    "UnavailableError",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_POLL_S = 0.002  # how often a round trip waiting for another's acks in flight plans again
SESSION_CLOSED_S = 1.5
"""Seconds a session's leases live after its every connection was closed by its peer (at most the
lease timeout): a live client's next heartbeat (every second at most) reclaims them meanwhile."""


class CancelledError(DatamillError, RuntimeError):
    """The iteration was cancelled: it hands out no more leases (HTTP 410)."""


@dataclass
class LeasePayload:
    """A lease and its batches as one Arrow IPC stream (one record batch per batch)."""

    lease: Lease
    units: list[int]
    body: bytes | pa.Buffer
    epoch: int
    runs: list[tuple[int, int, int]] | None = None  # (plan rank, first, stop batch) to build
    done: int = 0  # its queue's done prefix (static mode) or done batches (dynamic mode)


class ServeState(Catalog):
    """Datasets, iterations and keys of one server (see the module docstring).

    Args:
        state_dir: folder of the journal (created).
        roots: folders datasets may be registered from (resolved; symlinks out of them refused).
        auth: require API keys. Defaults to ``True``.
        lease_timeout: default seconds a lease lives without a heartbeat. Defaults to ``60.0``.
        cache_shards: released shards each batch service keeps for later leases. Defaults to
            ``None`` (two shuffle windows per rank: a lease built after another reuses its shards
            instead of rereading them).
        build_workers: worker processes building server-built leases (each with its own shard
            cache), so builds run past this process's GIL; ``0`` builds in the request's thread.
            Defaults to ``0``.
        clock: the monotonic clock the driver reads for each event (the state machine reads none).
            Defaults to :func:`time.monotonic`.
    """

    def session_closed(self, secret: str) -> None:
        """Every connection of a client session was closed by the client (its process exited or
        was killed): its leases of every live iteration end :data:`SESSION_CLOSED_S` from now
        unless the session connects again meanwhile, so a crashed client's batches go to the
        others at once instead of after a lease timeout."""
        sess = session_digest(secret)
        with self._lock:
            live = list(self._iterations.values())
            self._closed.add(sess)
        for it in live:
            with self.lock(it):
                within = min(SESSION_CLOSED_S, it.lease_timeout)
                it.session_closed(sess, now=self.clock(), within=within)

    def session_opened(self, secret: str) -> None:
        """A client session opened a connection (after :meth:`session_closed`: it is alive)."""
        sess = session_digest(secret)
        if sess not in self._closed:
            return
        with self._lock:
            self._closed.discard(sess)
            live = list(self._iterations.values())
        for it in live:
            with self.lock(it):
                it.session_opened(sess)

    async def ack_batches(
        self,
        it: Iteration,
        items: Sequence[AckItem],
        *,
        session: str | None = None,
        client: str | None = None,
    ) -> tuple[dict[str, str], dict[str, list[tuple[int, int]]]]:
        """Acknowledge batches ``(lease, fence, start, stop)`` (queue positions; ``None``: the
        whole lease) of one session (its secret; ``client`` when ``None``): ``(status per lease,
        unit runs done)``.

        The units are journaled in **one transaction** (group-committed, see
        :mod:`datamill.serve.protocol.iteration`) before memory changes, so ``"already"`` is only
        ever answered for journaled acks; the journal is awaited without a thread.

        Raises:
            UnavailableError: the journal could not be written (nothing changed; retry later).
        """
        secret = session if session is not None else client if client is not None else ""
        p, _ = await asyncio.shield(self._trip(it, items, session_digest(secret), None))
        return p.statuses, p.units

    async def _trip(
        self,
        it: Iteration,
        items: Sequence[AckItem],
        session: str,
        take: Take | None,
        *,
        build: bool = False,
    ) -> tuple[Planned, LeasePayload | None]:
        """The one code path of every round trip (see :mod:`datamill.serve.protocol.iteration`):
        under the iteration's lock, read the clock, ask the protocol and queue its records as one
        journal write; wait for the write without the lock; build the lease (``build``); tell the
        protocol the write's outcome (undone: raised). The lease ``None``: none taken, or it
        expired while it was built."""
        lock = self.lock(it)
        while True:
            with lock:
                p = plan(it, items, session=session, take=take, now=self.clock())
                if p is not None:
                    r = p.records
                    w = None if r is None else self.writes.submit(leases_write(it.id, **vars(r)))
                    break
            await asyncio.sleep(_POLL_S)  # another request's acks of these are in flight
        error = None
        if w is not None:
            try:
                await self.writes.wait(w)
            except Exception as exc:  # noqa: BLE001 - undone, then raised
                error = exc
        lease, body, t0, ok = p.lease, b"", time.perf_counter(), error is None
        build = build and ok and lease is not None
        if build:  # the build blocks (a worker process, or the GIL for milliseconds): a thread
            body, error = await lease_body(self, it, p)  # failed: the write committed, so it is
            build = error is None  # settled, then raised; the lease, unheld, expires
        with lock:  # a built lease's clock starts when its holder gets it, not before its build
            settled = finish(it, p, ok=ok, now=self.clock(), built=build)
        self.telemetry.settled(it, settled)
        if error is not None:
            raise error
        if settled.ended:  # forget it (the journal keeps it; a later request rebuilds it)
            with self._lock:
                if self._iterations.get(it.id) is it:
                    del self._iterations[it.id]
            # its end's records (two fsync'd writes, ~8 ms) once this reply is written: the last
            # acknowledgement of an epoch is not held for them; a request this loop takes after
            # the reply sees them (the loop runs the callback first)
            asyncio.get_running_loop().call_soon(self.telemetry.ended, it, "finished")
        if lease is None or not settled.live:
            return p, None
        seconds = time.perf_counter() - t0 if build else 0.0
        self.telemetry.leased(it, reissued=p.reissued, nbytes=len(body), seconds=seconds)
        epoch = int(it.config["epoch"])
        return p, LeasePayload(lease, p.lease_units, body, epoch, p.runs, settled.done)

    def heartbeat(
        self,
        it: Iteration,
        client: str,
        *,
        leases: Sequence[tuple[str, str]] = (),
        session: str | None = None,
        stall_s: float | None = None,
        batches: int | None = None,
    ) -> dict[str, list[str]]:
        """Extend (or reclaim after a restart) a client's leases: ``{"lost": [...], "refused":
        [...]}``."""
        with self.lock(it):
            return it.heartbeat(
                client,
                leases=leases,
                session=session,
                stall_s=stall_s,
                batches=batches,
                now=self.clock(),
            )

    def cancel(self, it: Iteration) -> dict[str, Any]:
        """Cancel an iteration for good (journaled first): no more leases, live ones revoked."""
        self.journal.cancel(it.id)
        with self.lock(it):
            it.cancel()
        self.telemetry.ended(it, "cancelled")
        return self.progress(it)

    async def round_trip(
        self,
        it: Iteration,
        client: str,
        acks: Sequence[AckItem],
        *,
        rank: int = 0,
        slot: int = 0,
        slots: int = 1,
        session: str | None = None,
        owner: str = "",
        transport: str = "built",
    ) -> tuple[dict[str, str], LeasePayload | None]:
        """Acknowledge ``acks`` and take the client's next lease, journaled in **one** write (see
        :mod:`datamill.serve.protocol.iteration`): ``(status per acknowledged lease, the lease or
        None)``; a lease ``None`` when none is left for this client (see
        :meth:`Iteration.finished`) or others hold the rest.

        ``transport="built"`` (the default): the server builds the batches (in a thread);
        ``"direct"``: the lease carries only its runs (the client builds the batches), refused
        (:class:`ConfigError`) when the dataset has no client location. A take refused
        (cancelled, draining, a bad rank or slot) still acknowledges, then raises.
        """
        secret = client if session is None else session
        take = Take(client, rank=rank, slot=slot, slots=slots, session=secret, owner=owner)
        take.drain_s = self.drain_timeout or None  # leases a drain can see acknowledged
        statuses: dict[str, str] = {}
        while True:  # a take refused (cancelled, draining, a bad rank) still acknowledges
            refusal = self._refusal(it, transport, rank=rank, slot=slot, slots=slots)
            # shielded: a request cancelled meanwhile (its client gone) runs to its end, as a
            # server-built one does in its thread, so that memory stays the journal's
            p, payload = await asyncio.shield(
                self._trip(
                    it,
                    acks,
                    session_digest(secret),
                    take if refusal is None else None,
                    build=transport == "built",
                )
            )
            if refusal is not None:
                raise refusal
            statuses = statuses or p.statuses
            if p.lease is None or payload is not None:
                return statuses, payload
            acks = ()  # it expired while being built (a loaded machine), back in the queue

    def _refusal(
        self, it: Iteration, transport: str, *, rank: int, slot: int, slots: int
    ) -> DatamillError | None:
        """Why no lease may be taken now (raised after the request's acks), or ``None``."""
        if transport == "direct":
            try:
                self.client_location(str(it.config["dataset"]))
            except DatamillError as exc:
                return exc
        elif transport != "built":
            return ConfigError(f"unknown transport {transport!r}; expected one of built, direct")
        if it.cancelled:
            return CancelledError(
                f"iteration {it.id} was cancelled by an admin",
                hint="start a new iteration (another name or config)",
            )
        if self.draining:
            return UnavailableError(
                "the server is shutting down (draining): no new leases",
                hint="retry: the server that replaces this one hands out the rest",
            )
        if it.mode == "static" and not 0 <= rank < it.world_size:
            return ConfigError(f"rank must be in [0, {it.world_size}), got {rank}")
        if not 0 <= slot < max(1, slots):
            return ConfigError(f"slot must be in [0, slots={slots}), got {slot}")
        return None

    async def rollback(self, it: Iteration, *, session: str, consumed: int) -> dict[str, Any]:
        """A dynamic-mode client restored a checkpoint of session ``session`` (its secret) that had
        consumed ``consumed`` batches: the units that session acknowledged after its first
        ``consumed`` are pending again (appended as a rewind record), so they are served again.

        Raises:
            ResumeStateError: not a dynamic iteration, or the journal has no lease of that session
                (another server's journal, or one gc'd): the state cannot be honoured.
        """
        if it.mode != "dynamic":
            raise ResumeStateError(
                f"a session rollback is for dynamic iterations; {it.id} is {it.mode}",
                hint="resume a static rank with {rank, consumed}",
            )
        sess = session_digest(session)
        acked = await to_thread.run_sync(self.journal.session_acks, it.id, sess)
        if acked is None:
            if consumed == 0:
                return {**self.progress(it), "rolled_back": 0}
            raise ResumeStateError(
                f"iteration {it.id} has no record of the saved session (it consumed {consumed} "
                "batches): this server cannot replay what it consumed after the checkpoint",
                hint="resume from a state saved against this server's journal, or start the epoch "
                "again",
            )
        after = np.asarray(acked[consumed:], dtype=np.int64)
        with self.lock(it):
            it.rollback(sess, after.tolist())
            w = self._rewind_write(it, after, np.zeros(0, np.int64))
        await self.writes.wait(w)
        return {**self.progress(it), "rolled_back": len(after)}

    async def rewind(self, it: Iteration, body: Mapping[str, Any]) -> dict[str, Any]:
        """Set the done set from a client checkpoint (``{rank, consumed}`` or ``{done: [[a, b],
        ...]}``).

        Its journal write is queued under the iteration's lock, after the writes of the acks already
        planned (an ack in flight lands before the rewind, in the journal as in memory), and it is
        appended (:func:`~datamill.serve.journal.leases.rewind_write`): the done set is changed by
        records computed from the journal's own, never rewritten from a memory snapshot (which
        misses other ranks' acks in flight: issue #37's rewind race).
        """
        await self.writes.wait(await to_thread.run_sync(self._rewound, it, body))
        return self.progress(it)

    def _rewound(self, it: Iteration, body: Mapping[str, Any]) -> Write:
        """A rewind's change (in a thread: it lists the units of a done set) and its queued
        write."""
        self.check_rewind(it, body)
        with self.lock(it):
            if body.get("done") is not None:
                drop, keep = it.rewind(
                    done=[u for a, b in body["done"] for u in range(int(a), int(b))]
                )
            else:
                drop, keep = it.rewind(rank=int(body["rank"]), consumed=int(body["consumed"]))
            return self._rewind_write(it, drop, keep)

    def check_rewind(self, it: Iteration, body: Mapping[str, Any]) -> None:
        """Refuse (:class:`ConfigError`) a rewind whose units, rank or count lie outside the
        iteration, before any change."""
        if body.get("done") is not None:
            bad = next(((a, b) for a, b in body["done"] if not 0 <= a <= b <= it.total), None)
            if bad is not None:
                raise ConfigError(
                    f"done ranges must satisfy 0 <= start <= stop <= {it.total:,} (the iteration's "
                    f"units), got [{bad[0]:,}, {bad[1]:,}]"
                )
            return
        rank, consumed = body.get("rank"), body.get("consumed")
        if rank is None or consumed is None:
            raise ConfigError("a rewind needs {rank, consumed} or {done: [[start, stop], ...]}")
        queues = [len(q) for q in it.queues]
        if it.mode != "static" or not 0 <= rank < len(queues) or not 0 <= consumed <= queues[rank]:
            raise ConfigError(
                f"rewind of rank {rank} to {consumed:,} batches does not fit this {it.mode} "
                f"iteration ({queues[:16]} batches per rank)"
            )

    def _rewind_write(
        self, it: Iteration, drop: NDArray[np.int64], keep: NDArray[np.int64]
    ) -> Write:
        """Queue a rewind's record (call under the iteration's lock, right after its change)."""
        self._rewinds += 1
        lease = f"rewind.{self.boot}.{self._rewinds}"
        return self.writes.submit(
            rewind_write(it.id, total=it.total, drop=drop, keep=keep, lease=lease)
        )
