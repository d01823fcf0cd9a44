"""core.parallel.ordered_map: the one ordered, bounded parallel map (preprocessing, loader, BERT)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from hypothesis import given
from hypothesis import strategies as st

from datamill.core.parallel import ordered_map


@given(items=st.lists(st.integers(-1000, 1000), max_size=60), threads=st.integers(0, 4),
       window=st.one_of(st.none(), st.integers(1, 5)), own_pool=st.booleans())
def test_ordered_map_equals_map_and_bounds_what_is_in_flight(items: list[int], threads: int, window: int | None,
                                                             own_pool: bool) -> None:
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
