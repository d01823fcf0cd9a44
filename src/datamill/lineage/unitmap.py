"""The unit map of a served iteration: which served rank or client read each unit of the plan,
and at which of its steps (:class:`UnitMap`); :class:`Shapes`, a source of shard sizes only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["Shapes", "UnitMap"]

I64 = NDArray[np.int64]


class Shapes:
    """A stand-in source with only shard sizes (to rebuild a Mix schedule from a record)."""

    def __init__(self, sizes: I64) -> None:
        self._sizes = sizes
        self.columns: list[str] = []

    def shard_sizes(self) -> I64:
        return self._sizes


class UnitMap:
    """A served iteration's units (``offsets[r] + b``: batch ``b`` of plan rank ``r``) -> who read
    them, when.

    Static mode resumed over another world size: ``who`` is the queue (served rank) and ``step`` the
    position in it. Dynamic mode: ``who`` indexes ``clients`` (the client that acknowledged the
    unit) and ``step`` counts that client's acknowledged batches in the order it received them.
    """

    def __init__(self, served: Mapping[str, Any]) -> None:
        rb = np.asarray(served["rank_batches"], dtype=np.int64)
        self.offsets: I64 = np.concatenate([[0], np.cumsum(rb)]).astype(np.int64)
        total = int(self.offsets[-1])
        self.who: I64 = np.full(total, -1, dtype=np.int64)
        self.step: I64 = np.full(total, -1, dtype=np.int64)
        self.clients: list[str] | None = None
        self.units: dict[Any, I64] = {}
        if served.get("mode") == "dynamic":
            per: dict[str, list[I64]] = {}
            for client, a, b in served.get("acks", []):
                if client is None:
                    continue  # a rewind's rows: no client read them
                per.setdefault(str(client), []).append(np.arange(int(a), int(b), dtype=np.int64))
            self.clients = list(per)
            for i, c in enumerate(self.clients):
                us = np.concatenate(per[c])
                self.units[c] = us
                self.who[us], self.step[us] = i, np.arange(len(us), dtype=np.int64)
        else:
            for q, rs in enumerate(served.get("queues") or []):
                us = (
                    np.concatenate([np.arange(int(a), int(b), dtype=np.int64) for a, b in rs])
                    if rs
                    else np.zeros(0, np.int64)
                )
                self.units[q] = us
                self.who[us], self.step[us] = q, np.arange(len(us), dtype=np.int64)
