"""Document packing for language-model batches: :class:`Packing`, the packers and the collate.

A *unit* is what a row of a batch holds: a packed sequence of ``seq_len`` token slots made of
*segments* (a piece ``[start, start + length)`` of one document). The packers work on a window of
documents' lengths only and return :class:`Units` (CSR: ``unit_ptr`` bounds each unit's segments),
so which document lands where is a pure function of the lengths; :func:`collate_units` then
gathers the tokens with one fancy-index per batch.

* ``strategy="concat"`` (GPT style): the documents are joined into one stream cut every
  ``seq_len`` tokens (:func:`cut_stream`); no padding, a document may span two sequences.
* ``strategy="best_fit"``: documents longer than ``seq_len`` are cut into ``seq_len`` chunks
  (``split_long="chunk"``, each a full sequence, the remainder packed like a document) or dropped
  (``"drop"``); the rest are placed by best-fit decreasing over the window (:func:`best_fit`): each
  piece, longest first, goes to the open sequence with the least room that still fits it.

Rows carry ``input_ids``, ``labels`` (``input_ids`` shifted left by one; ``-100`` at the last token
of every document when ``mask_boundaries``, and on padding), ``position_ids`` (restarting at 0 with
every segment) and ``segment_ids`` (1, 2, ... per segment in the row, 0 on padding: for
document-masked attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

from datamill.core.checks import check_int
from datamill.core.errors import ConfigError
from datamill.core.ragged import offsets_from_lengths, ranges

__all__ = [
    "IGNORE_INDEX",
    "Packing",
    "Units",
    "best_fit",
    "collate_segments",
    "collate_units",
    "cut_stream",
    "pack_window",
]

IGNORE_INDEX = -100
"""The label of a position with no next token to predict (torch's ``CrossEntropyLoss`` default)."""

I64 = NDArray[np.int64]
Strategy = Literal["concat", "best_fit"]
SplitLong = Literal["chunk", "drop"]


@dataclass(frozen=True)
class Packing:
    """How documents are packed into sequences of ``seq_len`` tokens.

    Args:
        seq_len: token slots per sequence.
        strategy: ``"best_fit"`` (whole documents, best-fit decreasing over ``window``) or
            ``"concat"`` (one stream cut every ``seq_len``). Defaults to ``"best_fit"``.
        split_long: documents longer than ``seq_len`` are cut into ``seq_len`` chunks
            (``"chunk"``) or dropped (``"drop"``). Defaults to ``"chunk"``.
        column: the list<int> column holding each document's tokens. Defaults to ``"tokens"``.
        window: documents of the shuffled stream packed together. Defaults to ``1000``.
        mask_boundaries: label ``-100`` at each document's last token (no prediction of the next
            document). Defaults to ``True``.
        pad_id: the token on padding slots. Defaults to ``0``.

    Examples:
        >>> Packing(seq_len=512).as_dict()["strategy"]
        'best_fit'
    """

    seq_len: int
    strategy: Strategy = "best_fit"
    split_long: SplitLong = "chunk"
    column: str = "tokens"
    window: int = 1000
    mask_boundaries: bool = True
    pad_id: int = 0

    def __post_init__(self) -> None:
        check_int(self.seq_len, name="Packing(seq_len=)", low=1, high=None)
        check_int(self.window, name="Packing(window=) (documents)", low=1, high=None)
        check_int(self.pad_id, name="Packing(pad_id=)", low=None, high=None)
        if self.strategy not in ("concat", "best_fit"):
            raise ConfigError(
                f"Packing(strategy=) must be 'concat' or 'best_fit', got {self.strategy!r}"
            )
        if self.split_long not in ("chunk", "drop"):
            raise ConfigError(
                f"Packing(split_long=) must be 'chunk' or 'drop', got {self.split_long!r}"
            )

    def as_dict(self) -> dict[str, Any]:
        """The settings as a JSON-able dict (saved in resume states and run records)."""
        return {
            "column": self.column,
            "mask_boundaries": bool(self.mask_boundaries),
            "pad_id": int(self.pad_id),
            "seq_len": int(self.seq_len),
            "split_long": self.split_long,
            "strategy": self.strategy,
            "window": int(self.window),
        }


class Units(NamedTuple):
    """Units as CSR over segments: unit ``u`` holds segments ``unit_ptr[u]:unit_ptr[u + 1]``.

    ``seg_doc`` indexes the window's documents, ``seg_start``/``seg_len`` the piece of it.
    """

    unit_ptr: I64
    seg_doc: I64
    seg_start: I64
    seg_len: I64

    def __len__(self) -> int:
        return len(self.unit_ptr) - 1

    def take(self, units: I64) -> Units:
        """The units ``units`` (in that order), renumbered from 0."""
        units = np.asarray(units, dtype=np.int64)
        counts = self.unit_ptr[units + 1] - self.unit_ptr[units]
        idx = ranges(self.unit_ptr[units], counts)
        return Units(
            offsets_from_lengths(counts), self.seg_doc[idx], self.seg_start[idx], self.seg_len[idx]
        )

    def tokens(self) -> I64:
        """Tokens (not padding) per unit."""
        cum = np.concatenate([[0], np.cumsum(self.seg_len)]).astype(np.int64)
        out: I64 = cum[self.unit_ptr[1:]] - cum[self.unit_ptr[:-1]]
        return out


def best_fit(lengths: I64, /, *, capacity: int) -> tuple[I64, int]:
    """Best-fit decreasing: the bin of each item (every length ``<= capacity``) and the bin count.

    Items are placed longest first (ties: lower index first) into the open bin with the least room
    that fits them. Items longer than half the capacity each open a bin (vectorised); the rest go
    through one loop step each over a table of open bins by remaining room (a ``bytearray.find``
    locates the tightest one in C).

    Examples:
        >>> bins, n = best_fit(np.array([5, 3, 4, 2, 6]), capacity=8)
        >>> n, sorted(np.bincount(bins, weights=[5, 3, 4, 2, 6]).tolist())
        (3, [4.0, 8.0, 8.0])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    sorted_len = lengths[order]
    bins = np.empty(len(lengths), dtype=np.int64)
    big = int(np.searchsorted(-sorted_len, -(capacity // 2), side="left"))  # items > capacity/2
    bins[order[:big]] = np.arange(big)
    rooms = (capacity - sorted_len[:big]).tolist()
    open_at: list[list[int]] = [[] for _ in range(capacity + 1)]
    flags = bytearray(capacity + 1)
    for b in range(big - 1, -1, -1):  # the last opened on top of each stack
        r = rooms[b]
        if r:
            open_at[r].append(b)
            flags[r] = 1
    out = [0] * (len(lengths) - big)
    for j, size in enumerate(sorted_len[big:].tolist()):
        room = flags.find(1, size)
        if room < 0:
            b, left = len(rooms), capacity - size
            rooms.append(left)
        else:
            stack = open_at[room]
            b = stack.pop()
            if not stack:
                flags[room] = 0
            left = room - size
            rooms[b] = left
        out[j] = b
        if left:
            open_at[left].append(b)
            flags[left] = 1
    bins[order[big:]] = np.asarray(out, dtype=np.int64)
    return bins, len(rooms)


def _pieces(lengths: I64, seq_len: int, split_long: SplitLong) -> tuple[I64, I64, I64]:
    """``(doc, start, length)`` per piece: documents cut into ``seq_len`` chunks (or dropped)."""
    if split_long == "drop":
        keep = np.flatnonzero((lengths > 0) & (lengths <= seq_len))
        return keep, np.zeros(len(keep), np.int64), lengths[keep]
    n_chunks = -(-lengths // seq_len)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), n_chunks)
    first = np.cumsum(n_chunks) - n_chunks
    k = np.arange(len(doc), dtype=np.int64) - np.repeat(first, n_chunks)
    start = k * seq_len
    return doc, start, np.minimum(lengths[doc] - start, seq_len)


def pack_window(lengths: I64, /, *, packing: Packing, rng: np.random.Generator) -> Units:
    """Pack one window of documents (their lengths; 0 for a filtered-out document) with best fit.

    Full ``seq_len`` chunks are units of their own; the other pieces are placed by
    :func:`best_fit`; the units are then shuffled by ``rng`` (so a batch is not sorted by length).

    Examples:
        >>> units = pack_window(
        ...     np.array([3, 9, 2]), packing=Packing(seq_len=4), rng=np.random.default_rng(0)
        ... )
        >>> len(units), int(units.tokens().sum())
        (4, 14)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    doc, start, length = _pieces(lengths, packing.seq_len, packing.split_long)
    full = length == packing.seq_len
    part = np.flatnonzero(~full)
    bins, nbins = best_fit(length[part], capacity=packing.seq_len)
    n_full = int(full.sum())
    unit = np.empty(len(doc), dtype=np.int64)
    unit[full] = np.arange(n_full)
    unit[part] = n_full + bins
    perm = rng.permutation(n_full + nbins)
    rank = np.empty_like(perm)
    rank[perm] = np.arange(len(perm))
    unit = rank[unit]
    order = np.lexsort((np.arange(len(doc)), unit))  # by unit, pieces in placement order
    counts = np.bincount(unit, minlength=len(perm)).astype(np.int64)
    return Units(offsets_from_lengths(counts), doc[order], start[order], length[order])


def cut_stream(
    seg_doc: I64, seg_start: I64, seg_len: I64, /, *, seq_len: int, first: int = 0
) -> Units:
    """Cut a stream of segments (in order) into units of ``seq_len`` tokens from token ``first``.

    Only whole units are returned (the tokens after the last full ``seq_len`` are left out).

    Examples:
        >>> u = cut_stream(np.array([0, 1]), np.array([0, 0]), np.array([5, 4]), seq_len=3)
        >>> len(u), u.seg_doc.tolist(), u.seg_len.tolist()
        (3, [0, 0, 1, 1], [3, 2, 1, 3])
    """
    seg_len = np.asarray(seg_len, dtype=np.int64)
    p0 = np.cumsum(seg_len) - seg_len - int(first)
    p1 = p0 + seg_len
    total = int(p1[-1]) if len(p1) else 0
    n_units = max(0, total // seq_len)
    end = n_units * seq_len
    keep = (p1 > 0) & (p0 < end) & (seg_len > 0)
    p0c, p1c = np.maximum(p0[keep], 0), np.minimum(p1[keep], end)
    u0, u1 = p0c // seq_len, (p1c - 1) // seq_len
    reps = u1 - u0 + 1
    idx = np.repeat(np.flatnonzero(keep), reps)
    k = np.arange(int(reps.sum()), dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
    unit = np.repeat(u0, reps) + k
    lo = np.maximum(np.repeat(p0c, reps), unit * seq_len)
    hi = np.minimum(np.repeat(p1c, reps), (unit + 1) * seq_len)
    counts = np.bincount(unit, minlength=n_units).astype(np.int64)
    return Units(
        offsets_from_lengths(counts),
        np.asarray(seg_doc, dtype=np.int64)[idx],
        np.asarray(seg_start, dtype=np.int64)[idx] + (lo - p0[idx]),
        hi - lo,
    )


def collate_units(
    units: Units,
    doc_offsets: I64,
    values: NDArray[Any],
    /,
    *,
    width: int,
    mask_boundaries: bool = True,
    pad_id: int = 0,
) -> dict[str, NDArray[Any]]:
    """Rows of ``width`` slots for ``units`` over one buffer of documents
    (:func:`collate_segments`).

    ``values[doc_offsets[d]:doc_offsets[d + 1]]`` are document ``d``'s tokens.

    Examples:
        >>> u = Units(np.array([0, 2]), np.array([0, 1]), np.array([0, 0]), np.array([2, 1]))
        >>> out = collate_units(u, np.array([0, 2, 3]), np.array([7, 8, 9]), width=4)
        >>> out["input_ids"].tolist(), out["labels"].tolist()
        ([[7, 8, 9, 0]], [[8, -100, -100, -100]])
        >>> out["position_ids"].tolist(), out["segment_ids"].tolist()
        ([[0, 1, 0, 0]], [[1, 1, 2, 0]])
    """
    counts = np.diff(units.unit_ptr)
    return collate_segments(
        np.repeat(np.arange(len(units), dtype=np.int64), counts),
        doc_offsets[units.seg_doc] + units.seg_start,
        units.seg_len,
        np.zeros(len(units.seg_len), dtype=np.int64),
        [values],
        rows=len(units),
        width=width,
        mask_boundaries=mask_boundaries,
        pad_id=pad_id,
    )


def collate_segments(
    seg_row: I64,
    seg_src: I64,
    seg_len: I64,
    seg_buf: I64,
    buffers: Sequence[NDArray[Any]],
    /,
    *,
    rows: int,
    width: int,
    mask_boundaries: bool = True,
    pad_id: int = 0,
) -> dict[str, NDArray[Any]]:
    """Rows of ``width`` slots: ``input_ids``, ``labels``, ``position_ids``, ``segment_ids``.

    Segment ``s`` (sorted by row, in row order) is ``buffers[seg_buf[s]][seg_src[s]:][:seg_len[s]]``
    and fills its row ``seg_row[s]`` after the segments before it; the rest of a row is padding.
    Every slot is covered by exactly one segment or one padding run per row, in order, so each
    array is a ``repeat`` over those runs (no scatter) and ``input_ids`` one gather per buffer.
    A row's last slot, padding and (with ``mask_boundaries``) each segment's last token are
    labelled ``-100``.
    """
    seg_row = np.asarray(seg_row, dtype=np.int64)
    seg_len = np.asarray(seg_len, dtype=np.int64)
    n_seg = len(seg_row)
    row_end = np.searchsorted(seg_row, np.arange(rows), side="right")  # segments in rows <= r
    row_start = np.concatenate([[0], row_end[:-1]]).astype(np.int64)
    used = np.bincount(seg_row, weights=seg_len, minlength=rows).astype(np.int64)
    if (used > width).any():
        raise ValueError(f"a row holds {int(used.max())} tokens, more than width={width}")
    at_seg = np.arange(n_seg, dtype=np.int64) + seg_row  # runs: each row's segments, then its pad
    at_pad = row_end + np.arange(rows, dtype=np.int64)
    runs = n_seg + rows
    lens = np.empty(runs, dtype=np.int64)
    lens[at_seg], lens[at_pad] = seg_len, width - used
    seg_id = np.zeros(runs, dtype=np.int32)
    seg_id[at_seg] = np.arange(n_seg) - row_start[seg_row] + 1
    start = np.zeros(runs, dtype=np.int64)
    start[at_seg] = seg_src
    small = rows * width < 2**31 and max((len(b) for b in buffers), default=0) + width < 2**31
    idx = np.dtype(np.int32 if small else np.int64)  # half the bytes per token pass when it fits
    run_begin = (np.cumsum(lens) - lens).astype(idx)
    seg = np.repeat(seg_id, lens)
    within = np.arange(rows * width, dtype=idx) - np.repeat(run_begin, lens)
    src = np.repeat(start.astype(idx), lens) + within
    wide = any(b.dtype.itemsize > 4 or b.dtype == np.uint32 for b in buffers)
    dtype = np.dtype(np.int64 if wide else np.int32)
    real = seg > 0
    if len(buffers) == 1 and len(buffers[0]):
        ids = np.take(buffers[0], src, mode="clip").astype(dtype, copy=False)
        ids[~real] = pad_id
    else:
        ids = np.full(rows * width, pad_id, dtype=dtype)
        which = np.full(runs, -1, dtype=np.int64)
        which[at_seg] = seg_buf
        tok_buf = np.repeat(which, lens)
        for b, values in enumerate(buffers):
            mine = tok_buf == b
            ids[mine] = values[src[mine]]
    pos = np.where(real, within, 0).astype(np.int32)
    labels = np.full(rows * width, IGNORE_INDEX, dtype=dtype)
    ok = real[:-1] & ((seg[1:] == seg[:-1]) if mask_boundaries else (seg[1:] > 0))
    labels[:-1] = np.where(ok, ids[1:], IGNORE_INDEX)
    shape = (rows, width)
    out = {
        "input_ids": ids.reshape(shape),
        "labels": labels.reshape(shape),
        "position_ids": pos.reshape(shape),
        "segment_ids": seg.reshape(shape),
    }
    out["labels"][:, -1] = IGNORE_INDEX
    return out
