"""Lineage of language-model batches: which documents (and which of their tokens) a packed
sequence of global step ``S`` holds.

A language-model run's record (:func:`lm_record`, ``LMLoader.run_record()``) holds its settings,
the schedule and the state it started from: the global steps after that are a pure function of
them, so :func:`trace_lm` replays the plan (lengths, filter and packing; no tokens gathered) from
the start to step ``S`` and lists, for each sequence of that global batch, its rank and its
document pieces ``(source, epoch, sample, start, length)`` (plus the source's uid when it has a
uid column). ``datamill trace RECORD --source PATH --step S [--rank R]`` prints the same.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from datamill.core.errors import ConfigError
from datamill.core.source import Source, uid_column_of
from datamill.loader.lm import LM_RECORD_FORMAT, LMLoader

__all__ = ["LM_RECORD_FORMAT", "is_lm_record", "lm_record", "trace_command", "trace_lm"]


def lm_record(loader: LMLoader, /, *, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run record of an :class:`~datamill.loader.lm.LMLoader` (keeps ``previous``'s start).

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader, Packing
        >>> src = TableSource(pa.table({"tokens": [[1, 2, 3], [4, 5], [6]] * 4}))
        >>> ld = Loader(src, 2, packing=Packing(seq_len=4, window=6))
        >>> _ = next(iter(ld))
        >>> rec = lm_record(ld)
        >>> rec["format"], rec["start"]["step"], rec["until"]["step"]
        ('datamill.lm-run/1', 0, 1)
    """
    return loader.run_record(previous=previous)


def is_lm_record(record: Any) -> bool:
    """Whether ``record`` (a dict or a JSON file path) is a language-model run record."""
    if not isinstance(record, Mapping):
        try:
            with open(os.fspath(record), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError, TypeError):
            return False
    return isinstance(record, Mapping) and record.get("format") == LM_RECORD_FORMAT


def _loader_for(
    record: Mapping[str, Any],
    source: Source,
    *,
    filter: Callable[[Any], Any] | None,
    balance: Any,
) -> Any:
    from datamill.loader.options import Batching
    from datamill.loader.packing import Packing

    cfg = record["config"]
    packing = Packing(**cfg["packing"]) if cfg.get("packing") else None
    if balance is None and cfg.get("balance") in ("tokens", "tokens_squared"):
        balance = cfg["balance"]
    if cfg.get("balance") and balance is None:
        raise ConfigError(
            f"the run balanced with {cfg['balance']!r}; pass that callable as balance=",
            hint="datamill trace lists the sequences of a step in global order without it",
        )
    loader = LMLoader(
        source,
        int(record["batch_size"]),
        packing=packing,
        balance=balance,
        seed=int(record["seed"]),
        columns=cfg.get("columns") or None,
        world_size=int(record["world_size"]),
        batching=Batching(filter=filter, shuffle=bool(cfg["shuffle"])),
    )
    if loader.dataset_fingerprint() != record["dataset_fingerprint"]:
        raise ConfigError(
            "the source is not the dataset of the run (fingerprints differ)",
            hint="pass the source the run read",
        )
    return loader


def trace_lm(
    record: Mapping[str, Any],
    source: Source,
    /,
    *,
    step: int,
    rank: int | None = None,
    filter: Callable[[Any], Any] | None = None,
    balance: Any = None,
) -> list[dict[str, Any]]:
    """The sequences of global step ``step`` (of rank ``rank``, or all) and their documents.

    Args:
        record: the run's :func:`lm_record`.
        source: the dataset the run read (a Mix of the same sources for a mixture).
        step: the global step.
        rank: only this rank's sequences (in the record's world size). Defaults to ``None``.
        filter: the run's filter (when it had one). Defaults to ``None``.
        balance: the run's balance callable (when it was one). Defaults to ``None``.

    Returns:
        One dict per sequence: ``global_index``, ``rank``, ``source`` (name) and ``documents``
        (``source``, ``epoch``, ``sample``, ``start``, ``length`` and ``uid`` when known).

    Raises:
        ConfigError: a step before the record's start, or another dataset.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader, Packing
        >>> src = TableSource(pa.table({"tokens": [[1, 2, 3], [4, 5], [6]] * 4}))
        >>> ld = Loader(src, 2, packing=Packing(seq_len=4, window=6), seed=1)
        >>> first = next(iter(ld))
        >>> rows = trace_lm(ld.run_record(), src, step=0)
        >>> seg = first["segment_ids"][0]
        >>> lengths = [int((seg == s).sum()) for s in range(1, seg.max() + 1)]
        >>> [d["length"] for d in rows[0]["documents"]] == lengths
        True
    """
    loader = _loader_for(record, source, filter=filter, balance=balance)
    start = record["start"]
    if step < int(start["step"]):
        raise ConfigError(
            f"step {step} is before this record's start (step {start['step']})",
            hint="trace with the record of the run that took that step",
        )
    pos, taken = start["sources"], start["taken"]
    plan = loader.plan_step(int(start["step"]), pos, taken)
    for s in range(int(start["step"]) + 1, step + 1):
        plan = loader.plan_step(s, plan.after["sources"], plan.after["taken"])
    streams = loader.streams
    out = []
    for u in range(loader.global_batch):
        r = int(plan.ranks[u])
        if rank is not None and r != rank:
            continue
        docs = []
        for src, epoch, sample, begin, length in plan.segments(u):
            doc = {
                "source": loader.names[src],
                "epoch": epoch,
                "sample": sample,
                "start": begin,
                "length": length,
            }
            uid = uid_column_of(streams[src].source)
            if uid is not None:
                doc["uid"] = _uid(streams[src].source, uid, sample)
            docs.append(doc)
        out.append(
            {
                "global_index": u,
                "rank": r,
                "source": loader.names[int(plan.unit_source[u])],
                "documents": docs,
            }
        )
    return out


def _uid(source: Source, column: str, sample: int) -> Any:
    import numpy as np

    starts = np.concatenate([[0], np.cumsum(source.shard_sizes())])
    k = int(np.searchsorted(starts, sample, side="right") - 1)
    return source.read_shard(k, columns=[column]).column(column)[sample - int(starts[k])].as_py()


def trace_command(args: argparse.Namespace, source: Source | None, filt: Any) -> int:
    """``datamill trace`` for a language-model record: the sequences of ``--step``."""
    if source is None or args.step is None:
        raise ConfigError(
            "a language-model run record is traced by step, replaying its plan over the data",
            hint="datamill trace RECORD --source PATH --step S [--rank R]",
        )
    with open(os.fspath(args.record[0]), encoding="utf-8") as f:
        record = json.load(f)
    rows = trace_lm(record, source, step=int(args.step), rank=args.rank, filter=filt)
    if args.json:
        print(json.dumps({"step": args.step, "sequences": rows}, indent=2, sort_keys=True))
        return 0
    print(f"global step {args.step}: {len(rows)} sequences")
    for row in rows:
        pieces = ", ".join(
            f"{d['source']}#{d['sample']}[{d['start']}:{d['start'] + d['length']}]"
            for d in row["documents"]
        )
        print(f"{row['global_index']:>6} rank {row['rank']:>3}  {pieces}")
    return 0
