"""core.parallel.ordered_map: the one ordered, bounded parallel map (preprocessing, loader,
BERT)."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import BuildError
from datamill.core.parallel import ordered_map


@given(
    items=st.lists(st.integers(-1000, 1000), max_size=60),
    threads=st.integers(0, 4),
    window=st.one_of(st.none(), st.integers(1, 5)),
    own_pool=st.booleans(),
)
def test_ordered_map_equals_map_and_bounds_what_is_in_flight(
    items: list[int], threads: int, window: int | None, own_pool: bool
) -> None:
    submitted = 0
    consumed = 0
    peak = 0
    lock = threading.Lock()

    def lazily() -> object:  # items are taken only when submitted
        nonlocal submitted, peak
        for x in items:
            with lock:
                submitted += 1
                peak = max(peak, submitted - consumed)
            yield x

    def square(x: int) -> int:
        return x * x

    if own_pool:
        with ThreadPoolExecutor(max(1, threads)) as pool:
            out = []
            for r in ordered_map(square, lazily(), pool=pool, window=window):
                out.append(r)
                consumed += 1
        limit = window or max(1, threads)
    else:
        out = []
        for r in ordered_map(square, lazily(), threads=threads, window=window):
            out.append(r)
            consumed += 1
        limit = (window or threads) if threads > 1 else 1
    assert out == [x * x for x in items]
    assert peak <= max(1, limit) + 1  # the item being submitted when the window is full


def test_closing_an_abandoned_iterator_does_not_wait_for_its_workers() -> None:
    # The garbage collector closes an abandoned ordered_map in whatever thread it runs in, even one
    # that is starting and holds threading's locks; joining the workers there deadlocked a test run.
    release, running = threading.Event(), threading.Event()

    def slow(x: int) -> int:
        if x == 1:
            running.set()
            release.wait(20)
        return x

    it = ordered_map(slow, range(4), threads=2)
    assert next(it) == 0
    assert running.wait(10)  # item 1 is running and blocked
    closer = threading.Thread(target=it.close)
    closer.start()
    closer.join(5)
    closed_without_waiting = not closer.is_alive()
    release.set()
    closer.join(20)
    assert closed_without_waiting


def test_an_error_still_waits_for_the_calls_in_flight() -> None:
    done: list[int] = []
    started = threading.Event()

    def work(x: int) -> int:
        if x == 0:
            started.wait(5)
            raise ValueError("boom")
        started.set()
        threading.Event().wait(0.2)
        done.append(x)
        return x

    try:
        list(ordered_map(work, range(2), threads=2))
    except ValueError:
        pass
    assert done == [1]  # the call in flight finished before the error reached the caller


def test_a_pool_shut_down_mid_map_raises_a_located_build_error() -> None:
    # A caller's pool shut down (cancel_futures) while the map runs: the cancelled item's turn and a
    # submit after the shutdown each raise BuildError naming the item, never a bare CancelledError.
    release = threading.Event()

    def slow(x: int) -> int:
        release.wait(10)
        return x

    pool = ThreadPoolExecutor(1)
    it = ordered_map(slow, range(6), pool=pool, window=3)
    first = threading.Thread(target=lambda: next(it, None))
    first.start()  # items 0, 1, 2 submitted; 0 runs, 1 and 2 wait
    while pool._work_queue.qsize() < 2:  # type: ignore[attr-defined]
        threading.Event().wait(0.01)
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()
    first.join(10)
    with pytest.raises(BuildError, match="item 1 of an ordered map") as got:
        next(it)
    assert not isinstance(got.value, CancelledError)
    assert got.value.hint and "shutting its pool down" in got.value.hint

    late = ordered_map(slow, range(3), pool=pool, window=2)
    with pytest.raises(BuildError, match="item 0 of an ordered map"):
        next(late)
