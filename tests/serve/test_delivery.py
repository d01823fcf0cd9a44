"""Leases that cannot be forged or stolen, resume states that always resume, a full disk at ack
time."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datamill.client import Client, Leases, RemoteLoader
from datamill.client.http import Http
from datamill.loader import Loader
from datamill.sources import open_source
from tests.serve._opts import grouped
from tests.serve._proc import env, free_port, make_key, read_log, start_worker, stop
from tests.serve._trips import ack, next_lease
from tests.serve.conftest import N

pytestmark = pytest.mark.server

S1, S2 = "a" * 32, "b" * 32


def _http(server: dict[str, Any], session: str | None) -> Http:
    h = Http(server["url"], server["read"])
    if session is not None:
        h.headers["X-Datamill-Session"] = session
    return h


def _one_line_json(res: Any) -> dict[str, Any]:
    assert b"\n" not in res.body.strip()
    body: dict[str, Any] = res.json()
    assert isinstance(body["error"], str) and "\n" not in body["error"]
    return body


def test_forged_stolen_and_expired_fences_over_http(server: dict[str, Any]) -> None:
    with Client(server["url"], server["read"]) as client:
        it = client.iteration(
            "ds", batch_size=100, leases=Leases(name="fences", size=4, timeout=4.0, mode="dynamic")
        )["id"]
    path = f"/api/v1/iterations/{it}"
    holder, thief = _http(server, S1), _http(server, S2)
    try:
        res = holder.request("GET", f"{path}/next", query=[("client", "holder")])
        lease, fence = res.headers["x-datamill-lease"], res.headers["x-datamill-fence"]
        assert len(fence) == 32 and int(fence, 16) >= 0  # 128 random bits
        assert float(res.headers["x-datamill-lease-ttl"]) == 4.0  # the holder's deadline
        assert (
            res.headers["x-datamill-lease"]
            != holder.request("GET", f"{path}/next", query=[("client", "holder")]).headers[
                "x-datamill-lease"
            ]
        )
        # another session with the right fence (a stolen lease), and the holder with a forged fence:
        # 409
        stolen = thief.request(
            "POST",
            f"{path}/ack",
            ok=(409,),
            body={"client": "thief", "acks": [[lease, fence, 0, 1]]},
        )
        assert _one_line_json(stolen)["acks"] == {lease: "refused"}
        forged = "%032x" % (int(fence, 16) ^ 1)
        res = holder.request(
            "POST",
            f"{path}/ack",
            ok=(409,),
            body={"client": "holder", "acks": [[lease, forged, 0, 1]]},
        )
        assert _one_line_json(res)["acks"] == {lease: "refused"}
        res = thief.request(
            "POST",
            f"{path}/heartbeat",
            ok=(409,),
            body={"client": "thief", "leases": [[lease, fence]]},
        )
        assert _one_line_json(res)["refused"] == [lease]
        res = thief.request(
            "GET", f"{path}/next", query=[("client", "thief"), ("ack", f"{lease}:{fence}:0-1")]
        )
        assert res.headers["x-datamill-acks"] == f"{lease}=refused"
        assert client_progress(server, it)["done"] == 0  # nothing of the thief's was taken
        # the holder acknowledges batch by batch; a repeat is "already"
        holder.request(
            "POST", f"{path}/heartbeat", body={"client": "holder", "leases": [[lease, fence]]}
        )
        ok = holder.request(
            "POST", f"{path}/ack", body={"client": "holder", "acks": [[lease, fence, 0, 1]]}
        )
        assert ok.json() == {"acks": {lease: "ok"}}
        again = holder.request(
            "POST", f"{path}/ack", body={"client": "holder", "acks": [[lease, fence, 0, 1]]}
        )
        assert again.json() == {"acks": {lease: "already"}}
        assert client_progress(server, it)["done"] == 1
        # malformed fences are 422 before any work
        for bad in ("9" * 5000, "xyz", ""):
            holder.request(
                "POST",
                f"{path}/ack",
                ok=(422,),
                body={"client": "holder", "acks": [[lease, bad, 0, 1]]},
            )
        # no heartbeat for longer than the lease timeout: expired, 410 (poll until the server
        # expired the holder's leases: reading the progress expires what is due)
        deadline = time.monotonic() + 30
        while client_progress(server, it)["clients"]["holder"]["leases"]:
            assert time.monotonic() < deadline, "the holder's leases did not expire within 30 s"
            time.sleep(0.1)
        res = holder.request(
            "POST",
            f"{path}/ack",
            ok=(410,),
            body={"client": "holder", "acks": [[lease, fence, 1, 2]]},
        )
        assert _one_line_json(res)["acks"] == {lease: "expired"}
        res = holder.request(
            "POST",
            f"{path}/heartbeat",
            ok=(410,),
            body={"client": "holder", "leases": [[lease, fence]]},
        )
        assert _one_line_json(res)["lost"] == [lease]
    finally:
        holder.close()
        thief.close()


def test_a_client_of_another_key_cannot_take_over_a_static_ranks_leases(
    server: dict[str, Any],
) -> None:
    with Client(server["url"], server["admin"]) as admin:
        other = admin.create_key(role="read", note="another team")["key"]
    with Client(server["url"], server["read"]) as client:
        it = client.iteration(
            "ds", batch_size=100, leases=Leases(name="takeover", size=4, world_size=2)
        )["id"]
    path = f"/api/v1/iterations/{it}"
    holder, thief = _http(server, S1), Http(server["url"], other)
    thief.headers["X-Datamill-Session"] = S2
    try:
        res = holder.request("GET", f"{path}/next", query=[("client", "holder"), ("rank", 0)])
        lease, fence = res.headers["x-datamill-lease"], res.headers["x-datamill-fence"]
        res = thief.request("GET", f"{path}/next", query=[("client", "thief"), ("rank", 0)])
        assert res.headers["x-datamill-positions"] == "0:4-8"  # not the holder's batches 0-3
        ok = holder.request(
            "POST", f"{path}/ack", body={"client": "holder", "acks": [[lease, fence, 0, 4]]}
        )
        assert ok.json() == {"acks": {lease: "ok"}}  # the holder's lease was not taken over
    finally:
        holder.close()
        thief.close()


def client_progress(server: dict[str, Any], it: str) -> dict[str, Any]:
    with Client(server["url"], server["read"]) as client:
        return client.progress(it)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("inside", [False, True])
def test_an_end_of_epoch_state_resumes_at_the_next_epoch(
    server: dict[str, Any], mode: str, inside: bool
) -> None:
    kw: dict[str, Any] = {
        "batch_size": 500,
        "seed": 3,
        "name": f"eoe-{mode}-{inside}",
        "collate": "arrow",
        "mode": mode,
        "lease_size": 4,
    }
    first = RemoteLoader(server["url"], server["read"], "ds", **grouped(**kw))
    state = None
    for _ in first:
        if inside:
            state = first.state_dict()  # taken in the loop, after the epoch's last batch
    if not inside:
        state = first.state_dict()  # taken after the loop
    assert state is not None
    second = RemoteLoader(server["url"], server["read"], "ds", **grouped(**kw))
    second.load_state_dict(json.loads(json.dumps(state)))
    got = [b.column("uid").to_pylist() for b in second]
    assert second.epoch == 2
    if mode == "static":
        ref = [
            b.column("uid").to_pylist()
            for b in Loader(
                open_source(server["root"] / "ds"), 500, seed=3, epoch=1, collate="arrow"
            )
        ]
        assert got == ref  # exactly epoch 1, in the in-process Loader's order
    else:
        assert sorted(u for b in got for u in b) == list(range(N))


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_replacement_process_state_counts_the_ranks_progress(
    server: dict[str, Any], tmp_path: Path, mode: str
) -> None:
    name = f"replace-{mode}"
    opts = {"batch_size": 50, "seed": 8, "mode": mode, "name": name, "lease_size": 4, "sleep": 0.02}
    log = tmp_path / "w.log"
    worker = start_worker(server["url"], server["read"], "ds", log, **opts)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(read_log(log)) < 30:
            time.sleep(0.02)
        stop(worker, kill=True)
    finally:
        stop(worker, kill=True)
    logged = read_log(log)
    assert len(logged) >= 30
    done_before = client_progress(server, name)["done"]
    assert (
        done_before >= len(logged) - 3
    )  # the killed process's tail: what it consumed since its last flush
    opts.pop("sleep")
    replacement = RemoteLoader(
        server["url"], server["read"], "ds", **grouped(collate="arrow", **opts)
    )  # type: ignore[arg-type]
    it = iter(replacement)
    seen = [next(it).column("uid").to_pylist()]
    state = replacement.state_dict()
    assert (
        state["consumed"] >= done_before + 1
    )  # the rank's progress, not this process's single batch
    seen += [b.column("uid").to_pylist() for b in it]
    assert {u for b in logged + seen for u in b} == set(range(N))  # nothing lost
    total = -(-N // 50)
    assert len(logged) + len(seen) <= total + 3


def test_a_killed_dynamic_client_resumed_from_its_state_re_delivers_nothing(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """The contract's exception: a killed client's unflushed batches are not served again when the
    job resumes from that client's ``state_dict()`` (here written after every batch the worker
    logs)."""
    name = "resume-dynamic"
    opts: dict[str, Any] = {
        "batch_size": 50,
        "seed": 12,
        "mode": "dynamic",
        "name": name,
        "lease_size": 4,
        "lease_timeout": 5.0,
    }
    log, saved = tmp_path / "w.log", tmp_path / "state.json"
    worker = start_worker(
        server["url"], server["read"], "ds", log, **opts, sleep=0.04, state=str(saved)
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(read_log(log)) < 20:
            time.sleep(0.01)
    finally:
        stop(worker, kill=True)
    logged = [tuple(b) for b in read_log(log)]
    checkpoint = json.loads(saved.read_text())
    state, covered = (
        checkpoint["state"],
        checkpoint["logged"],
    )  # the state covers the first `covered` batches
    assert len(logged) >= 20 and len(logged) - covered in (0, 1)
    assert state["unflushed"]  # consumed batches not yet journaled (the last one at least)
    resumed = RemoteLoader(server["url"], server["read"], "ds", **grouped(collate="arrow", **opts))
    resumed.load_state_dict(state)
    seen = [tuple(b.column("uid").to_pylist()) for b in resumed]
    every = Counter(logged + seen)
    assert {u for b in every for u in b} == set(range(N)) and len(every) == -(
        -N // 50
    )  # nothing lost
    twice = [b for b, n in every.items() if n > 1]
    # only a batch logged after the state was written (the worker died between the two) may come
    # again
    assert set(twice) <= set(logged[covered:]), (len(twice), len(logged), covered)


def _start_limited(root: Path, state: Path, port: int, fsize: int) -> subprocess.Popen[bytes]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    # drain_timeout 0: leases as large as asked (a drain-sized first lease holds 16 batches)
    config = state.parent / "serve-no-drain.yaml"
    config.write_text(f"roots: [{json.dumps(str(root))}]\ndrain_timeout: 0\n", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            str(config),
            "--port",
            str(port),
            "--state",
            str(state),
            "--lease-timeout",
            "30",
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=limit,  # noqa: PLW1509
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited"
        h = Http(f"http://127.0.0.1:{port}", None)
        try:
            h.request("GET", "/api/v1/health")
            return proc
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
        finally:
            h.close()
    stop(proc)
    raise RuntimeError("server did not start")


def test_a_full_disk_at_ack_time_is_503_and_already_only_for_journaled_acks(
    server: dict[str, Any], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    admin, read = make_key(state, "admin"), make_key(state, "read")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_limited(
        server["root"], state, port, 1 << 30
    )  # set up (register, iterate) without a limit
    try:
        with Client(url, admin) as c:
            c.register("ds", name="ds")
            it = c.iteration(
                "ds", batch_size=20, leases=Leases(name="full", size=300, timeout=30.0)
            )["id"]
    finally:
        stop(proc)
    biggest = max(os.path.getsize(p) for p in state.iterdir() if p.is_file())
    proc = _start_limited(
        server["root"], state, port, biggest + 48 * 1024
    )  # the state's file system fills up
    told: dict[int, str] = {}  # position -> the ack's answer
    path = f"/api/v1/iterations/{it}"
    h = Http(url, read)
    h.headers["X-Datamill-Session"] = S1
    try:
        res = h.request("GET", f"{path}/next", query=[("client", "c")])
        lease, fence = res.headers["x-datamill-lease"], res.headers["x-datamill-fence"]
        full = None
        for pos in range(300):
            res = h.request(
                "POST",
                f"{path}/ack",
                ok=(200, 503),
                body={"client": "c", "acks": [[lease, fence, pos, pos + 1]]},
            )
            if res.status == 503:
                assert (
                    int(res.headers["retry-after"]) > 0
                    and "journal" in _one_line_json(res)["error"]
                )
                full = pos
                break
            told[pos] = res.json()["acks"][lease]
        assert full is not None and full >= 1, "the file size limit was never reached"
        for _ in range(3):  # the retry of an ack that was not journaled is never "already"
            res = h.request(
                "POST",
                f"{path}/ack",
                ok=(200, 503),
                body={"client": "c", "acks": [[lease, fence, full, full + 1]]},
            )
            assert res.status == 503 or res.json()["acks"][lease] == "ok"
            if res.status == 200:
                told[full] = "ok"
                break
        assert server_alive(url)
    finally:
        h.close()
        stop(proc, kill=True)
    proc = _start_limited(server["root"], state, port, 1 << 30)
    try:
        with Client(url, read) as c:
            journaled = {u for a, b, _ in c.done(it) for u in range(a, b)}
    finally:
        stop(proc)
    assert journaled == set(told) and set(told.values()) == {
        "ok"
    }  # told "ok" exactly for what was journaled


def server_alive(url: str) -> bool:
    h = Http(url, None)
    try:
        return h.request("GET", "/api/v1/health").json()["ok"] is True
    finally:
        h.close()


def test_the_server_holds_no_per_sample_order_and_evicts_finished_iterations(
    server: dict[str, Any], tmp_path: Path
) -> None:
    from datamill.serve.server import ServeState

    st = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        st.register("ds", name="ds")
        info = st.create_iteration(
            {"dataset": "ds", "batch_size": 1000, "name": "evict", "lease_size": 2, "world_size": 2}
        )
        it = st.iteration(info["id"])
        for rank in range(2):
            while (payload := next_lease(st, it, f"c{rank}", rank=rank)) is not None:
                ack(st, it, payload.lease.id, payload.lease.fence, client=f"c{rank}")
        svc = st.service(it.config)
        assert (
            svc.stats()["plans_cached"] == 0 and not svc._orders
        )  # batches built without the epoch's full order
        assert info["id"] not in st._iterations  # finished: evicted from memory
        again = st.iteration(info["id"])  # rebuilt from the journal on demand
        assert (
            again is not it
            and st.progress(again)["done"] == again.total == 6
            and again.finished_all()
        )
    finally:
        st.close()
