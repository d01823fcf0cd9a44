"""``Workers(processes=N)``: the same batches as in process, resumable, and no process left."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.core.errors import ConfigError
from datamill.core.source import TableSource
from datamill.loader import Batching, Loader, Workers
from datamill.loader.procs import WorkerError

SRC = Path(__file__).resolve().parents[2] / "src"


def _source(n: int = 3000) -> TableSource:
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(int(k)) for k in rng.integers(0, 64, n)]
    tokens = [list(range(int(k))) for k in rng.integers(0, 9, n)]
    table = pa.table(
        {
            "uid": np.arange(n),
            "x": rng.random(n).astype(np.float32),
            "blob": pa.array(blobs, pa.binary()),
            "tokens": pa.array(tokens, pa.list_(pa.int32())),
        }
    )
    return TableSource(table, shard_size=250)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, pa.Table):
        return bool(a.equals(b))
    assert a.keys() == b.keys()
    assert all(type(a[k]) is type(b[k]) and a[k].dtype == b[k].dtype for k in a)
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie left to an init that does not reap counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_for(cond: Any, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize(("collate", "processes"), [("numpy", 2), ("arrow", 1), ("torch", 2)])
def test_same_batches_as_in_process_over_two_epochs(collate: str, processes: int) -> None:
    if collate == "torch":
        pytest.importorskip("torch")
    src = _source()
    kw: dict[str, Any] = {"seed": 7, "collate": collate, "batching": Batching(window=3)}
    here = Loader(src, 64, **kw)
    there = Loader(src, 64, **kw, workers=Workers(processes=processes, threads=1))
    for _ in range(2):
        a, b = list(here), list(there)
        assert len(a) == len(b) == 47
        assert all(_same(x, y) for x, y in zip(a, b, strict=True))
    assert there.stats()["yielded"] == here.stats()["yielded"] == 3000
    assert there.state_dict() == here.state_dict()


def test_a_build_reads_the_next_window_while_building_this_one() -> None:
    """In process and in a worker process alike, a build reads the next shuffle window while it
    builds this one (before, the in-process loader read only ``prefetch`` shards ahead): same
    batches, at most two windows held."""
    src = _source(6000)  # 24 shards of 250 rows
    kw: dict[str, Any] = {"seed": 3, "batching": Batching(window=6)}
    here = Loader(src, 50, **kw)
    there = Loader(src, 50, **kw, workers=Workers(processes=1))
    a, b = iter(here), iter(there)
    assert _same(next(a), next(b))
    assert here.stats()["shards_read"] == there.stats()["shards_read"] == 2 * 6  # two windows
    assert all(_same(x, y) for x, y in zip(a, b, strict=True))
    assert here.stats()["peak_shards_in_memory"] <= 2 * 6 + 2
    assert there.stats()["peak_shards_in_memory"] <= 2 * 6 + 4
    assert there._procs is not None
    there._procs.close()


def test_workers_started_as_fresh_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start where fork is not available (not Linux): the same batches."""
    from datamill.loader import procs

    monkeypatch.setattr(procs, "_START", "exec")
    src = _source(1000)
    there = Loader(src, 100, seed=5, workers=Workers(processes=1))
    assert [b["uid"].tolist() for b in there] == [
        b["uid"].tolist() for b in Loader(src, 100, seed=5)
    ]
    assert there._procs is not None
    there._procs.close()


def test_resume_mid_epoch_and_a_loop_left_early() -> None:
    src = _source()
    here = [b["uid"].tolist() for b in Loader(src, 100, seed=3)]
    loader = Loader(src, 100, seed=3, workers=Workers(processes=2))
    it = iter(loader)
    got = [next(it)["uid"].tolist() for _ in range(5)]
    state = loader.state_dict()
    it.close()  # the workers' abandoned batches are dropped by the next iteration
    got += [b["uid"].tolist() for b in loader]
    assert got == here
    resumed = Loader.from_state(src, state, workers=Workers(processes=2))
    assert [b["uid"].tolist() for b in resumed] == here[5:]
    assert resumed.state_dict()["epoch"] == 1


def test_a_worker_killed_is_a_located_error_not_a_hang() -> None:
    loader = Loader(_source(20000), 50, seed=1, workers=Workers(processes=2))
    it = iter(loader)
    next(it)
    assert loader._procs is not None
    victim = loader._procs.pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError, match=f"worker process 1 of 2 \\(pid {victim}\\).*-9"):
        for _ in it:
            pass
    loader._procs.close()


def test_unpicklable_filter_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="do not pickle"):
        Loader(
            _source(100),
            10,
            batching=Batching(filter=lambda t: t["x"]),  # a lambda does not pickle
            workers=Workers(processes=1),
        )


_TRAINER = """
import sys
import numpy as np, pyarrow as pa
from datamill.core.source import TableSource
from datamill.loader import Loader, Workers
src = TableSource(pa.table({"x": np.arange(100000)}), shard_size=1000)
loader = Loader(src, 10, workers=Workers(processes=2))
it = iter(loader)
next(it)
print(*loader._procs.pids, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_no_worker_outlives_a_trainer_killed_minus_9() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    with subprocess.Popen(
        [sys.executable, "-c", _TRAINER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as trainer:
        try:
            assert trainer.stdout is not None
            pids = [int(p) for p in trainer.stdout.readline().split()]
            assert len(pids) == 2 and not any(_gone(p) for p in pids)
        finally:
            trainer.kill()  # SIGKILL: nothing of the trainer runs after it
            trainer.wait(timeout=30)
    _wait_for(lambda: all(_gone(p) for p in pids), timeout=20, what="the workers to exit")


@pytest.mark.parametrize("used", ["not iterated", "one epoch", "left mid-epoch"])
def test_a_dropped_loader_goes_at_once_and_its_workers_with_it(used: str) -> None:
    """No reference cycle keeps a Loader the user dropped (its stages refer to it weakly): its
    worker processes exit without waiting for Python's garbage collector, which is off here."""
    loader = Loader(_source(), 64, seed=3, workers=Workers(processes=2))
    if used == "one epoch":
        assert sum(len(b["uid"]) for b in loader) == 3000
    elif used == "left mid-epoch":
        it = iter(loader)
        next(it)
        next(it)
        del it
    pids = loader._procs.pids if loader._procs is not None else []
    assert len(pids) == (0 if used == "not iterated" else 2)
    gone = weakref.ref(loader)
    collecting = gc.isenabled()
    gc.disable()
    try:
        del loader
        assert gone() is None, "the Loader outlived the last reference to it"
        _wait_for(lambda: all(_gone(p) for p in pids), timeout=20, what="the workers to exit")
    finally:
        if collecting:
            gc.enable()


def test_torch_dataloader_through_the_worker_processes() -> None:
    torch = pytest.importorskip("torch")
    from datamill.loader.torch import TorchLoaderDataset

    src = _source()
    here = Loader(src, 64, seed=2, collate="torch")
    ds = TorchLoaderDataset(Loader(src, 64, seed=2, collate="torch", workers=Workers(processes=2)))
    assert ds._procs is not None
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))
    assert all(_same(x, y) for x, y in zip(list(here), got, strict=True))
    ds._procs.close()


class _Logged(TableSource):
    """A table source writing ``pid shard`` to ``log`` for each shard read."""

    log = Path()

    def read_shard(self, index: int, *, columns: Any = None) -> pa.Table:
        with self.log.open("a") as f:
            f.write(f"{os.getpid()} {index}\n")
        return super().read_shard(index, columns=columns)


def test_each_shard_is_read_by_one_worker_only(tmp_path: Path) -> None:
    """With 2 workers a shard is read (decoded) once, by its owner, and mapped by the other."""
    base = _source(2000)
    src = _Logged(pa.concat_tables([base.read_shard(k) for k in range(8)]), shard_size=250)
    src.log = log = tmp_path / "reads.log"
    loader = Loader(src, 64, seed=4, workers=Workers(processes=2))
    got = [b["uid"].tolist() for b in loader]
    assert got == [b["uid"].tolist() for b in Loader(base, 64, seed=4)]
    reads = [line.split() for line in log.read_text().splitlines()]
    assert sorted(int(k) for _, k in reads) == list(range(8))  # each shard once
    assert loader._procs is not None
    assert {pid for pid, _ in reads} == {str(p) for p in loader._procs.pids}  # by both workers
    loader._procs.close()


def test_batches_kept_by_the_trainer_stay_intact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches are views of the workers' slots: kept ones are never overwritten; beyond a worker's
    slots (the trainer keeping them all) batches come through the pipe, the same bytes."""
    from datamill.loader import procs_worker

    monkeypatch.setattr(procs_worker, "_MAX_SLOTS", 3)
    monkeypatch.setattr(procs_worker, "_INFLIGHT", 2)
    src = _source(1500)
    here = list(Loader(src, 50, seed=9))
    there = Loader(src, 50, seed=9, workers=Workers(processes=1))
    kept = list(there)  # 30 batches held at once: 3 in slots, the rest by the pipe
    assert all(_same(x, y) for x, y in zip(here, kept, strict=True))
    kept[0]["x"][:] = 0  # writable, like in process
    del kept
    again = [b["uid"].tolist() for b in there]  # slots freed by the gc of the views, reused
    assert again == [b["uid"].tolist() for b in Loader(src, 50, seed=9, epoch=1)]
    assert there._procs is not None
    there._procs.close()
