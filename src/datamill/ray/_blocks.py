"""Global blocks held in Ray's object store, and the executor that runs the pipeline's per-block
functions on them.

The driver cuts the input into the local engine's global blocks (``Plan.block_ranges``: the same
``BLOCK_ROWS`` rows), whatever blocks Ray Data read: one :func:`_prepare_task` per global block
slices the Ray blocks it overlaps, concatenates them and calls
:func:`~datamill.preprocessing.pipeline.prepare`. The prepared
:class:`~datamill.preprocessing.plans.Block` stays in the object store; the driver keeps a
:class:`BlockHandle` (index, rows, split ids and the object ref). :class:`RayExecutor` implements
the pipeline's ``Executor`` seam: it resolves the handles inside each item on the worker, so
:func:`~datamill.preprocessing.pipeline.fit` runs unchanged (its merges on the driver, in block
order: bit-identical statistics).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.preprocessing.pipeline import prepare
from datamill.preprocessing.plans import Block, Origin, Plan
from datamill.ray._runtime import MAX_RETRIES, Spread, ordered_results, ray_module

__all__ = ["BlockHandle", "RayExecutor", "plan_pieces", "prepare_blocks", "window"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, eq=False)
class BlockHandle:
    """A prepared block in the object store, with what the driver's merges read (rows, split
    ids)."""

    index: int
    lo: int
    num_rows: int
    split: NDArray[np.int8] | None
    origin: Origin
    ref: Any  # ObjectRef[Block]
    uids: Any  # ObjectRef[pa.Array | None]: the configured key column of the kept rows
    node: str  # the Ray node that prepared it


def window() -> int:
    """Tasks kept in flight: two per CPU of the cluster (at least 2)."""
    ray = ray_module()
    return max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))


def _resolve(item: Any) -> Any:
    ray = ray_module()
    if isinstance(item, BlockHandle):
        return ray.get(item.ref)
    if isinstance(item, tuple):
        return tuple(_resolve(x) for x in item)
    return item


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(_resolve(item))


class RayExecutor:
    """The pipeline's ``Executor`` on Ray: one task per item, results yielded in order.

    Items may hold :class:`BlockHandle` objects (alone or in tuples); each is replaced by its
    :class:`~datamill.preprocessing.plans.Block` on the worker.
    """

    def __init__(self) -> None:
        ray = ray_module()
        self._remote = ray.remote(max_retries=MAX_RETRIES)(_apply)
        self._spread = Spread()

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn(item)`` on Ray for every item, in order (at most :func:`window` tasks in flight)."""

        def submit(pair: tuple[int, T]) -> Any:
            return self._remote.options(scheduling_strategy=self._spread(pair[0])).remote(
                fn, pair[1]
            )

        return ordered_results(submit, enumerate(items), window=window())


def plan_pieces(
    counts: list[int], ranges: list[tuple[int, int]]
) -> list[list[tuple[int, int, int]]]:
    """For each global ``(lo, hi)`` range, the ``(ray block, start, stop)`` slices that make it up.

    Examples:
        >>> plan_pieces([2, 1, 3], [(0, 4), (4, 6)])
        [[(0, 0, 2), (1, 0, 1), (2, 0, 1)], [(2, 1, 3)]]
    """
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
    out: list[list[tuple[int, int, int]]] = []
    for lo, hi in ranges:
        pieces: list[tuple[int, int, int]] = []
        j = max(0, bisect.bisect_right(starts, lo) - 1)
        while j < len(counts) and starts[j] < hi:
            a, b = max(lo, starts[j]), min(hi, starts[j + 1])
            if b > a:
                pieces.append((j, a - starts[j], b - starts[j]))
            j += 1
        out.append(pieces)
    return out


def _num_rows(table: pa.Table) -> int:
    return int(table.num_rows)


def _prepare_task(
    p: Plan,
    origin: Origin,
    index: int,
    lo: int,
    uid_column: str | None,
    slices: list[tuple[int, int]],
    *tables: pa.Table,
) -> tuple[Block, pa.Array | None, tuple[Any, ...]]:
    parts = [t.slice(a, b - a) for t, (a, b) in zip(tables, slices)]
    schema = parts[0].schema if parts else pa.schema([])
    table = (
        pa.concat_tables([t.cast(schema) for t in parts])
        if len(parts) > 1
        else (parts[0] if parts else pa.table({}))
    )
    uids = None
    block = prepare(p, origin, (index, lo, table))
    if uid_column is not None:
        key = table.column(uid_column).combine_chunks()
        uids = key if block.rows is None else key.take(pa.array(block.rows - lo))
    node = ray_module().get_runtime_context().get_node_id()
    return block, uids, (block.num_rows, block.split, node, os.getpid())


def prepare_blocks(
    p: Plan, origin: Origin, refs: list[Any], *, uid_column: str | None
) -> list[BlockHandle]:
    """Prepare every global block of the Ray blocks ``refs`` (in order) on the workers → handles."""
    ray = ray_module()
    count = ray.remote(max_retries=MAX_RETRIES)(_num_rows)
    counts = [int(n) for n in ray.get([count.remote(r) for r in refs])]
    ranges = p.block_ranges(sum(counts))
    task = ray.remote(max_retries=MAX_RETRIES, num_returns=3)(_prepare_task)
    spread = Spread()
    handles: list[BlockHandle] = []
    pending = []
    for index, ((lo, _hi), pieces) in enumerate(zip(ranges, plan_pieces(counts, ranges))):
        slices = [(a, b) for _, a, b in pieces]
        block_ref, uid_ref, info_ref = task.options(scheduling_strategy=spread(index)).remote(
            p, origin, index, lo, uid_column, slices, *[refs[j] for j, _, _ in pieces]
        )
        pending.append((index, lo, block_ref, uid_ref, info_ref))
    for index, lo, block_ref, uid_ref, info_ref in pending:
        num_rows, split, node, _pid = ray.get(info_ref)
        handles.append(
            BlockHandle(index, lo, int(num_rows), split, origin, block_ref, uid_ref, node)
        )
    return handles
