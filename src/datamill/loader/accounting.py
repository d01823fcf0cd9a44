"""Public accounting of built batches, and the one ``max_errors`` policy.

Every batch a :class:`~datamill.loader.service.BatchService` builds comes as a :class:`BatchResult`
carrying its own counts (samples read, dropped by the filter, failed, yielded) and where the shard
cache stood. :class:`Accounting` adds results up and applies the ``max_errors`` policy; the
:class:`~datamill.loader.Loader`, the torch adapter and a server all use it, so a failing sample is
counted and judged the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from datamill.core.checks import check_int
from datamill.core.errors import DataFileError

__all__ = ["Accounting", "BatchResult"]


@dataclass
class BatchResult:
    """One batch after filter/transform/collate, with its accounting.

    Attributes:
        batch: the batch number within the rank's epoch.
        output: the collated batch, or ``None`` when every sample was dropped.
        empty: the (empty) batch table when ``output`` is ``None`` (collate it to yield an empty
            batch).
        read: samples read for the batch (its positions).
        filtered: samples dropped by the filter.
        failed: ``(uid, global index, error)`` of every sample whose filter or transform raised.
        yielded: samples in ``output``.
        epoch: the epoch the batch belongs to.
        rank: the rank the batch belongs to.
        shards_read: shards the build had loaded (read, or reused from the shared cache) once this
            batch was done.
        shards_in_memory: shards the service held (for every active build) once this batch was done.
        peak_shards_in_memory: most shards the service held at once during this build so far.
    """

    batch: int
    output: Any
    empty: pa.Table | None
    read: int
    filtered: int
    failed: list[tuple[Any, int, BaseException]]
    yielded: int
    epoch: int = 0
    rank: int = 0
    shards_read: int = 0
    shards_in_memory: int = 0
    peak_shards_in_memory: int = 0


@dataclass
class Accounting:
    """Running counts of batch results, raising once more than ``max_errors`` samples failed.

    Keep one per stretch the budget applies to (the Loader: one per epoch; the torch adapter: one
    per worker iteration; a server: one per iteration and rank).

    Args:
        max_errors: samples that may fail ``filter``/``transform`` (skipped, counted) before
            :meth:`add` raises; ``None`` only counts. Defaults to ``0``.

    Examples:
        >>> acc = Accounting(max_errors=1)
        >>> acc.add(
        ...     BatchResult(
        ...         0,
        ...         None,
        ...         None,
        ...         read=4,
        ...         filtered=1,
        ...         failed=[("u1", 1, ValueError("x"))],
        ...         yielded=2,
        ...     )
        ... )
        >>> acc.as_dict()["read"], acc.failed
        (4, 1)
        >>> acc.add(
        ...     BatchResult(
        ...         1,
        ...         None,
        ...         None,
        ...         read=4,
        ...         filtered=0,
        ...         failed=[("u5", 5, ValueError("y"))],
        ...         yielded=3,
        ...     )
        ... )  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.DataFileError: uid 'u5': sample 5 failed in filter/transform
        (ValueError: y); 2 failures ...
    """

    ERRORS_KEPT: ClassVar[int] = 100
    """Failures :attr:`errors` describes (``(uid, global index, "Type: message")``); later ones are
    only counted."""

    max_errors: int | None = 0
    read: int = 0
    filtered: int = 0
    failed: int = 0
    yielded: int = 0
    batches: int = 0
    shards_read: int = 0
    peak_shards_in_memory: int = 0
    errors: list[tuple[Any, int, str]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        m = self.max_errors
        if m is not None:
            check_int(m, name="max_errors", low=0, high=None)

    def add(self, res: BatchResult) -> None:
        """Count ``res``.

        Raises:
            DataFileError: a failure beyond ``max_errors`` (``uid`` set, the sample's error
                chained).
        """
        self.read += res.read
        self.filtered += res.filtered
        self.yielded += res.yielded
        self.batches += res.output is not None
        self.shards_read = max(self.shards_read, res.shards_read)
        self.peak_shards_in_memory = max(self.peak_shards_in_memory, res.peak_shards_in_memory)
        for uid, index, exc in res.failed:
            self.failed += 1
            if len(self.errors) < self.ERRORS_KEPT:
                self.errors.append((uid, index, f"{type(exc).__name__}: {exc}"))
            if self.max_errors is not None and self.failed > self.max_errors:
                raise DataFileError(
                    f"sample {index} failed in filter/transform ({type(exc).__name__}: {exc}); "
                    f"{self.failed} failures this epoch exceed max_errors={self.max_errors}",
                    uid=uid,
                    hint="fix the transform or raise max_errors to skip such samples",
                ) from exc

    def as_dict(self) -> dict[str, int]:
        """The counts (``read``, ``filtered``, ``failed``, ``yielded``, ``batches``, shard
        figures)."""
        names = ("read", "filtered", "failed", "yielded", "batches", "shards_read")
        return {k: getattr(self, k) for k in (*names, "peak_shards_in_memory")}
