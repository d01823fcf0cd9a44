"""Contract harnesses shared by every stateful thing (GUIDE §4.8).

``check_resume(make, midpoint)`` follows torchdata's ``run_test_save_load_state``: run to the
midpoint, snapshot the state (through JSON, so it must be JSON-able), finish; restore the snapshot and
check that the tail matches; then check that the next epoch matches and that the initial state
reproduces the full run.

``make(state)`` returns a fresh object when ``state`` is ``None`` and an object restored from
``state`` otherwise. The object is iterable (one iteration = the rest of the current epoch, after
which it moves to the next epoch) and has ``state_dict()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["Resumable", "assert_same_items", "check_resume"]


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
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def assert_same_items(got: Sequence[Any], want: Sequence[Any], what: str) -> None:
    """Item-by-item deep equality (dicts of arrays, tensors, tables), naming the first difference."""
    assert len(got) == len(want), f"{what}: {len(got)} items, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert _same(g, w), f"{what}: item {i} differs:\n got  {g!r}\n want {w!r}"


def check_resume(make: Callable[[dict[str, Any] | None], Resumable], midpoint: int) -> None:
    """Resuming from the state taken after ``midpoint`` items continues exactly like the full run."""
    full = make(None)
    it = iter(full)
    head = []
    for _ in range(midpoint):
        try:
            head.append(next(it))
        except StopIteration:
            raise AssertionError(f"midpoint {midpoint} is past the end ({len(head)} items)") from None
    snapshot = json.loads(json.dumps(full.state_dict()))
    tail = list(it)
    next_epoch = list(full)

    resumed = make(snapshot)
    assert_same_items(list(resumed), tail, "tail after resuming")
    assert_same_items(list(resumed), next_epoch, "next epoch after resuming")

    initial = json.loads(json.dumps(make(None).state_dict()))
    assert_same_items(list(make(initial)), head + tail, "run from the initial state")
