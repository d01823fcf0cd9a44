"""``GET /api/v1/iterations/{id}/trace``: a served iteration's run record traces exactly what
clients received.

Ground truth: every batch a RemoteLoader yields is recorded (its ``uid`` column); trace must agree
in both directions (UID -> rank/client and step; rank/client and step -> UIDs) for every UID and
step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datamill.client import Client, Leases, RemoteLoader
from datamill.client.http import Http, RemoteError
from datamill.core.errors import ConfigError
from datamill.lineage.trace import Tracer
from datamill.loader import Loader
from datamill.shards.dataset import ShardsetDataset
from datamill.sources import open_source
from tests.serve._opts import grouped
from tests.serve._proc import env, read_log, start_worker, stop
from tests.serve.conftest import N

pytestmark = pytest.mark.server


def _record(server: dict[str, Any], it_id: str, key: str | None = None) -> dict[str, Any]:
    h = Http(server["url"], server["read"] if key is None else key)
    try:
        out: dict[str, Any] = h.request("GET", f"/api/v1/iterations/{it_id}/trace").json()
        return out
    finally:
        h.close()


def _uid_hits(tracer: Tracer) -> dict[int, list[tuple[Any, int, int]]]:
    """uid -> [(rank or client, step, position)] for every sample of the dataset."""
    samples = list(range(tracer.n))
    out: dict[int, list[tuple[Any, int, int]]] = {}
    for h in tracer.find(samples):
        out.setdefault(int(h.uid), []).append(
            (h.client if h.client is not None else h.rank, h.step, h.position)
        )
    return out


def test_static_iteration_trace_matches_what_each_rank_received(server: dict[str, Any]) -> None:
    opts: dict[str, Any] = {
        "batch_size": 64,
        "seed": 21,
        "mode": "static",
        "world_size": 2,
        "name": "trace-static",
        "lease_size": 3,
    }
    seen: dict[int, list[list[int]]] = {}
    it_id = None
    for rank in (0, 1):
        loader = RemoteLoader(
            server["url"], server["read"], "ds", **grouped(collate="arrow", rank=rank, **opts)
        )
        seen[rank] = [b.column("uid").to_pylist() for b in loader]
        it_id = loader.iteration_id
    assert it_id is not None
    record = _record(server, it_id)
    assert record["served"]["mode"] == "static" and "queues" not in record["served"]
    source = open_source(server["root"] / "ds")
    # the same order as in process
    for rank in (0, 1):
        local = Loader(source, 64, seed=21, rank=rank, world_size=2, collate="arrow")
        assert [b.column("uid").to_pylist() for b in local] == seen[rank]
    tracer = Tracer(record, source=source)
    for rank, batches in seen.items():
        for step, uids in enumerate(batches):
            assert tracer.batch(rank=rank, step=step, epoch=0).uids == uids
    hits = _uid_hits(tracer)
    want = {
        u: [(rank, step, pos)]
        for rank, bs in seen.items()
        for step, b in enumerate(bs)
        for pos, u in enumerate(b)
    }
    assert hits == want and len(want) == N


def test_dynamic_iteration_trace_after_a_client_kill(
    server: dict[str, Any], tmp_path: Path
) -> None:
    name = "trace-dynamic-kill"
    opts: dict[str, Any] = {
        "batch_size": 50,
        "seed": 33,
        "mode": "dynamic",
        "name": name,
        "lease_size": 4,
        "lease_timeout": 2.0,
    }
    log = tmp_path / "w.log"
    worker = start_worker(server["url"], server["read"], "ds", log, **opts, sleep=0.03)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(read_log(log)) < 15:
            time.sleep(0.01)
    finally:
        stop(worker, kill=True)
    logged = read_log(log)
    assert len(logged) >= 15
    survivor = RemoteLoader(server["url"], server["read"], "ds", **grouped(collate="arrow", **opts))
    seen = [b.column("uid").to_pylist() for b in survivor]
    assert survivor.iteration_id is not None
    record = _record(server, survivor.iteration_id)
    served = record["served"]
    clients = {c for c, _, _ in served["acks"]}
    assert survivor.client_id in clients and len(clients) == 2, clients
    killed = next(c for c in clients if c != survivor.client_id)
    tracer = Tracer(record, source=open_source(server["root"] / "ds"))
    # step -> uids, both clients: the survivor's every batch, the killed one's acknowledged prefix
    units = tracer.unit_map().units
    assert len(units[survivor.client_id]) == len(seen)
    for step, uids in enumerate(seen):
        b = tracer.batch(client=survivor.client_id, step=step)
        assert b.uids == uids and b.client == survivor.client_id
    acked = len(units[killed])
    assert 1 <= acked <= len(logged)
    killed_batches = [tracer.batch(client=killed, step=k).uids for k in range(acked)]
    assert killed_batches == logged[:acked]
    # uid -> (client, step): every sample exactly once, where it was acknowledged
    want = {u: [(survivor.client_id, s, p)] for s, b in enumerate(seen) for p, u in enumerate(b)}
    want.update(
        {u: [(killed, s, p)] for s, b in enumerate(killed_batches) for p, u in enumerate(b)}
    )
    assert _uid_hits(tracer) == want and len(want) == N
    # the killed client's batches not acknowledged were delivered again to the survivor
    redone = {tuple(b) for b in logged[acked:]}
    assert redone <= {tuple(b) for b in seen}


def test_trace_route_needs_a_key_and_the_cli_reads_the_url(
    server: dict[str, Any], tmp_path: Path
) -> None:
    loader = RemoteLoader(
        server["url"],
        server["read"],
        "ds",
        collate="arrow",
        batch_size=100,
        seed=2,
        leases=Leases(name="trace-cli", size=8),
    )
    batches = [b.column("uid").to_pylist() for b in loader]
    url = f"{server['url']}/api/v1/iterations/{loader.iteration_id}/trace"
    with pytest.raises(RemoteError) as err:
        _record(server, str(loader.iteration_id), key="")
    assert err.value.status == 401
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "trace",
            url,
            "--key",
            server["read"],
            "--source",
            str(server["root"] / "ds"),
            "--uid",
            str(batches[3][5]),
            "--json",
        ],
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)["hits"]
    assert [(h["rank"], h["step"], h["position"]) for h in hits] == [(0, 3, 5)]
    saved = tmp_path / "record.json"
    saved.write_text(json.dumps(_record(server, str(loader.iteration_id))))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "trace",
            str(saved),
            "--source",
            str(server["root"] / "ds"),
            "--step",
            "7",
            "--rank",
            "0",
            "--json",
        ],
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["batches"][0]["uids"] == batches[7]


def test_static_iteration_resumed_on_another_world_size_traces_the_served_ranks(
    server: dict[str, Any],
) -> None:
    kw: dict[str, Any] = {"batch_size": 30, "seed": 17, "collate": "arrow", "lease_size": 4}
    first: dict[int, list[list[int]]] = {}
    for rank in range(
        3
    ):  # each rank consumes 2 whole leases and a batch (acknowledged), then its process stops
        loader = RemoteLoader(
            server["url"],
            server["read"],
            "ds",
            **grouped(rank=rank, world_size=3, name="tr3", **kw),
        )
        it = iter(loader)  # the 9th batch is acknowledged as it is handed out
        first[rank] = [next(it).column("uid").to_pylist() for _ in range(2 * 4 + 1)]
        it.close()
        old_id = loader.iteration_id
    second: dict[int, list[list[int]]] = {}
    # create the resumed iteration (the RemoteLoaders join it by name)
    with Client(server["url"], server["read"]) as client:
        info = client.iteration(
            "ds",
            batch_size=30,
            seed=17,
            resume_from=str(old_id),
            leases=Leases(world_size=2, name="tr2r"),
        )
    for rank in range(2):
        loader = RemoteLoader(
            server["url"],
            server["read"],
            "ds",
            **grouped(rank=rank, world_size=2, name="tr2r", **kw),
        )
        second[rank] = [b.column("uid").to_pylist() for b in loader]
    source = open_source(server["root"] / "ds")
    old = Tracer(_record(server, str(old_id)), source=source)
    for rank, batches in first.items():
        for step, uids in enumerate(batches):
            assert old.batch(rank=rank, step=step, epoch=0).uids == uids
    record = _record(server, info["id"])
    assert record["served"]["queues"] is not None and record["served"]["base_done"]
    tracer = Tracer(record, source=source)
    for rank, batches in second.items():
        for step, uids in enumerate(batches):
            assert tracer.batch(rank=rank, step=step).uids == uids
    want = {
        u: [(rank, step, pos)]
        for rank, bs in second.items()
        for step, b in enumerate(bs)
        for pos, u in enumerate(b)
    }
    assert (
        _uid_hits(tracer) == want
    )  # the samples done before the resume: not read by this iteration
    assert len(want) + sum(len(b) for bs in first.values() for b in bs) == N


def test_a_run_served_as_one_iteration_per_epoch_is_traced_as_one(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """Several iterations' records (one per epoch) joined: every UID's batches in both epochs, and
    steps counted across them, as the client received them."""
    seen: list[list[int]] = []  # every batch of the run, epoch 0 then epoch 1
    ids = []
    for epoch in (0, 1):
        loader = RemoteLoader(
            server["url"],
            server["read"],
            "ds",
            collate="arrow",
            batch_size=128,
            seed=5,
            epoch=epoch,
            leases=Leases(name="trace-run", size=4),
        )
        seen += [b.column("uid").to_pylist() for b in loader]
        ids.append(loader.iteration_id)
    assert len(set(ids)) == 2
    per_epoch = len(seen) // 2
    records = [_record(server, str(i)) for i in reversed(ids)]  # any order
    from datamill.lineage.join import RunTracer

    run = RunTracer(records, source=open_source(server["root"] / "ds"))
    assert list(run.epochs()) == [0, 1]
    want: dict[int, list[tuple[int, int, int, str]]] = {}
    for g, uids in enumerate(seen):
        for pos, u in enumerate(uids):
            want.setdefault(u, []).append((g // per_epoch, g, pos, str(ids[g // per_epoch])))
    got: dict[int, list[tuple[int, int, int, str]]] = {}
    for h in run.find(list(range(run.n))):
        got.setdefault(int(h.uid), []).append((h.epoch, h.global_step, h.position, h.iteration))
    assert got == want and all(len(v) == 2 for v in got.values())
    for g in (0, per_epoch - 1, per_epoch, len(seen) - 1):
        b = run.batch(rank=0, step=g)
        assert b.uids == seen[g] and b.iteration == str(ids[g // per_epoch])
    assert run.batch(rank=0, step=2, epoch=1).uids == seen[per_epoch + 2]
    # the CLI takes the iterations' URLs together
    urls = [f"{server['url']}/api/v1/iterations/{i}/trace" for i in ids]
    uid = seen[per_epoch + 1][3]
    out = subprocess.run(
        [sys.executable, "-m", "datamill.cli", "trace", *urls, "--key", server["read"]]
        + ["--source", str(server["root"] / "ds"), "--uid", str(uid), "--json"],
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)["hits"]
    assert [(h["epoch"], h["global_step"], h["iteration"]) for h in hits] == [
        (e, g, i) for e, g, _, i in want[uid]
    ]
    # records of another run are refused
    other = RemoteLoader(
        server["url"],
        server["read"],
        "ds",
        collate="arrow",
        batch_size=128,
        seed=6,
        leases=Leases(name="other"),
    )
    for _ in other:
        pass
    with pytest.raises(ConfigError, match="not of the same run"):
        RunTracer([records[0], _record(server, str(other.iteration_id))])


def test_the_runs_route_joins_a_named_runs_iterations_within_the_keys_datasets(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """``GET /api/v1/runs/{name}/trace``: the records of the run's iterations in epoch order (a
    page at a time), traced as the clients received them; only datasets the key may use; bounded."""
    name = "route-run"
    seen: list[list[int]] = []
    ids = []
    for epoch in (0, 1, 2):
        loader = RemoteLoader(
            server["url"],
            server["read"],
            "ds",
            collate="arrow",
            batch_size=200,
            seed=8,
            epoch=epoch,
            leases=Leases(name=name, size=8),
        )
        seen += [b.column("uid").to_pylist() for b in loader]
        ids.append(str(loader.iteration_id))
    per_epoch = len(seen) // 3
    h = Http(server["url"], server["read"])
    try:
        doc = h.request("GET", f"/api/v1/runs/{name}/trace").json()
        assert doc["format"] == "datamill.run-records/1" and doc["run"] == name
        assert doc["iterations"] == ids and doc["next_epoch"] is None
        assert [r["served"]["iteration"] for r in doc["records"]] == ids
        page = h.request("GET", f"/api/v1/runs/{name}/trace?limit=2").json()
        assert page["iterations"] == ids[:2] and page["next_epoch"] == 2
        rest = h.request("GET", f"/api/v1/runs/{name}/trace?from_epoch=2").json()
        assert rest["iterations"] == ids[2:] and rest["next_epoch"] is None
        for bad, status in (
            (f"/api/v1/runs/{name}/trace?limit=65", 422),  # at most 64 records a request
            ("/api/v1/runs/no-such-run/trace", 404),
            (f"/api/v1/runs/{name}/trace?from_epoch=3", 404),
        ):
            with pytest.raises(RemoteError) as err:
                h.request("GET", bad)
            assert err.value.status == status, bad
        anonymous = Http(server["url"], "")
        try:
            with pytest.raises(RemoteError) as err:
                anonymous.request("GET", f"/api/v1/runs/{name}/trace")
            assert err.value.status == 401
        finally:
            anonymous.close()
    finally:
        h.close()
    from datamill.lineage.join import RunTracer

    run = RunTracer(doc["records"], source=open_source(server["root"] / "ds"))
    want: dict[int, list[tuple[int, int, int, str]]] = {}
    for g, uids in enumerate(seen):
        for pos, u in enumerate(uids):
            want.setdefault(u, []).append((g // per_epoch, g, pos, ids[g // per_epoch]))
    got: dict[int, list[tuple[int, int, int, str]]] = {}
    for hit in run.find(list(range(run.n))):
        got.setdefault(int(hit.uid), []).append(
            (hit.epoch, hit.global_step, hit.position, str(hit.iteration))
        )
    assert got == want and all(len(v) == 3 for v in got.values())
    # the CLI takes the run's URL and follows its pages
    uid = seen[2 * per_epoch + 4][1]
    out = subprocess.run(
        [sys.executable, "-m", "datamill.cli", "trace"]
        + [f"{server['url']}/api/v1/runs/{name}/trace?limit=1", "--key", server["read"]]
        + ["--source", str(server["root"] / "ds"), "--uid", str(uid), "--json"],
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)["hits"]
    assert [(x["epoch"], x["global_step"], x["iteration"]) for x in hits] == [
        (e, g, i) for e, g, _, i in want[uid]
    ]
    # a key limited to another dataset sees none of the run; a name on two datasets needs dataset=
    ShardsetDataset.create(
        server["root"] / "ds-runs",
        pa.table({"uid": list(range(300))}),
        uid="uid",
        shardset="main",
        shard_size=100,
    )
    with Client(server["url"], server["admin"]) as admin:
        admin.register("ds-runs", name="ds-runs")
        other_key = admin.http.request(
            "POST", "/api/v1/keys", body={"role": "read", "datasets": ["ds-runs"]}
        ).json()["key"]
    elsewhere = RemoteLoader(
        server["url"],
        other_key,
        "ds-runs",
        collate="arrow",
        batch_size=100,
        epoch=3,
        leases=Leases(name=name),
    )
    for _ in elsewhere:
        pass
    h = Http(server["url"], other_key)
    try:
        mine = h.request("GET", f"/api/v1/runs/{name}/trace").json()
        assert mine["iterations"] == [str(elsewhere.iteration_id)]  # not the ds epochs
    finally:
        h.close()
    h = Http(server["url"], server["read"])
    try:
        with pytest.raises(RemoteError) as err:
            h.request("GET", f"/api/v1/runs/{name}/trace")
        assert err.value.status == 400 and "dataset=" in str(err.value)
        assert h.request("GET", f"/api/v1/runs/{name}/trace?dataset=ds").json()["iterations"] == ids
    finally:
        h.close()
