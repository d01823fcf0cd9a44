"""The loader's stages, each with one job: plan an epoch, assemble, filter/transform.

* :class:`EpochPlan` - the rank's sample sequence for one epoch as index arrays (which shard and row
  each position reads, which batches need which shard): pure numpy, no per-sample Python.
* (reading shards ahead and sharing them between builds is :mod:`datamill.loader.cache`'s job)
* :func:`assemble` - the rows of several batches gathered with :func:`take_rows` (each shard gives
  its own rows, the small pieces are put in order with one take), then sliced per batch (zero-copy).
* :func:`process_batch` - filter and transform one batch with failures isolated per sample and
  counted.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.loader.accounting import BatchResult
from datamill.loader.order import num_batches, rank_sequence

__all__ = [
    "EpochPlan",
    "assemble",
    "assemble_block",
    "block_sources",
    "indices",
    "process_batch",
    "row_groups",
    "scatter_rows",
    "shard_index",
    "take_rows",
]

UID_COLUMN = "uid"


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: positions -> (global index, shard, row), and per-shard batch ranges."""

    seq: NDArray[np.int64]
    shard: NDArray[np.int64]
    row: NDArray[np.int64]
    batch_size: int
    total_batches: int
    first_batch: NDArray[np.int64]  # per shard; total_batches when unused
    last_batch: NDArray[np.int64]  # per shard; -1 when unused
    by_first: NDArray[np.int64] = field(repr=False)  # used shards sorted by first_batch
    by_last: NDArray[np.int64] = field(repr=False)  # used shards sorted by last_batch

    @classmethod
    def make(
        cls,
        sizes: NDArray[np.int64],
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int | None,
        rank: int,
        world_size: int,
        drop_last: bool,
        batch_size: int,
    ) -> EpochPlan:
        """Compute the plan (about 50 ms per million samples).

        Examples:
            >>> plan = EpochPlan.make(
            ...     np.array([3, 2]),
            ...     seed=0,
            ...     epoch=0,
            ...     shuffle=False,
            ...     window=None,
            ...     rank=0,
            ...     world_size=1,
            ...     drop_last=False,
            ...     batch_size=2,
            ... )
            >>> plan.total_batches, plan.shard.tolist(), plan.row.tolist(), plan.last_batch.tolist()
            (3, [0, 0, 0, 1, 1], [0, 1, 2, 0, 1], [1, 2])
        """
        seq = rank_sequence(
            sizes,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            window=window,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )
        return cls.from_sequence(seq, sizes, batch_size=batch_size, drop_last=drop_last)

    @classmethod
    def from_sequence(
        cls, seq: NDArray[np.int64], sizes: NDArray[np.int64], *, batch_size: int, drop_last: bool
    ) -> EpochPlan:
        """The plan of a rank visiting the global sample indices ``seq`` in order."""
        total = num_batches(len(seq), batch_size=batch_size, drop_last=drop_last)
        seq = seq[: min(len(seq), total * batch_size)]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        shard = shard_index(seq, offsets)
        row = seq - offsets[shard]
        batch_of = np.arange(len(seq), dtype=np.int64) // batch_size
        first = np.full(len(sizes), total, dtype=np.int64)
        last = np.full(len(sizes), -1, dtype=np.int64)
        np.minimum.at(first, shard, batch_of)
        np.maximum.at(last, shard, batch_of)
        used = np.flatnonzero(last >= 0)
        return cls(
            seq,
            shard,
            row,
            batch_size,
            total,
            first,
            last,
            used[np.argsort(first[used], kind="stable")],
            used[np.argsort(last[used], kind="stable")],
        )

    def positions(self, batch: int) -> slice:
        """Positions of batch ``batch`` in ``seq``."""
        return slice(batch * self.batch_size, min((batch + 1) * self.batch_size, len(self.seq)))


def indices(values: NDArray[np.int64]) -> pa.Array:
    """An int64 Arrow array viewing ``values`` (no copy; ``pa.array`` would import pandas).

    Examples:
        >>> indices(np.array([2, 0])).to_pylist()
        [2, 0]
    """
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def take_rows(
    tables: Sequence[pa.Table], table_of: NDArray[np.int64], row: NDArray[np.int64]
) -> pa.Table:
    """``pa.concat_tables(tables).take(offsets[table_of] + row)``, without combining the tables.

    For binary, string and list columns pyarrow combines every chunk of a column before a gather
    (apache/arrow GH-39565 fixed that for fixed-width types only), so a take over a shuffle window
    would copy the whole window per call. Here, per column:

    * binary and string columns without nulls: each table's column is cast to 16-byte views once
      (:func:`_prepared`: the views point into the table's own data buffers); a take gathers the
      views of the rows taken with numpy and casts them back, which copies the bytes taken, once;
    * numbers without nulls: a numpy gather from each table into one new buffer;
    * lists of numbers without nulls: the lengths gathered first (the new offsets), then each
      table's values copied into place with one vectorised gather per table;
    * the rest (other lists, booleans, nulls, ...): each table gives its own rows (one small take
      per table, in ascending position order), the pieces are concatenated (only the rows taken)
      and one take of that small table puts them in the requested order.

    The result equals the straightforward take: same schema, values, validity and (one) chunk per
    column. A loop runs per table and column, never per row.

    Args:
        tables: the tables (same schema).
        table_of: for each output row, the index into ``tables`` it comes from.
        row: for each output row, its row in that table.

    Examples:
        >>> a, b = pa.table({"x": ["a", "b"]}), pa.table({"x": ["c", "d", "e"]})
        >>> take_rows([a, b], np.array([1, 0, 1]), np.array([2, 1, 0]))["x"].to_pylist()
        ['e', 'b', 'c']
    """
    table_of = np.asarray(table_of, dtype=np.int64)
    row = np.asarray(row, dtype=np.int64)
    if len(tables) == 1:
        return tables[0].take(indices(row))
    if not len(row):  # no rows at all: the empty take keeps the schema
        return pa.concat_tables(tables).slice(0, 0)
    schema = tables[0].schema
    prepared = [_prepared(t) for t in tables]
    mine = row_groups(table_of, len(tables))
    rows = [row[m] for m in mine]
    columns: list[pa.Array | pa.ChunkedArray | None] = [None] * len(schema)
    for i, f in enumerate(schema):
        columns[i] = _gathered([p[i] for p in prepared], mine, rows, table_of, f.type)
    rest = [i for i, c in enumerate(columns) if c is None]
    if rest:
        taken = _grouped_take([t.select(rest) for t in tables], table_of, row)
        for j, i in enumerate(rest):
            columns[i] = taken.column(j)
    return pa.Table.from_arrays(columns, schema=schema)


def _gathered(
    cols: list[Any],
    mine: list[NDArray[np.int64]],
    rows: list[NDArray[np.int64]],
    table_of: NDArray[np.int64],
    typ: pa.DataType,
) -> pa.Array | None:
    """One column of :func:`take_rows` by the gather of its kind (views, ragged lists, numbers),
    from each table's :func:`_prepared` column; None when a table's column has none."""
    if any(c is None for c in cols):
        return None
    if typ in _VIEW_OF:
        return _view_take(cast("list[_Views]", cols), mine, rows, table_of, typ)
    if isinstance(cols[0], _Ragged):
        return _ragged_take(cast("list[_Ragged]", cols), mine, rows, len(table_of), typ)
    return _dense_take(cast("list[_Dense]", cols), mine, rows, len(table_of), typ)


_VIEW_OF = {
    pa.binary(): pa.binary_view(),
    pa.string(): pa.string_view(),
    pa.large_binary(): pa.binary_view(),
    pa.large_string(): pa.string_view(),
}
_NUMPY_OF: dict[pa.DataType, np.dtype[Any]] = {
    pa.int8(): np.dtype(np.int8),
    pa.int16(): np.dtype(np.int16),
    pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64),
    pa.uint8(): np.dtype(np.uint8),
    pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32),
    pa.uint64(): np.dtype(np.uint64),
    pa.float16(): np.dtype(np.float16),
    pa.float32(): np.dtype(np.float32),
    pa.float64(): np.dtype(np.float64),
}
_INLINE = 12  # a binary view holds up to 12 bytes inline; a longer one points into a data buffer


@dataclass(frozen=True)
class _Views:
    """A binary/string column as views: ``(rows, 4)`` int32 and the data buffers they point into."""

    views: NDArray[np.int32]
    buffers: list[pa.Buffer]


@dataclass(frozen=True)
class _Ragged:
    """A list column of numbers without nulls: ``offsets`` (rows + 1) into ``values``."""

    offsets: NDArray[np.int64]
    values: NDArray[Any]


_Dense: TypeAlias = "NDArray[Any] | _Masked"
"""Numbers (``(rows,)``) or fixed-size lists of numbers (``(rows, size)``), maybe masked."""


@dataclass(frozen=True)
class _Masked:
    """Numbers with nulls: their values and validity (``True``: a value)."""

    values: NDArray[Any]
    valid: NDArray[np.bool_]


_Prepared: TypeAlias = "list[_Views | _Ragged | _Dense | None]"
_PREPARED: dict[int, tuple[weakref.ref[pa.Table], _Prepared]] = {}
_PREPARED_LOCK = threading.Lock()


def _prepared(table: pa.Table) -> _Prepared:
    """Per column of ``table``: its views, its numpy values or ``None`` (piecewise take); made once.

    Kept while the table lives (shards stay the same objects in the shard cache while a window is
    consumed), so a take costs a few numpy calls per table and column, not a cast of each table.
    """
    key = id(table)
    with _PREPARED_LOCK:
        entry = _PREPARED.get(key)
    if entry is not None and entry[0]() is table:
        return entry[1]
    out: _Prepared = [
        _prepare(table.schema.field(i).type, table.column(i)) for i in range(table.num_columns)
    ]

    def forget(ref: weakref.ref[pa.Table], key: int = key) -> None:
        with _PREPARED_LOCK:
            if key in _PREPARED and _PREPARED[key][0] is ref:
                del _PREPARED[key]

    with _PREPARED_LOCK:
        _PREPARED[key] = (weakref.ref(table, forget), out)
    return out


def _prepare(typ: pa.DataType, col: pa.ChunkedArray) -> _Views | _Ragged | _Dense | None:
    if typ in _NUMPY_OF:
        arr = _one_chunk(col)
        values = np.frombuffer(arr.buffers()[1], dtype=_NUMPY_OF[typ])[
            arr.offset : arr.offset + len(arr)
        ]
        if not arr.null_count:
            return values
        bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
        valid = np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + len(arr)]
        return _Masked(values, valid.astype(bool))
    if col.null_count:
        return None
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and typ.value_type in _NUMPY_OF:
        return _ragged(_one_chunk(col), typ)
    if pa.types.is_fixed_size_list(typ) and typ.value_type in _NUMPY_OF:
        flat = _one_chunk(col).flatten()  # the rows' values (the array's offset applied)
        if flat.null_count:
            return None
        return np.frombuffer(flat.buffers()[1], dtype=_NUMPY_OF[typ.value_type])[
            flat.offset : flat.offset + len(flat)
        ].reshape(len(col), typ.list_size)
    if typ not in _VIEW_OF:
        return None
    arr = _one_chunk(col)
    try:
        viewed = arr.cast(_VIEW_OF[typ])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. past 2 GiB: piecewise
        return None
    bufs = viewed.buffers()
    views = np.frombuffer(bufs[1], dtype=np.int32).reshape(-1, 4)[
        viewed.offset : viewed.offset + len(viewed)
    ]
    return _Views(views, [b for b in bufs[2:] if b is not None])


def shard_index(seq: NDArray[np.int64], offsets: NDArray[np.int64]) -> NDArray[np.int64]:
    """The shard of each global sample index in ``seq``: ``searchsorted(offsets, seq, "right") -
    1`` for the shards' first indices ``offsets`` (cumulative, the total last; empty shards
    allowed), without a binary search per sample.

    Every non-empty shard holds at least ``2**b`` samples, so a bucket of ``2**b`` consecutive
    indices spans at most two of them: a small table gives the shard where each bucket starts, and
    one comparison moves a sample on to the next shard (2M samples in 40 shards: about 10 ms
    against 50-90 ms for the binary search). Falls back to the search when the table would be
    large (shards of a few samples among many).

    Examples:
        >>> offsets = np.array([0, 3, 3, 5, 9])  # shard 1 is empty
        >>> shard_index(np.array([8, 0, 3, 2, 5, 4]), offsets).tolist()
        [3, 0, 2, 0, 3, 2]
    """
    seq = np.asarray(seq, dtype=np.int64)
    sizes = np.diff(offsets)
    full = np.flatnonzero(sizes > 0)  # the shards that hold samples
    if not len(full) or not len(seq):
        return (np.searchsorted(offsets, seq, side="right") - 1).astype(np.int64)
    b = int(sizes[full].min()).bit_length() - 1
    buckets = (int(offsets[-1]) >> b) + 1
    if buckets > max(len(seq), 1 << 16):  # the table would cost more than the search saves
        return (np.searchsorted(offsets, seq, side="right") - 1).astype(np.int64)
    starts = np.append(offsets[full], offsets[-1])  # non-empty shards' starts, then the end
    where = np.searchsorted(starts, np.arange(buckets, dtype=np.int64) << b, side="right") - 1
    j = np.minimum(where, len(full) - 1)[seq >> b]
    j += seq >= starts[j + 1]
    out: NDArray[np.int64] = full[j]
    return out


def scatter_rows(dst: NDArray[Any], at: Any, src: NDArray[Any], rows: Any) -> None:
    """``dst[at] = src[rows]``. Rows of several numbers (``(n, ...)`` arrays of one dtype and row
    shape) move as one opaque ``np.void`` item each, one copy a row, where numpy's fancy index
    walks a row number by number: a block's gather of 16 float32 a row took 40-50% less time.

    Examples:
        >>> dst, src = np.zeros((3, 2), np.int16), np.arange(8, dtype=np.int16).reshape(4, 2)
        >>> scatter_rows(dst, np.array([2, 0]), src, np.array([3, 1])); dst.tolist()
        [[2, 3], [0, 0], [6, 7]]
    """
    if (
        dst.ndim > 1
        and dst.dtype == src.dtype
        and dst.shape[1:] == src.shape[1:]
        and dst.flags.c_contiguous
        and src.flags.c_contiguous
        and dst.size
        and src.size
    ):
        row = np.dtype((np.void, dst.itemsize * (dst.size // len(dst))))
        whole = dst.reshape(len(dst), -1).view(row).reshape(len(dst))  # views: no copy
        whole[at] = src.reshape(len(src), -1).view(row).reshape(len(src))[rows]
    else:
        dst[at] = src[rows]


def _view_take(
    cols: Sequence[_Views],
    mine: Sequence[NDArray[np.int64]],
    rows: Sequence[NDArray[np.int64]],
    table_of: NDArray[np.int64],
    typ: pa.DataType,
) -> pa.Array:
    """The views of the rows taken, pointed at the joined buffer list, cast back to ``typ``."""
    got = np.empty((len(table_of), 4), dtype=np.int32)
    base = np.zeros(len(cols), dtype=np.int32)
    buffers: list[pa.Buffer] = []
    for k, c in enumerate(cols):
        base[k] = len(buffers)
        buffers.extend(c.buffers)
        if len(mine[k]):
            scatter_rows(got, mine[k], c.views, rows[k])
    long = got[:, 0] > _INLINE
    got[long, 2] += base[table_of[long]]
    out = pa.Array.from_buffers(_VIEW_OF[typ], len(got), [None, pa.py_buffer(got), *buffers])
    return out.cast(typ)


def _dense_take(
    cols: Sequence[_Dense],
    mine: Sequence[NDArray[np.int64]],
    rows: Sequence[NDArray[np.int64]],
    n: int,
    typ: pa.DataType,
) -> pa.Array:
    """Numbers or fixed-size lists of numbers gathered with numpy into one new buffer (and a new
    validity bitmap when a table has nulls)."""
    first = cols[0].values if isinstance(cols[0], _Masked) else cols[0]
    got = np.empty((n, *first.shape[1:]), dtype=first.dtype)
    valid = np.ones(n, dtype=bool) if any(isinstance(c, _Masked) for c in cols) else None
    for k, c in enumerate(cols):
        if not len(mine[k]):
            continue
        if isinstance(c, _Masked):
            scatter_rows(got, mine[k], c.values, rows[k])
            assert valid is not None
            valid[mine[k]] = c.valid[rows[k]]
        else:
            scatter_rows(got, mine[k], c, rows[k])
    nulls = 0 if valid is None else int(n - np.count_nonzero(valid))
    bitmap = None
    if valid is not None and nulls:
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if got.ndim == 1:
        return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(got)], null_count=nulls)
    child = pa.Array.from_buffers(typ.value_type, got.size, [None, pa.py_buffer(got)])
    return pa.Array.from_buffers(typ, n, [None], children=[child])


def _ragged(arr: pa.Array, typ: pa.DataType) -> _Ragged | None:
    """A list array's offsets and values as numpy views (``None`` when a value is null)."""
    child = arr.values  # the whole child: the offsets index into it
    if child.null_count:
        return None
    width = np.int64 if pa.types.is_large_list(typ) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset : arr.offset + len(arr) + 1]
    values = np.frombuffer(child.buffers()[1], dtype=_NUMPY_OF[typ.value_type])[
        child.offset : child.offset + len(child)
    ]
    return _Ragged(offsets.astype(np.int64), values)


def _ragged_take(
    cols: Sequence[_Ragged],
    mine: Sequence[NDArray[np.int64]],
    rows: Sequence[NDArray[np.int64]],
    n: int,
    typ: pa.DataType,
) -> pa.Array:
    """The lists of the rows taken: lengths first (the output offsets), then each table's values
    copied into their places with one vectorised gather per table (no per-row loop)."""
    lengths = np.zeros(n, dtype=np.int64)
    for k, c in enumerate(cols):
        if len(mine[k]):
            lengths[mine[k]] = c.offsets[rows[k] + 1] - c.offsets[rows[k]]
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    values = np.empty(int(out_offsets[-1]), dtype=cols[0].values.dtype)
    for k, c in enumerate(cols):
        if not len(mine[k]):
            continue
        lens = lengths[mine[k]]
        total = int(lens.sum())
        if not total:
            continue
        dst_start = out_offsets[mine[k]]
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        dst = np.repeat(dst_start, lens) + within
        values[dst] = c.values[np.repeat(c.offsets[rows[k]], lens) + within]
    width = np.int64 if pa.types.is_large_list(typ) else np.int32
    child = pa.Array.from_buffers(typ.value_type, len(values), [None, pa.py_buffer(values)])
    offsets = pa.py_buffer(out_offsets.astype(width))
    return pa.Array.from_buffers(typ, n, [None, offsets], children=[child])


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _grouped_take(
    tables: Sequence[pa.Table], table_of: NDArray[np.int64], row: NDArray[np.int64]
) -> pa.Table:
    """Each table's rows taken from that table (ascending output position), the pieces joined,
    reordered once."""
    by_table = np.argsort(table_of, kind="stable")
    counts = np.bincount(table_of, minlength=len(tables))
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sorted_rows = row[by_table]
    pieces = [
        tables[k].take(indices(sorted_rows[bounds[k] : bounds[k + 1]]))
        for k in range(len(tables))
        if counts[k]
    ]
    grouped = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
    inverse = np.empty_like(by_table)
    inverse[by_table] = np.arange(len(by_table), dtype=np.int64)
    return grouped.take(indices(inverse))


def assemble(
    plan: EpochPlan, get: Callable[[int], pa.Table], batches: Sequence[int]
) -> list[pa.Table]:
    """The tables of ``batches`` (consecutive or not), gathered with :func:`take_rows` from the
    shards ``get(k)`` returns."""
    taken, rows = assemble_block(plan, get, batches)
    out, start = [], 0
    for n in rows:
        out.append(taken.slice(start, n))
        start += n
    return out


def assemble_block(
    plan: EpochPlan, get: Callable[[int], pa.Table], batches: Sequence[int]
) -> tuple[pa.Table, list[int]]:
    """The rows of ``batches`` gathered in one table, and each batch's row count (the tables of
    :func:`assemble` are its consecutive slices)."""
    table_of, row, needed, counts = block_sources(plan, batches)
    taken = take_rows([get(int(k)) for k in needed], table_of, row)
    return taken, counts.tolist()


def block_sources(
    plan: EpochPlan, batches: Sequence[int]
) -> tuple[NDArray[np.int64], NDArray[Any], NDArray[Any], NDArray[np.int64]]:
    """Where the rows of ``batches`` (in order) come from: ``(table_of, row, needed, counts)``, the
    shards in use ascending (``needed``), each row's index into them and its row in its shard, and
    each batch's row count (what :func:`assemble_block` gathers, and a worker places)."""
    parts = [plan.positions(b) for b in batches]
    shard = np.concatenate([plan.shard[p] for p in parts])
    row = np.concatenate([plan.row[p] for p in parts])
    # the shards in use, ascending (np.unique's first call imports numpy.ma: 0.1 s of a first
    # batch), and each shard's index among them, looked up (a searchsorted of every row: 5-7x the
    # time)
    present = np.bincount(shard) > 0
    needed = np.flatnonzero(present).astype(shard.dtype, copy=False)
    index_of = np.cumsum(present, dtype=np.int64) - 1
    counts = np.fromiter((p.stop - p.start for p in parts), np.int64, len(parts))
    return index_of[shard], row, needed, counts


def row_groups(table_of: NDArray[np.int64], n: int) -> list[NDArray[np.intp]]:
    """For each of ``n`` tables, the positions ``i`` (ascending) with ``table_of[i]`` equal to
    its index: a stable sort of the indices as 8- or 16-bit integers (numpy sorts those by radix:
    3-4x faster than 64-bit ones for a block of 8,192 rows), cut by their counts.

    Examples:
        >>> [g.tolist() for g in row_groups(np.array([2, 0, 2, 1, 0]), 4)]
        [[1, 4], [3], [0, 2], []]
    """
    small = np.uint8 if n <= 1 << 8 else np.uint16 if n <= 1 << 16 else None
    order = np.argsort(table_of if small is None else table_of.astype(small), kind="stable")
    cuts = [0, *np.cumsum(np.bincount(table_of, minlength=n)).tolist()]
    return [order[cuts[k] : cuts[k + 1]] for k in range(n)]


def _uid(table: pa.Table, i: int, index: int) -> Any:
    if UID_COLUMN in table.column_names:
        return table.column(UID_COLUMN)[i].as_py()
    return index


def _mask_of(fn: Callable[[pa.Table], Any], table: pa.Table) -> NDArray[np.bool_]:
    raw = fn(table)
    if isinstance(raw, (pa.Array, pa.ChunkedArray)):
        mask = np.asarray(raw.to_numpy(zero_copy_only=False))
    else:
        mask = np.asarray(raw)
    if mask.shape != (table.num_rows,):
        raise ConfigError(
            f"filter must return one bool per row ({table.num_rows}), got shape {mask.shape}"
        )
    return mask.astype(bool)


def process_batch(
    batch: int,
    table: pa.Table,
    index: NDArray[np.int64],
    *,
    filter: Callable[[pa.Table], Any] | None,
    transform: Callable[[pa.Table], pa.Table] | None,
    collate: Callable[[pa.Table], Any],
) -> BatchResult:
    """Filter, transform and collate one batch; a failing sample is isolated, skipped and
    recorded."""
    read = table.num_rows
    failed: list[tuple[Any, int, BaseException]] = []
    filtered = 0
    if filter is not None:
        table, index, filtered = _apply_filter(filter, table, index, failed)
    if transform is not None and table.num_rows:
        table = _apply_transform(transform, table, index, failed)
    yielded = table.num_rows
    output = collate(table) if yielded else None
    return BatchResult(batch, output, None if yielded else table, read, filtered, failed, yielded)


def _apply_filter(
    filter: Callable[[pa.Table], Any],
    table: pa.Table,
    index: NDArray[np.int64],
    failed: list[tuple[Any, int, BaseException]],
) -> tuple[pa.Table, NDArray[np.int64], int]:
    """The rows ``filter`` keeps, their sample indices and how many it dropped; when it fails on
    the batch, each sample is evaluated alone and the failing ones are appended to ``failed``."""
    read = table.num_rows
    try:
        keep = _mask_of(filter, table)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - user code: isolate by evaluating each sample alone
        keep = np.zeros(read, dtype=bool)
        bad = np.zeros(read, dtype=bool)
        for i in range(read):
            try:
                keep[i] = bool(_mask_of(filter, table.slice(i, 1))[0])
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - recorded, counted against max_errors
                bad[i] = True
                failed.append((_uid(table, i, int(index[i])), int(index[i]), exc))
        filtered = int((~keep & ~bad).sum())
    else:
        filtered = int((~keep).sum())
    if not keep.all():
        sel = np.flatnonzero(keep)
        table, index = table.take(indices(sel)), index[sel]
    return table, index, filtered


def _apply_transform(
    transform: Callable[[pa.Table], pa.Table],
    table: pa.Table,
    index: NDArray[np.int64],
    failed: list[tuple[Any, int, BaseException]],
) -> pa.Table:
    """``transform(table)``; when it fails on the batch, each sample is transformed alone and the
    failing ones are appended to ``failed``.

    Raises:
        ConfigError: ``transform`` returned something else than a Table.
    """
    try:
        table = transform(table)
    except Exception:  # noqa: BLE001 - user code: isolate by re-running each sample alone
        good = []
        for i in range(table.num_rows):
            try:
                good.append(transform(table.slice(i, 1)))
            except Exception as exc:  # noqa: BLE001 - recorded, counted against max_errors
                failed.append((_uid(table, i, int(index[i])), int(index[i]), exc))
        table = pa.concat_tables(good) if good else table.slice(0, 0)
    if not isinstance(table, pa.Table):
        raise ConfigError(f"transform must return a pyarrow Table, got {type(table).__name__}")
    return table
