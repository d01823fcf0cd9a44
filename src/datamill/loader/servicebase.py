"""What the halves of :class:`~datamill.loader.service.BatchService` share: the settings and
the plan methods the service defines, declared once for the mixins (:mod:`datamill.loader.build`,
:mod:`datamill.loader.resumes`) that use them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.source import Source
from datamill.loader.accounting import Accounting
from datamill.loader.cache import ShardCache
from datamill.loader.options import Batching, Workers
from datamill.loader.order import Elastic, EpochOrder
from datamill.loader.stages import EpochPlan

__all__ = ["ServiceBase"]


class ServiceBase:
    """The attributes and plan methods of a :class:`~datamill.loader.service.BatchService`, as
    its mixins see them (the service sets and defines them)."""

    source: Source
    columns: list[str] | None
    sizes: NDArray[np.int64]
    batch_size: int
    seed: int
    batching: Batching
    workers: Workers
    window: int
    warmup: bool
    collate_fn: Callable[[pa.Table], Any]
    _lock: threading.Lock
    _cache: ShardCache
    _totals: Accounting
    _builds: int
    _active: int
    _lazy: OrderedDict[int, EpochOrder]

    if TYPE_CHECKING:

        def fingerprint(self) -> str: ...

        def config(
            self, *, rank: int = 0, world_size: int = 1, replication: int = 1
        ) -> dict[str, Any]: ...

        def epoch_samples(self, epoch: int = 0) -> int: ...

        def plan(
            self,
            epoch: int,
            rank: int = 0,
            world_size: int = 1,
            *,
            elastic: Elastic | None = None,
            replication: int = 1,
        ) -> EpochPlan: ...

        def rank_samples(
            self, rank: int = 0, world_size: int = 1, *, replication: int = 1
        ) -> int: ...

        def epoch_order(self, epoch: int) -> EpochOrder | None: ...
