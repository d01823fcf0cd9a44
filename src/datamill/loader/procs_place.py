"""A worker process's batches built straight into shared memory, a block of batches at a time.

In process, a block of batches (about one shard's rows, :data:`~datamill.loader.build.BLOCK_ROWS`)
is gathered from the shards into new Arrow buffers (:func:`~datamill.loader.stages.take_rows`),
then each batch is collated on its own (ragged lists padded into new arrays). A worker of
:mod:`datamill.loader.procs` would then copy each batch into its shared-memory slot. Here the
worker does it in one pass: the block's final arrays (what
:func:`~datamill.loader.collate.collate_numpy`, or ``collate_torch``'s dtypes, gives for each of its
batches) are laid out in one slot, column by column (each column's batches one after the other,
each array aligned to its item size), and each shard's rows are gathered into their places with one
vectorised gather per shard and column: numbers into their column, list values into their padded
rows (the mask set with the same indices). Binary bytes are gathered for the whole block in Arrow
(the views taken and cast back, as in process) and copied into the slot with one ``memcpy``: a
numpy gather per shard straight into their places cost a temporary and a scatter (two copies of
each row) and a few calls per shard and block, 0.28-0.31 s of CPU an ``img`` epoch against
0.23-0.26 s. No Python runs per batch beyond its layout.

Only blocks whose columns are all numbers, lists of numbers or binary, without nulls, are placed
(the shard columns :func:`~datamill.loader.stages._prepared` gives as numpy arrays, ragged lists or
binary views); the others, and a block that finds no free slot, are built as in process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.loader.accounting import BatchResult
from datamill.loader.collate import MASK_SUFFIX, OFFSETS_SUFFIX
from datamill.loader.stages import (
    EpochPlan,
    _prepared,
    _Ragged,
    _view_take,
    _Views,
    block_sources,
    row_groups,
    scatter_rows,
)

__all__: list[str] = []

_Layout = tuple[list[tuple[str, str, tuple[int, ...], int]], int]
Alloc = Callable[[int], "tuple[Any, NDArray[np.uint8]] | None"]


@dataclass(frozen=True)
class Placed:
    """A batch's arrays in a slot: the slot's ``token`` (the worker's) and the batch's layout."""

    token: Any
    layout: _Layout
    last: bool  # the block's last batch


def _out_dtype(dtype: np.dtype[Any], mode: str) -> np.dtype[Any]:
    """The dtype a worker hands out: signed ids as int64 for torch (as ``to_torch`` makes them)."""
    if mode == "torch" and dtype.kind == "i" and dtype.itemsize < 8:
        return np.dtype(np.int64)
    return dtype


class _Block:
    """One block's rows: which table and row each comes from, and its batches' bounds."""

    def __init__(self, counts: NDArray[np.int64], n_tables: int, table_of: Any) -> None:
        self.counts = counts
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.starts[1:])
        self.n = int(self.starts[-1])
        self.mine = row_groups(table_of, n_tables)
        self.batch_of = np.repeat(np.arange(len(counts), dtype=np.int64), self.counts)


def _kind(cols: list[Any], typ: pa.DataType) -> str | None:
    """How a column is placed: ``"dense"``, ``"ragged"``, ``"binary"``; ``None``: not placed."""
    if all(isinstance(c, np.ndarray) for c in cols):
        return "dense"
    if all(isinstance(c, _Ragged) for c in cols):
        return "ragged"
    if all(isinstance(c, _Views) for c in cols) and (
        pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
    ):
        return "binary"
    return None


class _Column:
    """One output array of the block: its dtype and, per batch, its shape (the column's batches
    laid out one after the other from ``base``)."""

    def __init__(
        self, name: str, dtype: np.dtype[Any], shapes: list[tuple[int, ...]], cells: Any
    ) -> None:
        self.name, self.dtype, self.shapes = name, dtype, shapes
        # where each batch's array starts, in bytes from ``base`` (``cells``: its cells, cumulated)
        self.starts = (np.asarray(cells, dtype=np.int64) * dtype.itemsize).tolist()
        self.nbytes = self.starts[-1]
        self.base = 0

    def view(self, region: NDArray[np.uint8]) -> NDArray[Any]:
        return region[self.base : self.base + self.nbytes].view(self.dtype)


def prepared_read(read: Callable[[int], pa.Table], k: int) -> pa.Table:
    """``read(k)``, one chunk per column, with its gather views made (binary columns cast to
    views) here, in the reader thread, not when the worker's one thread first gathers from it."""
    table = read(k)
    if any(col.num_chunks > 1 for col in table.columns):
        try:
            table = table.combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowCapacityError):  # too large for one chunk: as it is
            return table
    _prepared(table)
    return table


def place_block(
    plan: EpochPlan,
    get: Callable[[int], pa.Table],
    task: list[int],
    *,
    mode: str,
    alloc: Alloc,
) -> list[BatchResult] | None:
    """Batches ``task`` of ``plan`` built into one region ``alloc(nbytes)`` gives; ``None`` when a
    column is not placed or no region is free (the caller builds them as in process)."""
    table_of, row, needed, counts = block_sources(plan, task)
    tables = [get(int(k)) for k in needed]
    prepared = [_prepared(t) for t in tables]
    schema = tables[0].schema
    kinds = [_kind([p[i] for p in prepared], f.type) for i, f in enumerate(schema)]
    if None in kinds:
        return None
    block = _Block(counts, len(tables), table_of)
    rows = [row[m] for m in block.mine]
    fills: list[Callable[[NDArray[np.uint8]], None]] = []
    columns: list[_Column] = []
    for i, f in enumerate(schema):
        made = _made(kinds[i], f, [p[i] for p in prepared], block, rows, table_of, mode)
        columns += made[0]
        fills.append(made[1])
    at = 0
    for c in columns:
        c.base = at
        at += -(-c.nbytes // 64) * 64
    got = alloc(max(at, 64))
    if got is None:
        return None
    token, region = got
    for fill in fills:
        fill(region)
    return [
        BatchResult(
            b,
            Placed(token, (_batch_layout(columns, j), at), j == len(task) - 1),
            None,
            int(block.counts[j]),
            0,
            [],
            int(block.counts[j]),
        )
        for j, b in enumerate(task)
    ]


def _made(
    kind: str | None,
    field: pa.Field,
    cols: list[Any],
    block: _Block,
    rows: list[Any],
    table_of: Any,
    mode: str,
) -> _Made:
    """One column's output arrays and how to fill them."""
    if kind == "dense":
        return _dense(field.name, cols, block, rows, mode)
    if kind == "ragged":
        return _ragged(field.name, cast("list[_Ragged]", cols), block, rows, mode)
    return _binary(field.name, cast("list[_Views]", cols), block, rows, table_of, field.type)


def _batch_layout(columns: list[_Column], j: int) -> list[tuple[str, str, tuple[int, ...], int]]:
    return [(c.name, c.dtype.str, c.shapes[j], c.base + c.starts[j]) for c in columns]


_Made = tuple[list[_Column], Callable[[NDArray[np.uint8]], None]]


def _dense(name: str, cols: list[Any], block: _Block, rows: list[Any], mode: str) -> _Made:
    """Numbers (or fixed-size lists of numbers): each shard's rows gathered into their column."""
    inner = tuple(cols[0].shape[1:])
    per = int(np.prod(inner)) if inner else 1
    col = _Column(
        name,
        _out_dtype(cols[0].dtype, mode),
        [(c, *inner) for c in block.counts.tolist()],
        block.starts * per,
    )

    def fill(region: NDArray[np.uint8]) -> None:
        out = col.view(region).reshape(block.n, *inner)
        for k, c in enumerate(cols):
            if len(block.mine[k]):
                scatter_rows(out, block.mine[k], c, rows[k])

    return [col], fill


def _ragged(name: str, cols: list[_Ragged], block: _Block, rows: list[Any], mode: str) -> _Made:
    """Lists of numbers: padded to each batch's longest row, the mask beside (``pad``'s output)."""
    lengths = np.zeros(block.n, dtype=np.int64)
    for k, c in enumerate(cols):
        if len(block.mine[k]):
            lengths[block.mine[k]] = c.offsets[rows[k] + 1] - c.offsets[rows[k]]
    width = np.maximum.reduceat(lengths, block.starts[:-1]) if block.n else lengths[:0]
    shapes: list[tuple[int, ...]] = list(zip(block.counts.tolist(), width.tolist()))
    # each batch's first cell in the column's cells (the same for values and mask)
    cells = np.zeros(len(block.counts) + 1, dtype=np.int64)
    np.cumsum(block.counts * width, out=cells[1:])
    values = _Column(name, _out_dtype(cols[0].values.dtype, mode), shapes, cells)
    mask = _Column(name + MASK_SUFFIX, np.dtype(np.bool_), shapes, cells)
    b = block.batch_of
    first = cells[b] + (np.arange(block.n, dtype=np.int64) - block.starts[b]) * width[b]

    def fill(region: NDArray[np.uint8]) -> None:
        out, real = values.view(region), mask.view(region)
        out[:] = 0
        real[:] = False
        for k, c in enumerate(cols):
            lens = lengths[block.mine[k]]
            ends = np.cumsum(lens)
            total = int(ends[-1]) if len(ends) else 0
            if not total:
                continue
            begin = c.offsets[rows[k]]
            # the source index of each value, and the shift to its padded cell
            src = np.arange(total, dtype=np.int64) + np.repeat(begin - (ends - lens), lens)
            dst = src + np.repeat(first[block.mine[k]] - begin, lens)
            out[dst] = c.values[src]
            real[dst] = True

    return [values, mask], fill


def _binary(
    name: str, cols: list[_Views], block: _Block, rows: list[Any], table_of: Any, typ: Any
) -> _Made:
    """Binary: each batch's bytes and ``<col>_offsets`` from 0. The block's bytes are gathered
    once, in Arrow (the views taken, cast back, as in process: one pass in C++ over the rows), and
    copied into the slot with one ``memcpy``; a gather of each shard's rows straight into their
    places cost more (a fancy index per shard into a temporary, then a scatter: two copies of
    every row, and a few numpy calls per shard and block)."""
    taken = _view_take(cols, block.mine, rows, table_of, typ)
    width = np.int64 if pa.types.is_large_binary(taken.type) else np.int32
    offs = np.frombuffer(taken.buffers()[1], dtype=width)[
        taken.offset : taken.offset + block.n + 1
    ].astype(np.int64)
    first = offs[block.starts]
    sizes = np.diff(first)
    values = _Column(name, np.dtype(np.uint8), [(s,) for s in sizes.tolist()], first - first[0])
    offsets = _Column(
        name + OFFSETS_SUFFIX,
        np.dtype(np.int64),
        [(c + 1,) for c in block.counts.tolist()],
        block.starts + np.arange(len(block.starts)),
    )
    lens = block.counts + 1
    at = np.repeat(block.starts[:-1], lens) + (
        np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    )

    def fill(region: NDArray[np.uint8]) -> None:
        if values.nbytes:
            data = taken.buffers()[2]
            assert data is not None
            src = np.frombuffer(data, dtype=np.uint8)[int(offs[0]) : int(offs[-1])]
            values.view(region)[:] = src
        offsets.view(region)[:] = offs[at] - np.repeat(first[:-1], lens)

    return [values, offsets], fill
