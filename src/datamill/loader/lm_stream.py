"""One source's stream of units for language-model batches: epochs -> windows -> units.

A source's documents are visited epoch after epoch in its shard-aware shuffled order
(:class:`~datamill.loader.order.EpochOrder`, under the source's own seed), cut into *windows* of
``window`` consecutive documents. A window is read, filtered and packed on its own
(:func:`~datamill.loader.packing.pack_window`), so its units are a pure function of
``(seed, source, epoch, window)``, and the stream's position is three integers
``(epoch, window, offset)``: the next unit is unit ``offset`` of that window (for ``concat``,
the next sequence starts at token ``offset`` of that window's stream and may run into the next
windows). The weights of a mixture only change how fast each stream is consumed, never its order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, SchemaError
from datamill.core.ragged import csr_from_arrow, offsets_from_lengths, ranges
from datamill.core.rng import rng_for
from datamill.core.source import Source
from datamill.loader.order import EpochOrder
from datamill.loader.packing import Packing, Units, cut_stream, pack_window

__all__ = ["Piece", "Position", "SourceStream", "Window"]

I64 = NDArray[np.int64]
READ_WINDOW = 1024
"""Documents per window when nothing is packed (or ``concat``: the read unit)."""
KEEP_WINDOWS = 4
KEEP_SHARDS = 8


class Position(NamedTuple):
    """Where a source's stream is: unit (or token, for ``concat``) ``offset`` of ``window`` of
    ``epoch``."""

    epoch: int
    window: int
    offset: int


@dataclass
class Window:
    """One window's documents: their tokens (document ``d`` is ``values[doc_start[d]:]
    [:lengths[d]]``), sample ids, kept lengths (0: filtered out) and units."""

    key: tuple[int, int]
    values: NDArray[Any]
    doc_start: I64
    samples: I64
    lengths: I64  # 0 for a document the filter dropped
    units: Units
    filtered: int


class Piece(NamedTuple):
    """Units taken from one window: ``units`` (renumbered) over that window's documents, as units
    ``base, base + 1, ...`` of the take (``concat``: a unit's segments may sit in two pieces)."""

    window: Window
    units: Units
    base: int


class SourceStream:
    """The unit stream of source ``index`` of a run (see the module docstring).

    Args:
        source: the source.
        index: its position in the mix (keys its seed).
        seed: the run's seed.
        column: the token column.
        packing: how units are made, or ``None`` (a unit is one document).
        shuffle: shuffle documents (and units). Defaults to ``True``.
        filter: ``fn(window table) -> bool mask`` of documents kept. Defaults to ``None``.
        columns: columns read for the filter (the token column is always read). Defaults to
            ``None`` (every column with a filter, else only the token column).
    """

    def __init__(
        self,
        source: Source,
        *,
        index: int,
        seed: int,
        column: str,
        packing: Packing | None,
        shuffle: bool = True,
        filter: Callable[[pa.Table], Any] | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        if column not in source.columns:
            raise SchemaError(
                f"the token column {column!r} is not a column of the source ({source.columns})",
                column=column,
                hint="name the list<int> column with Packing(column=...)",
            )
        self.source, self.index, self.column, self.packing = source, index, column, packing
        self.shuffle, self.filter = bool(shuffle), filter
        wanted = columns or (source.columns if filter is not None else [])
        self.columns = list(dict.fromkeys([column, *wanted]))
        self.seed = int(rng_for(seed, "lm.source", index).integers(2**62))
        self.sizes = np.asarray(source.shard_sizes(), dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.total = int(self.starts[-1])
        concat = packing is not None and packing.strategy == "concat"
        self.window_docs = packing.window if packing is not None and not concat else READ_WINDOW
        self.num_windows = -(-self.total // self.window_docs)
        self._orders: OrderedDict[int, EpochOrder] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], Window] = OrderedDict()
        self._shards: OrderedDict[int, tuple[pa.Table, NDArray[Any], I64]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"], state["_windows"], state["_shards"] = OrderedDict(), OrderedDict(), {}
        return state

    # ----------------------------------------------------------------- reading
    def _order(self, epoch: int) -> EpochOrder:
        eo = self._orders.get(epoch)
        if eo is None:
            eo = self._orders[epoch] = EpochOrder(
                self.sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle
            )
            while len(self._orders) > 2:
                self._orders.popitem(last=False)
        return eo

    def _shard(self, k: int) -> tuple[pa.Table, NDArray[Any], I64]:
        got = self._shards.get(k)
        if got is not None:
            self._shards.move_to_end(k)
            return got
        table = self.source.read_shard(k, columns=self.columns)
        if table.num_rows != int(self.sizes[k]):
            raise DataFileError(
                f"expected {int(self.sizes[k])} rows (shard_sizes()), got {table.num_rows}", shard=k
            )
        col = table.column(self.column)
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or not (
            pa.types.is_integer(col.type.value_type)
        ):
            raise SchemaError(
                f"the token column {self.column!r} must be list<int>, got {col.type}",
                column=self.column,
                shard=k,
            )
        values, offsets = csr_from_arrow(col)
        got = self._shards[k] = (table, values, offsets)
        while len(self._shards) > KEEP_SHARDS:
            self._shards.popitem(last=False)
        return got

    def _read(self, samples: I64) -> tuple[NDArray[Any], I64, I64, pa.Table | None]:
        """The documents' tokens: one buffer (grouped by shard, one gather per shard), each
        document's start in it and length, in ``samples`` order; with a filter, the rows as a
        table."""
        shard = np.searchsorted(self.starts, samples, side="right") - 1
        rows = samples - self.starts[shard]
        order = np.argsort(shard, kind="stable")
        ks, first = np.unique(shard[order], return_index=True)
        bounds = np.append(first, len(order))
        lengths = np.zeros(len(samples), dtype=np.int64)
        doc_start = np.zeros(len(samples), dtype=np.int64)
        pieces: list[NDArray[Any]] = []
        tables, where = [], []
        base = 0
        for i, k in enumerate(ks.tolist()):
            at = order[bounds[i] : bounds[i + 1]]
            table, values, offsets = self._shard(int(k))
            r = rows[at]
            ln = offsets[r + 1] - offsets[r]
            lengths[at] = ln
            doc_start[at] = base + np.cumsum(ln) - ln
            pieces.append(values[ranges(offsets[r], ln)])
            base += int(ln.sum())
            if self.filter is not None:
                tables.append(table.take(pa.array(r)))
                where.append(at)
        out = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        table_out = None
        if tables:
            perm = np.argsort(np.concatenate(where), kind="stable")
            table_out = pa.concat_tables(tables).take(pa.array(perm))
        return out, doc_start, lengths, table_out

    def _kept(self, table: pa.Table | None, key: tuple[int, int]) -> NDArray[np.bool_]:
        assert self.filter is not None and table is not None
        try:
            mask = np.asarray(self.filter(table), dtype=bool).reshape(-1)
        except Exception as exc:
            raise ConfigError(
                f"the filter failed on window {key[1]} of epoch {key[0]} of source {self.index}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if len(mask) != table.num_rows:
            raise ConfigError(
                f"the filter returned {len(mask)} values for {table.num_rows} documents",
                hint="return one bool per row of the table it receives",
            )
        return mask

    def window(self, epoch: int, w: int) -> Window:
        """Window ``w`` of ``epoch``: read, filtered and packed (cached)."""
        key = (int(epoch), int(w))
        got = self._windows.get(key)
        if got is not None:
            return got
        samples = self._order(key[0]).take(w * self.window_docs, (w + 1) * self.window_docs)
        values, doc_start, lengths, table = self._read(samples)
        filtered = 0
        if self.filter is not None:
            keep = self._kept(table, key)
            filtered = int((~keep).sum())
            lengths = np.where(keep, lengths, 0)
        got = Window(key, values, doc_start, samples, lengths, self._units(lengths, key), filtered)
        self._windows[key] = got
        while len(self._windows) > KEEP_WINDOWS:
            self._windows.popitem(last=False)
        return got

    def _units(self, lengths: I64, key: tuple[int, int]) -> Units:
        p = self.packing
        kept = np.flatnonzero(lengths > 0)
        if p is None or p.strategy == "concat":  # one unit per document (concat: the stream)
            one = np.arange(len(kept) + 1, dtype=np.int64)
            return Units(one, kept, np.zeros(len(kept), np.int64), lengths[kept])
        rng = rng_for(self.seed, "lm.units", *key) if self.shuffle else _Identity()
        return pack_window(lengths, packing=p, rng=rng)  # type: ignore[arg-type]

    # ----------------------------------------------------------------- taking units
    def _next(self, pos: Position) -> Position:
        w = pos.window + 1
        return Position(pos.epoch + 1, 0, 0) if w >= self.num_windows else Position(pos.epoch, w, 0)

    def take(self, pos: Position, n: int) -> tuple[list[Piece], Position]:
        """The next ``n`` units from ``pos`` (as pieces per window) and the position after them."""
        if n and not self.total:
            raise ConfigError(f"source {self.index} is empty but the mix takes units from it")
        if self.packing is not None and self.packing.strategy == "concat":
            return self._take_concat(pos, n)
        out: list[Piece] = []
        empty, base = 0, 0
        while n > 0:
            win = self.window(pos.epoch, pos.window)
            got = min(n, len(win.units) - pos.offset)
            if got > 0:
                units = win.units.take(np.arange(pos.offset, pos.offset + got))
                out.append(Piece(win, units, base))
                n, base = n - got, base + got
                empty = 0
            else:
                empty += 1
                if empty > self.num_windows:
                    raise ConfigError(
                        f"source {self.index} yields no units in a whole epoch (every document "
                        "filtered out or dropped as too long)"
                    )
            pos = Position(pos.epoch, pos.window, pos.offset + got)
            if pos.offset >= len(win.units):
                pos = self._next(pos)
        return out, pos

    def _stream_from(
        self, pos: Position, tokens: int
    ) -> tuple[list[tuple[Window, I64, I64, I64]], Position]:
        """The next ``tokens`` tokens of the concatenated stream from ``pos``, as pieces
        ``(window, document, start, length)`` per window (only the documents they touch)."""
        out, p, off, left, empty = [], pos, pos.offset, tokens, 0
        while left > 0:
            win = self.window(p.epoch, p.window)
            docs, lens = win.units.seg_doc, win.units.seg_len
            cum = np.cumsum(lens)
            total = int(cum[-1]) if len(cum) else 0
            if off >= total:
                empty += 1
                if empty > self.num_windows + 1:
                    raise ConfigError(f"source {self.index} has no tokens left after the filter")
                p, off = self._next(p), 0
                continue
            empty = 0
            d0 = int(np.searchsorted(cum, off, side="right"))
            end = min(total, off + left)
            d1 = int(np.searchsorted(cum, end, side="left")) + 1
            start = np.zeros(d1 - d0, dtype=np.int64)
            length = lens[d0:d1].astype(np.int64, copy=True)
            start[0] = off - (int(cum[d0]) - int(lens[d0]))
            length[0] -= start[0]
            length[-1] -= int(cum[d1 - 1]) - end
            out.append((win, docs[d0:d1], start, length))
            left -= end - off
            p, off = (self._next(p), 0) if end == total else (p, end)
        return out, Position(p.epoch, p.window, off)

    def _take_concat(self, pos: Position, n: int) -> tuple[list[Piece], Position]:
        assert self.packing is not None
        if n == 0:
            return [], pos
        seq_len = self.packing.seq_len
        parts, after = self._stream_from(pos, n * seq_len)
        which = np.repeat(np.arange(len(parts)), [len(d) for _, d, _, _ in parts])
        seg_doc = np.concatenate([d for _, d, _, _ in parts])
        seg_start = np.concatenate([s for _, _, s, _ in parts])
        seg_len = np.concatenate([ln for _, _, _, ln in parts])
        cut = cut_stream(np.arange(len(seg_doc)), seg_start, seg_len, seq_len=seq_len)
        src = cut.seg_doc  # index into the concatenated pieces
        out = []
        for i, (win, _, _, _) in enumerate(parts):  # a unit's segments may come from two windows
            mine = which[src] == i
            if mine.any():
                out.append(Piece(win, _Masked.of(cut, mine, seg_doc[src]), 0))
        return out, after


class _Identity:
    """A stand-in generator whose permutation keeps the order (``shuffle=False``)."""

    def permutation(self, n: int) -> I64:
        return np.arange(n, dtype=np.int64)


class _Masked:
    @staticmethod
    def of(cut: Units, mine: NDArray[np.bool_], docs: I64) -> Units:
        """The segments of ``cut`` in ``mine`` (doc ids mapped by ``docs``), keeping every unit
        (possibly empty) so unit numbers stay aligned across the windows' pieces."""
        per_unit = np.repeat(np.arange(len(cut)), np.diff(cut.unit_ptr))
        counts = np.bincount(per_unit[mine], minlength=len(cut)).astype(np.int64)
        return Units(
            offsets_from_lengths(counts), docs[mine], cut.seg_start[mine], cut.seg_len[mine]
        )
