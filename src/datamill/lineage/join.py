"""Several run records of one run, traced as one.

A run served as one iteration per epoch has one record per iteration (``GET
/api/v1/iterations/{id}/trace``); a trainer that saved ``Loader.run_record()`` at each restart has
several files too. :class:`RunTracer` answers the :class:`~datamill.lineage.trace.Tracer` queries
over all of them: a UID's batches in every record (each hit names its ``iteration``), a step
counted across the records (``global_step`` runs on from one record's epochs to the next's), and a
step of a given epoch from the record that covers that epoch.

The records must be of one run: the same dataset fingerprint, seed and order settings (world
size, batch size and serving mode may change between them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.core.source import Source
from datamill.lineage.trace import BatchTrace, Hit, Tracer

__all__ = ["RunTracer"]

SAME_RUN = ("dataset_fingerprint", "seed", "order")
"""Record fields that must agree for records to be joined."""

Record = Mapping[str, Any] | str | os.PathLike[str]


class RunTracer:
    """Trace queries over several records of one run (sorted by their first epoch).

    Args:
        records: run records (dicts or JSON paths), at least one.
        source: the dataset the run read. Defaults to ``None``.

    Raises:
        ConfigError: no record, or records of different runs (the differing field named).

    Examples:
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader
        >>> src = TableSource(pa.table({"x": list(range(8))}), shard_size=4)
        >>> epoch0, epoch1 = (Loader(src, 4, seed=1, epoch=e) for e in (0, 1))
        >>> seen = [b["x"].tolist() for b in epoch0] + [b["x"].tolist() for b in epoch1]
        >>> run = RunTracer([epoch1.run_record(), epoch0.run_record()])
        >>> x = seen[3][0]  # batches 0-1 are epoch 0, 2-3 epoch 1
        >>> hits = [(h.epoch, h.global_step) for h in run.find([x])]
        >>> hits == [(i // 2, i) for i, b in enumerate(seen) if x in b], len(hits)
        (True, 2)
        >>> run.batch(rank=0, step=3).samples == seen[3]
        True
    """

    def __init__(self, records: Sequence[Record], /, *, source: Source | None = None) -> None:
        if not records:
            raise ConfigError("no run record to trace", hint="give one record per iteration")
        tracers = [Tracer(r, source=source) for r in records]
        labels = [_label(t, r, i) for i, (t, r) in enumerate(zip(tracers, records))]
        first = tracers[0].record
        for i, t in enumerate(tracers[1:], start=1):
            for key in SAME_RUN:
                if t.record[key] != first[key]:
                    raise ConfigError(
                        f"record {labels[i]} is not of the same run as {labels[0]}: its {key} "
                        "differs",
                        hint="trace the iterations of one run together (same dataset, seed and "
                        "order settings)",
                    )
        order = sorted(range(len(tracers)), key=lambda i: (tracers[i].epochs().start, i))
        self.tracers = [tracers[i] for i in order]
        self.labels = [labels[i] for i in order]
        self.record = self.tracers[0].record
        self.source = source
        self.n = self.tracers[0].n
        self._offsets: list[int] | None = None

    # ----------------------------------------------------------------- the run's extent
    def epochs(self) -> range:
        """From the first record's first epoch to the last record's end."""
        return range(
            min(t.epochs().start for t in self.tracers), max(t.epochs().stop for t in self.tracers)
        )

    def _steps(self, t: Tracer) -> int:
        return sum(t.steps_in_epoch(e) for e in t.epochs())

    def offsets(self) -> list[int]:
        """Global step of each record's first step (the steps of the records before it)."""
        if self._offsets is None:
            counts = [self._steps(t) for t in self.tracers]
            self._offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        return self._offsets

    # ----------------------------------------------------------------- uids and rows
    def uid_values(self) -> pa.Array | None:
        """Every sample's UID (the records share the dataset)."""
        return self.tracers[0].uid_values()

    def samples_of(self, uids: Sequence[Any]) -> NDArray[np.int64]:
        """Sample numbers of ``uids`` (``-1``: unknown UID)."""
        return self.tracers[0].samples_of(uids)

    def uids_of(self, samples: NDArray[np.int64]) -> list[Any]:
        """UIDs of sample numbers."""
        return self.tracers[0].uids_of(samples)

    def rows(
        self, samples: Sequence[int] | NDArray[np.int64], *, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The rows of ``samples`` read from the source."""
        return self.tracers[0].rows(samples, columns=columns)

    def rejected(self, batch: BatchTrace, filter: Callable[[pa.Table], Any]) -> list[bool]:
        """Which samples of ``batch`` the filter rejected."""
        return self.tracers[0].rejected(batch, filter)

    # ----------------------------------------------------------------- queries
    def find(
        self,
        samples: Sequence[int] | NDArray[np.int64],
        *,
        epochs: Sequence[int] | None = None,
        uids: Sequence[Any] | None = None,
    ) -> list[Hit]:
        """Every batch of every record holding each sample (by sample, epoch, step, rank)."""
        s = np.asarray(samples, dtype=np.int64).reshape(-1)
        ulist = list(uids) if uids is not None else self.uids_of(s.clip(0))
        hits: list[Hit] = []
        for t, label, base in zip(self.tracers, self.labels, self.offsets()):
            mine = [e for e in t.epochs() if epochs is None or e in set(epochs)]
            if not mine:
                continue
            for h in t.find(s, epochs=mine, uids=ulist):
                hits.append(replace(h, iteration=label, global_step=h.global_step + base))
        hits.sort(key=lambda h: (h.sample, h.epoch, h.global_step, h.rank, h.client or ""))
        return hits

    def batch(
        self,
        *,
        rank: int | None = None,
        step: int,
        epoch: int | None = None,
        client: str | None = None,
    ) -> BatchTrace:
        """A batch: ``step`` of ``epoch`` from the record covering that epoch, or (``epoch=None``)
        ``step`` counted across the records.

        Raises:
            ConfigError: the epoch is in no record or in several, or the step is past the end.
        """
        if epoch is not None:
            holding = [i for i, t in enumerate(self.tracers) if epoch in t.epochs()]
            if len(holding) != 1:
                names = [self.labels[i] for i in holding]
                raise ConfigError(
                    f"epoch {epoch} is in {'no record' if not names else f'several: {names}'}; "
                    f"the records cover epochs {self.epochs().start}..{self.epochs().stop - 1}",
                    hint="give an epoch one record covers, or trace that record alone",
                )
            i = holding[0]
            b = self.tracers[i].batch(rank=rank, step=step, epoch=epoch, client=client)
            return replace(
                b, iteration=self.labels[i], global_step=b.global_step + self.offsets()[i]
            )
        left = int(step)
        for t, label, base in zip(self.tracers, self.labels, self.offsets()):
            count = self._steps(t)
            if left < count:
                b = t.batch(rank=rank, step=left, epoch=None, client=client)
                return replace(b, iteration=label, global_step=b.global_step + base)
            left -= count
        raise ConfigError(
            f"step {step} is past the run's end ({int(step) - left} steps in these records)",
            hint="count steps from the first record's first epoch, or give --epoch",
        )


def _label(tracer: Tracer, record: Record, index: int) -> str:
    """The record's iteration id (served), its file, else its place in the list."""
    served = tracer.record.get("served") or {}
    if served.get("iteration"):
        return str(served["iteration"])
    if not isinstance(record, Mapping):
        return os.fspath(record)
    return f"record {index + 1}"
