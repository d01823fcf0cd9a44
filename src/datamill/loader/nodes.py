"""The Loader's batch stream as small stateful stages, composed (``torchdata.nodes`` style).

Each stage wraps the one before it (its ``source``), has :meth:`Stage.next`, and owns some fields
of the Loader's one flat resume state: :meth:`Stage.state_dict` returns its source's fields updated
with its own, :meth:`Stage.load_state_dict` takes its fields and passes the state on, and
:meth:`Stage.check` compares the saved settings it owns with its own. A stage's fields sit in the
same JSON object as the others' (``{"batches_seen": 3, "skip": 2, "counts": {...}}``), so composing
stages never nests the format: a state saved before the stages existed loads unchanged.

A :class:`~datamill.loader.Loader` is one of these chains::

    Positions (batches_seen, counts) -> DropEmpty                         (no refill)
    Positions (batches_seen, counts) -> Refilled (skip) -> Collated       (refill)

What is *not* a stage over finished batches, and why (see ``docs/architecture.md``): the length
buckets are a permutation of the epoch plan (``BatchService.plan``), and the filter and transform
run where the batch is built (the service's worker threads), because the server builds any rank's
batch ``k`` alone through the same service: a stage that regrouped or dropped samples across
finished batches would make batch ``k`` depend on the batches before it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from datamill.core.checks import check_int
from datamill.core.errors import ResumeStateError
from datamill.core.state import check_resume_compat
from datamill.loader.accounting import Accounting, BatchResult
from datamill.loader.refill import Refill

__all__ = [
    "COUNTED",
    "Collated",
    "DropEmpty",
    "Positions",
    "Refilled",
    "Stage",
    "WeakMethod",
    "compose",
]

COUNTED = ("read", "filtered", "failed", "yielded")
"""The epoch's counts a resume state carries."""


class Stage:
    """A stage of the batch stream: ``next()``, and its fields of the flat resume state.

    Subclasses implement :meth:`next` and, when they own fields, extend the other methods (calling
    the source's). The base class owns ``__iter__``/``__next__`` and the forwarding.
    """

    source: Stage | None = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self) -> Any:
        """The next item; ``StopIteration`` at the end of the epoch."""
        raise NotImplementedError

    def begin(self, total: int) -> None:
        """Start (or restart) iterating the epoch's position batches up to ``total``."""
        if self.source is not None:
            self.source.begin(total)

    def rewind(self) -> None:
        """Go back to the start of an epoch (the finished epoch's counts stay for ``stats()``)."""
        if self.source is not None:
            self.source.rewind()

    def close(self) -> None:
        """Stop building batches (a consumer stopped early)."""
        if self.source is not None:
            self.source.close()

    def state_dict(self) -> dict[str, Any]:
        """The position fields of the resume state, this stage's own included."""
        return self.source.state_dict() if self.source is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from the position fields of ``state`` (a checked resume state of this rank)."""
        if self.source is not None:
            self.source.load_state_dict(state)

    def check(self, state: Mapping[str, Any], *, allow_mismatch: Sequence[str] = ()) -> None:
        """Raise :class:`ResumeStateError` if ``state`` was saved with other settings of this
        stage."""
        if self.source is not None:
            self.source.check(state, allow_mismatch=allow_mismatch)


class WeakMethod:
    """A bound method called through a weak reference to its object, which pickles as the method.

    A stage that keeps its owner's method (a Loader's ``iter_batches``) would make a cycle with
    the owner that keeps it: the owner, and with it its worker processes and shards, would then
    outlive the user's last reference until Python's garbage collector next ran. An iteration
    keeps the owner alive by itself (its generator refers to it), so the reference is never dead
    while the stage builds.

    Examples:
        >>> class Owner:
        ...     def build(self, n): return n + 1
        >>> owner = Owner(); call = WeakMethod(owner.build)
        >>> call(1)
        2
        >>> del owner; call(1)
        Traceback (most recent call last):
        ...
        ReferenceError: the object of build is gone
    """

    def __init__(self, method: Callable[..., Any]) -> None:
        self._ref = weakref.WeakMethod(method)
        self._name = getattr(method, "__name__", "the method")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        method = self._ref()
        if method is None:
            raise ReferenceError(f"the object of {self._name} is gone")
        return method(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # a pickled stage takes its owner along (a copy of a Loader pickles its stages with it)
        return (WeakMethod, (self._ref(),))


class Positions(Stage):
    """The source stage: the rank's position batches of the epoch, built by ``build``, counted.

    Owns ``batches_seen`` (the next position batch) and ``counts`` (the epoch's read, filtered,
    failed and yielded samples before it).

    Args:
        build: builds the given batch numbers of the current epoch, in order
            (:meth:`Loader.iter_batches <datamill.loader.Loader.iter_batches>`).
        accounting: a fresh :class:`~datamill.loader.accounting.Accounting`.
        observe: called with every batch result as it arrives (progress, timing).
            Defaults to ``None``.
    """

    def __init__(
        self,
        build: Callable[[range], Generator[BatchResult, None, None]],
        accounting: Callable[[], Accounting],
        *,
        observe: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self._build, self._accounting, self.observe = build, accounting, observe
        self.batches_seen = 0
        self.acc = accounting()
        self.before: dict[str, int] = self.acc.as_dict()  # the counts before the latest batch
        self._results: Generator[BatchResult, None, None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_results"] = state["observe"] = None  # a generator and a closure do not pickle
        return state

    def next(self) -> BatchResult:
        if self._results is None:
            raise StopIteration
        res = next(self._results)
        self.before = self.acc.as_dict()
        self.acc.add(res)
        self.batches_seen = res.batch + 1
        if self.observe is not None:
            self.observe(res)
        return res

    def begin(self, total: int) -> None:
        self.close()
        self._results = self._build(range(self.batches_seen, total))

    def rewind(self) -> None:
        self.close()
        self.batches_seen = 0

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None

    def new_counts(self, counts: Mapping[str, int] | None = None) -> None:
        """Start the epoch's accounting again, from ``counts`` (zeros by default)."""
        self.acc = self._accounting()
        for k in COUNTED:
            setattr(self.acc, k, int((counts or {}).get(k, 0)))
        self.before = self.acc.as_dict()

    def state_dict(self) -> dict[str, Any]:
        counts = self.acc.as_dict()
        at_start = self.batches_seen == 0  # nothing of the epoch consumed: its counts are zero
        return {
            "batches_seen": self.batches_seen,
            "counts": {k: 0 if at_start else int(counts[k]) for k in COUNTED},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.close()
        self.batches_seen = int(state.get("batches_seen", 0))
        counts = state.get("counts") or {}
        if not isinstance(counts, Mapping):
            raise ResumeStateError(
                f"resume state field 'counts' must map names to ints >= 0, got {counts!r}"
            )
        for v in counts.values():
            check_int(
                v,
                name="a count of resume state field 'counts'",
                low=0,
                high=None,
                error=ResumeStateError,
            )
        self.new_counts(counts)


def _skip_of(state: Mapping[str, Any]) -> int:
    return check_int(
        state.get("skip", 0),
        name="resume state field 'skip'",
        low=0,
        high=None,
        error=ResumeStateError,
    )


def _check_refill(state: Mapping[str, Any], *, refill: bool, allow_mismatch: Sequence[str]) -> None:
    cfg = state.get("config", {}) if isinstance(state, Mapping) else {}
    saved = bool(cfg.get("refill", False)) if isinstance(cfg, Mapping) else False
    check_resume_compat(
        {"refill": saved},
        {"refill": refill},
        fields=("refill",),
        allow_mismatch=allow_mismatch,
        hint="resume with the same refill setting",
    )


class DropEmpty(Stage):
    """The batches as built, less those the filter left empty (a batch is its positions)."""

    def __init__(self, source: Positions) -> None:
        self.source = source

    def next(self) -> Any:
        assert self.source is not None
        while True:
            res = self.source.next()
            if res.output is not None:
                return res.output

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        skip = _skip_of(state)
        if skip:
            raise ResumeStateError(
                f"resume state field 'skip' must be 0 without refill, got {skip!r}"
            )
        super().load_state_dict(state)

    def check(self, state: Mapping[str, Any], *, allow_mismatch: Sequence[str] = ()) -> None:
        _check_refill(state, refill=False, allow_mismatch=allow_mismatch)
        super().check(state, allow_mismatch=allow_mismatch)


class Refilled(Stage):
    """The passing samples cut into tables of exactly ``batch_size`` rows.

    :mod:`datamill.loader.refill` holds the rows not yet emitted.

    Owns ``skip`` (rows of position batch ``batches_seen`` already emitted) and moves
    ``batches_seen``/``counts`` back to where the rows not yet emitted start, so a resumed loader
    rebuilds that batch, drops ``skip`` rows and continues. Records ``config.refill``.

    Args:
        source: the position batches (collated to ``pa.Table``).
        batch_size: rows per emitted table.
        drop_last: drop the short last table of the epoch.
    """

    def __init__(self, source: Positions, batch_size: int, *, drop_last: bool) -> None:
        self.source: Positions = source
        self.batch_size, self.drop_last = int(batch_size), bool(drop_last)
        self._seen, self._skip = 0, 0
        self._counts: dict[str, int] | None = None  # counts before the resume point (None: current)
        self._buf = Refill(self.batch_size)
        self._ended = False

    def next(self) -> pa.Table:
        while True:
            if self._buf.ready():
                out = self._buf.pop()
                self._point()
                return out
            if self._ended:
                raise StopIteration
            try:
                res = self.source.next()
            except StopIteration:
                self._ended = True
                rest = self._buf.flush()
                self._seen, self._skip, self._counts = self.source.batches_seen, 0, None
                if rest is not None and not self.drop_last:
                    return rest
                raise
            self._buf.push(
                res.batch, res.output if res.output is not None else res.empty, self.source.before
            )
            self._point()

    def _point(self) -> None:
        self._seen, self._skip = self._buf.resume_point(self.source.batches_seen)
        self._counts = self._buf.counts_at(self.source.acc.as_dict())

    def begin(self, total: int) -> None:
        # rows kept but not emitted are built again from the resume point
        self._buf, self._ended = Refill(self.batch_size, skip=self._skip), False
        self.source.batches_seen = self._seen
        super().begin(total)

    def rewind(self) -> None:
        self._seen, self._skip, self._counts = 0, 0, None
        super().rewind()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        counts = self._counts if self._counts is not None else self.source.acc.as_dict()
        at_start = self._seen == 0 and self._skip == 0
        state.update(
            batches_seen=self._seen,
            skip=self._skip,
            counts={k: 0 if at_start else int(counts[k]) for k in COUNTED},
            config={"refill": True},
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        skip = _skip_of(state)
        super().load_state_dict(state)
        self._seen, self._skip, self._counts = self.source.batches_seen, skip, None

    def check(self, state: Mapping[str, Any], *, allow_mismatch: Sequence[str] = ()) -> None:
        _check_refill(state, refill=True, allow_mismatch=allow_mismatch)
        super().check(state, allow_mismatch=allow_mismatch)


class Collated(Stage):
    """Each item passed through ``collate`` (the refilled tables, collated after cutting)."""

    def __init__(self, source: Stage, collate: Callable[[pa.Table], Any]) -> None:
        self.source, self.collate = source, collate

    def next(self) -> Any:
        assert self.source is not None
        return self.collate(self.source.next())


def compose(
    positions: Positions,
    *,
    refill: bool,
    batch_size: int,
    drop_last: bool,
    collate: Callable[[pa.Table], Any],
) -> Stage:
    """The Loader's chain over ``positions``: refilled then collated, or the non-empty batches.

    Without refill the position batches are collated where they are built (the service's
    collate); with refill they are built as ``pa.Table`` and ``collate`` runs after the cut.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader.options import Batching
        >>> from datamill.loader.service import BatchService
        >>> src = TableSource(pa.table({"x": list(range(6))}), shard_size=3)
        >>> svc = BatchService(src, batch_size=4, batching=Batching(shuffle=False), collate="arrow")
        >>> pos = Positions(lambda r: svc.build(0, 0, r), svc.accounting)
        >>> rows = lambda t: t["x"].to_pylist()
        >>> stream = compose(pos, refill=True, batch_size=4, drop_last=False, collate=rows)
        >>> stream.begin(svc.num_batches(0))
        >>> next(stream), stream.state_dict()["batches_seen"], list(stream)
        ([0, 1, 2, 3], 1, [[4, 5]])
    """
    if refill:
        return Collated(Refilled(positions, batch_size, drop_last=drop_last), collate)
    return DropEmpty(positions)
