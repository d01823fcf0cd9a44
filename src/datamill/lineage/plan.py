"""The plan a run record describes: per epoch, the global order (its index, built once and kept
beside the record), the segments of the runs (elastic resizes, world and batch sizes) and the
length buckets; :class:`RecordPlan` is the base of :class:`~datamill.lineage.trace.Tracer`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.core.io import atomic_write
from datamill.core.rng import rng_for
from datamill.core.source import Source
from datamill.lineage.index import (
    ArangeIndex,
    EpochIndex,
    Layout,
    Segment,
    SequenceIndex,
    ShardOrderIndex,
)
from datamill.lineage.record import load_record
from datamill.lineage.unitmap import Shapes, UnitMap
from datamill.loader.buckets import bucket_arrange, bucket_boundaries, sample_lengths
from datamill.loader.mix import Mix
from datamill.loader.record import unrle_sizes

__all__ = ["RecordPlan"]

I64 = NDArray[np.int64]


class RecordPlan:
    """A run record's plan: each epoch's order, its segments (runs, elastic resizes) and buckets
    (indexes per epoch cached in memory and on disk); :class:`~datamill.lineage.trace.Tracer`
    answers the queries on it.

    Args:
        record: a run record (dict) or the path of its JSON file.
        source: the dataset the run read (for UIDs from a ``uid`` column, length buckets, filters
            and rows); must have the record's fingerprint. Defaults to ``None``.
        index_dir: where the per-epoch indexes are kept. Defaults to ``None`` (``RECORD.index``
            beside a record file; in memory only for a dict).
    """

    def __init__(
        self,
        record: Mapping[str, Any] | str | os.PathLike[str],
        *,
        source: Source | None = None,
        index_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.record = load_record(record)
        if self.record.get("refill"):
            raise ConfigError(
                "a refill=True run re-cuts batches after filtering; trace needs position batches",
                hint="trace runs without refill",
            )
        if index_dir is None and not isinstance(record, Mapping):
            index_dir = os.fspath(record) + ".index"
        self.index_dir = None if index_dir is None else Path(index_dir)
        o = self.record["order"]
        self.sizes = unrle_sizes(o["shard_sizes"])
        self.n, self.drop_last, self.seed = (
            int(o["num_samples"]),
            bool(o["drop_last"]),
            int(self.record["seed"]),
        )
        self.source = source
        if source is not None and source.fingerprint() != self.record["dataset_fingerprint"]:
            raise ConfigError(
                f"the source's fingerprint {source.fingerprint()} is not the record's "
                f"{self.record['dataset_fingerprint']}",
                hint="pass the dataset the run read",
            )
        self.runs = sorted(
            self.record["runs"], key=lambda r: (r["epoch"], len(r["elastic"]), r["batches_seen"])
        )
        self._orders: dict[int, EpochIndex] = {}
        self._layouts: dict[int, tuple[Layout, int | None]] = {}
        self._bucketed: dict[tuple[int, int], tuple[I64, I64]] = {}
        self._uids: pa.Array | None = None
        self._steps: dict[int, int] = {}
        self.served: dict[str, Any] | None = self.record.get("served")
        self._umap: UnitMap | None = None

    # ----------------------------------------------------------------- the epoch's order
    def order(self, epoch: int) -> EpochIndex:
        """The epoch's global order (its index built once, then loaded)."""
        idx = self._orders.get(epoch)
        if idx is not None:
            return idx
        o = self.record["order"]
        if self.record.get("mix") is not None:
            m = self.record["mix"]
            shapes: list[tuple[Any, float]] = [
                (Shapes(unrle_sizes(s)), float(w)) for s, w in zip(m["shard_sizes"], m["weights"])
            ]
            mix = Mix(
                shapes,
                epoch_size=int(m["epoch_size"]),
                names=m["names"],
                source_column=m["source_column"],
            )
            idx = SequenceIndex(
                mix.epoch_sequence(
                    seed=self.seed, epoch=epoch, shuffle=bool(o["shuffle"]), window=int(o["window"])
                )
            )
        elif not o["shuffle"]:
            idx = ArangeIndex(self.n)
        else:
            path = None if self.index_dir is None else self.index_dir / f"order-v2-{epoch}.npz"
            if path is not None and path.exists():
                idx = ShardOrderIndex.load(path)
            else:
                idx = ShardOrderIndex.build(
                    self.sizes, seed=self.seed, epoch=epoch, window=int(o["window"])
                )
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with atomic_write(path, "wb") as f:
                        idx.save(f)
        self._orders[epoch] = idx
        return idx

    def build_index(self, epochs: Sequence[int] | None = None) -> None:
        """Build (and store) the index of ``epochs`` (the record's by default) now."""
        for e in self.epochs() if epochs is None else epochs:
            self.order(int(e))

    # ----------------------------------------------------------------- runs -> segments
    def epochs(self) -> range:
        """The epochs the record covers (first run's epoch to ``until``'s, when it has started)."""
        until = self.record["until"]
        last = int(until["epoch"]) + (1 if self._started(int(until["epoch"])) else 0)
        return range(int(self.runs[0]["epoch"]), max(int(self.runs[0]["epoch"]), last))

    def _started(self, epoch: int) -> bool:
        until = self.record["until"]
        last = self._last_run(epoch)
        return int(until["batches_seen"]) > 0 or bool(
            last and last["epoch"] == epoch and last["elastic"]
        )

    def _last_run(self, epoch: int) -> dict[str, Any] | None:
        act = [r for r in self.runs if r["epoch"] <= epoch]
        return act[-1] if act else None

    def layout(self, epoch: int) -> tuple[Layout, int | None]:
        """The epoch's :class:`Layout` and the final segment's batch cut-off (``until``), or
        ``None``."""
        hit = self._layouts.get(epoch)
        if hit is not None:
            return hit
        last = self._last_run(epoch) or self.runs[0]
        hist = last["elastic"] if last["epoch"] == epoch else []
        sizes = last.get("elastic_batch_size") or [last["batch_size"]] * len(hist)
        repls = last.get("elastic_replication") or [1] * len(hist)
        segs, offset = [], 0
        for (w, cs), bs, k in zip(hist, sizes, repls):
            segs.append(Segment(int(w), tuple(int(c) for c in cs), int(bs), int(k), offset))
            offset += max([-(-int(c) // int(bs)) for c in cs], default=0)
        k = int(last["replication"])
        segs.append(
            Segment(
                int(last["world_size"]) // k,
                None,
                int(last["batch_size"]),
                k,
                offset,
                self._eras(epoch, last),
            )
        )
        until = self.record["until"]
        cut = int(until["batches_seen"]) if int(until["epoch"]) == epoch else None
        out = (Layout(self.n, segs, drop_last=self.drop_last), cut)
        self._layouts[epoch] = out
        return out

    def _eras(self, epoch: int, last: dict[str, Any]) -> tuple[tuple[int, int], ...]:
        """``(first batch, replication)`` of the runs that read the epoch's final plan, oldest
        first.

        A resume with the same data world size and batch size continues the plan (no elastic
        segment), possibly with another replication: its first batches were read by the run before.
        """
        act = [r for r in self.runs if r["epoch"] <= epoch]
        i = len(act) - 1
        hist = last["elastic"] if last["epoch"] == epoch else []
        eras = [
            (int(last["batches_seen"]) if last["epoch"] == epoch else 0, int(last["replication"]))
        ]
        while i > 0 and act[i]["epoch"] == epoch and int(act[i]["batches_seen"]) > 0:
            prev = act[i - 1]
            same = (
                int(prev["world_size"]) // int(prev["replication"])
                == int(last["world_size"]) // int(last["replication"])
                and int(prev["batch_size"]) == int(last["batch_size"])
                and (prev["elastic"] if prev["epoch"] == epoch else []) == hist
            )
            if not same:
                break
            eras.insert(
                0,
                (
                    int(prev["batches_seen"]) if prev["epoch"] == epoch else 0,
                    int(prev["replication"]),
                ),
            )
            i -= 1
        eras[0] = (0, eras[0][1])
        return tuple(eras)

    def _final_len(self, lay: Layout, d: int) -> int:
        seg = lay.segments[-1]
        length = lay.part_len(len(lay.segments) - 1, d)
        return length // seg.batch_size * seg.batch_size if self.drop_last else length

    def steps_in_epoch(self, epoch: int) -> int:
        """Lockstep steps of the whole epoch (the most batches any data rank has)."""
        if epoch not in self._steps:
            lay, _ = self.layout(epoch)
            seg = lay.segments[-1]
            most = max(-(-self._final_len(lay, d) // seg.batch_size) for d in range(seg.data_world))
            self._steps[epoch] = seg.step_offset + most
        return self._steps[epoch]

    def _global_base(self, epoch: int) -> int:
        return sum(self.steps_in_epoch(e) for e in range(int(self.runs[0]["epoch"]), epoch))

    # ----------------------------------------------------------------- buckets
    def _bucket_perm(self, epoch: int, d: int) -> tuple[I64, I64]:
        """(plan position -> part index, and back) of data rank ``d``'s bucketed final segment."""
        key = (epoch, d)
        if key not in self._bucketed:
            b = self.record["buckets"]
            lengths = self._lengths(str(b["bucket_by"]))
            bounds = bucket_boundaries(lengths, b["buckets"])
            lay, _ = self.layout(epoch)
            seg = lay.segments[-1]
            seq = self.order(epoch).at(lay.part(len(lay.segments) - 1, d))
            chunk = int(self.record["order"]["window"]) * max(
                1, int(self.sizes.mean()) if len(self.sizes) else 1
            )
            rng = rng_for(self.seed, "loader.buckets", epoch, d, seg.data_world)
            perm = bucket_arrange(
                lengths[seq], batch_size=seg.batch_size, chunk=chunk, boundaries=bounds, rng=rng
            )
            inv = np.empty_like(perm)
            inv[perm] = np.arange(len(perm), dtype=np.int64)
            self._bucketed[key] = (perm, inv)
        return self._bucketed[key]

    def _lengths(self, column: str) -> I64:
        path = None if self.index_dir is None else self.index_dir / "lengths.npy"
        if path is not None and path.exists():
            stored: I64 = np.load(path)
            return stored
        if self.source is None:
            raise ConfigError(
                f"this run batched by the length of {column!r}; trace needs the dataset once to "
                "index the lengths",
                hint="pass source= (CLI: --source PATH)",
            )
        lengths = sample_lengths(self.source, column)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(path, "wb") as f:
                np.save(f, lengths)
        return lengths
