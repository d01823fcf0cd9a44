"""Direct mode (the client builds its batches) and build workers (the server builds in worker
processes)."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.client.http import RemoteError
from datamill.loader import Loader
from datamill.serve.server import ServeState
from datamill.sources import open_source
from tests.serve._opts import grouped
from tests.serve._proc import (
    assert_once_after_kills,
    free_port,
    read_log,
    start_server,
    start_worker,
    stop,
)
from tests.serve._trips import ack, next_lease
from tests.serve.conftest import N

pytestmark = pytest.mark.server


def _ipc(tables: list[pa.Table]) -> bytes:
    from datamill.serve.data.workers import ipc_stream

    return bytes(ipc_stream(tables).to_pybytes())


@pytest.fixture(scope="module")
def direct(server: dict[str, Any]) -> dict[str, Any]:
    """The shared server with ``dsd``: the same files as ``ds``, registered with a client
    location."""
    if not (server["root"] / "dsd").exists():  # one path, one dataset id: a copy of ds
        shutil.copytree(server["root"] / "ds", server["root"] / "dsd")
    with Client(server["url"], server["admin"]) as c:
        c.register("dsd", name="dsd", client_location=str((server["root"] / "dsd").resolve()))
    return server


def _same_arrays(a: pa.Table, b: pa.Table) -> None:
    """The same numpy batches (what a training loop gets), compared by dtype, shape and bytes."""
    from datamill.loader.collate import resolve_collate

    to_np = resolve_collate("numpy")
    x, y = to_np(a), to_np(b)
    assert list(x) == list(y)
    for k in x:
        assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
        assert (
            x[k].tolist() == y[k].tolist()
            if x[k].dtype == object
            else x[k].tobytes() == y[k].tobytes()
        )


def test_direct_batches_are_byte_identical_to_server_built_and_in_process(
    direct: dict[str, Any],
) -> None:
    source = open_source(direct["root"] / "ds")
    for rank in range(2):
        kw: dict[str, Any] = {
            "batch_size": 64,
            "seed": 13,
            "rank": rank,
            "world_size": 2,
            "lease_size": 5,
            "collate": "arrow",
        }
        built = list(
            RemoteLoader(direct["url"], direct["read"], "dsd", **grouped(name="d-built", **kw))
        )
        loader = RemoteLoader(
            direct["url"],
            direct["read"],
            "dsd",
            **grouped(name="d-direct", transport="direct", **kw),
        )
        got = list(loader)
        ref = list(Loader(source, 64, seed=13, rank=rank, world_size=2, collate="arrow"))
        assert len(got) == len(built) == len(ref) == 47
        for a, b, c in zip(got, built, ref):
            assert _ipc([a]) == _ipc(
                [b]
            )  # direct == server-built, byte for byte (the lease's IPC form)
            _same_arrays(a, c)  # == the in-process Loader, collated array bytes
        assert loader.stats["batches"] == 47 and loader.stats["acks"].get("ok", 0) >= 1
    with Client(direct["url"], direct["read"]) as client:
        progress = client.progress("d-direct")
        assert (progress["total"], progress["done"], progress["leased"]) == (94, 94, 0)
        # the direct leases carried no batches: the server sent no Arrow bytes for them
        assert client.location("dsd") == str((direct["root"] / "dsd").resolve())


def test_direct_numpy_batches_of_two_epochs_equal_the_loader(direct: dict[str, Any]) -> None:
    """Direct mode with the default numpy collate (the batches collated as they are built, a block
    at a time), an epoch after the first planned while its join is in flight (not during the
    previous epoch), one epoch's plans kept: the in-process Loader's arrays, epoch after epoch."""
    import numpy as np

    kw: dict[str, Any] = {"batch_size": 96, "seed": 21, "name": "d-numpy", "lease_size": 4}
    loader = RemoteLoader(direct["url"], direct["read"], "dsd", **grouped(transport="direct", **kw))
    ref = Loader(open_source(direct["root"] / "ds"), 96, seed=21)
    assert loader._direct is not None
    early: list[tuple[int, int, int]] = []
    plan_ahead = loader._direct.plan_ahead
    loader._direct.plan_ahead = lambda *a: (early.append(a), plan_ahead(*a))[1]  # type: ignore[method-assign]
    primed: list[int] = []
    prime = loader._direct.prime
    loader._direct.prime = lambda cfg, **k: (primed.append(k["batch"]), prime(cfg, **k))[1]  # type: ignore[method-assign]
    opened: list[str] = []  # the copy opened during epoch 0's join, checked again at epoch 1
    for name in ("preopen", "recheck"):
        method = getattr(loader._direct, name)
        spy = lambda *a, _m=method, _n=name, **k: (opened.append(_n), _m(*a, **k))[1]
        setattr(loader._direct, name, spy)
    restarts: list[int] = []  # builds per epoch: the first batch built ahead is the first lease's
    end_epoch = loader._direct.end_epoch
    loader._direct.end_epoch = lambda: (  # type: ignore[method-assign]
        restarts.append(getattr(loader._direct.stream, "restarts", -1)),
        end_epoch(),
    )[1]
    for epoch in (0, 1):
        got, want = list(loader), list(ref)
        assert len(got) == len(want) > 10
        for a, b in zip(got, want):
            assert list(a) == list(b)
            for k in a:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
                assert a[k].flags.writeable == b[k].flags.writeable
        assert loader._direct._service is not None
        plans = {k[0] for k in loader._direct._service[1]._plans}
        assert epoch + 1 not in plans  # nothing planned ahead during the epoch
        assert plans == {epoch}  # one epoch's plans kept, as in process: the last one's dropped
        # epoch 0 opened the dataset and planned itself; epoch 1 began its plan before its join
        assert early == [(1, 0, 1)][:epoch]
        assert opened == ["preopen", "recheck"][: epoch + 1] and loader._direct._pre is None
        assert restarts == [1] * (epoch + 1) and primed == [0] * (epoch + 1)


@pytest.mark.parametrize("acks_go_through", [True, False])
def test_a_static_epoch_ends_when_its_last_acks_are_journaled(
    direct: dict[str, Any], monkeypatch: pytest.MonkeyPatch, acks_go_through: bool
) -> None:
    """A static client whose loop took the rank's last batch ends the epoch as soon as one request
    has journaled its last acks; when that request fails, it waits for the server's end of epoch as
    before. Either way the server records every batch done, once."""
    from datamill.client.feed import LeaseFeed

    if not acks_go_through:
        monkeypatch.setattr(LeaseFeed, "flush_all", lambda self: False)
    name = f"end-{acks_go_through}"
    loader = RemoteLoader(
        direct["url"],
        direct["read"],
        "dsd",
        batch_size=128,
        seed=2,
        leases=Leases(name=name, size=8),
    )
    got = list(loader)
    assert loader.stats["ended_by_acks"] == (1 if acks_go_through else 0)
    assert sum(b["uid"].shape[0] for b in got) == N
    with Client(direct["url"], direct["read"]) as client:
        progress, done = client.progress(name), client.done(name)
    assert progress["done"] == progress["total"] == len(got) and progress["leased"] == 0
    units = sorted(u for a, b, _ in done for u in range(a, b))
    assert units == list(range(len(got)))  # the committed record: every batch exactly once


def test_direct_mode_needs_a_client_location(direct: dict[str, Any]) -> None:
    """A dataset registered without client_location: direct mode is refused with a one-line 400."""
    loader = RemoteLoader(
        direct["url"],
        direct["read"],
        "ds",
        batch_size=50,
        leases=Leases(name="no-loc"),
        transport=Transport("direct"),
    )
    with pytest.raises(RemoteError) as exc:
        next(iter(loader))
    assert exc.value.status == 400 and "no client_location" in str(exc.value).splitlines()[0]
    with Client(direct["url"], direct["read"]) as client, pytest.raises(RemoteError) as exc2:
        client.iteration("ds", batch_size=50, transport="direct")
    assert exc2.value.status == 400
    with Client(direct["url"], direct["admin"]) as admin, pytest.raises(RemoteError) as exc3:
        admin.register("ds", name="rel", client_location="relative/path")
    assert exc3.value.status == 400 and "absolute path or s3://" in str(exc3.value)
    with pytest.raises(Exception, match="unknown transport"):
        RemoteLoader(
            direct["url"], direct["read"], "dsd", batch_size=5, transport=Transport("pigeon")
        )


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_direct_exactly_once_with_a_client_kill_and_a_server_kill(
    direct: dict[str, Any], tmp_path: Path, mode: str
) -> None:
    """As test_restart's: a client killed -9 and replaced, the server killed -9 and restarted; in
    direct mode."""
    state, port = tmp_path / "state", free_port()
    shutil.copytree(direct["state"], state)
    url = f"http://127.0.0.1:{port}"
    opts: dict[str, Any] = {
        "batch_size": 20,
        "seed": 6,
        "mode": mode,
        "name": "ddups",
        "sleep": 0.04,
        "transport": "direct",
        "lease_size": 16,  # several leases per client (direct mode's default is 64 batches)
    }
    if mode == "static":
        opts["world_size"] = 2
    rank = {"a": 0, "a2": 0, "b": 1}
    proc = start_server(direct["root"], state, port, "--lease-timeout", "2", "--build-workers", "0")
    logs = {k: tmp_path / f"{k}.log" for k in ("a", "b", "a2")}

    def start(k: str) -> Any:
        return start_worker(
            url,
            direct["read"],
            "dsd",
            logs[k],
            **opts,
            **({"rank": rank[k]} if mode == "static" else {}),
        )

    def wait_for(k: str, n: int) -> None:
        deadline = time.monotonic() + 60
        while len(read_log(logs[k])) < n:
            assert time.monotonic() < deadline, f"timed out waiting for {k}'s batches"
            time.sleep(0.02)

    workers = {k: start(k) for k in ("a", "b")}
    try:
        wait_for("a", 25)
        stop(workers["a"], kill=True)
        workers["a2"] = start("a2")
        wait_for("a2", 15)
        stop(proc, kill=True)
        proc = start_server(
            direct["root"], state, port, "--lease-timeout", "2", "--build-workers", "0"
        )
        for k in ("b", "a2"):
            err = Path(str(logs[k]) + ".err")
            assert workers[k].wait(timeout=120) == 0, err.read_text() if err.exists() else ""
        with Client(url, direct["read"]) as client:
            progress, done = client.progress("ddups"), client.done("ddups")
    finally:
        for w in workers.values():
            stop(w, kill=True)
        stop(proc)
    assert_once_after_kills(progress, done, logs, samples=N, total=N // 20)


def test_direct_mode_reads_s3_through_the_client_cache(
    direct: dict[str, Any],
    tmp_path: Path,
    seaweed: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server registers a local copy with client_location s3://...; the client reads
    SeaweedFS."""
    from datamill.core.objstore import s3_filesystem

    endpoint, key, secret = seaweed
    fs = s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    )
    fs.create_dir("direct")
    pafs.copy_files(str(direct["root"] / "ds"), "direct/ds", destination_filesystem=fs)
    for var, val in (
        ("AWS_ACCESS_KEY_ID", key),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_ENDPOINT_URL", endpoint),
    ):
        monkeypatch.setenv(var, val)
    shutil.copytree(direct["root"] / "ds", direct["root"] / "ds3")
    with Client(direct["url"], direct["admin"]) as c:
        c.register("ds3", name="ds3", client_location="s3://direct/ds")
    cache = tmp_path / "cache"
    kw: dict[str, Any] = {"batch_size": 100, "seed": 2, "collate": "arrow", "lease_size": 4}
    got = list(
        RemoteLoader(
            direct["url"],
            direct["read"],
            "ds3",
            **grouped(transport="direct", cache_dir=cache, cache_limit=64 << 20, name="d-s3", **kw),
        )
    )
    ref = list(Loader(open_source(direct["root"] / "ds"), 100, seed=2, collate="arrow"))
    assert len(got) == len(ref) == N // 100
    for a, b in zip(got, ref):
        _same_arrays(a, b)
    assert any(cache.rglob("*"))  # the shards came through the local cache


def test_build_workers_give_the_same_bytes_as_one_process(
    direct: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ServeState with 2 build workers vs in-process builds: the same lease bodies, lease for
    lease (2 ranks: a worker each; 1 rank: each lease built in parts by both workers, in chunks
    of 3 batches, and stitched)."""
    from datamill.serve.data import workers as build_workers

    monkeypatch.setattr(build_workers, "SPLIT_CHUNK", 3)
    bodies: dict[int, list[bytes]] = {}
    for workers in (0, 2):
        st = ServeState(
            tmp_path / f"state{workers}", roots=[direct["root"]], auth=False, build_workers=workers
        )
        try:
            st.register("ds", name="ds")
            out = []
            for world in (2, 1):
                it_id = st.create_iteration(
                    {
                        "dataset": "ds",
                        "batch_size": 70,
                        "seed": 3,
                        "world_size": world,
                        "lease_size": 4,
                        "mode": "static",
                    }
                )["id"]
                it = st.iteration(it_id)
                for rank in range(world):
                    while (
                        p := next_lease(st, it, f"c{rank}", rank=rank, session=f"c{rank}")
                    ) is not None:
                        out.append(p.body)
                        ack(st, it, p.lease.id, p.lease.fence, session=f"c{rank}")
            bodies[workers] = out
        finally:
            st.close()
    assert len(bodies[0]) == len(bodies[2]) > 10 and bodies[0] == bodies[2]
    n = sum(pa.ipc.open_stream(io.BytesIO(b)).read_all().num_rows for b in bodies[2])
    assert n == 2 * N


def test_build_workers_decode_with_their_share_of_the_cores(tmp_path: Path) -> None:
    """Each build worker's Arrow thread pool is its share of the cores, not one thread per core
    (N workers would run N times as many decoding threads as cores)."""
    from datamill.core.parallel import usable_cores
    from datamill.serve.data.workers import BuildPool

    pool = BuildPool(2)
    try:
        share = max(1, usable_cores() // 2)
        assert pool.arrow_threads == share
        assert [pool.workers.call(w, pa.cpu_count) for w in range(2)] == [share, share]
    finally:
        pool.close()


def test_build_workers_hand_leases_over_in_shared_memory_or_the_pipe(
    direct: dict[str, Any], tmp_path: Path
) -> None:
    """A worker hands a lease over in one of its shared-memory slots, reused once the HTTP process
    copied it out (more leases than slots, all of them shared); without shared memory, through the
    pipe: the same bytes either way."""
    bodies: dict[bool, list[bytes]] = {}
    for shared in (True, False):
        st = ServeState(
            tmp_path / f"state{shared}", roots=[direct["root"]], auth=False, build_workers=1
        )
        try:
            assert st.pool.shared  # memfd + /proc/PID/fd on Linux
            st.pool.shared = shared
            st.register("ds", name="ds")
            cfg = {"dataset": "ds", "batch_size": 50, "seed": 1, "lease_size": 2}
            it = st.iteration(st.create_iteration(cfg)["id"])
            out = []
            while (p := next_lease(st, it, "c", session="c")) is not None:
                out.append(bytes(p.body))
                ack(st, it, p.lease.id, p.lease.fence, session="c")
            bodies[shared] = out
            assert len(out) > 8
            assert st.pool.workers.handed == (
                {"shared": len(out), "pipe": 0} if shared else {"shared": 0, "pipe": len(out)}
            )
        finally:
            st.close()
    assert bodies[True] == bodies[False]
    n = sum(pa.ipc.open_stream(io.BytesIO(b)).read_all().num_rows for b in bodies[True])
    assert n == N


def test_a_server_with_build_workers_serves_the_loader_batches(
    direct: dict[str, Any], tmp_path: Path
) -> None:
    state, port = tmp_path / "state", free_port()
    shutil.copytree(direct["state"], state)
    proc = start_server(direct["root"], state, port, "--build-workers", "2")
    try:
        url = f"http://127.0.0.1:{port}"
        got = [
            list(
                RemoteLoader(
                    url,
                    direct["read"],
                    "ds",
                    batch_size=64,
                    seed=5,
                    rank=r,
                    collate="arrow",
                    leases=Leases(world_size=2, name="bw"),
                )
            )
            for r in (0, 1)
        ]
    finally:
        stop(proc)
    source = open_source(direct["root"] / "ds")
    for r in (0, 1):
        ref = list(Loader(source, 64, seed=5, rank=r, world_size=2, collate="arrow"))
        assert len(ref) == len(got[r])
        for a, b in zip(got[r], ref):
            _same_arrays(a, b)


@pytest.mark.parametrize("noticed", [False, True])
def test_a_killed_build_worker_is_replaced(
    direct: dict[str, Any], tmp_path: Path, noticed: bool
) -> None:
    """A build worker killed -9 between two leases: the next lease is built by its replacement,
    also when its death is known before the next ask (``noticed``: the ask's send fails)."""
    import os
    import signal

    st = ServeState(tmp_path / "state", roots=[direct["root"]], auth=False, build_workers=1)
    try:
        st.register("ds", name="ds")
        it = st.iteration(
            st.create_iteration({"dataset": "ds", "batch_size": 100, "lease_size": 2})["id"]
        )
        first = next_lease(st, it, "c", session="c")
        assert first is not None and first.body
        procs = st.pool.workers.procs
        pid = procs[0].pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while noticed and procs[0].proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not noticed or procs[0].proc.poll() is not None
        second = next_lease(st, it, "c", session="c")
        assert second is not None
        assert pa.ipc.open_stream(io.BytesIO(second.body)).read_all().num_rows == 200
        assert procs[0].pid != pid
    finally:
        st.close()


def test_build_workers_exit_when_their_server_is_killed(tmp_path: Path) -> None:
    """A server process killed -9 (or by the out-of-memory killer) leaves no build worker behind:
    each worker watches its server and exits within about a second of it (they used to wait on
    their queue for ever, with their forkserver)."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from datamill.serve.data.workers import BuildPool\n"
        "pool = BuildPool(2)\n"
        "print(*pool.warm(), flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2
        assert all(_running(p) for p in workers)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 15
    while any(_running(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in workers)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_iterate_cli_transport_direct(
    direct: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`datamill iterate DATASET --url URL --transport direct` (and `datamill serve iterate`): the
    process builds the batches; a dataset without a client location is refused in one line."""
    from datamill.cli import main

    url, key = direct["url"], direct["read"]
    for i, cmd in enumerate((["iterate"], ["serve", "iterate"])):
        args = [*cmd, "dsd", "--url", url, "--key", key, "--batch-size", "500"]
        assert main([*args, "--name", f"cli-direct-{i}", "--transport", "direct"]) == 0
        out = capsys.readouterr().out
        assert "12 batches, 6,000 samples" in out and "transport direct" in out
        with Client(url, key) as client:  # every batch acknowledged
            progress = client.progress(f"cli-direct-{i}")
        assert progress["done"] == progress["total"] == 12
        # the same dataset registered without a client location: direct mode is refused
        bad = [*cmd, "ds", "--url", url, "--key", key, "--transport", "direct", "--name", "nope"]
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "no client_location" in err and err.count("\n") == 1
    assert main(["iterate", str(direct["root"] / "ds"), "--transport", "direct"]) == 2
    assert "needs --url" in capsys.readouterr().err


def test_a_wide_ack_window_sends_acks_from_two_threads_each_batch_once(
    direct: dict[str, Any],
) -> None:
    """With ``ack_window`` > 1 two ack requests may be in flight (each with the acks consumed
    since the other was sent): the Loader's arrays, every batch committed exactly once, and no
    ack thread left after the epoch."""
    import threading

    import numpy as np

    name = "wide-window"
    kw: dict[str, Any] = {"batch_size": 64, "seed": 5, "name": name, "lease_size": 8}
    loader = RemoteLoader(
        direct["url"], direct["read"], "dsd", **grouped(transport="direct", ack_window=16, **kw)
    )
    want = list(Loader(open_source(direct["root"] / "ds"), 64, seed=5))
    senders: set[str] = set()
    got = []
    for batch in loader:
        senders.update(t.name for t in threading.enumerate() if "serve-ack" in t.name)
        got.append(batch)
    assert senders == {"datamill-serve-ack", "datamill-serve-ack1"}
    assert len(got) == len(want) and all(
        np.array_equal(a[k], b[k]) for a, b in zip(got, want) for k in b
    )
    assert not [t for t in threading.enumerate() if t.name.startswith("datamill-serve-ack")]
    with Client(direct["url"], direct["read"]) as client:
        progress, done = client.progress(name), client.done(name)
    assert progress["done"] == progress["total"] == len(got)
    assert sorted(u for a, b, _ in done for u in range(a, b)) == list(range(len(got)))


def test_a_static_wide_window_carries_its_acks_on_the_lease_requests(
    direct: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Static mode, ``ack_window`` of two leases and more: the batches consumed ride on the next
    lease request (``?ack=``), so ack requests are the exception; every batch is still committed
    exactly once (``on_commit`` and the server's record). Dynamic mode does not piggy-back."""
    from datamill.client.feed import LeaseFeed
    from datamill.client.http import Http

    calls: list[tuple[str, int]] = []  # (path's last part, acks carried)

    def spied(send: Any) -> Any:  # lease requests go by Http.head, the others by Http.request
        def spy(self: Http, method: str, path: str, **kw: Any) -> Any:
            carried = sum(k == "ack" for k, _ in kw.get("query", ()))
            calls.append((path.rsplit("/", 1)[-1], carried))
            return send(self, method, path, **kw)

        return spy

    monkeypatch.setattr(Http, "request", spied(Http.request))
    monkeypatch.setattr(Http, "head", spied(Http.head))
    committed: list[int] = []
    name = "piggyback"
    t = {"ack_window": 32, "on_commit": committed.extend}
    kw: dict[str, Any] = {"batch_size": 64, "seed": 5, "name": name, "lease_size": 8}
    loader = RemoteLoader(
        direct["url"], direct["read"], "dsd", **grouped(transport="direct", **t, **kw)
    )
    got = list(loader)
    leases = sum(p == "next" for p, _ in calls)
    assert sum(c > 0 for p, c in calls if p == "next") >= leases // 2
    assert sum(p == "ack" for p, _ in calls) < leases // 2
    with Client(direct["url"], direct["read"]) as client:
        progress, done = client.progress(name), client.done(name)
    assert progress["done"] == progress["total"] == len(got)
    assert sorted(u for a, b, _ in done for u in range(a, b)) == list(range(len(got)))
    assert sorted(committed) == sorted(u for a, b, _ in done for u in range(a, b))
    loader.mode = "dynamic"
    assert not LeaseFeed(loader, "x", 1.0, direct=True, ack_window=32).piggyback


def test_a_static_fetch_thread_waits_for_the_loop_once_every_position_is_leased() -> None:
    """Static mode, one slot: once the rank's last position is leased to the client, its fetch
    thread sends nothing (a request would only be answered `409`) until the loop has finished every
    lease it was handed; then it asks again (`204`, or a lease re-issued after an expiry). Dynamic
    mode asks on as before."""
    from datamill.client.feed import LeaseFeed

    loader = RemoteLoader(
        "http://127.0.0.1:1", None, "d", batch_size=8, **grouped(transport="direct", ack_window=8)
    )
    feed = LeaseFeed(loader, "x", 1.0, direct=True, ack_window=8)
    loader._queue_total = 24
    feed.fetched, feed.leased_to = 2, 16
    assert not feed._idle()  # positions left to lease
    feed.fetched, feed.leased_to = 3, 24
    assert feed._idle()  # every position leased, the loop holds three leases
    feed.lease_done()
    feed.lease_done()
    assert feed._idle() and feed.acked.is_set()  # each finished lease wakes the fetch thread
    feed.lease_done()
    assert not feed._idle()  # the loop finished every lease: ask again
    loader.mode = "dynamic"
    feed = LeaseFeed(loader, "x", 1.0, direct=True, ack_window=8)
    feed.fetched, feed.leased_to = 3, 24
    assert not feed._idle()


def test_a_waiting_loop_lets_the_acks_in_flight_answer_before_another_request() -> None:
    """Static mode with a wide window: a loop waiting for an answer that the acks in flight (on a
    lease request) would give does not make the ack thread send another request at once; it does
    when nothing is in flight or the acks not in flight would hold the loop anyway, and in dynamic
    mode as before."""
    from datamill.client.feed import LeaseFeed

    loader = RemoteLoader(
        "http://127.0.0.1:1", None, "d", batch_size=8, **grouped(transport="direct", ack_window=8)
    )
    feed = LeaseFeed(loader, "x", 1.0, direct=True, ack_window=8)
    loader._unflushed = [("l", "f", i) for i in range(8)]
    feed.loop_waits = True
    assert feed._due()  # nothing in flight: the pending acks go now
    feed.in_flight = set(loader._unflushed[:4])
    assert not feed._due()  # the answer to the 4 in flight lets the loop go on
    loader._unflushed += [("l", "f", i) for i in range(8, 12)]
    feed.in_flight = set(loader._unflushed[:3])  # 9 not in flight: the loop would still wait
    assert feed._due()
    loader.mode = "dynamic"
    feed = LeaseFeed(loader, "x", 1.0, direct=True, ack_window=8)
    feed.loop_waits, feed.in_flight = True, set(loader._unflushed[:4])
    assert feed._due()


def test_a_static_direct_loader_takes_leases_of_half_its_ack_window() -> None:
    """Without ``Leases(size=)``, a static direct loader's leases hold half its ``ack_window``
    (at least the default 64, at most 1,024), so each lease request carries half a window of
    acknowledgements; dynamic, server-built and sized loaders keep their sizes."""

    def size(batch: int = 8, **kw: Any) -> int | None:
        loader = RemoteLoader("http://127.0.0.1:1", None, "d", batch_size=batch, **grouped(**kw))
        return loader.leases.size

    assert size(transport="direct", ack_window=256) == 128
    assert size(transport="direct", ack_window=1 << 16) == 1024
    assert size(16384, transport="direct", ack_window=1 << 16) == 256  # the server's sample bound
    assert size(transport="direct") == size(transport="direct", ack_window=64) == 64
    assert size(transport="direct", ack_window=256, mode="dynamic") == 64
    assert size(transport="direct", ack_window=256, lease_size=8) == 8
    assert size(ack_window=256) is None  # server-built: sized by bytes on the server
