"""Executors run the pipeline's per-block functions: the :class:`Executor` protocol and
:class:`LocalExecutor`.

The pipeline (:mod:`datamill.preprocessing.pipeline`) hands an executor picklable per-block
functions (``functools.partial`` of module-level functions over the plan) and merges what comes
back in block order, so any executor that keeps the order gives bit-identical output. The local
one runs them in a bounded thread pool; a Ray executor implements the same method with Ray tasks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

from datamill.core.errors import ConfigError
from datamill.core.parallel import ordered_map

__all__ = ["Executor", "LocalExecutor", "THREADS", "thread_count"]  # noqa: RUF022 - Python sorted() order (house rule)

T = TypeVar("T")
R = TypeVar("R")

#: worker threads of :class:`LocalExecutor` when it is not given a count; None: the environment
#: variable ``DATAMILL_THREADS`` (1: no threads), else the cores, at most 4
THREADS: int | None = None


def thread_count() -> int:
    """How many worker threads a default :class:`LocalExecutor` uses (see :data:`THREADS`).

    Returns:
        :data:`THREADS` when set, else ``DATAMILL_THREADS``, else ``min(4, cores)``.

    Raises:
        ConfigError: ``DATAMILL_THREADS`` is not a positive integer.

    Examples:
        >>> thread_count() >= 1
        True
    """
    if THREADS is not None:
        return THREADS
    raw = os.environ.get("DATAMILL_THREADS", "").strip()
    if not raw:
        return max(1, min(4, os.cpu_count() or 1))
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"DATAMILL_THREADS must be a positive integer, got {raw!r}")
    return int(raw)


class Executor(Protocol):
    """Runs a per-block function over blocks; results come back in input order."""

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn(item)`` for every item, yielded in the order of ``items``."""
        ...


class LocalExecutor:
    """The in-process executor: an ordered, bounded thread pool
    (:func:`datamill.core.parallel.ordered_map`).

    Args:
        threads: worker threads. Defaults to ``None``: :func:`thread_count` at each call.

    Examples:
        >>> list(LocalExecutor(threads=2).map_ordered(str.upper, ["a", "b", "c"]))
        ['A', 'B', 'C']
    """

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self.threads = threads

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn(item)`` for every item in worker threads, yielded in order (at most ``threads``
        ahead)."""
        return ordered_map(
            fn,
            items,
            threads=self.threads if self.threads is not None else thread_count(),
            trim_memory=True,
        )

    def __repr__(self) -> str:
        return f"LocalExecutor(threads={self.threads})"
