"""Lineage from the pure order: which steps read sample X, and which samples step S read.

A run's order is a pure function of (shard sizes, seed, epoch, settings, world size, batch size and
the elastic history), so a tiny JSON *run record* (:func:`run_record`, ``Loader.run_record()``)
answers both questions without logging a single sample:

* :func:`trace` with ``uids=`` (or ``samples=``): every ``(epoch, rank, step, position in batch)``
  that yielded each sample;
* :func:`trace` with ``steps=``: the samples of rank ``R``'s batch at step ``S`` (of epoch ``E``,
  or counted from the start of the record).

A record lists the *runs* that make up the training run (a run: one Loader configuration, started
fresh or resumed, possibly elastically, with another world size or batch size), and where the
latest one was when the record was written (``until``). A step of an epoch counts the position
batches of the run's ranks in lockstep: after an elastic resize, the new segment's batch ``b`` is
step ``offset + b``, where ``offset`` is the number of batches the ranks had taken before.

Filters: a batch is a fixed range of positions and a filter only removes rows from it, so trace
reports the samples that *would have been* in the batch; given the source and the filter it also
says which of them the filter rejected (``rejected``). ``refill=True`` runs re-cut batches after
filtering and are not traceable by position (:class:`~datamill.core.errors.ConfigError`).

A served iteration's record (``GET /api/v1/iterations/{id}/trace``, :func:`plan_record` plus a
``served`` section) is traced the same way; in dynamic mode (or static mode resumed over another
world size) its steps are the journaled ones: ``Hit.client`` names the client, and
:meth:`Tracer.batch` takes ``client=`` (see :mod:`datamill.serve.trace`).

The per-epoch index (:mod:`datamill.lineage.index`, ``O(shards)`` numbers) is built on first
use and stored beside the record (``RECORD.index/``), so later queries replay one shuffle window.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.core.io import atomic_write
from datamill.core.source import Source, take_rows
from datamill.lineage.plan import RecordPlan
from datamill.lineage.record import BatchTrace, Hit, load_record
from datamill.lineage.unitmap import UnitMap

__all__ = ["BatchTrace", "Hit", "Tracer", "load_record", "trace"]

I64 = NDArray[np.int64]


class Tracer(RecordPlan):
    """Answers trace queries for one run record (indexes per epoch are cached in memory and on
    disk).

    Args:
        record: a run record (dict) or the path of its JSON file.
        source: the dataset the run read (for UIDs from a ``uid`` column, length buckets, filters
            and rows); must have the record's fingerprint. Defaults to ``None``.
        index_dir: where the per-epoch indexes are kept. Defaults to ``None`` (``RECORD.index``
            beside a record file; in memory only for a dict).
    """

    # ----------------------------------------------------------------- uids
    def uid_values(self) -> pa.Array | None:
        """Every sample's UID (the ``uid_column``), or ``None`` when UIDs are sample indices."""
        col = self.record.get("uid_column")
        if col is None:
            return None
        if self._uids is None:
            path = None if self.index_dir is None else self.index_dir / "uids.arrow"
            if path is not None and path.exists():
                with pa.memory_map(str(path)) as mm:
                    self._uids = pa.ipc.open_file(mm).read_all().column(0).combine_chunks()
            else:
                if self.source is None:
                    raise ConfigError(
                        f"this dataset identifies samples by {col!r}; trace needs it once to index "
                        "the UIDs",
                        hint="pass source= (CLI: --source PATH), or trace sample numbers",
                    )
                cols = [
                    self.source.read_shard(k, columns=[col]).column(0)
                    for k in range(len(self.sizes))
                ]
                typ = cols[0].type if cols else pa.null()
                self._uids = pa.chunked_array(
                    [c for x in cols for c in x.chunks], type=typ
                ).combine_chunks()
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    table = pa.table({col: self._uids})
                    with atomic_write(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                        w.write_table(table)
        return self._uids

    def samples_of(self, uids: Sequence[Any]) -> I64:
        """Sample numbers of ``uids`` (``-1``: unknown UID)."""
        values = self.uid_values()
        if values is None:
            return np.asarray([int(u) for u in uids], dtype=np.int64)
        found = pc.index_in(pa.array(list(uids), type=values.type), value_set=values)
        return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)

    def uids_of(self, samples: I64) -> list[Any]:
        """UIDs of sample numbers (``None`` each when the UIDs are a column not indexed yet and no
        source is given)."""
        if (
            self.record.get("uid_column") is not None
            and self._uids is None
            and self.source is None
            and (self.index_dir is None or not (self.index_dir / "uids.arrow").exists())
        ):
            return [None] * len(samples)
        values = self.uid_values()
        if values is None:
            return [int(s) for s in samples]
        out: list[Any] = values.take(pa.array(np.asarray(samples, dtype=np.int64))).to_pylist()
        return out

    # ----------------------------------------------------------------- queries
    def find(
        self,
        samples: Sequence[int] | I64,
        *,
        epochs: Sequence[int] | None = None,
        uids: Sequence[Any] | None = None,
    ) -> list[Hit]:
        """Every batch holding each sample (sorted by sample, epoch, step, rank)."""
        s = np.asarray(samples, dtype=np.int64).reshape(-1)
        ulist = list(uids) if uids is not None else self.uids_of(s.clip(0))
        hits: list[Hit] = []
        bucketed = self.record.get("buckets") is not None
        for e in self.epochs() if epochs is None else epochs:
            order = self.order(int(e))
            pos, which = order.where(s)
            lay, cut = self.layout(int(e))
            seg_of, d_of, j_of = lay.locate(pos)
            base = self._global_base(int(e))
            for p, q, k, d, j in zip(
                pos.tolist(), which.tolist(), seg_of.tolist(), d_of.tolist(), j_of.tolist()
            ):
                if k < 0:
                    continue
                seg = lay.segments[k]
                final = k == len(lay.segments) - 1
                if final:
                    if bucketed:
                        j = int(self._bucket_perm(int(e), d)[1][j])
                    if j >= self._final_len(lay, d) or (
                        cut is not None and j // seg.batch_size >= cut
                    ):
                        continue
                b = j // seg.batch_size
                if self.remapped:
                    hit = self._served_hit(ulist[q], int(s[q]), int(e), d, b, j % seg.batch_size)
                    if hit is not None:
                        hits.append(hit)
                    continue
                k_b = seg.replication_at(b)
                for r in range(d * k_b, (d + 1) * k_b):
                    hits.append(
                        Hit(
                            ulist[q],
                            int(s[q]),
                            int(e),
                            r,
                            seg.step_offset + b,
                            base + seg.step_offset + b,
                            b,
                            j % seg.batch_size,
                            k,
                        )
                    )
        hits.sort(key=lambda h: (h.sample, h.epoch, h.step, h.rank))
        return hits

    def batch(
        self,
        *,
        rank: int | None = None,
        step: int,
        epoch: int | None = None,
        client: str | None = None,
    ) -> BatchTrace:
        """The samples of rank ``rank``'s batch at ``step`` of ``epoch`` (``None``: ``step`` counts
        from the record's first epoch).

        A served dynamic iteration's steps are per client: give ``client`` (its ``k``-th
        acknowledged batch is its step ``k``) instead of ``rank``.

        Raises:
            ConfigError: the step is past the record's end, or the rank is not in the step's world.
        """
        if self.remapped:
            return self._served_batch(rank=rank, step=step, client=client)
        if rank is None:
            raise ConfigError("a step needs its rank", hint="give rank= (CLI: --rank R)")
        epoch, step = self._epoch_step(epoch, step)
        lay, cut = self.layout(epoch)
        k = max(i for i, sg in enumerate(lay.segments) if sg.step_offset <= step)
        seg = lay.segments[k]
        b = step - seg.step_offset
        k_b = seg.replication_at(b)
        if not 0 <= rank < seg.data_world * k_b:
            raise ConfigError(
                f"rank {rank} is not a rank of epoch {epoch} step {step} "
                f"(world size {seg.data_world * k_b})"
            )
        d = rank // k_b
        final = k == len(lay.segments) - 1
        lim = self._final_len(lay, d) if final else min(int(seg.consumed[d]), lay.part_len(k, d))  # type: ignore[index]  # consumed is set for non-final segments
        if final and cut is not None and b >= cut:
            raise ConfigError(
                f"step {step} of epoch {epoch} had not run when the record was written (it ends at "
                f"batch {cut} of the epoch's last segment)",
                hint="save a newer run record",
            )
        js = np.arange(b * seg.batch_size, min(lim, (b + 1) * seg.batch_size), dtype=np.int64)
        if final and self.record.get("buckets") is not None:
            js = self._bucket_perm(epoch, d)[0][js]
        samples = self.order(epoch).at(lay.part(k, d, js)) if len(js) else np.zeros(0, np.int64)
        return BatchTrace(
            epoch,
            rank,
            step,
            self._global_base(epoch) + step,
            b,
            k,
            samples.tolist(),
            self.uids_of(samples),
        )

    def _epoch_step(self, epoch: int | None, step: int) -> tuple[int, int]:
        """``(epoch, step in it)`` of a step (counted from the record's first epoch when ``epoch``
        is ``None``), checked to be in the record."""
        if epoch is None:
            epoch, left = int(self.runs[0]["epoch"]), int(step)
            while epoch in self.epochs() and left >= self.steps_in_epoch(epoch):
                left -= self.steps_in_epoch(epoch)
                epoch += 1
            step = left
        if epoch not in self.epochs() or not 0 <= step < self.steps_in_epoch(epoch):
            raise ConfigError(
                f"step {step} of epoch {epoch} is not in this record (epochs "
                f"{self.epochs().start}..{self.epochs().stop - 1})",
                hint="check --epoch/--step against the run",
            )
        return epoch, step

    # ----------------------------------------------------------------- served iterations
    @property
    def remapped(self) -> bool:
        """Whether the record is a served iteration whose ranks and steps are not the plan's
        (dynamic mode, or static mode resumed with another world size): steps come from the
        journaled units."""
        sv = self.served
        return sv is not None and (sv.get("mode") == "dynamic" or sv.get("queues") is not None)

    def unit_map(self) -> UnitMap:
        """Unit -> (queue or client, step) of a served iteration (see :func:`served_record`)."""
        if self._umap is None:
            assert self.served is not None
            self._umap = UnitMap(self.served)
        return self._umap

    def _served_hit(
        self, uid: Any, sample: int, epoch: int, d: int, b: int, position: int
    ) -> Hit | None:
        m = self.unit_map()
        u = int(m.offsets[d]) + b
        if not 0 <= u < len(m.who) or m.who[u] < 0:
            return None  # not served by this iteration (done before it, or not acknowledged)
        step = int(m.step[u])
        if m.clients is not None:
            return Hit(
                uid, sample, epoch, d, step, step, b, position, 0, client=m.clients[int(m.who[u])]
            )
        return Hit(uid, sample, epoch, int(m.who[u]), step, step, b, position, 0)

    def _served_batch(self, *, rank: int | None, step: int, client: str | None) -> BatchTrace:
        m = self.unit_map()
        key: Any = client if m.clients is not None else rank
        units = m.units.get(key)
        if units is None:
            what = f"client {client!r}" if m.clients is not None else f"rank {rank}"
            known = list(m.units)[:20]
            raise ConfigError(
                f"{what} has no batch in this served iteration; known: {known}",
                hint="dynamic iterations: give --client C (see the record's served.acks); "
                "static: --rank R",
            )
        if not 0 <= step < len(units):
            raise ConfigError(
                f"step {step} is not in this served iteration ({len(units)} steps for "
                f"{'client ' + str(client) if m.clients is not None else 'rank ' + str(rank)})",
                hint="check --step against the run",
            )
        u = int(units[step])
        d = int(np.searchsorted(m.offsets, u, side="right") - 1)
        epoch = int(self.runs[-1]["epoch"])
        inner = self._plan_batch(epoch, d, u - int(m.offsets[d]))
        return BatchTrace(
            epoch,
            d if m.clients is not None else int(rank or 0),
            step,
            step,
            u - int(m.offsets[d]),
            0,
            inner.tolist(),
            self.uids_of(inner),
            client=client,
        )

    def _plan_batch(self, epoch: int, d: int, b: int) -> I64:
        lay, _ = self.layout(epoch)
        seg = lay.segments[-1]
        lim = self._final_len(lay, d)
        js = np.arange(b * seg.batch_size, min(lim, (b + 1) * seg.batch_size), dtype=np.int64)
        out: I64 = (
            self.order(epoch).at(lay.part(len(lay.segments) - 1, d, js))
            if len(js)
            else np.zeros(0, np.int64)
        )
        return out

    # ----------------------------------------------------------------- rows and filters
    def rows(
        self, samples: Sequence[int] | I64, *, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The rows of ``samples`` (in that order) read from the source."""
        if self.source is None:
            raise ConfigError(
                "reading rows needs the dataset", hint="pass source= (CLI: --source PATH)"
            )
        cols = list(columns) if columns is not None else self.record["order"]["columns"]
        return take_rows(self.source, samples, cols)

    def rejected(self, batch: BatchTrace, filter: Callable[[pa.Table], Any]) -> list[bool]:
        """Which samples of ``batch`` the filter rejected (evaluated on the batch, as the loader
        does)."""
        table = self.rows(batch.samples)
        keep = filter(table) if table.num_rows else np.zeros(0, dtype=bool)
        if isinstance(keep, (pa.Array, pa.ChunkedArray)):
            keep = keep.to_numpy(zero_copy_only=False)
        return [not bool(k) for k in np.asarray(keep)]


def trace(
    record: Mapping[str, Any] | str | os.PathLike[str],
    /,
    *,
    uids: Sequence[Any] | Any = None,
    samples: Sequence[int] | int | None = None,
    steps: Sequence[tuple[int | None, int, int]] | tuple[int | None, int, int] | None = None,
    epochs: Sequence[int] | None = None,
    source: Source | None = None,
    filter: Callable[[pa.Table], Any] | None = None,
    index_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Trace samples to batches and batches to samples from a run record.

    Args:
        record: the run record (dict or JSON path); several records of one run (one per served
            iteration or restart): :class:`~datamill.lineage.join.RunTracer`.
        uids: UID(s) to trace (values of the dataset's ``uid`` column, else sample numbers).
            Defaults to ``None``.
        samples: sample number(s) (rows of the dataset in shard order) to trace. Defaults to
            ``None``.
        steps: ``(epoch, rank, step)`` tuple(s); ``epoch=None`` counts ``step`` from the record's
            first epoch. Defaults to ``None``.
        epochs: epochs searched for ``uids``/``samples``. Defaults to ``None`` (the record's).
        source: the dataset the run read (UID columns, buckets, filters). Defaults to ``None``.
        filter: the run's filter, to mark the samples it rejected (needs ``source``). Defaults to
            ``None``.
        index_dir: where per-epoch indexes are kept. Defaults to ``None`` (beside a record file).

    Returns:
        ``{"hits": [Hit, ...], "batches": [BatchTrace, ...]}``.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader
        >>> loader = Loader(TableSource(pa.table({"x": list(range(10))}), shard_size=4), 4, seed=3)
        >>> seen = [b["x"].tolist() for b in loader]
        >>> out = trace(loader.run_record(), samples=seen[1][2], steps=(0, 0, 2))
        >>> h = out["hits"][0]
        >>> (h.epoch, h.rank, h.step, h.position), out["batches"][0].samples == seen[2]
        ((0, 0, 1, 2), True)
    """
    tracer = Tracer(record, source=source, index_dir=index_dir)
    hits: list[Hit] = []
    if uids is not None:
        ulist = list(uids) if isinstance(uids, (list, tuple, np.ndarray)) else [uids]
        s = tracer.samples_of(ulist)
        hits += tracer.find(s[s >= 0], epochs=epochs, uids=[u for u, x in zip(ulist, s) if x >= 0])
    if samples is not None:
        hits += tracer.find(np.asarray(samples, dtype=np.int64).reshape(-1), epochs=epochs)
    batches: list[BatchTrace] = []
    if steps is not None:
        many: list[Any] = (
            [steps] if isinstance(steps, tuple) and not isinstance(steps[0], tuple) else list(steps)
        )
        for e, r, st in many:
            batches.append(
                tracer.batch(rank=int(r), step=int(st), epoch=None if e is None else int(e))
            )
    if filter is not None:
        if source is None:
            raise ConfigError("evaluating the filter needs the dataset", hint="pass source=")
        batches = [
            BatchTrace(**{**b.as_dict(), "rejected": tracer.rejected(b, filter)}) for b in batches
        ]
        out = []
        for h in hits:
            b = tracer.batch(rank=h.rank, step=h.step, epoch=h.epoch)
            out.append(Hit(**{**h.as_dict(), "rejected": tracer.rejected(b, filter)[h.position]}))
        hits = out
    return {"hits": hits, "batches": batches}
