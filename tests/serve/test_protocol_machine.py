"""The lease protocol's pure state machine and its journal, driven at random (through the
driver, :class:`ServeState`, whose clock is the test's: time is data) against a small reference
model (issue #37 point 5): next, ack (per batch, out of order, duplicated), heartbeat, expiry, a
resume of one rank while another rank's ack is in flight, rewind, cancel, client crash (its
connections seen closed or not), server crash + replay.

Invariants, after every step: the journal's done set (the fold of its records) = memory's = the
model's; no unit is acknowledged ``ok`` twice; no live lease is handed out to two holders; counters
(progress, the metrics' and UI's sums) = the journal; and with clients that acknowledge each batch
before yielding the next, at most one batch per client per fault is yielded twice.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from datamill.serve.journal.leases import leases_write
from datamill.serve.protocol.iteration import Iteration, finish, plan
from datamill.serve.protocol.state import session_digest
from datamill.serve.server import CancelledError, ServeState
from datamill.shards.dataset import ShardsetDataset
from tests.serve._trips import ack_batches, next_lease

from .conftest import _table

pytestmark = pytest.mark.server

_ROOT: list[Path] = []


def _root() -> Path:
    """A small dataset (60 samples, 3 shards), made once per test process."""
    if not _ROOT:
        root = Path(tempfile.mkdtemp(prefix="datamill-machine-"))
        ShardsetDataset.create(root / "ds", _table(60), uid="uid", shardset="main", shard_size=20)
        _ROOT.append(root)
    return _ROOT[0]


@dataclass
class Held:
    """A lease as its holder knows it, and the batches (positions) it yielded."""

    id: str
    fence: str
    queue: int
    start: int
    units: list[int]
    yielded: int = 0  # positions yielded so far (each acknowledged before the next is yielded)


@dataclass
class Client:
    id: str
    rank: int
    session: str = field(default_factory=lambda: secrets.token_hex(16))
    leases: list[Held] = field(default_factory=list)


class LeaseMachine(RuleBasedStateMachine):
    """Drives :class:`ServeState` (the real protocol, group commit and journal) in one process."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="datamill-machine-state-"))
        self.state: ServeState | None = None
        self.it: Iteration | None = None
        self.done: set[int] = set()  # the model's done set
        self.yielded: Counter[int] = Counter()  # units yielded to training loops
        self.faults: Counter[str] = Counter()  # faults per client that could leave a batch in doubt
        self.clients: list[Client] = []
        self.cancelled = False
        self.now = 1000.0  # the driver's clock: only the rules move it

    def _clock(self) -> float:
        return self.now

    # ------------------------------------------------------------------ set-up and helpers
    @initialize(mode=st.sampled_from(["static", "dynamic"]), lease_size=st.integers(1, 4))
    def start(self, mode: str, lease_size: int) -> None:
        self.state = self._server()
        self.state.register("ds", name="ds")
        world = 2 if mode == "static" else 1
        req = {
            "dataset": "ds",
            "batch_size": 3,
            "mode": mode,
            "world_size": world,
            "lease_size": lease_size,
            "name": "m",
            "shuffle": True,
        }
        self.it = self.state.iteration(self.state.create_iteration(req)["id"])
        n = 2 if mode == "static" else 3
        self.clients = [Client(f"c{k}", k % world) for k in range(n)]

    def _server(self) -> ServeState:
        return ServeState(
            self.dir, roots=[_root()], auth=False, lease_timeout=30.0, clock=self._clock
        )

    def teardown(self) -> None:
        if self.state is not None:
            self.state.close()

    def _st(self) -> tuple[ServeState, Iteration]:
        assert self.state is not None and self.it is not None
        return self.state, self.it

    def _ack(self, c: Client, held: Held, lo: int, hi: int) -> str:
        state, it = self._st()
        statuses, units = ack_batches(
            state, it, [(held.id, held.fence, lo, hi)], session=c.session, client=c.id
        )
        got = {u for a, b in units.get(held.id, []) for u in range(a, b)}
        assert not got & self.done, "a unit was acknowledged twice"
        self.done |= got
        return statuses[held.id]

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: not self.cancelled)
    @rule(k=st.integers(0, 2))
    def next(self, k: int) -> None:
        state, it = self._st()
        c = self.clients[k % len(self.clients)]
        try:
            p = next_lease(state, it, c.id, rank=c.rank, session=c.session)
        except CancelledError:
            raise AssertionError("a lease refused on a live iteration") from None
        if p is None:
            return
        units = set(p.units)
        assert not units & self.done, "a done unit was handed out"
        live = {u for x in self.clients for h in x.leases for u in h.units if h.id in it.leases}
        assert not units & live, "a unit of a live lease was handed out again"
        c.leases.append(Held(p.lease.id, p.lease.fence, p.lease.queue, p.lease.start, p.units))

    @rule(k=st.integers(0, 2), j=st.integers(0, 7))
    def train_one(self, k: int, j: int) -> None:
        """The client yields one batch and acknowledges it (durable) before the next."""
        c = self.clients[k % len(self.clients)]
        open_ = [h for h in c.leases if h.yielded < len(h.units)]
        if not open_:
            return
        h = open_[j % len(open_)]
        pos = h.start + h.yielded
        self.yielded[h.units[h.yielded]] += 1
        h.yielded += 1
        status = self._ack(c, h, pos, pos + 1)
        assert status in ("ok", "already", "expired")
        if status == "expired":  # the lease was lost: the batch just yielded is the one in doubt
            self.faults[c.id] += 1
            c.leases.remove(h)

    @rule(k=st.integers(0, 2), j=st.integers(0, 7), twice=st.booleans())
    def ack_out_of_order(self, k: int, j: int, twice: bool) -> None:
        """A duplicated or out-of-order acknowledgement of batches already yielded."""
        c = self.clients[k % len(self.clients)]
        if not c.leases:
            return
        h = c.leases[j % len(c.leases)]
        if h.yielded == 0:
            return
        lo = h.start + (j % h.yielded)
        for _ in range(2 if twice else 1):
            assert self._ack(c, h, lo, lo + 1) in ("ok", "already", "expired")

    @rule(k=st.integers(0, 2))
    def heartbeat(self, k: int) -> None:
        state, it = self._st()
        c = self.clients[k % len(self.clients)]
        out = state.heartbeat(
            it, c.id, leases=[(h.id, h.fence) for h in c.leases], session=c.session
        )
        assert not out["refused"]
        for h in [h for h in c.leases if h.id in out["lost"]]:
            if h.yielded < len(h.units):  # not finished: lost (a finished one is acknowledged)
                c.leases.remove(h)

    @rule()
    def expiry(self) -> None:
        """Time passes beyond every lease's TTL + grace: every live lease goes back."""
        state, it = self._st()
        self.now += it.lease_timeout + it.grace + 1
        state.progress(it)  # a reading expires them (as a take would)
        for c in self.clients:
            if any(h.yielded < len(h.units) for h in c.leases):
                self.faults[c.id] += 1
            c.leases.clear()

    @rule(k=st.integers(0, 2), closed=st.booleans())
    def client_crash(self, k: int, closed: bool) -> None:
        """A client is killed (its leases held until they expire; with ``closed``, the server saw
        its connections closed and ends them soon) and replaced by a new process."""
        c = self.clients[k % len(self.clients)]
        if closed:
            self._st()[0].session_closed(c.session)
        if c.leases:
            self.faults[c.id] += 1
        c.leases.clear()
        c.session = secrets.token_hex(16)

    @precondition(lambda self: self.it is not None and self.it.mode == "static")
    @rule(rank=st.integers(0, 1), frac=st.floats(0, 1))
    def resume_rank_while_the_other_acks(self, rank: int, frac: float) -> None:
        """A ``{rank, consumed}`` resume while the other rank's ack awaits its journal write."""
        state, it = self._st()
        other = self.clients[1 - rank]
        racing = [h for h in other.leases if h.yielded < len(h.units)]
        p = None
        if racing:
            h = racing[0]
            pos = h.start + h.yielded
            self.yielded[h.units[h.yielded]] += 1
            h.yielded += 1
            with state.lock(it):  # the driver's first step: decided, its write queued
                p = plan(
                    it,
                    [(h.id, h.fence, pos, pos + 1)],
                    session=session_digest(h_s(other)),
                    now=self.now,
                )
                assert p is not None and p.records is not None
                r = p.records
                w = state.writes.submit(leases_write(it.id, add=r.add, drop=r.drop, done=r.done))
        event(f"resume of a rank with an ack in flight: {p is not None}")
        consumed = int(frac * len(it.queues[rank]))
        asyncio.run(state.rewind(it, {"rank": rank, "consumed": consumed}))
        if p is not None:
            asyncio.run(state.writes.wait(w))  # the driver's last steps: committed, then applied
            with state.lock(it):
                finish(it, p, ok=True, now=state.clock())
            got = {u for rs in p.units.values() for a, b in rs for u in range(a, b)}
            assert not got & self.done
            self.done |= got
        q = [int(u) for u in it.queues[rank]]
        self.done = (self.done - set(q)) | set(q[:consumed])
        mine = self.clients[rank]
        if mine.leases:
            self.faults[mine.id] += 1
        mine.leases.clear()  # its leases were revoked: it resumes from its checkpoint
        for u in q[consumed:]:
            self.yielded[u] = 0  # rewound: to be trained on again (not a duplicate)

    @rule(frac=st.floats(0, 1))
    def rewind_to_checkpoint(self, frac: float) -> None:
        """An admin rewind to a saved done set (the model's, minus its last units)."""
        state, it = self._st()
        keep = sorted(self.done)[: int(frac * len(self.done))]
        asyncio.run(state.rewind(it, {"done": [[u, u + 1] for u in keep]}))
        for u in set(range(it.total)) - set(keep):
            self.yielded[u] = 0
        self.done = set(keep)
        for c in self.clients:
            if c.leases:
                self.faults[c.id] += 1
            c.leases.clear()

    @precondition(lambda self: not self.cancelled)
    @rule()
    def cancel(self) -> None:
        state, it = self._st()
        state.cancel(it)
        self.cancelled = True
        for c in self.clients:
            c.leases.clear()
        with pytest.raises(CancelledError):
            next_lease(state, it, self.clients[0].id, rank=0)

    @rule()
    def server_crash_and_replay(self) -> None:
        """The server stops and a new one replays the journal; clients keep their leases (they
        reclaim them by fence within the grace period)."""
        state, it = self._st()
        state.close()
        self.state = self._server()
        self.it = self.state.iteration(it.id)
        got = set(self.it.done_units())
        assert got == self.done, "the replayed done set differs from what was acknowledged"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def journal_equals_memory_equals_model(self) -> None:
        if self.it is None:
            return
        state, it = self._st()
        journal = {u for a, b in state.journal.done_runs(it.id) for u in range(a, b)}
        assert journal == set(it.done_units()) == self.done
        summed = state.journal._exec(
            "SELECT COALESCE(SUM((stop - start) * sign), 0) FROM done WHERE iteration = ?",
            (it.id,),
        )[0][0]
        assert state.progress(it)["done"] == summed == len(self.done)  # counters are folds of it

    @invariant()
    def at_most_one_batch_in_doubt_per_client_per_fault(self) -> None:
        twice = sum(n - 1 for n in self.yielded.values() if n > 1)
        assert twice <= sum(self.faults.values()), (twice, dict(self.faults))


def h_s(c: Client) -> str:
    """The session secret of a client."""
    return c.session


LeaseMachine.TestCase.settings = settings(
    settings.get_profile("ci"), max_examples=25, stateful_step_count=25
)
test_lease_protocol_machine = LeaseMachine.TestCase
