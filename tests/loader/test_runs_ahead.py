"""RunAhead (a build worker's batches built ahead in its one build thread): a take always ends.
Each case below hung for ever before (the take waited on a condition nothing would notify)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest

from datamill.core.errors import DatamillError
from datamill.core.source import TableSource
from datamill.loader.runs import RunAhead, RunStream, service_for

_JOIN_S = 20.0  # a take that has not ended by then hangs


class _Pool(ThreadPoolExecutor):
    """One build thread that says when a turn is queued."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.submitted.set()
        return future


class _Killed(BaseException):
    """Not an ``Exception``: what ``except Exception`` in a build thread lets through."""


def _converted(tables: Iterable[pa.Table]) -> list[tuple[Any, int]]:
    return [(t, t.nbytes) for t in tables]


def _ahead(pool: ThreadPoolExecutor, convert: Callable[..., Any]) -> RunAhead:
    table = pa.table({"x": list(range(64))})
    cfg = {"batch_size": 4, "seed": 1, "shuffle": False, "window": None, "drop_last": False}
    svc = service_for(TableSource(table, shard_size=16), {**cfg, "columns": None})
    stream = RunStream(svc, {"epoch": 0, "plan_world": 1, "dataset": "ds"})
    return RunAhead(stream, 0, 0, pool=pool, convert=convert, held=[0])


def _start(ahead: RunAhead, a: int, b: int) -> tuple[threading.Thread, list[Any]]:
    """``ahead.take(a, b)`` started in a thread of its own (see :func:`_ended`)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(ahead.take(a, b, ahead=0))
        except BaseException as exc:  # noqa: BLE001 - what the take raised is the answer
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _ended(started: tuple[threading.Thread, list[Any]]) -> Any:
    """What a :func:`_start` take returned or raised, joined with a bound (the test fails,
    instead of hanging, when the take does not end)."""
    thread, out = started
    thread.join(_JOIN_S)
    assert not thread.is_alive(), f"the take still waits after {_JOIN_S} s"
    return out[0]


def _take(ahead: RunAhead, a: int, b: int) -> Any:
    return _ended(_start(ahead, a, b))


def _blocking(entered: threading.Event, release: threading.Event) -> Callable[..., Any]:
    def convert(tables: Iterable[pa.Table]) -> list[tuple[Any, int]]:
        entered.set()
        assert release.wait(_JOIN_S)
        return _converted(tables)

    return convert


def _stopped(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunAhead, Iterator[None]]:
    """The RunAhead is stopped (a newer one took its rank) while a take waits for its turn."""
    entered, release = threading.Event(), threading.Event()
    ahead = _ahead(pool, _blocking(entered, release))

    def act() -> Iterator[None]:
        assert entered.wait(_JOIN_S)
        ahead.stop()
        yield
        release.set()

    return ahead, act()


def _cancelled(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunAhead, Iterator[None]]:
    """The pool is shut down (its queued turns cancelled) while the take's turn waits in it."""
    busy, release = threading.Event(), threading.Event()
    pool.submit(lambda: (busy.set(), release.wait(_JOIN_S)))
    assert busy.wait(_JOIN_S)
    pool.submitted.clear()
    ahead = _ahead(pool, _converted)

    def act() -> Iterator[None]:
        assert pool.submitted.wait(_JOIN_S)
        pool.shutdown(wait=False, cancel_futures=True)
        yield
        release.set()

    return ahead, act()


def _shut(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunAhead, Iterator[None]]:
    """The pool is shut down during a turn: the next turn, needed by the take, cannot be queued."""
    monkeypatch.setattr(RunAhead, "CHUNK", 4)

    def convert(tables: Iterable[pa.Table]) -> list[tuple[Any, int]]:
        pool.shutdown(wait=False)
        return _converted(tables)

    return _ahead(pool, convert), iter([None])


def _killed(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunAhead, Iterator[None]]:
    """The build raises a ``BaseException``: the turn ends without a word."""

    def convert(tables: Iterable[pa.Table]) -> list[tuple[Any, int]]:
        raise _Killed

    return _ahead(pool, convert), iter([None])


def _short(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunAhead, Iterator[None]]:
    """The build ends before the batches asked (a stream stopped under it)."""
    return _ahead(pool, lambda tables: []), iter([None])


def _stuck(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunAhead, Iterator[None]]:
    """The build thread builds nothing for longer than ``STALL_S``."""
    monkeypatch.setattr(RunAhead, "STALL_S", 0.3, raising=False)  # (new)
    entered, release = threading.Event(), threading.Event()
    ahead = _ahead(pool, _blocking(entered, release))

    def act() -> Iterator[None]:
        yield
        release.set()

    return ahead, act()


@pytest.mark.parametrize(
    ("case", "says"),
    [
        (_stopped, "its build was stopped"),
        (_cancelled, "its turn was cancelled"),
        (_shut, "pool was shut down"),
        (_killed, "ended with _Killed"),
        (_short, "its build ended after 0 batches"),
        (_stuck, "no batch was built for 0.3 s"),
    ],
    ids=["stopped", "cancelled", "shut-down", "base-exception", "short", "stuck"],
)
def test_a_take_always_ends_with_a_located_error(
    case: Callable[[_Pool, pytest.MonkeyPatch], tuple[RunAhead, Iterator[None]]],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: each of these left a build worker's lease waiting for ever on its RunAhead."""
    pool = _Pool()
    try:
        ahead, act = case(pool, monkeypatch)
        started = _start(ahead, 0, 8)
        next(act)  # the fault, while the take waits
        try:
            error = _ended(started)
        finally:
            next(act, None)
        assert isinstance(error, DatamillError), error
        assert error.path == "ds" and "plan rank 0 of epoch 0" in str(error)
        assert says in str(error)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def test_a_failed_build_is_a_located_error_caused_by_the_builds() -> None:
    """An ``Exception`` of the build reaches the take as a DatamillError naming the rank and
    batches, caused by it; a DatamillError of the build is raised as it is."""
    with ThreadPoolExecutor(1) as pool:

        def oserror(tables: Iterable[pa.Table]) -> list[tuple[Any, int]]:
            raise OSError("a read failed")

        error = _take(_ahead(pool, oserror), 0, 3)
        assert isinstance(error, DatamillError) and isinstance(error.__cause__, OSError)
        assert "batches [0, 3): its build failed: OSError: a read failed" in str(error)
        located = DatamillError("bad row", path="shard-0.parquet", row=3)

        def bad(tables: Iterable[pa.Table]) -> list[tuple[Any, int]]:
            raise located

        assert _take(_ahead(pool, bad), 0, 3) is located


def test_batches_past_the_ranks_end_are_refused_not_waited_for() -> None:
    with ThreadPoolExecutor(1) as pool:
        ahead = _ahead(pool, _converted)
        error = _take(ahead, 0, ahead.total + 1)
        assert isinstance(error, DatamillError) and "the rank has 16 batches" in str(error)
        got = _take(ahead, 0, ahead.total)
        assert isinstance(got, list) and len(got) == 16
        ahead.stop()
