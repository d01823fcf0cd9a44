"""Contract harnesses: resumption of every stateful thing, conformance of every Source (GUIDE §4.8).

``check_resume(make, midpoint)`` follows torchdata's ``run_test_save_load_state``: run to the
midpoint, snapshot the state (through JSON, so it must be JSON-able), finish; restore the snapshot
and check that the tail matches; then check that the next epoch matches and that the initial state
reproduces the full run.

``make(state)`` returns a fresh object when ``state`` is ``None`` and an object restored from
``state`` otherwise. The object is iterable (one iteration = the rest of the current epoch, after
which it moves to the next epoch) and has ``state_dict()``.

``check_source(source, reopen=..., different=...)`` checks the contract documented in
:mod:`datamill.core.source` (shard sizes, columns, column selection, the errors of bad arguments,
fingerprints, the UID column).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pytest

from datamill.core.errors import ConfigError, SchemaError
from datamill.core.source import Source, uid_column_of

__all__ = ["Resumable", "assert_same_items", "check_resume", "check_source"]


class Resumable(Protocol):
    def __iter__(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "numpy") and hasattr(a, "detach"):  # torch tensor, without importing torch
        a, b = a.detach().numpy(), b.detach().numpy()
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if hasattr(a, "equals"):  # pyarrow Table / Array
        return bool(a.equals(b))
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b))
        )
    return bool(a == b)


def assert_same_items(got: Sequence[Any], want: Sequence[Any], what: str) -> None:
    """Item-by-item deep equality (dicts of arrays, tensors, tables), naming the first
    difference."""
    assert len(got) == len(want), f"{what}: {len(got)} items, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert _same(g, w), f"{what}: item {i} differs:\n got  {g!r}\n want {w!r}"


def check_resume(make: Callable[[dict[str, Any] | None], Resumable], midpoint: int) -> None:
    """Resuming from the state taken after ``midpoint`` items continues exactly like the full
    run."""
    full = make(None)
    it = iter(full)
    head = []
    for _ in range(midpoint):
        try:
            head.append(next(it))
        except StopIteration:
            raise AssertionError(
                f"midpoint {midpoint} is past the end ({len(head)} items)"
            ) from None
    snapshot = json.loads(json.dumps(full.state_dict()))
    tail = list(it)
    next_epoch = list(full)

    resumed = make(snapshot)
    assert_same_items(list(resumed), tail, "tail after resuming")
    assert_same_items(list(resumed), next_epoch, "next epoch after resuming")

    initial = json.loads(json.dumps(make(None).state_dict()))
    assert_same_items(list(make(initial)), head + tail, "run from the initial state")


def _check_selection(source: Source, k: int, full: pa.Table) -> None:
    cols = source.columns
    for c in cols:
        one = source.read_shard(k, columns=[c])
        assert one.column_names == [c], f"shard {k}, columns=[{c!r}]: got {one.column_names}"
        assert one.column(c).equals(full.column(c)), (
            f"shard {k}: column {c!r} alone differs from the full read"
        )
    backwards = source.read_shard(k, columns=cols[::-1])
    assert backwards.column_names == cols[::-1], f"shard {k}: columns not in the order asked for"


def check_source(
    source: Source, *, reopen: Callable[[], Source] | None = None, different: Source | None = None
) -> None:
    """``source`` keeps the Source contract of :mod:`datamill.core.source`.

    Args:
        source: the source to check (it should have at least one shard).
        reopen: opens the same data again (e.g. from disk), whose fingerprint must be the same.
        different: a source over different content, whose fingerprint must differ.
    """
    cols = source.columns
    assert isinstance(cols, list) and cols and all(isinstance(c, str) for c in cols), (
        f"columns: {cols!r}"
    )
    assert len(set(cols)) == len(cols), f"duplicate columns: {cols}"
    n = source.num_shards
    sizes = source.shard_sizes()
    assert isinstance(sizes, np.ndarray) and sizes.dtype == np.int64, (
        f"shard_sizes(): {type(sizes)} {sizes!r}"
    )
    assert sizes.shape == (n,), f"shard_sizes() has shape {sizes.shape}, num_shards is {n}"
    assert n > 0 and (sizes >= 0).all(), f"shard sizes: {sizes.tolist()}"
    for k in range(n):
        table = source.read_shard(k)
        assert isinstance(table, pa.Table), f"read_shard({k}) returned {type(table).__name__}"
        assert table.num_rows == sizes[k], (
            f"read_shard({k}) has {table.num_rows} rows, shard_sizes() says {sizes[k]}"
        )
        assert table.column_names == cols, (
            f"read_shard({k}) has columns {table.column_names}, expected {cols}"
        )
        if k in (0, n - 1):
            _check_selection(source, k, table)
    for bad in (-1, n, "x"):
        with pytest.raises(ConfigError) as info:
            source.read_shard(bad)  # type: ignore[arg-type]
        assert info.value.shard is not None, (
            f"read_shard({bad!r}): the error does not name the shard"
        )
    with pytest.raises(SchemaError) as schema_info:
        source.read_shard(0, columns=["__no_such_column__"])
    assert schema_info.value.column == "__no_such_column__"
    fp = source.fingerprint()
    assert isinstance(fp, str) and fp and fp == source.fingerprint(), (
        "fingerprint() is not a stable str"
    )
    if reopen is not None:
        assert reopen().fingerprint() == fp, "fingerprint() changed when the data was opened again"
    if different is not None:
        assert different.fingerprint() != fp, "fingerprint() is the same for different content"
    uid = uid_column_of(source)
    assert uid is None or uid in cols, f"uid column {uid!r} is not among the columns {cols}"
