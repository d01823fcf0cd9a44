"""Run records read back: :func:`load_record` checks one, and the answers a trace gives
(:class:`Hit`: a batch that held a sample; :class:`BatchTrace`: the samples of one batch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from datamill.loader.record import load_record

__all__ = ["BatchTrace", "Hit", "load_record"]


@dataclass(frozen=True)
class Hit:
    """One batch that held a sample: ``position`` in rank ``rank``'s batch at ``step`` of ``epoch``.

    ``batch`` numbers the batch in its segment's plan (what the loader's state counts),
    ``global_step`` counts steps from the first epoch of the record, ``rejected`` says whether the
    filter dropped the sample (``None``: not evaluated).
    """

    uid: Any
    sample: int
    epoch: int
    rank: int
    step: int
    global_step: int
    batch: int
    position: int
    segment: int
    rejected: bool | None = None
    client: str | None = None
    iteration: str | None = None
    """Which record of several (:class:`~datamill.lineage.join.RunTracer`) the batch is in."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict."""
        return asdict(self)


@dataclass(frozen=True)
class BatchTrace:
    """The samples of rank ``rank``'s batch at ``step`` of ``epoch`` (in batch order)."""

    epoch: int
    rank: int
    step: int
    global_step: int
    batch: int
    segment: int
    samples: list[int]
    uids: list[Any]
    rejected: list[bool] | None = None
    client: str | None = None
    iteration: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict."""
        return asdict(self)
