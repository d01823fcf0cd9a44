"""The lease bookkeeping alone (no HTTP): exactly once under any interleaving of takes, acks,
deaths, expiries."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.ragged import runs
from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import Lease
from tests.serve._trips import pure_ack


@given(
    batches=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    static=st.booleans(),
    lease_size=st.integers(1, 4),
    ops=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5)), max_size=60),
)
def test_every_unit_is_acknowledged_exactly_once_whatever_happens(
    batches: list[int], static: bool, lease_size: int, ops: list[tuple[int, int]]
) -> None:
    world = len(batches)
    it = Iteration(
        "t",
        batches,
        mode="static" if static else "dynamic",
        world_size=world if static else 1,
        lease_size=lease_size,
        boot="b",
    )
    held: dict[str, list[tuple[str, str]]] = {}
    acked: list[int] = []
    for op, arg in ops:
        client = f"c{arg}"
        rank = arg % world if static else 0
        if op <= 1:  # take
            lease = it.take(client, rank=rank, now=0.0)
            if lease is not None:
                held.setdefault(client, []).append((lease.id, lease.fence))
        elif op == 2 and held.get(client):  # ack the oldest lease held
            lease_id, fence = held[client].pop(0)
            res = pure_ack(it, lease_id, fence, client=client, now=0.0)
            if res.status == "ok":
                acked.extend(u for a, b in res.units for u in range(a, b))
            assert pure_ack(it, lease_id, fence, client=client, now=0.0).status in (
                "already",
                "expired",
            )  # never twice
        elif op == 3:  # the client dies: its leases expire
            for lease_id, _ in held.pop(client, []):
                if lease_id in it.leases:
                    it.leases[lease_id].deadline = -1.0
            it.expire(now=0.0)
        elif op == 4 and held.get(client):  # a stale ack with a wrong fence is refused
            lease_id, fence = held[client][0]
            assert pure_ack(it, lease_id, "0" * 32, client=client, now=0.0).status in (
                "refused",
                "expired",
            )
            assert pure_ack(it, lease_id, fence, client="thief", now=0.0).status in (
                "refused",
                "expired",
            )
    # the clients still alive acknowledge what they hold (a stale one is refused), then finish the
    # epoch
    for client, leases in held.items():
        for lease_id, fence in leases:
            res = pure_ack(it, lease_id, fence, client=client, now=0.0)
            acked.extend(u for a, b in res.units for u in range(a, b))
    for rounds in range(10_000):
        progress = False
        for r in range(world if static else 1):
            lease = it.take(f"final{r}", rank=r, now=0.0)
            if lease is not None:
                res = pure_ack(it, lease.id, lease.fence, now=0.0)
                acked.extend(u for a, b in res.units for u in range(a, b))
                progress = True
        if not progress:
            break
    assert rounds < 9_999
    assert sorted(acked) == list(range(it.total))  # every unit exactly once
    assert all(it.finished(rank=r) for r in range(world if static else 1))
    assert it.progress(now=0.0)["done"] == it.total


def test_static_replacement_takes_over_the_dead_ranks_leases_first_in_order() -> None:
    it = Iteration("t", [10, 10], mode="static", world_size=2, lease_size=3, boot="b")
    a = it.take("old", rank=1, now=0.0)
    b = it.take("old", rank=1, now=0.0)
    assert a is not None and b is not None and (a.start, b.start) == (0, 3)
    c = it.take(
        "new", rank=1, now=0.0
    )  # a new process for rank 1: the old one's leases come back first
    assert c is not None and (c.start, c.stop) == (0, 3) and it.units_of(c) == [10, 11, 12]
    assert (
        pure_ack(it, a.id, a.fence, client="old", now=0.0).status == "expired"
    )  # the old process's late ack is refused
    assert pure_ack(it, c.id, c.fence, now=0.0).status == "ok"
    d = it.take("new", rank=1, now=0.0)
    assert d is not None and d.start == 3


def test_unknown_leases_are_expired_and_elastic_queues_split_the_rest() -> None:
    it = Iteration(
        "t", [4, 4, 4], mode="static", world_size=2, base_done=[0, 1, 4], lease_size=2, boot="new"
    )
    assert pure_ack(it, "old.1", "1", now=0.0).status == "expired"
    assert [len(q) for q in it.queues] == [5, 4] and it.progress(now=0.0)["done"] == 3
    assert sorted(np.concatenate(it.queues).tolist()) == [2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert runs([3, 1, 2, 7]) == [(1, 4), (7, 8)]


def test_rewind_sets_the_done_set_from_a_checkpoint() -> None:
    it = Iteration("t", [6], mode="static", world_size=1, lease_size=2, boot="b")
    lease = it.take("c", rank=0, now=0.0)
    assert lease is not None
    pure_ack(it, lease.id, lease.fence, now=0.0)
    it.take("c", rank=0, now=0.0)
    it.rewind(rank=0, consumed=3)
    assert not it.leases and it.done_units() == [0, 1, 2]
    nxt = it.take("c", rank=0, now=0.0)
    assert nxt is not None and (nxt.start, nxt.stop) == (3, 4)  # never crosses a lease boundary


def test_cancel_stops_leases_and_reissues_after_expiry_are_counted() -> None:
    it = Iteration("i", [6], lease_size=2, lease_timeout=60.0, boot="b")
    first = it.take("c0", now=0.0)
    assert first is not None and it.progress(now=0.0)["reissued_leases"] == 0
    assert (
        it.expire(now=first.deadline + 1) == 1
    )  # the lease times out: its batches go back to the head of the queue
    again = it.take("c1", now=0.0)
    assert again is not None and (again.start, again.stop) == (first.start, first.stop)
    p = it.progress(now=0.0)
    assert (p["expired_leases"], p["reissued_leases"]) == (1, 1)
    assert (
        pure_ack(it, first.id, first.fence, client="c0", now=0.0).status == "expired"
    )  # the late ack of the expired lease
    it.cancel()
    assert (
        it.take("c2", now=0.0) is None
        and it.progress(now=0.0)["cancelled"]
        and it.progress(now=0.0)["leased"] == 0
    )
    assert (
        pure_ack(it, again.id, again.fence, client="c1", now=0.0).status == "expired"
    )  # cancelling revoked the live leases


def test_fences_are_128_random_bits_bound_to_the_session_that_took_the_lease() -> None:
    it = Iteration("i", [40], lease_size=4, boot="b")
    leases = [it.take("c0", session="s" * 32, now=0.0) for _ in range(5)]
    assert all(x is not None for x in leases)
    fences = [x.fence for x in leases if x is not None]
    assert len(set(fences)) == 5 and all(
        len(f) == 32 and int(f, 16) >= 0 for f in fences
    )  # 128 bits, hex
    ids = [x.id for x in leases if x is not None]
    assert len(set(ids)) == 5 and not any(
        i.startswith("b.") for i in ids
    )  # not derived from the boot id
    a = leases[0]
    assert a is not None
    # the right fence from another session (a stolen lease) and a forged fence are both refused
    assert pure_ack(it, a.id, a.fence, session="t" * 32, now=0.0).status == "refused"
    assert (
        pure_ack(it, a.id, "%032x" % (int(a.fence, 16) ^ 1), session="s" * 32, now=0.0).status
        == "refused"
    )
    assert it.heartbeat("c1", leases=[(a.id, a.fence)], session="t" * 32, now=0.0) == {
        "lost": [],
        "refused": [a.id],
    }
    assert it.leases[a.id].deadline > 0 and it.progress(now=0.0)["done"] == 0  # nothing changed
    # per-batch acks: the holder acknowledges positions one by one
    res = pure_ack(it, a.id, a.fence, session="s" * 32, start=0, stop=1, now=0.0)
    assert (res.status, res.units) == (
        "ok",
        [(0, 1)],
    ) and a.id in it.leases  # still live: 3 batches left
    assert (
        pure_ack(it, a.id, a.fence, session="s" * 32, start=0, stop=1, now=0.0).status == "already"
    )
    assert (
        pure_ack(it, a.id, a.fence, session="s" * 32, start=1, stop=4, now=0.0).units == [(1, 4)]
        and a.id not in it.leases
    )
    assert (
        pure_ack(it, a.id, "0" * 32, session="t" * 32, now=0.0).status == "already"
    )  # journaled: nothing to steal
    # an expired lease: 410 for the ack and lost for the heartbeat
    b = leases[1]
    assert b is not None
    it.expire(now=b.deadline + 1)
    assert pure_ack(it, b.id, b.fence, session="s" * 32, now=0.0).status == "expired"
    assert it.heartbeat("c0", leases=[(b.id, b.fence)], session="s" * 32, now=0.0)["lost"] == [b.id]


def test_restored_leases_are_held_for_their_holder_until_reclaimed_or_the_grace_period_ends() -> (
    None
):
    it = Iteration("i", [8], lease_size=4, lease_timeout=60.0, boot="b")
    a = it.take("c0", session="s" * 32, now=0.0)
    assert a is not None
    pure_ack(it, a.id, a.fence, session="s" * 32, start=0, stop=1, now=0.0)
    # a restarted server: the same lease (without its fence, only its hash) restored from the
    # journal
    fresh = Iteration("i", [8], lease_size=4, lease_timeout=60.0, boot="c")
    fresh.mark_done([0])
    fresh.restore(
        Lease(
            a.id,
            "",
            a.queue,
            a.start,
            a.stop,
            a.client,
            0.0,
            0.0,
            fence_hash=a.fence_hash,
            session=a.session,
            slot=0,
        ),
        now=0.0,
    )
    other = fresh.take("c1", session="u" * 32, now=0.0)
    assert other is not None and (other.start, other.stop) == (
        4,
        8,
    )  # positions 1-3 are held for c0
    assert fresh.take("c1", session="u" * 32, now=0.0) is None and not fresh.finished()
    assert fresh.heartbeat("c0", leases=[(a.id, a.fence)], session="s" * 32, now=0.0) == {
        "lost": [],
        "refused": [],
    }
    assert fresh.leases[a.id].reclaimed
    assert pure_ack(fresh, a.id, a.fence, session="s" * 32, start=1, stop=4, now=0.0).units == [
        (1, 4)
    ]
    # not reclaimed within the grace period: the positions go to another client
    late = Iteration("i", [8], lease_size=4, lease_timeout=60.0, boot="d")
    late.restore(
        Lease(a.id, "", 0, 0, 4, "c0", 0.0, 0.0, fence_hash=a.fence_hash, session=a.session),
        grace=0.0,
        now=0.0,
    )
    again = late.take("c1", session="u" * 32, now=1.0)
    assert again is not None and (again.start, again.stop) == (0, 4)


def test_a_closed_session_s_leases_end_soon_unless_it_reclaims_them() -> None:
    """Every connection of a session closed by its client (a process that exited or was killed):
    its leases end ``within`` seconds, not a lease timeout later, and a request of it already in
    flight (an ack) extends them no further; a session that connects again is alive (its heartbeat
    keeps them); other sessions' leases are untouched."""
    it = Iteration("i", [16], mode="dynamic", lease_size=4, lease_timeout=60.0, boot="b")
    dead = it.take("c0", session="s" * 32, now=0.0)
    live = it.take("c1", session="t" * 32, now=0.0)
    kept = it.take("c2", session="u" * 32, now=0.0)
    assert dead is not None and live is not None and kept is not None
    for lease in (dead, live):
        it.session_closed(lease.session, now=10.0, within=1.5)
    # the dead client's last ack, sent before it died, lands after the close; so does its last
    # request for a lease: neither keeps anything past the close + 1.5 s
    assert (
        pure_ack(it, dead.id, dead.fence, session="s" * 32, start=0, stop=1, now=10.5).status
        == "ok"
    )
    late = it.take("c0", session="s" * 32, now=10.5)
    assert late is not None and late.deadline == 11.5
    it.session_opened(live.session)  # the live one connects again, then heartbeats
    assert it.heartbeat("c1", leases=[(live.id, live.fence)], session="t" * 32, now=11.0) == {
        "lost": [],
        "refused": [],
    }
    assert it.take("c2", session="u" * 32, now=11.0) is None  # not yet: 1.5 s after the close
    again = it.take("c2", session="u" * 32, now=11.6)
    assert again is not None and it.units_of(again) == it.units_of(dead)[1:]
    assert set(it.leases) == {live.id, kept.id, again.id} and it.expired == 2
