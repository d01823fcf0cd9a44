"""Skip-gram examples as a :class:`~datamill.core.source.Source` and the seed's ``batchify``
(private)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.optional import require
from datamill.core.ragged import csr_from_arrow, offsets_from_lengths, pad
from datamill.core.source import FixedShards, FixedShardsSource, check_read_args

__all__ = ["COLUMNS", "Batchify", "SkipGramSource", "batchify_arrays"]

COLUMNS = ["center", "contexts", "negatives"]


def _lengths_values(arr: pa.Array | pa.ChunkedArray) -> tuple[NDArray[np.int64], NDArray[Any]]:
    """(row lengths, the rows' values in order) of a list array, zero-copy where arrow allows."""
    values, offsets = csr_from_arrow(arr)
    return np.diff(offsets), values


def batchify_arrays(
    centers: NDArray[Any],
    n_ctx: NDArray[np.int64],
    ctx: NDArray[Any],
    n_neg: NDArray[np.int64],
    neg: NDArray[Any],
) -> dict[str, NDArray[np.int64]]:
    """The seed's ``batchify`` on CSR parts, without a per-row loop.

    The contexts are padded to the batch width with :func:`datamill.core.ragged.pad` (its mask is
    ``labels``); row-major, the cells where ``masks`` is 1 and ``labels`` 0 are exactly the
    negatives in order, so one more boolean-mask assignment completes the batch.

    Examples:
        >>> b = batchify_arrays(np.array([1, 1]), np.array([2, 3]), np.array([2, 2, 2, 2, 2]),
        ...                     np.array([4, 2]), np.array([3, 3, 3, 3, 3, 3]))
        >>> b["contexts_negatives"].tolist(), b["labels"].tolist()
        ([[2, 2, 3, 3, 3, 3], [2, 2, 2, 3, 3, 0]], [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    """
    n_ctx, n_neg = np.asarray(n_ctx, dtype=np.int64), np.asarray(n_neg, dtype=np.int64)
    total = n_ctx + n_neg
    width = int(total.max()) if len(total) else 0
    out, is_ctx = pad(np.asarray(ctx), offsets_from_lengths(n_ctx), width, dtype=np.int64)
    is_real = np.arange(width) < total[:, None]
    out[is_real & ~is_ctx] = neg
    return {
        "centers": np.asarray(centers, dtype=np.int64).reshape(-1, 1),
        "contexts_negatives": out,
        "masks": is_real.astype(np.int64),
        "labels": is_ctx.astype(np.int64),
    }


class Batchify:
    """Loader ``collate``: a batch ``pa.Table`` of examples -> the seed's padded batch (numpy or
    torch).

    A class (not a closure) so torch DataLoader worker processes can pickle it.
    """

    def __init__(self, *, as_torch: bool = False) -> None:
        self.as_torch = as_torch

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        centers = table.column("center").to_numpy()
        n_ctx, ctx = _lengths_values(table.column("contexts"))
        n_neg, neg = _lengths_values(table.column("negatives"))
        batch: dict[str, Any] = batchify_arrays(centers, n_ctx, ctx, n_neg, neg)
        if self.as_torch:
            torch = require("torch", extra="torch")
            batch = {k: torch.from_numpy(v) for k, v in batch.items()}
        return batch


class SkipGramSource(FixedShardsSource):
    """The examples as a Source: columns ``center`` (int32), ``contexts``, ``negatives``
    (list<int32>).

    Shards are consecutive runs of ``shard_size`` examples, built zero-copy over the (memory-mapped)
    arrays.
    """

    def __init__(
        self,
        centers: NDArray[np.int32],
        ctx_off: NDArray[np.int64],
        ctx: NDArray[np.int32],
        neg_off: NDArray[np.int64],
        neg: NDArray[np.int32],
        *,
        fingerprint: str,
        shard_size: int = 16384,
    ) -> None:
        self._centers, self._ctx_off, self._ctx, self._neg_off, self._neg = (
            centers,
            ctx_off,
            ctx,
            neg_off,
            neg,
        )
        self._shards = FixedShards(len(centers), shard_size)
        self._fp, self.shard_size = fingerprint, self._shards.shard_size
        self.uid_column: str | None = None
        self._ctx_arr = pa.array(np.asarray(ctx))
        self._neg_arr = pa.array(np.asarray(neg))

    @property
    def columns(self) -> list[str]:
        return list(COLUMNS)

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        cols = check_read_args(self, index, columns)
        a, b = self._shards.bounds(index)
        data: dict[str, pa.Array] = {}
        for c in cols:
            if c == "center":
                data[c] = pa.array(np.asarray(self._centers[a:b]))
            else:
                off, vals = (
                    (self._ctx_off, self._ctx_arr)
                    if c == "contexts"
                    else (self._neg_off, self._neg_arr)
                )
                data[c] = pa.LargeListArray.from_arrays(pa.array(np.asarray(off[a : b + 1])), vals)
        return pa.table(data)

    def padded_collate(self, *, as_torch: bool = False) -> Batchify:
        """The loader ``collate`` giving the seed's padded batches (:class:`Batchify`)."""
        return Batchify(as_torch=as_torch)

    def fingerprint(self) -> str:
        return self._fp
