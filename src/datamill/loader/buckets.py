"""Length-bucketed batches: samples of similar length batched together, inside the shuffle window.

:func:`bucket_arrange` reorders one rank's sequence so that each batch of ``batch_size`` consecutive
positions holds samples of one length bucket where it can. It works chunk by chunk, each chunk about
one shuffle window of positions rounded up to whole batches (so memory stays bounded by the window):

1. samples of the chunk are grouped by bucket (stable, so the shuffled order within a bucket stays);
2. each bucket gives ``count // batch_size`` full batches; the rest of every bucket (fewer than a
   batch each) is gathered, by bucket, into mixed batches;
3. the chunk's batches are shuffled (a generator of ``(seed, epoch, ...)``); the last chunk's
   partial batch stays last (``drop_last`` drops it, as before).

It is a permutation of the rank's positions, so every sample is still seen exactly once per epoch,
and a pure function of (the sequence, the lengths, the settings), so resumption stays exact.
Lengths come from :func:`sample_lengths` (one read of the column's offsets per shard).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, SchemaError
from datamill.core.source import Source

__all__ = ["bucket_arrange", "bucket_boundaries", "padding_of", "sample_lengths"]


def sample_lengths(source: Source, column: str, /) -> NDArray[np.int64]:
    """Length of ``column`` (a list or string column) for every sample of ``source``.

    Raises:
        SchemaError: the column is unknown, or not a list/string column (``column`` set).

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.core.source import TableSource
        >>> sample_lengths(
        ...     TableSource(pa.table({"t": [[1], [], [2, 3]]}), shard_size=2), "t"
        ... ).tolist()
        [1, 0, 2]
    """
    if column not in source.columns:
        raise SchemaError(
            f"bucket_by column {column!r} is not a column of the source ({source.columns})",
            column=column,
        )
    out = []
    for k in range(source.num_shards):
        col = source.read_shard(k, columns=[column]).column(0)
        typ = col.type
        if (
            pat.is_list(typ)
            or pat.is_large_list(typ)
            or pat.is_string(typ)
            or pat.is_large_string(typ)
            or pat.is_binary(typ)
        ):
            fn = (
                pc.list_value_length
                if pat.is_list(typ) or pat.is_large_list(typ)
                else pc.binary_length
            )
            out.append(
                np.asarray(fn(col).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
            )
        else:
            raise SchemaError(
                f"bucket_by column {column!r} has type {typ}; expected a list or string column",
                column=column,
            )
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def bucket_boundaries(
    lengths: NDArray[np.int64], /, buckets: int | Sequence[int]
) -> NDArray[np.int64]:
    """Upper-exclusive bucket boundaries: given ones (sorted), or ``buckets`` quantiles of
    ``lengths``.

    Examples:
        >>> (
        ...     bucket_boundaries(np.arange(100), 4).tolist(),
        ...     bucket_boundaries(np.arange(9), [64, 8]).tolist(),
        ... )
        ([25, 50, 75], [8, 64])
    """
    if isinstance(buckets, bool):
        raise ConfigError(
            f"buckets must be a number of buckets or a list of int boundaries, got {buckets!r}"
        )
    if isinstance(buckets, (int, np.integer)):
        if buckets < 1:
            raise ConfigError(f"buckets must be >= 1, got {buckets}")
        if not len(lengths) or buckets == 1:
            return np.zeros(0, dtype=np.int64)
        qs = np.quantile(lengths, np.arange(1, buckets) / buckets, method="higher")
        return np.unique(qs.astype(np.int64))
    try:
        bounds = np.unique(np.asarray(list(buckets), dtype=np.int64))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"buckets must be a number of buckets or a list of int boundaries, got {buckets!r}"
        ) from exc
    return bounds


def bucket_arrange(
    lengths: NDArray[np.int64],
    /,
    *,
    batch_size: int,
    chunk: int,
    boundaries: NDArray[np.int64],
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """A permutation of ``range(len(lengths))`` putting same-bucket samples in the same batches.

    Args:
        lengths: the length of the sample at each position of the sequence.
        batch_size: samples per batch.
        chunk: positions arranged together (rounded up to whole batches).
        boundaries: sorted bucket boundaries (bucket of ``x``: ``searchsorted(boundaries, x,
            "right")``).
        rng: shuffles the batch order within each chunk.

    Examples:
        >>> perm = bucket_arrange(
        ...     np.array([1, 9, 2, 8, 3, 7]),
        ...     batch_size=3,
        ...     chunk=6,
        ...     boundaries=np.array([5]),
        ...     rng=np.random.default_rng(0),
        ... )
        >>> sorted(sorted(np.array([1, 9, 2, 8, 3, 7])[perm[i:i + 3]].tolist()) for i in (0, 3))
        [[1, 2, 3], [7, 8, 9]]
    """
    n, bs = len(lengths), int(batch_size)
    step = max(bs, -(-int(chunk) // bs) * bs)
    out = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        bucket = np.searchsorted(boundaries, lengths[lo:hi], side="right")
        by = np.argsort(bucket, kind="stable")
        counts = np.bincount(bucket, minlength=len(boundaries) + 1)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        sb = bucket[by]
        full = (np.arange(hi - lo) - starts[sb]) < (counts // bs * bs)[sb]
        ordered = np.concatenate([by[full], by[~full]]) + lo
        whole = (hi - lo) // bs
        batches = ordered[: whole * bs].reshape(whole, bs)
        out.append(batches[rng.permutation(whole)].reshape(-1))
        out.append(ordered[whole * bs :])  # the last chunk's partial batch stays last
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def padding_of(lengths: NDArray[np.int64], /, *, batch_size: int) -> tuple[int, int]:
    """``(padding cells, total cells)`` when consecutive batches are padded to their longest sample.

    Examples:
        >>> padding_of(np.array([1, 3, 2, 2]), batch_size=2)
        (2, 10)
    """
    n = len(lengths)
    if not n:
        return 0, 0
    starts = np.arange(0, n, batch_size)
    longest = np.maximum.reduceat(lengths, starts)
    sizes = np.diff(np.append(starts, n))
    total = int((longest * sizes).sum())
    return total - int(lengths.sum()), total
