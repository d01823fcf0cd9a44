"""Pure iteration order: which sample comes when, on which rank, in which batch.

Everything here is a pure function of its arguments (seed, epoch, shard sizes, world size) computed
with numpy index arrays, so every process computes the same global order without talking to the
others, and resuming recomputes the order instead of replaying samples.

The global order of one epoch (:func:`global_order`) does not depend on the world size or the number
of workers; those only slice it:

1. **Shard-aware shuffle** (:func:`shard_order`): the shard order is permuted per ``(seed, epoch)``,
   then consecutive shards of that permuted order are grouped into windows of ``window`` shards and
   the samples of each window are shuffled together (each window by its own generator, so any
   window, and so any batch, can be computed alone: :class:`EpochOrder`). A reader therefore needs
   at most one window of shards in memory, while samples from different shards are mixed within each
   batch. The epoch may warm up (``warmup=True``, :func:`window_bounds`): its first windows hold 1,
   2, 4,
   ... shards, so the first batch waits for one shard rather than a whole window.
2. **Rank split** (:func:`split_for_rank`): rank ``r`` takes the ``r``-th contiguous slice of the
   global order (contiguous, so a rank reads only the shards of its part). Without ``drop_last``
   every sample is used exactly once per epoch over all ranks and, when ``world_size`` does not
   divide the number of samples, the *first* ``n % world_size`` ranks get one sample more than the
   others (no padding, no repetition). With ``drop_last`` every rank gets ``n // world_size``
   samples and the last ``n % world_size`` samples of the global order are skipped this epoch (a
   different set each epoch) so that all ranks see the same number of batches, as DDP requires.
3. **Elastic resumption** (:func:`remaining_positions`): a run that stopped part-way through an
   epoch with ``W`` ranks, rank ``r`` having consumed the first ``c_r`` samples of its slice, leaves
   exactly the positions ``concat(slice_r[c_r:] for r in range(W))`` (in global order); a resumed
   run with any ``W'`` ranks splits *those* with the same rule. Chained resumptions apply the rule
   once per segment of the epoch's :data:`Elastic` history; the next epoch is plain again.
4. **Replication** (:func:`replica_group`): with ``replication=k`` the ``k`` consecutive ranks of a
   group share one slice (rank ``r`` reads data rank ``r // k`` of ``world_size // k``).
5. **Batches and workers** (:func:`num_batches`, :func:`worker_batches`): a rank's batch ``b`` holds
   the samples at positions ``[b * batch_size, (b + 1) * batch_size)`` of its slice; worker ``w`` of
   ``W`` builds batches ``w, w + W, ...`` and the consumer interleaves them in order, so the batch
   sequence is the same for any number of workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from datamill.core.checks import check_int, check_rank
from datamill.core.errors import ConfigError
from datamill.core.rng import rng_for

__all__ = [
    "DEFAULT_WINDOW_BYTES",
    "DEFAULT_WINDOW_SAMPLES",
    "DEFAULT_WINDOW_SHARDS",
    "Elastic",
    "EpochOrder",
    "default_window",
    "epoch_order",
    "global_order",
    "lockstep_consumed",
    "num_batches",
    "rank_sequence",
    "remaining_after",
    "remaining_positions",
    "replica_group",
    "shard_order",
    "split_for_rank",
    "split_sizes",
    "window_bounds",
    "worker_batches",
]

Elastic: TypeAlias = tuple[tuple[int, tuple[int, ...]], ...]
"""An epoch's elastic history: ``((world_size, samples consumed per rank), ...)``, oldest first."""

DEFAULT_WINDOW_SHARDS = 4
"""At least this many shards are shuffled together by default."""
DEFAULT_WINDOW_SAMPLES = 1 << 16
"""...and enough shards to hold about this many samples (tiny shards would mix too little)..."""
DEFAULT_WINDOW_BYTES = 64 << 20
"""...but, when the shards' bytes are known, no more shards than hold about this many bytes of
shard files: a build holds about two windows decoded, and every decoded page a window adds is a
page the process first touches (100 shards of 2,000 binary samples of 3 KB, a fresh process's
epoch: windows of 33 shards peaked at 526-550 MB and faulted 127k-131k pages; windows of 10
shards peaked at 266-282 MB, faulted 56k-80k and read the epoch about 20% faster)."""


def _check_seed_epoch(seed: int, epoch: int) -> None:
    check_int(seed, name="seed", low=0, high=None)
    check_int(epoch, name="epoch", low=0, high=None)


def epoch_order(num_samples: int, /, *, seed: int, epoch: int) -> NDArray[np.int64]:
    """A full uniform permutation of ``range(num_samples)`` for ``(seed, epoch)``.

    Args:
        num_samples: dataset size.
        seed: the run's seed.
        epoch: the epoch number.

    Returns:
        An int64 permutation; the same arguments give the same array in every process.

    Examples:
        >>> order = epoch_order(5, seed=0, epoch=0)
        >>> sorted(order.tolist()), order.dtype.name
        ([0, 1, 2, 3, 4], 'int64')
        >>> bool((order == epoch_order(5, seed=0, epoch=0)).all())
        True
    """
    _check_seed_epoch(seed, epoch)
    check_int(num_samples, name="num_samples", low=0, high=None)
    return rng_for(seed, "epoch_order", epoch).permutation(int(num_samples)).astype(np.int64)


def default_window(
    shard_sizes: Sequence[int] | NDArray[np.int64],
    shard_nbytes: Sequence[int] | NDArray[np.int64] | None = None,
) -> int:
    """Shards per shuffle window: at least 4, and enough to hold about 65,536 samples; with
    ``shard_nbytes`` (bytes of each shard's files), no more than hold about 64 MiB of them
    (:data:`DEFAULT_WINDOW_BYTES`), unless that is fewer than 4.

    Examples:
        >>> default_window([100_000] * 10), default_window([1_000] * 200)
        (4, 66)
        >>> default_window([2_000] * 100), default_window([2_000] * 100, [6_000_000] * 100)
        (33, 11)
        >>> default_window([2_000] * 100, [600_000] * 100)  # small shards: the samples decide
        33
        >>> default_window([2_000] * 100, [60_000_000] * 100)  # large shards: 4 at least
        4
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if len(sizes) == 0:
        return 1
    mean = max(1.0, float(sizes.mean()))
    window = -(-DEFAULT_WINDOW_SAMPLES // int(mean))
    nbytes = None if shard_nbytes is None else np.asarray(shard_nbytes, dtype=np.int64)
    if nbytes is not None and len(nbytes) == len(sizes) and int(nbytes.sum()) > 0:
        window = min(window, DEFAULT_WINDOW_BYTES // max(1, int(nbytes.mean())))
    return int(max(DEFAULT_WINDOW_SHARDS, window))


def shard_order(
    shard_sizes: Sequence[int] | NDArray[np.int64],
    /,
    *,
    seed: int,
    epoch: int,
    window: int | None = None,
    warmup: bool = False,
) -> NDArray[np.int64]:
    """Shard-aware shuffle: permute shards, then shuffle samples within windows of ``window``
    shards.

    Args:
        shard_sizes: rows per shard; sample ``i`` is row ``i - offsets[k]`` of shard ``k``.
        seed: the run's seed.
        epoch: the epoch number.
        window: shards shuffled together. Defaults to ``None`` (:func:`default_window`).
        warmup: the first windows hold 1, 2, 4, ... shards (:func:`window_bounds`). Defaults to
            ``False``.

    Returns:
        An int64 permutation of ``range(sum(shard_sizes))``.

    Examples:
        >>> order = shard_order([3, 2, 4], seed=1, epoch=0, window=1)
        >>> sorted(order.tolist()) == list(range(9))
        True
        >>> # with window=1 each shard's samples stay together (shuffled among themselves)
        >>> [sorted(order[a:b].tolist()) for a, b in [(0, 3), (3, 5), (5, 9)]][0] in (
        ...     [0, 1, 2],
        ...     [3, 4],
        ...     [5, 6, 7, 8],
        ... )
        True
    """
    eo = EpochOrder(
        shard_sizes, seed=seed, epoch=epoch, window=window, warmup=warmup, cache_windows=0
    )
    return eo.take(0, len(eo))


def window_bounds(
    num_shards: int, /, *, window: int, warmup: bool = False
) -> list[tuple[int, int]]:
    """``(first, stop)`` positions in the permuted shard order of each shuffle window of an epoch.

    Every window holds ``window`` shards (the last one what is left). With ``warmup`` the epoch
    *warms up*: its first windows hold 1, 2, 4, ... shards (doubling while below ``window``). The
    first batch therefore waits for one shard, not a whole window (from object storage: one
    download), and while a window is consumed the next one, at most twice as large, is read; the
    samples of the warm-up windows mix over fewer shards than the later ones.

    Examples:
        >>> window_bounds(10, window=4)
        [(0, 4), (4, 8), (8, 10)]
        >>> window_bounds(10, window=4, warmup=True)
        [(0, 1), (1, 3), (3, 7), (7, 10)]
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 shard, got {window}")
    out, start, size = [], 0, 1 if warmup else window
    while start < num_shards:
        stop = min(num_shards, start + min(size, window))
        out.append((start, stop))
        start, size = stop, size * 2
    return out


class EpochOrder:
    """An epoch's :func:`global_order` held per shard: the permuted shard list, one seed per window.

    Memory is O(shards): ``take(a, b)`` computes ``global_order(...)[a:b]`` on demand from the
    windows it touches (each window's samples are shuffled by its own generator,
    ``rng_for(seed, "shard_order.window", epoch, w)``), so a server can hand out any rank's batch of
    a 100M-sample epoch without an int64 per sample. :func:`shard_order` is ``take(0, len)``.

    Args:
        shard_sizes: rows per shard.
        seed: the run's seed.
        epoch: the epoch number.
        shuffle: ``False`` keeps source order. Defaults to ``True``.
        window: shards per shuffle window. Defaults to ``None`` (:func:`default_window`).
        warmup: the first windows hold 1, 2, 4, ... shards (:func:`window_bounds`). Defaults to
            ``False``.
        cache_windows: shuffled windows kept for later calls. Defaults to ``4``.

    Examples:
        >>> eo = EpochOrder([3, 2, 4], seed=1, epoch=0, window=2)
        >>> (
        ...     bool(
        ...         (eo.take(2, 7) == shard_order([3, 2, 4], seed=1, epoch=0, window=2)[2:7]).all()
        ...     ),
        ...     len(eo),
        ... )
        (True, 9)
    """

    def __init__(
        self,
        shard_sizes: Sequence[int] | NDArray[np.int64],
        /,
        *,
        seed: int,
        epoch: int,
        shuffle: bool = True,
        window: int | None = None,
        warmup: bool = False,
        cache_windows: int = 4,
    ) -> None:
        _check_seed_epoch(seed, epoch)
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        if (sizes < 0).any():
            raise ValueError("shard sizes must be >= 0")
        win = default_window(sizes) if window is None else int(window)
        if win < 1:
            raise ValueError(f"window must be >= 1 shard, got {win}")
        self.seed, self.epoch, self.shuffle, self.window = int(seed), int(epoch), bool(shuffle), win
        self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._perm = (
            rng_for(seed, "shard_order", epoch).permutation(len(sizes))
            if shuffle
            else np.arange(len(sizes), dtype=np.int64)
        )
        self._psizes = sizes[self._perm]
        self._pcum = np.concatenate([[0], np.cumsum(self._psizes)]).astype(np.int64)
        self._bounds = window_bounds(len(sizes), window=win, warmup=warmup)
        self._wstart = (
            self._pcum[[a for a, _ in self._bounds]]
            if shuffle and self._bounds
            else np.zeros(1, dtype=np.int64)
        )
        self.total = int(self._pcum[-1])
        self._cache: dict[int, NDArray[np.int64]] = {}
        self._keep = int(cache_windows)

    def __len__(self) -> int:
        return self.total

    def _window(self, w: int) -> NDArray[np.int64]:
        got = self._cache.get(w)
        if got is not None:
            return got
        s0, s1 = self._bounds[w]
        psizes = self._psizes[s0:s1]
        base = self._pcum[s0]
        # sample j of the permuted sequence is starts[perm[s]] + (j - pcum[s]) for its shard s
        out = np.repeat(
            self._starts[self._perm[s0:s1]] - (self._pcum[s0:s1] - base), psizes
        ) + np.arange(int(psizes.sum()), dtype=np.int64)
        rng_for(self.seed, "shard_order.window", self.epoch, w).shuffle(out)
        if self._keep:
            while len(self._cache) >= self._keep:
                self._cache.pop(next(iter(self._cache)))
            self._cache[w] = out
        return out

    def take(self, start: int, stop: int) -> NDArray[np.int64]:
        """Global sample indices at positions ``[start, stop)`` of the epoch's order."""
        start, stop = max(0, int(start)), min(self.total, int(stop))
        if stop <= start:
            return np.zeros(0, dtype=np.int64)
        if not self.shuffle:
            return np.arange(start, stop, dtype=np.int64)
        w0 = int(np.searchsorted(self._wstart, start, side="right") - 1)
        w1 = int(np.searchsorted(self._wstart, stop - 1, side="right") - 1)
        parts = [self._window(w) for w in range(w0, w1 + 1)]
        chunk = parts[0] if len(parts) == 1 else np.concatenate(parts)
        off = start - int(self._wstart[w0])
        return chunk[off : off + stop - start].astype(np.int64, copy=False)


def global_order(
    shard_sizes: Sequence[int] | NDArray[np.int64],
    /,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    window: int | None = None,
    warmup: bool = False,
) -> NDArray[np.int64]:
    """The epoch's order over all ranks: :func:`shard_order`, or ``arange`` without shuffling.

    Examples:
        >>> global_order([2, 2], seed=0, epoch=0, shuffle=False).tolist()
        [0, 1, 2, 3]
    """
    if not shuffle:
        _check_seed_epoch(seed, epoch)
        return np.arange(int(np.sum(np.asarray(shard_sizes, dtype=np.int64))), dtype=np.int64)
    return shard_order(shard_sizes, seed=seed, epoch=epoch, window=window, warmup=warmup)


def split_for_rank(
    order: NDArray[np.int64], /, *, rank: int, world_size: int, drop_last: bool = False
) -> NDArray[np.int64]:
    """Rank ``rank``'s contiguous part of ``order`` (a view, no copy).

    Without ``drop_last`` the parts cover ``order`` exactly once; the first ``len(order) %
    world_size`` ranks get one sample more. With ``drop_last`` every rank gets ``len(order) //
    world_size``.

    Examples:
        >>> o = np.arange(7)
        >>> [split_for_rank(o, rank=r, world_size=3).tolist() for r in range(3)]
        [[0, 1, 2], [3, 4], [5, 6]]
        >>> [split_for_rank(o, rank=r, world_size=3, drop_last=True).tolist() for r in range(3)]
        [[0, 1], [2, 3], [4, 5]]
    """
    check_rank(
        rank,
        world_size=check_int(world_size, name="world_size (the number of ranks)", low=1, high=None),
    )
    n = len(order)
    base, extra = divmod(n, world_size)
    if drop_last:
        return order[rank * base : (rank + 1) * base]
    start = rank * base + min(rank, extra)
    return order[start : start + base + (1 if rank < extra else 0)]


def rank_sequence(
    shard_sizes: Sequence[int] | NDArray[np.int64],
    /,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    window: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
) -> NDArray[np.int64]:
    """Global sample indices rank ``rank`` visits in epoch ``epoch``, in order.

    Examples:
        >>> rank_sequence([3, 3], seed=0, epoch=0, shuffle=False, rank=1, world_size=2).tolist()
        [3, 4, 5]
    """
    order = global_order(shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    return split_for_rank(order, rank=rank, world_size=world_size, drop_last=drop_last)


def num_batches(num_samples: int, /, *, batch_size: int, drop_last: bool = False) -> int:
    """Batches over ``num_samples`` positions (the last one partial unless ``drop_last``).

    Examples:
        >>> num_batches(10, batch_size=4), num_batches(10, batch_size=4, drop_last=True)
        (3, 2)
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def worker_batches(total: int, /, *, worker: int, num_workers: int, start: int = 0) -> range:
    """Batch numbers worker ``worker`` of ``num_workers`` builds: ``start + worker``, every
    ``num_workers``.

    Examples:
        >>> (
        ...     list(worker_batches(7, worker=1, num_workers=3)),
        ...     list(worker_batches(7, worker=0, num_workers=2, start=3)),
        ... )
        ([1, 4], [3, 5])
    """
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(
            f"need 0 <= worker < num_workers, got worker={worker}, num_workers={num_workers}"
        )
    return range(start + worker, total, num_workers)


def split_sizes(num_samples: int, /, *, world_size: int, drop_last: bool = False) -> list[int]:
    """Lengths of the :func:`split_for_rank` parts of ``num_samples`` positions.

    Examples:
        >>> split_sizes(7, world_size=3), split_sizes(7, world_size=3, drop_last=True)
        ([3, 2, 2], [2, 2, 2])
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    base, extra = divmod(int(num_samples), world_size)
    return [base if drop_last else base + (1 if r < extra else 0) for r in range(world_size)]


def replica_group(rank: int, /, *, world_size: int, replication: int = 1) -> tuple[int, int]:
    """``(data_rank, data_world_size)`` of ``rank``: groups of ``replication`` ranks read the same
    batches.

    Raises:
        ValueError: ``replication`` does not divide ``world_size``, or ``rank`` is out of range.

    Examples:
        >>> [replica_group(r, world_size=4, replication=2) for r in range(4)]
        [(0, 2), (0, 2), (1, 2), (1, 2)]
    """
    check_int(world_size, name="world_size", low=1, high=None)
    if check_int(replication, name="replication", low=1, high=None) < 1 or world_size % replication:
        raise ConfigError(
            f"replication must be >= 1 and divide world_size, got replication={replication}, "
            f"world_size={world_size}"
        )
    check_rank(rank, world_size=world_size)
    return rank // replication, world_size // replication


def lockstep_consumed(
    num_samples: int, /, *, world_size: int, batches: int, batch_size: int, drop_last: bool = False
) -> tuple[int, ...]:
    """Samples each rank consumed after ``batches`` batches each (ranks in lockstep, as under DDP).

    A rank with fewer batches than ``batches`` (its slice is shorter) consumed its whole slice.

    Examples:
        >>> lockstep_consumed(10, world_size=3, batches=1, batch_size=3)
        (3, 3, 3)
        >>> lockstep_consumed(10, world_size=3, batches=2, batch_size=3)
        (4, 3, 3)
    """
    if batches < 0 or batch_size < 1:
        raise ValueError(f"need batches >= 0 and batch_size >= 1, got {batches}, {batch_size}")
    return tuple(
        min(batches * batch_size, s)
        for s in split_sizes(num_samples, world_size=world_size, drop_last=drop_last)
    )


def remaining_positions(
    num_samples: int, /, *, history: Elastic, drop_last: bool = False
) -> NDArray[np.int64]:
    """Positions of an epoch's global order not consumed after the segments of ``history``.

    Segment ``(W, consumed)`` split the positions left by the segments before it (all of them for
    the first) over ``W`` ranks with :func:`split_for_rank`; rank ``r`` consumed the first
    ``consumed[r]`` of its part. What is left is every part's tail, concatenated in rank order (so
    in global order). Without ``drop_last`` the consumed positions and the returned ones partition
    ``range(num_samples)``; with it, each segment also leaves out its ``len % W`` last positions.

    Args:
        num_samples: positions in the epoch's global order.
        history: the epoch's segments, oldest first (``()``: nothing consumed).
        drop_last: the split rule of the run. Defaults to ``False``.

    Returns:
        Ascending int64 positions into the global order.

    Raises:
        ValueError: a segment names a rank count that does not match ``consumed``, or a rank
            consumed more than its part.

    Examples:
        >>> remaining_positions(10, history=((2, (2, 1)),)).tolist()
        [2, 3, 4, 6, 7, 8, 9]
        >>> remaining_positions(10, history=((2, (2, 1)), (3, (1, 1, 0)))).tolist()
        [3, 4, 7, 8, 9]
    """
    pos = np.arange(int(num_samples), dtype=np.int64)
    for world, consumed in history:
        if len(consumed) != world:
            raise ValueError(
                f"a segment with world_size={world} needs {world} consumed counts, got "
                f"{len(consumed)}"
            )
        parts = [
            split_for_rank(pos, rank=r, world_size=world, drop_last=drop_last) for r in range(world)
        ]
        over = [
            (r, c, len(p)) for r, (p, c) in enumerate(zip(parts, consumed)) if not 0 <= c <= len(p)
        ]
        if over:
            r, c, n = over[0]
            raise ValueError(f"rank {r} of {world} consumed {c} samples, but its part has {n}")
        pos = np.concatenate([p[c:] for p, c in zip(parts, consumed)]) if world else pos
    return pos.astype(np.int64, copy=False)


def remaining_after(
    shard_sizes: Sequence[int] | NDArray[np.int64],
    /,
    *,
    seed: int,
    epoch: int,
    history: Elastic,
    shuffle: bool = True,
    window: int | None = None,
    drop_last: bool = False,
) -> NDArray[np.int64]:
    """Global sample indices an elastic resume still has to visit in ``epoch`` (in global order).

    ``global_order(...)[remaining_positions(...)]``; a resumed rank ``r'`` of ``W'`` visits
    ``split_for_rank(remaining_after(...), rank=r', world_size=W')``.

    Examples:
        >>> remaining_after([4, 4], seed=0, epoch=0, shuffle=False, history=((2, (4, 1)),)).tolist()
        [5, 6, 7]
    """
    order = global_order(shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    return order[remaining_positions(len(order), history=history, drop_last=drop_last)]
