"""The loader's lineage hook: the tiny JSON *run record* of a run (:func:`run_record`,
``Loader.run_record()``) or of one epoch's plan (:func:`plan_record`, a served iteration's).

Everything that reads records (trace, index, join, diff) lives in :mod:`datamill.lineage`; the
loader only writes them.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.core.source import uid_column_of
from datamill.loader.mix import Mix

__all__ = [
    "RUN_RECORD_FORMAT",
    "load_record",
    "plan_record",
    "rle_sizes",
    "run_record",
    "unrle_sizes",
]

RUN_RECORD_FORMAT = "datamill.run/1"
RLE_PAIRS = 64
"""Shard sizes with more runs than this are stored compressed in the record."""
I64 = NDArray[np.int64]


def rle_sizes(sizes: I64) -> list[list[int]] | dict[str, str]:
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


def unrle_sizes(pairs: Sequence[Sequence[int]] | Mapping[str, str]) -> I64:
    """The shard sizes of :func:`rle_sizes`' encoding."""
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
        >>> import pyarrow as pa
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
    rec: dict[str, Any] = {
        "format": RUN_RECORD_FORMAT,
        "dataset_fingerprint": svc.fingerprint(),
        "seed": svc.seed,
        "order": _order(svc),
        "uid_column": uid_column_of(source),
        "mix": _mix(source) if isinstance(source, Mix) else None,
        "buckets": None
        if svc.batching.bucket_by is None
        else {"bucket_by": svc.batching.bucket_by, "buckets": _buckets(svc.batching.buckets)},
        "filter": _name(svc.batching.filter),
        "transform": _name(svc.batching.transform),
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
    runs = _previous_runs(previous, rec) if previous is not None else []
    sizes, repls = _history_sizes(runs, run)
    run["elastic_batch_size"], run["elastic_replication"] = sizes, repls
    if not _continues(runs, run) and (not runs or runs[-1] != run):
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

    ``served`` (the iteration, its mode and journaled units; see :mod:`datamill.serve.trace`) is
    kept under ``"served"``; :class:`Tracer` maps the plan's batches to the served ranks or clients
    with it.
    """
    source = svc.source
    order = _order(svc)
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
        "filter": _name(svc.batching.filter),
        "transform": _name(svc.batching.transform),
        "refill": False,
        "runs": [run],
        "until": {"epoch": int(epoch), "batches_seen": int(batches_seen)},
        **({"served": dict(served)} if served is not None else {}),
    }


def _order(svc: Any) -> dict[str, Any]:
    """The record's ``order`` section: what the pure order of a service depends on."""
    return {
        "shuffle": svc.batching.shuffle,
        "window": svc.window,
        "drop_last": svc.batching.drop_last,
        "columns": svc.columns,
        "num_samples": svc.epoch_samples(),
        "shard_sizes": rle_sizes(svc.sizes),
    }


def _mix(source: Mix) -> dict[str, Any]:
    """The record's ``mix`` section (a Mix's schedule is rebuilt from it)."""
    return {
        "names": source.names,
        "weights": source.weights,
        "epoch_size": source.epoch_size,
        "source_column": source.source_column,
        "shard_sizes": [
            rle_sizes(np.asarray(s.shard_sizes(), dtype=np.int64)) for s in source.sources
        ],
    }


def _previous_runs(previous: Mapping[str, Any], rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of the record this one extends, which must be of the same dataset and order."""
    prev = load_record(previous)
    for key in ("dataset_fingerprint", "seed", "order", "mix", "buckets"):
        if prev[key] != rec[key]:
            raise ConfigError(
                f"the previous run record differs in {key!r}: {prev[key]!r} != {rec[key]!r}",
                hint="pass the record saved by the run this loader resumed",
            )
    return [dict(r) for r in prev["runs"]]


def _continues(runs: list[dict[str, Any]], run: dict[str, Any]) -> bool:
    """Whether ``run`` continues the last run (a record written again, or a plain resume of the
    same plan)."""
    if not runs:
        return False
    last = runs[-1]
    return (
        all(last.get(k) == run[k] for k in ("world_size", "replication", "batch_size"))
        and (last["epoch"], last["elastic"]) == (run["epoch"], run["elastic"])
        and last["batches_seen"] <= run["batches_seen"]
    )


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


def _buckets(buckets: Any) -> Any:
    """The bucket count, or the boundaries as a JSON list."""
    return buckets if isinstance(buckets, int) else [int(b) for b in buckets]
