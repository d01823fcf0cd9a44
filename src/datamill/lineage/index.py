"""An epoch's order, forwards and backwards, without materialising it: the index behind ``trace``.

:func:`~datamill.loader.order.shard_order` permutes the shards, then shuffles the samples of each
window of ``window`` shards with that window's own generator. Knowing the shard permutation
(``O(shards)`` numbers) is enough to answer both directions for any position or sample by replaying
*one* window's shuffle:

* :meth:`EpochIndex.at`: the sample at global positions (a batch: ``step -> UIDs``);
* :meth:`EpochIndex.where`: the positions holding given samples (``UID -> steps``).

:class:`ShardOrderIndex` does that; :class:`ArangeIndex` is the unshuffled order and
:class:`SequenceIndex` a materialised sequence (a :class:`~datamill.loader.mix.Mix` schedule, where
a sample may occur several times per epoch). :class:`Layout` maps global positions to
``(segment, data rank, index in the rank's part)`` through an epoch's elastic history without
materialising the remaining positions (they are a few intervals).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

from datamill.core.rng import rng_for

__all__ = ["ArangeIndex", "EpochIndex", "Layout", "Segment", "SequenceIndex", "ShardOrderIndex"]

I64 = NDArray[np.int64]


class EpochIndex:
    """One epoch's global order ``order[position] -> sample`` (``n`` positions)."""

    n: int

    def at(self, positions: I64) -> I64:
        """Samples at ``positions``."""
        raise NotImplementedError

    def where(self, samples: I64) -> tuple[I64, I64]:
        """``(positions, which)``: every position holding ``samples[which[i]]``, grouped by
        query."""
        raise NotImplementedError


class ArangeIndex(EpochIndex):
    """The unshuffled order ``0, 1, ..., n - 1``.

    Examples:
        >>> ArangeIndex(5).where(np.array([3, 9]))
        (array([3]), array([0]))
    """

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def at(self, positions: I64) -> I64:
        return np.asarray(positions, dtype=np.int64)

    def where(self, samples: I64) -> tuple[I64, I64]:
        s = np.asarray(samples, dtype=np.int64)
        ok = np.flatnonzero((s >= 0) & (s < self.n))
        return s[ok], ok.astype(np.int64)


class SequenceIndex(EpochIndex):
    """A materialised sequence (samples may repeat), with a sorted view for lookups.

    Examples:
        >>> SequenceIndex(np.array([4, 2, 4])).where(np.array([4]))
        (array([0, 2]), array([0, 0]))
    """

    def __init__(self, seq: I64) -> None:
        self.seq = np.asarray(seq, dtype=np.int64)
        self.n = len(self.seq)
        self._by = np.argsort(self.seq, kind="stable")
        self._sorted = self.seq[self._by]

    def at(self, positions: I64) -> I64:
        return self.seq[np.asarray(positions, dtype=np.int64)]

    def where(self, samples: I64) -> tuple[I64, I64]:
        s = np.asarray(samples, dtype=np.int64)
        lo = np.searchsorted(self._sorted, s, side="left")
        hi = np.searchsorted(self._sorted, s, side="right")
        which = np.repeat(np.arange(len(s), dtype=np.int64), hi - lo)
        idx = (
            np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])
            if len(s)
            else np.zeros(0, np.int64)
        )
        return self._by[idx.astype(np.int64)].astype(np.int64), which


class ShardOrderIndex(EpochIndex):
    """:func:`~datamill.loader.order.shard_order` of one epoch from its ``O(shards)`` index.

    The index is the shard permutation; each window's shuffle has its own generator
    (``rng_for(seed, "shard_order.window", epoch, w)``, as
    :class:`~datamill.loader.order.EpochOrder` draws it), so a query replays only the one or two
    windows it touches (cached). :meth:`build` draws the permutation; :meth:`save`/:meth:`load` keep
    it.

    Examples:
        >>> from datamill.loader.order import shard_order
        >>> sizes = np.array([3, 5, 0, 4, 2])
        >>> order = shard_order(sizes, seed=7, epoch=2, window=2)
        >>> idx = ShardOrderIndex.build(sizes, seed=7, epoch=2, window=2)
        >>> (
        ...     bool((idx.at(np.arange(14)) == order).all()),
        ...     bool((order[idx.where(order)[0]] == order).all()),
        ... )
        (True, True)
    """

    def __init__(
        self, sizes: I64, perm: I64, window: int, *, seed: int, epoch: int, cache: int = 8
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.perm = np.asarray(perm, dtype=np.int64)
        self.window = int(window)
        self.seed, self.epoch = int(seed), int(epoch)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.inv_perm = np.empty_like(self.perm)
        self.inv_perm[self.perm] = np.arange(len(self.perm), dtype=np.int64)
        self.pcum = np.concatenate([[0], np.cumsum(self.sizes[self.perm])]).astype(np.int64)
        self.n = int(self.pcum[-1])
        self.wstart = self.pcum[
            np.arange(0, len(self.perm) + 1, self.window).clip(max=len(self.perm))
        ]
        if self.wstart[-1] != self.n:
            self.wstart = np.append(self.wstart, self.n)
        self._cache: OrderedDict[int, I64] = OrderedDict()
        self._keep = cache

    @classmethod
    def build(
        cls, sizes: I64 | Sequence[int], *, seed: int, epoch: int, window: int
    ) -> ShardOrderIndex:
        """The index of ``shard_order(sizes, seed=seed, epoch=epoch, window=window)`` (draws the
        shard permutation)."""
        sz = np.asarray(sizes, dtype=np.int64)
        perm = rng_for(seed, "shard_order", epoch).permutation(len(sz))
        return cls(sz, perm, window, seed=seed, epoch=epoch)

    def save(self, path: str | Path | IO[bytes]) -> None:
        """Write the index (``.npz``)."""
        np.savez(
            path,
            sizes=self.sizes,
            perm=self.perm,
            window=np.int64(self.window),
            seed=np.uint64(self.seed),
            epoch=np.int64(self.epoch),
        )

    @classmethod
    def load(cls, path: str | Path) -> ShardOrderIndex:
        """Read an index written by :meth:`save`."""
        with np.load(path) as z:
            return cls(
                z["sizes"], z["perm"], int(z["window"]), seed=int(z["seed"]), epoch=int(z["epoch"])
            )

    def _window(self, w: int) -> I64:
        """The shuffled ``arange`` of window ``w`` (the same draws as the window's shuffle of sample
        ids)."""
        hit = self._cache.get(w)
        if hit is not None:
            self._cache.move_to_end(w)
            return hit
        p = np.arange(int(self.wstart[w + 1] - self.wstart[w]), dtype=np.int64)
        rng_for(self.seed, "shard_order.window", self.epoch, w).shuffle(p)
        self._cache[w] = p
        while len(self._cache) > self._keep:
            self._cache.popitem(last=False)
        return p

    def _inverse(self, p: I64, local: I64) -> I64:
        """Where the values ``local`` ended up in the shuffled window ``p``."""
        if len(local) <= 16:
            return np.array(
                [int(np.flatnonzero(p == u)[0]) for u in local.tolist()], dtype=np.int64
            )
        inv = np.empty_like(p)
        inv[p] = np.arange(len(p), dtype=np.int64)
        out: I64 = inv[local]
        return out

    def _pre(self, q: I64) -> I64:
        s = np.searchsorted(self.pcum, q, side="right") - 1
        return self.starts[self.perm[s]] + (q - self.pcum[s])

    def at(self, positions: I64) -> I64:
        pos = np.asarray(positions, dtype=np.int64)
        w = np.searchsorted(self.wstart, pos, side="right") - 1
        q = np.empty_like(pos)
        for wi in np.unique(w):
            sel = w == wi
            p = self._window(int(wi))
            q[sel] = self.wstart[wi] + p[pos[sel] - self.wstart[wi]]
        return self._pre(q)

    def where(self, samples: I64) -> tuple[I64, I64]:
        s = np.asarray(samples, dtype=np.int64)
        ok = np.flatnonzero((s >= 0) & (s < self.n))
        s = s[ok]
        k = np.searchsorted(self.offsets, s, side="right") - 1
        slot = self.inv_perm[k]
        q = self.pcum[slot] + (s - self.offsets[k])
        w = slot // self.window
        out = np.empty_like(q)
        for wi in np.unique(w):
            sel = w == wi
            out[sel] = self.wstart[wi] + self._inverse(
                self._window(int(wi)), q[sel] - self.wstart[wi]
            )
        return out, ok.astype(np.int64)


@dataclass(frozen=True)
class Segment:
    """A part of an epoch run with one data world size: ``consumed`` per data rank (``None``: to the
    end)."""

    data_world: int
    consumed: tuple[int, ...] | None
    batch_size: int
    replication: int = 1
    step_offset: int = 0
    eras: tuple[tuple[int, int], ...] = ()
    """``(first batch, replication)`` when runs continuing the same plan changed the replication."""

    def replication_at(self, batch: int) -> int:
        """The replication of the run that read ``batch`` of this segment."""
        k = self.replication
        for first, repl in self.eras:
            if batch >= first:
                k = repl
        return k


def _split(m: int, world: int, drop_last: bool) -> tuple[I64, I64]:
    base, extra = divmod(m, world)
    r = np.arange(world, dtype=np.int64)
    if drop_last:
        return r * base, np.full(world, base, dtype=np.int64)
    return r * base + np.minimum(r, extra), base + (r < extra).astype(np.int64)


class Layout:
    """Positions of an epoch -> ``(segment, data rank, index in the rank's part)`` and back.

    Segment ``k`` splits the positions the segments before it left (intervals of the global order)
    with :func:`~datamill.loader.order.split_for_rank`; data rank ``r`` consumed the first
    ``consumed[r]`` of its part; the last segment runs to the end of the epoch.

    Examples:
        >>> lay = Layout(10, [Segment(2, (2, 1), 2), Segment(3, None, 2)], drop_last=False)
        >>> [lay.part(1, r).tolist() for r in range(3)]
        [[2, 3, 4], [6, 7], [8, 9]]
        >>> [x.tolist() for x in lay.locate(np.array([0, 5, 6, 9]))]
        [[0, 0, 1, 1], [0, 1, 1, 2], [0, 0, 0, 1]]
    """

    def __init__(self, n: int, segments: Sequence[Segment], *, drop_last: bool) -> None:
        self.n, self.segments, self.drop_last = int(n), list(segments), bool(drop_last)
        starts, lens = np.zeros(1, np.int64), np.array([self.n], dtype=np.int64)
        self._ivals: list[
            tuple[I64, I64]
        ] = []  # per segment: (interval starts, cumulative lengths)
        self._parts: list[
            tuple[I64, I64]
        ] = []  # per segment: (part start, part length) per data rank
        for seg in self.segments:
            cum = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            self._ivals.append((starts, cum))
            pst, pln = _split(int(cum[-1]), seg.data_world, self.drop_last)
            self._parts.append((pst, pln))
            if seg.consumed is None:
                break
            c = np.minimum(np.asarray(seg.consumed, dtype=np.int64), pln)
            tails = [
                self._map_range(starts, cum, int(a + ci), int(a + ln))
                for a, ci, ln in zip(pst, c, pln)
            ]
            starts = np.concatenate([t[0] for t in tails]) if tails else np.zeros(0, np.int64)
            lens = np.concatenate([t[1] for t in tails]) if tails else np.zeros(0, np.int64)

    @staticmethod
    def _map_range(starts: I64, cum: I64, a: int, b: int) -> tuple[I64, I64]:
        """Intervals (global starts, lengths) of indices ``[a, b)`` of the interval list."""
        if b <= a:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        i0 = int(np.searchsorted(cum, a, side="right") - 1)
        i1 = int(np.searchsorted(cum, b - 1, side="right") - 1)
        idx = np.arange(i0, i1 + 1)
        lo = np.maximum(cum[idx], a)
        hi = np.minimum(cum[idx + 1], b)
        return (starts[idx] + (lo - cum[idx])).astype(np.int64), (hi - lo).astype(np.int64)

    def part_len(self, seg: int, data_rank: int) -> int:
        """Length of data rank ``data_rank``'s part in segment ``seg``."""
        return int(self._parts[seg][1][data_rank])

    def part(self, seg: int, data_rank: int, js: I64 | None = None) -> I64:
        """Global positions of indices ``js`` (all by default) of the rank's part in segment
        ``seg``."""
        starts, cum = self._ivals[seg]
        pst, pln = self._parts[seg]
        j = (
            np.arange(int(pln[data_rank]), dtype=np.int64)
            if js is None
            else np.asarray(js, dtype=np.int64)
        )
        idx = pst[data_rank] + j
        i = np.searchsorted(cum, idx, side="right") - 1
        out: I64 = starts[i] + (idx - cum[i])
        return out

    def locate(self, positions: I64) -> tuple[I64, I64, I64]:
        """``(segment, data rank, j)`` of each position; segment ``-1``: not visited
        (``drop_last``)."""
        pos = np.asarray(positions, dtype=np.int64)
        seg_of = np.full(len(pos), -1, dtype=np.int64)
        rank_of = np.full(len(pos), -1, dtype=np.int64)
        j_of = np.full(len(pos), -1, dtype=np.int64)
        live = np.ones(len(pos), dtype=bool)
        for k, seg in enumerate(self.segments[: len(self._ivals)]):
            starts, cum = self._ivals[k]
            if not live.any():
                break
            i = np.searchsorted(starts, pos, side="right") - 1
            lens = np.diff(cum)
            inside = (
                live & (i >= 0) & (pos < starts[i.clip(0)] + lens[i.clip(0)])
                if len(starts)
                else live & False
            )
            live &= inside
            idx = cum[i.clip(0)] + pos - starts[i.clip(0)] if len(starts) else pos
            pst, pln = self._parts[k]
            r = np.searchsorted(pst, idx, side="right") - 1
            j = idx - pst[r.clip(0)]
            in_part = live & (r >= 0) & (j < pln[r.clip(0)])
            live &= in_part
            used = live & (
                j
                < (
                    np.inf
                    if seg.consumed is None
                    else np.minimum(np.asarray(seg.consumed, dtype=np.int64), pln)[r.clip(0)]
                )
            )
            seg_of[used], rank_of[used], j_of[used] = k, r[used], j[used]
            live &= ~used
        return seg_of, rank_of, j_of
