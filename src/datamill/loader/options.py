"""The Loader's two option groups: :class:`Batching` (what a batch holds) and :class:`Workers` (how
it runs).

The common options stay keywords of :class:`~datamill.loader.Loader` (``seed``, ``epoch``,
``columns``, ``collate``, ``rank``, ``world_size``, and for language-model batches ``packing``,
``balance``). The rest fall in two groups a user can tell apart by one question, *does it change
the batches?*

- :class:`Batching` does: shuffle on or off, the shuffle window, ``drop_last``, length buckets, the
  filter and transform, the error budget, refill, replication, warmup. Its order settings are
  recorded in the resume state and the run record.
- :class:`Workers` never does: threads, read-ahead, pinned memory and the progress bar only change
  speed and display, so two loaders differing only in ``Workers`` yield the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datamill.core.errors import ConfigError

__all__ = ["Batching", "Workers", "checked_groups"]


@dataclass(frozen=True)
class Batching:
    """How batches are formed: settings that change what a batch holds.

    Args:
        window: shards per shuffle window (memory holds about two: the next window is read
            while one is consumed).
            Defaults to ``None`` (:func:`~datamill.loader.order.default_window`).
        bucket_by: a list (ragged) or string column: each batch groups samples of similar length,
            inside the shuffle window; still every sample once per epoch, deterministic, resumable
            (not elastically). Defaults to ``None``.
        buckets: number of length buckets (quantiles) or the boundaries. Defaults to ``8``.
        filter: ``fn(batch: pa.Table) -> bool mask`` (see :func:`~datamill.loader.per_sample` for
            row predicates). Defaults to ``None``.
        transform: ``fn(batch: pa.Table) -> pa.Table`` run in the worker. Defaults to ``None``.
        max_errors: samples that may fail ``filter``/``transform`` per epoch (skipped, counted)
            before the loader raises. Defaults to ``0``.
        refill: cut the samples passing ``filter`` into batches of exactly ``batch_size`` (the
            last one shorter, or dropped with ``drop_last``) instead of leaving filtered batches
            smaller; the state records where the rows not yet emitted start, so resuming stays exact
            (:mod:`datamill.loader.refill`). ``len()`` then counts position batches. Defaults to
            ``False``.
        replication: ranks per replication group (tensor/context parallelism): the ``replication``
            consecutive ranks of a group get the same batches, groups split the data. Must divide
            ``world_size``. Defaults to ``1``.
        warmup: the epoch's first shuffle windows hold 1, 2, 4, ... shards, so the first batch waits
            for one shard instead of a whole window (:func:`~datamill.loader.order.window_bounds`),
            with more reads in flight. ``None``: on for a source on object storage (``s3://``), off
            for local files. Defaults to ``None``.
        shuffle: shard-aware shuffle; ``False`` keeps source order. Defaults to ``True``.
        drop_last: give every rank ``n // world_size`` samples and drop the incomplete last batch;
            otherwise every sample is used exactly once and the first ``n % world_size`` ranks get
            one sample more. Defaults to ``False``.

    Examples:
        >>> Batching(window=4, bucket_by="tokens").buckets
        8
        >>> Batching(shuffle=False, drop_last=True).shuffle
        False
    """

    window: int | None = None
    bucket_by: str | None = None
    buckets: int | Sequence[int] = 8
    filter: Callable[[pa.Table], Any] | None = None
    transform: Callable[[pa.Table], pa.Table] | None = None
    max_errors: int = 0
    refill: bool = False
    replication: int = 1
    warmup: bool | None = None
    shuffle: bool = True
    drop_last: bool = False


@dataclass(frozen=True)
class Workers:
    """How batches are built: settings that change speed or display, never the batches.

    Args:
        threads: threads assembling/filtering/transforming/collating batches (``0``: in the
            consuming thread). Threads, not processes: arrow and numpy release the GIL; for
            GIL-bound Python transforms use the torch adapter with ``DataLoader(num_workers=N)``
            worker processes. ``filter``/``transform`` must then be thread-safe. Defaults to ``0``.
        prefetch: shards read ahead in a background thread pool (and batches in flight per
            thread), at least; the next shuffle window is read while one is consumed. Defaults to
            ``2``.
        pin_memory: with ``collate="torch"``, pin tensors (when CUDA is available). Defaults to
            ``False``.
        progress: show a tqdm bar. Defaults to ``False``.
        processes: worker processes building the batches (``0``: in this process), each with its
            own shard cache and Arrow pool; batches come back through shared memory, the same bytes
            in the same order (:mod:`datamill.loader.procs`). The source, ``filter`` and
            ``transform`` must then pickle. Defaults to ``0``.

    Examples:
        >>> Workers(2).prefetch
        2
    """

    threads: int = 0
    prefetch: int = 2
    pin_memory: bool = False
    progress: bool = False
    processes: int = 0


def checked_groups(batching: Batching | None, workers: Workers | None) -> tuple[Batching, Workers]:
    """The two option groups, defaults for ``None``; anything else than the two types is refused.

    Examples:
        >>> b, w = checked_groups(None, Workers(threads=2))
        >>> b.shuffle, w.threads
        (True, 2)
    """
    b = batching if batching is not None else Batching()
    w = workers if workers is not None else Workers()
    if not isinstance(b, Batching) or not isinstance(w, Workers):
        raise ConfigError(
            f"batching must be a Batching and workers a Workers, got {type(b).__name__} and "
            f"{type(w).__name__}",
            hint="from datamill.loader import Batching, Workers",
        )
    return b, w
