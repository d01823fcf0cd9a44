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
:meth:`Tracer.batch` takes ``client=`` (see :mod:`datamill.serve.data.trace`).

The per-epoch index (:mod:`datamill.loader.trace_index`, ``O(shards)`` numbers) is built on first
use and stored beside the record (``RECORD.index/``), so later queries replay one shuffle window.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.core.io import atomic_write
from datamill.core.rng import rng_for
from datamill.core.source import Source, uid_column_of
from datamill.loader.buckets import bucket_arrange, bucket_boundaries, sample_lengths
from datamill.loader.mix import Mix
from datamill.loader.trace_index import (
    ArangeIndex,
    EpochIndex,
    Layout,
    Segment,
    SequenceIndex,
    ShardOrderIndex,
)

__all__ = [
    "RUN_RECORD_FORMAT",
    "BatchTrace",
    "Hit",
    "Tracer",
    "load_record",
    "plan_record",
    "run_record",
    "trace",
]

RUN_RECORD_FORMAT = "datamill.run/1"
RLE_PAIRS = 64
"""Shard sizes with more runs than this are stored compressed in the record."""
I64 = NDArray[np.int64]


def _rle(sizes: I64) -> list[list[int]] | dict[str, str]:
    """Run-length encoding ``[[size, count], ...]`` (equal shards: one pair); many different sizes
    are stored as ``{"int64_zlib_b64": ...}`` instead (a short string, fast to read)."""
    arr = np.asarray(sizes, dtype=np.int64)
    starts = np.flatnonzero(np.diff(arr, prepend=-1)) if len(arr) else np.zeros(0, np.int64)
    if len(starts) > RLE_PAIRS:
        return {
            "int64_zlib_b64": base64.b64encode(
                zlib.compress(arr.astype("<i8").tobytes(), 9)
            ).decode("ascii")
        }
    counts = np.diff(np.append(starts, len(arr)))
    return [[int(arr[i]), int(c)] for i, c in zip(starts, counts)]


def _unrle(pairs: Sequence[Sequence[int]] | Mapping[str, str]) -> I64:
    if isinstance(pairs, Mapping):
        raw = zlib.decompress(base64.b64decode(pairs["int64_zlib_b64"]))
        return np.frombuffer(raw, dtype="<i8").astype(np.int64)
    if not pairs:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(np.array([p[0] for p in pairs], dtype=np.int64), [int(p[1]) for p in pairs])


def _name(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


# long (68 lines): the record's fields in the order the format lists them, then the earlier runs
# joined in; one dict built in one place
def run_record(loader: Any, /, *, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run record of ``loader`` (a :class:`~datamill.loader.Loader`), extending ``previous``.

    Save it beside each checkpoint; when the run resumes, pass the saved record as ``previous`` so
    the new record keeps the earlier runs (their world and batch sizes: needed for exact steps after
    an elastic resize).

    Args:
        loader: the (rank 0) loader of the run.
        previous: the record saved by the run this one resumed. Defaults to ``None``.

    Returns:
        A JSON-able dict (format ``datamill.run/1``).

    Raises:
        ConfigError: ``previous`` is of another dataset or order settings.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader
        >>> loader = Loader(TableSource(pa.table({"x": list(range(10))}), shard_size=4), 4, seed=3)
        >>> _ = next(iter(loader))
        >>> rec = run_record(loader)
        >>> rec["order"]["shard_sizes"], rec["until"], rec["runs"][0]["batch_size"]
        ([[4, 2], [2, 1]], {'epoch': 0, 'batches_seen': 1}, 4)
    """
    svc = loader.service
    source = svc.source
    order = {
        "shuffle": svc.shuffle,
        "window": svc.window,
        "drop_last": svc.drop_last,
        "columns": svc.columns,
        "num_samples": svc.epoch_samples(),
        "shard_sizes": _rle(svc.sizes),
    }
    mix = None
    if isinstance(source, Mix):
        mix = {
            "names": source.names,
            "weights": source.weights,
            "epoch_size": source.epoch_size,
            "source_column": source.source_column,
            "shard_sizes": [
                _rle(np.asarray(s.shard_sizes(), dtype=np.int64)) for s in source.sources
            ],
        }
    rec: dict[str, Any] = {
        "format": RUN_RECORD_FORMAT,
        "dataset_fingerprint": svc.fingerprint(),
        "seed": svc.seed,
        "order": order,
        "uid_column": uid_column_of(source),
        "mix": mix,
        "buckets": None
        if svc.bucket_by is None
        else {"bucket_by": svc.bucket_by, "buckets": svc.buckets},
        "filter": _name(svc.filter),
        "transform": _name(svc.transform),
        "refill": bool(loader.refill),
    }
    start_epoch, start_batch, hist = getattr(loader, "_trace_start", (loader.epoch, 0, ()))
    run = {
        "epoch": int(start_epoch),
        "batches_seen": int(start_batch),
        "elastic": [[int(w), [int(c) for c in cs]] for w, cs in hist],
        "world_size": loader.world_size,
        "replication": loader.replication,
        "batch_size": svc.batch_size,
    }
    runs: list[dict[str, Any]] = []
    if previous is not None:
        prev = load_record(previous)
        for key in ("dataset_fingerprint", "seed", "order", "mix", "buckets"):
            if prev[key] != rec[key]:
                raise ConfigError(
                    f"the previous run record differs in {key!r}: {prev[key]!r} != {rec[key]!r}",
                    hint="pass the record saved by the run this loader resumed",
                )
        runs = [dict(r) for r in prev["runs"]]
    sizes, repls = _history_sizes(runs, run)
    run["elastic_batch_size"], run["elastic_replication"] = sizes, repls
    if (
        runs
        and all(runs[-1].get(k) == run[k] for k in ("world_size", "replication", "batch_size"))
        and (runs[-1]["epoch"], runs[-1]["elastic"]) == (run["epoch"], run["elastic"])
        and runs[-1]["batches_seen"] <= run["batches_seen"]
    ):
        pass  # the same run continues (a record written again, or a plain resume of the same plan)
    elif not runs or runs[-1] != run:
        runs.append(run)
    rec["runs"] = runs
    rec["until"] = {"epoch": int(loader.epoch), "batches_seen": int(loader._batches_seen)}
    return rec


def plan_record(
    svc: Any,
    *,
    epoch: int,
    world_size: int,
    batches_seen: int,
    served: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run record of one epoch's plan of a :class:`~datamill.loader.BatchService`
    (``world_size`` ranks of ``svc.batch_size``, no elastic history): what a served iteration's
    trace route answers.

    ``served`` (the iteration, its mode and journaled units; see :mod:`datamill.serve.data.trace`)
    is
    kept under ``"served"``; :class:`Tracer` maps the plan's batches to the served ranks or clients
    with it.
    """
    source = svc.source
    order = {
        "shuffle": svc.shuffle,
        "window": svc.window,
        "drop_last": svc.drop_last,
        "columns": svc.columns,
        "num_samples": svc.epoch_samples(),
        "shard_sizes": _rle(svc.sizes),
    }
    run = {
        "epoch": int(epoch),
        "batches_seen": 0,
        "elastic": [],
        "world_size": int(world_size),
        "replication": 1,
        "batch_size": int(svc.batch_size),
        "elastic_batch_size": [],
        "elastic_replication": [],
    }
    return {
        "format": RUN_RECORD_FORMAT,
        "dataset_fingerprint": svc.fingerprint(),
        "seed": svc.seed,
        "order": order,
        "uid_column": uid_column_of(source),
        "mix": None,
        "buckets": None,
        "filter": _name(svc.filter),
        "transform": _name(svc.transform),
        "refill": False,
        "runs": [run],
        "until": {"epoch": int(epoch), "batches_seen": int(batches_seen)},
        **({"served": dict(served)} if served is not None else {}),
    }


def _history_sizes(runs: list[dict[str, Any]], run: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Batch size and replication of each segment of ``run``'s elastic history, from the runs
    before."""
    hist = run["elastic"]
    if not hist:
        return [], []
    last = runs[-1] if runs else None
    if (
        last is not None
        and last["epoch"] == run["epoch"]
        and last["elastic"] == hist[: len(last["elastic"])]
    ):
        sizes, repls = (
            list(last.get("elastic_batch_size", [])),
            list(last.get("elastic_replication", [])),
        )
        if len(hist) > len(last["elastic"]):
            sizes.append(int(last["batch_size"]))
            repls.append(int(last["replication"]))
    elif last is not None and last["epoch"] < run["epoch"] and len(hist) == 1:
        sizes, repls = [int(last["batch_size"])], [int(last["replication"])]
    else:
        sizes, repls = [], []
    sizes += [int(run["batch_size"])] * (len(hist) - len(sizes))  # unknown: assume the current ones
    repls += [1] * (len(hist) - len(repls))
    return sizes, repls


def load_record(record: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """A run record from a dict or a JSON file, checked.

    Raises:
        ConfigError: not a ``datamill.run/1`` record (file named).
    """
    path = None
    if not isinstance(record, Mapping):
        path = os.fspath(record)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError as exc:
            raise ConfigError(
                "run record not found",
                path=path,
                hint="write one with json.dump(loader.run_record(), f)",
            ) from exc
        except (OSError, ValueError) as exc:
            raise ConfigError(f"run record is not readable JSON: {exc}", path=path) from exc
    if not isinstance(record, Mapping) or record.get("format") != RUN_RECORD_FORMAT:
        got = record.get("format") if isinstance(record, Mapping) else type(record).__name__
        raise ConfigError(
            f"expected a run record with format {RUN_RECORD_FORMAT!r}, got {got!r}",
            path=path,
            hint="pass the JSON written from Loader.run_record()",
        )
    missing = [
        k for k in ("dataset_fingerprint", "seed", "order", "runs", "until") if k not in record
    ]
    if missing or not record["runs"]:
        raise ConfigError(f"run record lacks {missing or ['runs']}", path=path)
    return dict(record)


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
    """Which record of several (:class:`~datamill.loader.trace_join.RunTracer`) the batch is in."""

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


class _Shapes:
    """A stand-in source with only shard sizes (to rebuild a Mix schedule from a record)."""

    def __init__(self, sizes: I64) -> None:
        self._sizes = sizes
        self.columns: list[str] = []

    def shard_sizes(self) -> I64:
        return self._sizes


class _UnitMap:
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


class Tracer:
    """Answers trace queries for one run record (indexes per epoch are cached in memory and on
    disk).

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
        self.sizes = _unrle(o["shard_sizes"])
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
        self._umap: _UnitMap | None = None

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
                (_Shapes(_unrle(s)), float(w)) for s, w in zip(m["shard_sizes"], m["weights"])
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
        if epoch is None:
            epoch, left = int(self.runs[0]["epoch"]), int(step)
            while epoch in self.epochs() and left >= self.steps_in_epoch(epoch):
                left -= self.steps_in_epoch(epoch)
                epoch += 1
            step = left
        if epoch not in self.epochs() or not 0 <= step < self.steps_in_epoch(epoch):
            raise ConfigError(
                f"step {step} of epoch {epoch} is not in this record (epochs "
                f"{self.epochs().start}.."
                f"{self.epochs().stop - 1})",
                hint="check --epoch/--step against the run",
            )
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

    # ----------------------------------------------------------------- served iterations
    @property
    def remapped(self) -> bool:
        """Whether the record is a served iteration whose ranks and steps are not the plan's
        (dynamic mode, or static mode resumed with another world size): steps come from the
        journaled units."""
        sv = self.served
        return sv is not None and (sv.get("mode") == "dynamic" or sv.get("queues") is not None)

    def unit_map(self) -> _UnitMap:
        """Unit -> (queue or client, step) of a served iteration (see :func:`served_record`)."""
        if self._umap is None:
            assert self.served is not None
            self._umap = _UnitMap(self.served)
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
        s = np.asarray(samples, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        shard = np.searchsorted(offsets, s, side="right") - 1
        cols = list(columns) if columns is not None else self.record["order"]["columns"]
        needed = np.unique(shard)
        tables = [self.source.read_shard(int(k), columns=cols) for k in needed]
        if not tables:
            return (
                self.source.read_shard(0, columns=cols).slice(0, 0)
                if len(self.sizes)
                else pa.table({})
            )
        base = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64)
        where = base[np.searchsorted(needed, shard)] + (s - offsets[shard])
        return (tables[0] if len(tables) == 1 else pa.concat_tables(tables)).take(pa.array(where))

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
            iteration or restart): :class:`~datamill.loader.trace_join.RunTracer`.
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
