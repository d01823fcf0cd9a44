"""Group commit of the lease journal: many requests' writes in one transaction, and still
durable."""

from __future__ import annotations

import http.client
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datamill.client import Client, Leases
from datamill.core.errors import ResumeStateError
from datamill.serve.server import ServeState
from tests.serve._proc import free_port, start_server, stop
from tests.serve._trips import ack_batches, next_lease

pytestmark = pytest.mark.server


def test_concurrent_acks_share_transactions_and_journal_each_unit_once(
    server: dict[str, Any], tmp_path: Path
) -> None:
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        state.register("ds", name="ds")
        info = state.create_iteration(
            {"dataset": "ds", "batch_size": 50, "mode": "dynamic", "lease_size": 2}
        )
        it = state.iteration(info["id"])
        clients = 12
        leases = [next_lease(state, it, f"c{k}") for k in range(clients)]
        assert all(p is not None for p in leases)
        answers: dict[int, tuple[dict[str, str], dict[str, list[tuple[int, int]]]]] = {}

        def ack(k: int) -> None:
            p = leases[k]
            assert p is not None
            answers[k] = ack_batches(
                state, it, [(p.lease.id, p.lease.fence, None, None)], client=f"c{k}"
            )

        before = state.writes.commits
        with state.journal._lock:  # the disk is busy: every ack's write queues behind the first
            threads = [threading.Thread(target=ack, args=(k,)) for k in range(clients)]
            for t in threads:
                t.start()
            for _ in range(1000):
                if state.writes.queued() >= clients - 1:
                    break
                time.sleep(0.01)
            assert not answers  # nobody was answered before its write committed
        for t in threads:
            t.join(timeout=60)
        assert state.writes.commits - before <= 2  # 12 acks, at most 2 transactions (2 fsyncs)
        assert all(answers[k][0] == {leases[k].lease.id: "ok"} for k in range(clients))  # type: ignore[union-attr]
        units = Counter(u for a, b, _ in state.journal.done(it.id) for u in range(a, b))
        told = Counter(
            u
            for k in range(clients)
            for rs in answers[k][1].values()
            for a, b in rs
            for u in range(a, b)
        )
        assert units == told and max(units.values()) == 1
        assert state.progress(it)["done"] == sum(told.values())
    finally:
        state.close()


def test_a_second_ack_of_positions_in_flight_waits_and_answers_already(
    server: dict[str, Any], tmp_path: Path
) -> None:
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        state.register("ds", name="ds")
        info = state.create_iteration({"dataset": "ds", "batch_size": 50, "lease_size": 4})
        it = state.iteration(info["id"])
        p = next_lease(state, it, "c")
        assert p is not None
        item = [(p.lease.id, p.lease.fence, None, None)]
        out: list[dict[str, str]] = []
        with state.journal._lock:  # the first ack's write is in flight
            threads = [
                threading.Thread(
                    target=lambda: out.append(ack_batches(state, it, item, client="c")[0])
                )
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            whole = [(p.lease, p.lease.start, p.lease.stop)]
            for _ in range(500):  # the first ack's write is in flight (its positions reserved)
                if it.in_flight(whole):
                    break
                time.sleep(0.01)
            for _ in range(20):  # meanwhile nobody is answered, the second ack included
                assert out == []
                time.sleep(0.01)
        for t in threads:
            t.join(timeout=60)
        assert sorted(s[p.lease.id] for s in out) == ["already", "ok"]
        assert len(state.journal.done(it.id)) == 1  # journaled once
    finally:
        state.close()


def _client(port: int, key: str, it_id: str, k: int, told: list[int], stop_at: float) -> None:
    """A direct-mode client acknowledging each lease with its next request, reading nothing."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {
        "X-Datamill-Session": f"group-commit-session-{k:04d}",
        "Authorization": f"Bearer {key}",
    }
    ack, units = None, []
    try:
        while time.monotonic() < stop_at:
            q = f"client=g{k}&transport=direct" + (f"&ack={ack}" if ack else "")
            conn.request("GET", f"/api/v1/iterations/{it_id}/next?{q}", headers=headers)
            res = conn.getresponse()
            res.read()
            statuses = dict(
                x.split("=") for x in (res.getheader("X-Datamill-Acks") or "").split(",") if x
            )
            if ack and statuses.get(ack.split(":")[0]) == "ok":
                told.extend(units)  # the server said its done rows are durable
            ack = None
            if res.status == 409:  # the rest is held by leases of before the restart: wait
                time.sleep(0.05)
                continue
            if res.status != 200:
                return
            units = [int(u) for u in res.getheader("X-Datamill-Units", "").split(",")]
            ack = f"{res.getheader('X-Datamill-Lease')}:{res.getheader('X-Datamill-Fence')}"
    except OSError:  # the server was killed
        return
    finally:
        conn.close()


def test_group_committed_acks_survive_a_server_kill_9_and_are_never_reissued(
    server: dict[str, Any], tmp_path: Path
) -> None:
    state, port = tmp_path / "state", free_port()
    shutil.copytree(server["state"], state)
    url = f"http://127.0.0.1:{port}"
    proc = start_server(server["root"], state, port, "--lease-timeout", "2")
    try:
        with Client(url, server["admin"]) as c:
            c.register("ds", name="ds", client_location=str(server["root"] / "ds"))
            it_id = c.iteration(
                "ds", batch_size=1, leases=Leases(mode="dynamic", size=4, name="gc")
            )["id"]
        told: list[int] = []
        threads = [
            threading.Thread(
                target=_client, args=(port, server["read"], it_id, k, told, time.monotonic() + 60)
            )
            for k in range(8)
        ]
        for t in threads:
            t.start()
        for _ in range(3000):  # kill -9 mid-run, with acks in flight
            if len(told) >= 400:
                break
            time.sleep(0.01)
        stop(proc, kill=True)
        for t in threads:
            t.join(timeout=60)
        assert len(told) >= 400
    finally:
        stop(proc, kill=True)
    proc = start_server(server["root"], state, port, "--lease-timeout", "2")
    try:
        with Client(url, server["admin"]) as c:
            done = Counter(u for a, b, _ in c.done(it_id) for u in range(a, b))
            assert max(done.values()) == 1  # no unit journaled twice
            assert set(told) <= set(done)  # every "ok" was durable
            rest: list[int] = []
            stop_at = time.monotonic() + 120  # the grace period (one lease timeout) first
            _client(
                port, server["read"], it_id, 99, rest, stop_at
            )  # to the end (204), its last ack included
            total = c.iteration(
                "ds", batch_size=1, leases=Leases(mode="dynamic", size=4, name="gc")
            )["total"]
        assert not set(rest) & set(done)  # nothing acknowledged before the kill was issued again
        assert sorted(list(done) + rest) == list(range(total))  # and the epoch is complete, once
    finally:
        stop(proc)


def test_resume_checks_are_the_loaders_one_check(server: dict[str, Any], tmp_path: Path) -> None:
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        state.register("ds", name="ds")
        old = state.create_iteration({"dataset": "ds", "batch_size": 50, "seed": 1, "name": "o"})
        with pytest.raises(ResumeStateError, match="seed: saved 1, now 2") as err:
            state.create_iteration(
                {"dataset": "ds", "batch_size": 50, "seed": 2, "resume_from": old["id"]}
            )
        assert old["id"] in str(err.value)
        from datamill.loader import Loader
        from datamill.sources import open_source

        src = open_source(server["root"] / "ds")
        states = []
        for rank in range(2):
            loader = Loader(src, 50, seed=3, rank=rank, world_size=2)
            it = iter(loader)
            next(it)
            states.append(loader.state_dict())
        with pytest.raises(ResumeStateError, match="seed: saved 3, now 4"):
            state.create_iteration(
                {"dataset": "ds", "batch_size": 50, "seed": 4, "loader_states": states}
            )
        with pytest.raises(ResumeStateError, match="ranks \\[1, 1\\]"):
            state.create_iteration(
                {"dataset": "ds", "batch_size": 50, "seed": 3, "loader_states": [states[1]] * 2}
            )
        resumed = state.create_iteration(
            {"dataset": "ds", "batch_size": 50, "seed": 3, "loader_states": states}
        )
        assert resumed["base_done"] == 2
    finally:
        state.close()
