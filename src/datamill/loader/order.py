"""Pure iteration order: which sample comes when, on which rank, in which batch.

Everything here is a pure function of its arguments (seed, epoch, shard sizes, world size) computed
with numpy index arrays, so every process computes the same global order without talking to the
others, and resuming recomputes the order instead of replaying samples.

The global order of one epoch (:func:`global_order`) does not depend on the world size or the number
of workers; those only slice it:

1. **Shard-aware shuffle** (:func:`shard_order`): the shard order is permuted per ``(seed, epoch)``,
   then consecutive shards of that permuted order are grouped into windows of ``window`` shards and
   the samples of each window are shuffled together. A reader therefore needs at most one window of
   shards in memory, while samples from different shards are mixed within each batch.
2. **Rank split** (:func:`split_for_rank`): rank ``r`` takes the ``r``-th contiguous slice of the
   global order (contiguous, so a rank reads only the shards of its part). Without ``drop_last`` every
   sample is used exactly once per epoch over all ranks and, when ``world_size`` does not divide the
   number of samples, the *first* ``n % world_size`` ranks get one sample more than the others (no
   padding, no repetition). With ``drop_last`` every rank gets ``n // world_size`` samples and the
   last ``n % world_size`` samples of the global order are skipped this epoch (a different set each
   epoch) so that all ranks see the same number of batches, as DDP requires.
3. **Batches and workers** (:func:`num_batches`, :func:`worker_batches`): a rank's batch ``b`` holds
   the samples at positions ``[b * batch_size, (b + 1) * batch_size)`` of its slice; worker ``w`` of
   ``W`` builds batches ``w, w + W, ...`` and the consumer interleaves them in order, so the batch
   sequence is the same for any number of workers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from datamill.core.rng import rng_for

__all__ = [
    "DEFAULT_WINDOW_SAMPLES",
    "DEFAULT_WINDOW_SHARDS",
    "default_window",
    "epoch_order",
    "global_order",
    "num_batches",
    "rank_sequence",
    "shard_order",
    "split_for_rank",
    "worker_batches",
]

DEFAULT_WINDOW_SHARDS = 4
"""At least this many shards are shuffled together by default."""
DEFAULT_WINDOW_SAMPLES = 1 << 16
"""...and enough shards to hold about this many samples (tiny shards would mix too little)."""


def _check_seed_epoch(seed: int, epoch: int) -> None:
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")


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
    return rng_for(seed, "epoch_order", epoch).permutation(int(num_samples)).astype(np.int64)


def default_window(shard_sizes: Sequence[int] | NDArray[np.int64]) -> int:
    """Shards per shuffle window: at least 4, and enough to hold about 65,536 samples.

    Examples:
        >>> default_window([100_000] * 10), default_window([1_000] * 200)
        (4, 66)
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if len(sizes) == 0:
        return 1
    mean = max(1.0, float(sizes.mean()))
    return int(max(DEFAULT_WINDOW_SHARDS, -(-DEFAULT_WINDOW_SAMPLES // int(mean))))


def shard_order(
    shard_sizes: Sequence[int] | NDArray[np.int64], /, *, seed: int, epoch: int, window: int | None = None
) -> NDArray[np.int64]:
    """Shard-aware shuffle: permute shards, then shuffle samples within windows of ``window`` shards.

    Args:
        shard_sizes: rows per shard; sample ``i`` is row ``i - offsets[k]`` of shard ``k``.
        seed: the run's seed.
        epoch: the epoch number.
        window: shards shuffled together. Defaults to ``None`` (:func:`default_window`).

    Returns:
        An int64 permutation of ``range(sum(shard_sizes))``.

    Examples:
        >>> order = shard_order([3, 2, 4], seed=1, epoch=0, window=1)
        >>> sorted(order.tolist()) == list(range(9))
        True
        >>> # with window=1 each shard's samples stay together (shuffled among themselves)
        >>> [sorted(order[a:b].tolist()) for a, b in [(0, 3), (3, 5), (5, 9)]][0] in ([0, 1, 2], [3, 4], [5, 6, 7, 8])
        True
    """
    _check_seed_epoch(seed, epoch)
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if (sizes < 0).any():
        raise ValueError("shard sizes must be >= 0")
    win = default_window(sizes) if window is None else int(window)
    if win < 1:
        raise ValueError(f"window must be >= 1 shard, got {win}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    rng = rng_for(seed, "shard_order", epoch)
    perm = rng.permutation(len(sizes))
    psizes = sizes[perm]
    pcum = np.concatenate([[0], np.cumsum(psizes)]).astype(np.int64)
    total = int(pcum[-1])
    # sample j of the permuted sequence is starts[perm[s]] + (j - pcum[s]) for its shard s
    order = np.repeat(starts[perm] - pcum[:-1], psizes) + np.arange(total, dtype=np.int64)
    for w0 in range(0, len(perm), win):
        a, b = int(pcum[w0]), int(pcum[min(w0 + win, len(perm))])
        rng.shuffle(order[a:b])
    return order


def global_order(
    shard_sizes: Sequence[int] | NDArray[np.int64], /, *, seed: int, epoch: int, shuffle: bool = True,
    window: int | None = None,
) -> NDArray[np.int64]:
    """The epoch's order over all ranks: :func:`shard_order`, or ``arange`` without shuffling.

    Examples:
        >>> global_order([2, 2], seed=0, epoch=0, shuffle=False).tolist()
        [0, 1, 2, 3]
    """
    if not shuffle:
        _check_seed_epoch(seed, epoch)
        return np.arange(int(np.sum(np.asarray(shard_sizes, dtype=np.int64))), dtype=np.int64)
    return shard_order(shard_sizes, seed=seed, epoch=epoch, window=window)


def split_for_rank(
    order: NDArray[np.int64], /, *, rank: int, world_size: int, drop_last: bool = False
) -> NDArray[np.int64]:
    """Rank ``rank``'s contiguous part of ``order`` (a view, no copy).

    Without ``drop_last`` the parts cover ``order`` exactly once; the first ``len(order) % world_size``
    ranks get one sample more. With ``drop_last`` every rank gets ``len(order) // world_size``.

    Examples:
        >>> o = np.arange(7)
        >>> [split_for_rank(o, rank=r, world_size=3).tolist() for r in range(3)]
        [[0, 1, 2], [3, 4], [5, 6]]
        >>> [split_for_rank(o, rank=r, world_size=3, drop_last=True).tolist() for r in range(3)]
        [[0, 1], [2, 3], [4, 5]]
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    n = len(order)
    base, extra = divmod(n, world_size)
    if drop_last:
        return order[rank * base:(rank + 1) * base]
    start = rank * base + min(rank, extra)
    return order[start:start + base + (1 if rank < extra else 0)]


def rank_sequence(
    shard_sizes: Sequence[int] | NDArray[np.int64], /, *, seed: int, epoch: int, shuffle: bool = True,
    window: int | None = None, rank: int = 0, world_size: int = 1, drop_last: bool = False,
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
    """Batch numbers worker ``worker`` of ``num_workers`` builds: ``start + worker``, every ``num_workers``.

    Examples:
        >>> list(worker_batches(7, worker=1, num_workers=3)), list(worker_batches(7, worker=0, num_workers=2, start=3))
        ([1, 4], [3, 5])
    """
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"need 0 <= worker < num_workers, got worker={worker}, num_workers={num_workers}")
    return range(start + worker, total, num_workers)
