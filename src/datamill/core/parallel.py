"""The ordered map kernel: ``fn`` over items in worker threads, results in input order.

numpy and Arrow release the GIL in their heavy parts, so threads give real parallelism for the
block-wise work of the capabilities (preprocessing blocks, shard builds). At most ``threads``
results are in flight, so memory stays bounded by ``threads`` blocks whatever the item count.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TypeVar

from datamill.core.memory import release_memory

__all__ = ["ordered_map"]

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, threads: int = 1, pool: Executor | None = None,
                window: int | None = None, trim_memory: bool = False) -> Iterator[R]:
    """Apply ``fn`` to every item in worker threads (or ``pool``); yield the results in input order.

    At most ``window`` calls are pending at a time (the consumer drives the pace, so memory stays
    bounded). Items are taken from ``items`` only when they are submitted, so a generator may do
    per-item preparation (e.g. schedule reads) just in time. An exception raised by ``fn`` propagates
    at its item's turn; the items after it are not started.

    Args:
        fn: the function; thread-safe (or picklable, with a process pool).
        items: the inputs (consumed lazily).
        threads: worker threads of a pool made here; ``<= 1`` runs everything in the calling
            thread. Defaults to ``1``. Ignored when ``pool`` is given.
        pool: an existing executor (threads or processes) to submit to. Defaults to ``None``.
        window: most calls in flight. Defaults to ``None`` (``threads``, or the pool's workers).
        trim_memory: give freed memory back to the OS after each result (worker threads' glibc
            arenas keep freed blocks otherwise: +15% peak RSS on preprocessing). Defaults to ``False``.

    Returns:
        An iterator over ``fn(item)`` in the order of ``items``.

    Examples:
        >>> list(ordered_map(lambda x: x * x, range(6), threads=3))
        [0, 1, 4, 9, 16, 25]
    """
    if pool is None:
        if threads <= 1 or (isinstance(items, (list, tuple)) and len(items) <= 1):
            yield from map(fn, items)
            return
        with ThreadPoolExecutor(threads, thread_name_prefix="datamill-block") as own:
            yield from ordered_map(fn, items, pool=own, window=window or threads, trim_memory=trim_memory)
        return
    limit = max(1, window or getattr(pool, "_max_workers", 1))
    pending: collections.deque[Future[R]] = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= limit:
                yield pending.popleft().result()
                if trim_memory:
                    release_memory()
        while pending:
            yield pending.popleft().result()
    finally:
        for fut in pending:  # an error or an abandoned iterator: start nothing more
            fut.cancel()
