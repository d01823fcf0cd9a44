"""Collation of a whole lease: record batches of one schema -> one dict of numpy arrays per batch.

``collate_numpy_batches(batches)[k]`` equals ``collate_numpy(pa.Table.from_batches([batches[k]]))``
(same keys in the same order, dtypes, shapes and values), but each column is converted **once** for
all the batches and every batch gets slices of it, so the Python work per batch is a few slices
instead of a conversion per column (a server-built lease is 64 record batches). Fast paths:

* numbers and booleans, nulls or not: a batch without nulls gets a view of the values (numbers
  read-only, as those of a batch read from an IPC stream), a batch with nulls what
  ``to_numpy(zero_copy_only=False)`` gives it (integers: float64 with NaN; floats: their dtype
  with NaN; booleans: an object array with ``None``), each converted once for the lease;
* ``fixed_size_list`` (nested too) of those, without a null list: the leaf values reshaped;
* binary columns as bytes + ``<col>_offsets`` (one concatenated buffer, offsets cut per batch);
* strings, and binary columns with ``binary="bytes"``: one object array for the lease.

Any other column (ragged lists, dictionaries, timestamps, structs...) is converted batch by batch
by :func:`~datamill.loader.collate.column_arrays`, the code :func:`collate_numpy` runs.

Arrays of different batches never overlap (mutating one batch cannot change another), but the
arrays of a lease may be views of one buffer, which stays alive while any of them does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from datamill.core import arrow
from datamill.core.errors import ConfigError, SchemaError
from datamill.loader.collate import (
    _NUMERIC,
    OFFSETS_SUFFIX,
    BinaryOutput,
    _fixed_shape,
    _offsets,
    _single,
    _valid,
    builtin_collate,
    column_arrays,
    to_torch,
)

__all__ = [
    "block_collate",
    "collate_block",
    "collate_numpy_batches",
    "collate_torch_batches",
]

_Column = list[tuple[str, list[np.ndarray]]]
"""One column's output: ``(key, one array per batch)`` pairs."""


class _Bounds:
    """Where each batch's rows start and stop in the lease (as arrays and as Python ints), and how
    an array over the lease is cut into the batches' arrays (for numpy, or ``for_torch``)."""

    def __init__(self, rows: np.ndarray, *, for_torch: bool, ipc: bool = True) -> None:
        self.edges = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(rows, out=self.edges[1:])
        self.starts: list[int] = self.edges[:-1].tolist()
        self.stops: list[int] = self.edges[1:].tolist()
        self.prepare = _for_torch if for_torch else _same
        self.for_torch, self.ipc = for_torch, ipc

    def ipc_view(self, values: np.ndarray) -> np.ndarray:
        """Numbers without nulls as collate_numpy gives those of a batch read from an IPC stream:
        a read-only view (for torch: as they are; ``prepare`` copies them only if read-only). A
        block's (``ipc=False``) as they are: what collate_numpy gives a slice of the block."""
        if self.for_torch or not self.ipc:
            return values
        view = values.view()
        view.flags.writeable = False
        return view

    def cut(
        self,
        bases: Sequence[np.ndarray],
        pick: np.ndarray | None,
        starts: list[int] | None = None,
        stops: list[int] | None = None,
    ) -> list[np.ndarray]:
        """``prepare(bases[pick[k]])[starts[k]:stops[k]]`` for each batch ``k`` (``bases[0]``
        without ``pick``; the batches' rows without ``starts`` and ``stops``)."""
        bases = [self.prepare(b) for b in bases]
        starts = self.starts if starts is None else starts
        stops = self.stops if stops is None else stops
        if pick is None:
            base = bases[0]
            return [base[a:b] for a, b in zip(starts, stops)]
        return [bases[p][a:b] for p, a, b in zip(pick.tolist(), starts, stops)]

    def with_nulls(self, nulls: np.ndarray, scale: int = 1) -> np.ndarray:
        """Per batch, 1 where it holds a null (``nulls``: their sorted positions; ``scale`` cells
        per row), else 0."""
        return (np.diff(np.searchsorted(nulls, self.edges * scale)) > 0).astype(np.intp)


def _plain(typ: pa.DataType) -> bool:
    return pat.is_boolean(typ) or typ in _NUMERIC


def _raw(arr: pa.Array) -> np.ndarray:
    """A primitive or boolean array's values, whatever its validity says (null slots included)."""
    buf, n, off = arr.buffers()[1], len(arr), arr.offset
    if pat.is_boolean(arr.type):
        bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
        return bits[off : off + n].astype(np.bool_)
    return np.frombuffer(buf, dtype=arrow._DTYPES[arr.type])[off : off + n]


def _numbers(
    arr: pa.Array, bounds: _Bounds, scale: int = 1
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The lease's values of a number/boolean array as ``(bases, pick)`` for :meth:`_Bounds.cut`
    (``scale`` values per row): the values, and (nulls) what ``to_numpy`` makes of them."""
    if not arr.null_count:
        values = arrow.to_numpy(arr)
        return [values if values.dtype == np.bool_ else bounds.ipc_view(values)], None
    nulls = np.flatnonzero(~_valid(arr))
    raw = _raw(arr)
    if raw.dtype == np.bool_:
        filled = np.empty(len(raw), dtype=object)
        filled[:] = raw  # Python bools, as pyarrow's to_numpy gives them
        filled[nulls] = None
    else:  # pyarrow's to_numpy: integers -> float64, floats keep their dtype; NaN for a null
        filled = raw.astype(np.float64 if raw.dtype.kind in "iu" else raw.dtype)
        filled[nulls] = np.nan
    plain = raw if raw.dtype == np.bool_ else bounds.ipc_view(raw)
    return [plain, filled], bounds.with_nulls(nulls, scale)


def _fixed(name: str, arr: pa.Array, bounds: _Bounds) -> _Column | None:
    """A ``fixed_size_list`` column: the leaf values reshaped (``None``: a null list somewhere,
    which the per-batch code handles, or a leaf type without a fast path)."""
    dims, leaf = _fixed_shape(arr.type)
    if not _plain(leaf):
        return None
    flat = arr
    while pat.is_fixed_size_list(flat.type):
        if flat.null_count:  # a null list is left out of the flattened values: per batch
            return None
        flat = flat.flatten()
    bases, pick = _numbers(flat, bounds, math.prod(dims))
    shaped = [b.reshape(len(arr), *dims) for b in bases]
    return [(name, bounds.cut(shaped, pick))]


def _binary(name: str, arr: pa.Array, bounds: _Bounds) -> _Column:
    """A binary column as the lease's bytes, cut per batch, and each batch's offsets from 0."""
    pick = None
    if arr.null_count:  # a null's slot may hold bytes: make it empty (a new, writeable buffer)
        pick = bounds.with_nulls(np.flatnonzero(~_valid(arr)))
        arr = arr.fill_null(b"")
    offs = _offsets(arr).astype(np.int64)
    data = arr.buffers()[2]
    values = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
    starts, stops = offs[bounds.edges[:-1]].tolist(), offs[bounds.edges[1:]].tolist()
    cut = bounds.cut([bounds.ipc_view(values), values], pick, starts, stops)
    # every batch's offsets from 0 (rows + 1 each) in one array, cut per batch
    lens = np.diff(bounds.edges) + 1
    ends = np.cumsum(lens)
    begins = ends - lens
    at = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(begins - bounds.edges[:-1], lens)
    rel = offs[at] - np.repeat(offs[bounds.edges[:-1]], lens)
    return [
        (name, cut),
        (name + OFFSETS_SUFFIX, bounds.cut([rel], None, begins.tolist(), ends.tolist())),
    ]


def _objects(name: str, arr: pa.Array, bounds: _Bounds) -> _Column:
    """Strings (or bytes): one object array for the lease (``to_pylist``, as the per-batch code)."""
    out = np.empty(len(arr), dtype=object)
    out[:] = arr.to_pylist()
    return [(name, bounds.cut([out], None))]


def _fast(typ: pa.DataType) -> bool:
    """Whether a column of type ``typ`` may have a fast path (see :func:`_lease_column`)."""
    if pat.is_fixed_size_list(typ):
        return _plain(_fixed_shape(typ)[1])
    textual = (pat.is_binary, pat.is_large_binary, pat.is_string, pat.is_large_string)
    return _plain(typ) or any(bool(is_(typ)) for is_ in textual)


def _lease_column(
    name: str, arr: pa.Array, bounds: _Bounds, binary: BinaryOutput
) -> _Column | None:
    """A column (one array over the lease) by its fast path, or ``None`` (converted per batch)."""
    typ = arr.type
    if _plain(typ):
        bases, pick = _numbers(arr, bounds)
        return [(name, bounds.cut(bases, pick))]
    if pat.is_fixed_size_list(typ):
        return _fixed(name, arr, bounds)
    if binary == "offsets" and (pat.is_binary(typ) or pat.is_large_binary(typ)):
        return _binary(name, arr, bounds)
    return _objects(name, arr, bounds)  # strings, bytes


def _combined(table: pa.Table, columns: list[int]) -> list[pa.Array]:
    """Columns ``columns`` of ``table``, each as one array (one copy of the lease's buffers)."""
    sub = table.select(columns)
    for j, col in enumerate(sub.columns):
        if pat.is_binary(col.type) and col.nbytes >= 2**31 - 1:  # int32 offsets would overflow
            sub = sub.set_column(
                j, sub.field(j).with_type(pa.large_binary()), col.cast(pa.large_binary())
            )
    return [_single(col) for col in sub.combine_chunks().columns]


def _per_batch(name: str, parts: Sequence[pa.Array], binary: BinaryOutput) -> _Column:
    """A column converted batch by batch (``parts``: its array in each batch; what
    :func:`collate_numpy` does)."""
    outs = [column_arrays(name, part, binary=binary) for part in parts]
    return [(key, [o[j][1] for o in outs]) for j, (key, _) in enumerate(outs[0])]


def _same(values: np.ndarray) -> np.ndarray:
    return values


def _for_torch(values: np.ndarray) -> np.ndarray:
    """What :func:`~datamill.loader.collate.to_torch` would make of each batch's slice, made of the
    lease's array once: signed ids as int64, read-only arrays copied."""
    if values.dtype.kind == "i" and values.dtype.itemsize < 8:
        return values.astype(np.int64)
    return values if values.flags.writeable or values.dtype == object else values.copy()


def collate_numpy_batches(
    batches: Sequence[pa.RecordBatch], *, binary: BinaryOutput = "offsets"
) -> list[dict[str, np.ndarray]]:
    """Record batches of one schema (a lease) -> :func:`collate_numpy` of each, column by column.

    Args:
        batches: the batches, one schema (as read from one Arrow IPC stream).
        binary: as for :func:`~datamill.loader.collate.collate_numpy`. Defaults to ``"offsets"``.

    Returns:
        One dict per batch, equal to ``collate_numpy(pa.Table.from_batches([batch]))``; number
        arrays without nulls are read-only views (as for a batch read from an IPC stream).

    Raises:
        ConfigError: an unknown ``binary``. SchemaError: batches of different schemas.

    Examples:
        >>> bs = pa.table({"x": [1, 2, None], "s": ["a", "b", "c"]}).to_batches(max_chunksize=2)
        >>> out = collate_numpy_batches(bs)
        >>> [(d["x"].dtype.name, d["x"].tolist(), d["s"].tolist()) for d in out]
        [('int64', [1, 2], ['a', 'b']), ('float64', [nan], ['c'])]
    """
    return _collate(batches, binary, for_torch=False)


def _collate(
    batches: Sequence[pa.RecordBatch],
    binary: BinaryOutput,
    *,
    for_torch: bool,
) -> list[dict[str, np.ndarray]]:
    """:func:`collate_numpy_batches`; ``for_torch``: each array over the lease made ready for
    :func:`~datamill.loader.collate.to_torch` before it is cut (see :func:`_for_torch`)."""
    schema = _lease_schema(batches, binary)
    if schema is None:
        return []
    table = pa.Table.from_batches(batches, schema=schema)  # zero-copy: a chunk per batch
    rows = np.fromiter((b.num_rows for b in batches), np.int64, len(batches))
    return _collate_table(
        table,
        _Bounds(rows, for_torch=for_torch),
        binary,
        lambda i: [b.column(i) for b in batches],
    )


def _collate_table(
    table: pa.Table,
    bounds: _Bounds,
    binary: BinaryOutput,
    parts: Callable[[int], Sequence[pa.Array]],
) -> list[dict[str, np.ndarray]]:
    """The batches of ``table`` cut at ``bounds``, collated column by column (``parts(i)``: column
    ``i`` of each batch, for the columns without a fast path)."""
    fast = [i for i, field in enumerate(table.schema) if _fast(field.type)]
    combined = dict(zip(fast, _combined(table, fast)))
    keys: list[str] = []
    cols: list[list[np.ndarray]] = []
    for i, name in enumerate(table.schema.names):
        column = _lease_column(name, combined[i], bounds, binary) if i in combined else None
        for key, arrays in column if column is not None else _per_batch(name, parts(i), binary):
            keys.append(key)
            cols.append(arrays)
    if not cols:
        return [{} for _ in bounds.starts]
    return [dict(zip(keys, arrays)) for arrays in zip(*cols)]


def collate_block(
    table: pa.Table, rows: Sequence[int], *, torch: bool = False, pin_memory: bool = False
) -> list[Any]:
    """The batches of a built block (``table``, cut into batches of ``rows`` rows each, in order)
    collated at once: ``collate_numpy`` (``torch``: ``collate_torch``) of each batch's slice, with
    each column converted once for the block (the arrays are views of the block's columns, as
    those of a slice are; a block of several chunks per column is combined once).

    Examples:
        >>> t = pa.table({"x": [1, 2, 3], "s": ["a", "b", "c"]})
        >>> [(d["x"].tolist(), d["s"].tolist()) for d in collate_block(t, [2, 1])]
        [([1, 2], ['a', 'b']), ([3], ['c'])]
    """
    bounds = _Bounds(np.asarray(rows, dtype=np.int64), for_torch=torch, ipc=False)
    out = _collate_table(
        table,
        bounds,
        "offsets",
        lambda i: [
            _single(table.column(i).slice(a, b - a)) for a, b in zip(bounds.starts, bounds.stops)
        ],
    )
    return [to_torch(arrays, pin_memory=pin_memory) for arrays in out] if torch else out


def block_collate(collate: Callable[[pa.Table], Any]) -> Callable[..., list[Any]] | None:
    """The block form (``(table, rows) -> batches``, :func:`collate_block`) of a built-in batch
    collate (``collate="numpy"`` / ``"torch"``: :func:`~datamill.loader.collate.builtin_collate`),
    or ``None`` for any other: what a batch service's build uses when it has neither a filter nor
    a transform, so the in-process Loader and a direct client convert each column once per block.

    Examples:
        >>> from datamill.loader.collate import collate_numpy
        >>> block_collate(collate_numpy)(pa.table({"x": [1, 2, 3]}), [2, 1])[1]["x"].tolist()
        [3]
        >>> block_collate(lambda t: t) is None
        True
    """
    mode, pin = builtin_collate(collate)
    if mode is None:
        return None
    return functools.partial(collate_block, torch=mode == "torch", pin_memory=pin)


def _lease_schema(batches: Sequence[pa.RecordBatch], binary: BinaryOutput) -> pa.Schema | None:
    """The one schema of a lease's record batches (None: no batch).

    Raises:
        ConfigError: an unknown ``binary``. TypeError: not record batches. SchemaError: the
            batches' schemas differ.
    """
    if binary not in ("offsets", "bytes"):
        raise ConfigError(f"binary must be 'offsets' or 'bytes', got {binary!r}")
    if not all(isinstance(b, pa.RecordBatch) for b in batches):
        raise TypeError("collate_numpy_batches takes pyarrow RecordBatches")
    if not batches:
        return None
    schema = batches[0].schema
    if not all(b.schema.equals(schema) for b in batches):
        raise SchemaError(
            f"the batches of a lease must share one schema; the first is {schema}, others differ"
        )
    return schema


def collate_torch_batches(
    batches: Sequence[pa.RecordBatch],
    *,
    pin_memory: bool = False,
    binary: BinaryOutput = "offsets",
) -> list[dict[str, Any]]:
    """Record batches of one schema -> :func:`~datamill.loader.collate.collate_torch` of each.

    Each column is made ready for torch once for the lease (signed ids widened to int64, read-only
    arrays copied, as ``collate_torch`` does per batch), so a batch's tensors are views of the
    lease's arrays: no two batches' tensors overlap (mutating one batch cannot change another), and
    a tensor kept alive keeps its column of the lease alive.

    Args:
        batches: the batches, one schema.
        pin_memory: as for ``collate_torch``. Defaults to ``False``.
        binary: as for ``collate_torch``. Defaults to ``"offsets"``.

    Examples:
        >>> import importlib.util
        >>> if importlib.util.find_spec("torch"):
        ...     bs = pa.table({"x": pa.array([1, 2, 3], pa.int8())}).to_batches(max_chunksize=2)
        ...     print([d["x"].tolist() for d in collate_torch_batches(bs)])
        ... else:
        ...     print([[1, 2], [3]])
        [[1, 2], [3]]
    """
    return [
        to_torch(arrays, pin_memory=pin_memory)
        for arrays in _collate(batches, binary, for_torch=True)
    ]
