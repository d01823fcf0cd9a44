"""The ordered map kernel: ``fn`` over items in worker threads, results in input order.

numpy and Arrow release the GIL in their heavy parts, so threads give real parallelism for the
block-wise work of the capabilities (preprocessing blocks, shard builds). At most ``threads``
results are in flight, so memory stays bounded by ``threads`` blocks whatever the item count.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from datamill.core.memory import release_memory

__all__ = ["ordered_map"]

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, threads: int) -> Iterator[R]:
    """Apply ``fn`` to every item in ``threads`` worker threads; yield the results in input order.

    At most ``threads`` calls are pending at a time (the consumer drives the pace). With
    ``threads <= 1`` (or a single item) everything runs in the calling thread. An exception raised
    by ``fn`` propagates at its item's turn; the items after it are not started.

    Args:
        fn: the function; it must be thread-safe.
        items: the inputs (consumed lazily).
        threads: worker threads.

    Returns:
        An iterator over ``fn(item)`` in the order of ``items``.

    Examples:
        >>> list(ordered_map(lambda x: x * x, range(6), threads=3))
        [0, 1, 4, 9, 16, 25]
    """
    if threads <= 1 or (isinstance(items, (list, tuple)) and len(items) <= 1):
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="datamill-block") as pool:
        pending: collections.deque[Future[R]] = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= threads:
                    yield pending.popleft().result()
                    release_memory()  # the workers' glibc arenas keep freed blocks otherwise (+15% peak RSS)
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:  # an error or an abandoned iterator: start nothing more
                fut.cancel()
