"""One pass over a build (:func:`summarize`): its schema, UIDs, per-column row hashes and column
statistics, cached beside it (:mod:`datamill.lineage.hashcache`); :func:`datamill.lineage.diff.diff`
compares two summaries."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.fingerprint import fingerprint_obj
from datamill.core.source import Source, uid_column_of
from datamill.lineage.hashcache import SIDECAR_FORMAT, HashCache
from datamill.lineage.rowhash import HASH_VERSION, column_hash

__all__ = ["TOP", "BuildSummary", "summarize"]

TOP = 10
"""Most frequent values kept per category column."""


@dataclass
class BuildSummary:
    """One pass over a build: schema, UIDs, per-column row hashes and column statistics."""

    kind: str
    fingerprint: str
    rows: int
    schema: dict[str, str]
    uid_column: str | None
    uids: pa.Array | None
    hashes: dict[str, NDArray[np.uint64]]
    stats: dict[str, dict[str, Any]]
    uid_hash: NDArray[np.uint64] | None = None
    """:func:`column_hash` of non-integer UIDs (cached with the summary): UIDs are matched by it,
    then checked."""
    uid_order: NDArray[np.int64] | None = None
    """The rows by ``uid_hash`` (an argsort, cached too): two builds' UIDs match by one merge."""


def _number_stats(values: NDArray[Any]) -> dict[str, Any]:
    v = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    if not len(v):
        return {"type": "number", "count": 0}
    q = np.quantile(v.astype(np.float64), [0.05, 0.25, 0.5, 0.75, 0.95])
    return {
        "type": "number",
        "count": len(v),
        "mean": float(v.mean()),
        "std": float(v.std()),
        "q05": float(q[0]),
        "q25": float(q[1]),
        "q50": float(q[2]),
        "q75": float(q[3]),
        "q95": float(q[4]),
    }


def _is_number(t: pa.DataType) -> bool:
    return bool(pat.is_integer(t) or pat.is_floating(t))


def _is_category(t: pa.DataType) -> bool:
    return bool(
        pat.is_string(t) or pat.is_large_string(t) or pat.is_dictionary(t) or pat.is_boolean(t)
    )


def summarize(
    source: Source,
    /,
    *,
    cache: bool = True,
    location: str | os.PathLike[str] | None = None,
) -> BuildSummary:
    """Read ``source`` once (or its cached summary): row hashes per column and column statistics.

    The summary is cached beside the build at ``location`` (:func:`sidecar_path`, written
    atomically; a file of that name that is not a row-hash file is never replaced) and the build's
    ``dataset.json`` / ``meta.json`` points at it (:class:`~datamill.lineage.hashcache.HashCache`),
    or, when there is no ``location`` or it cannot be written, in ``$DATAMILL_CACHE_DIR`` (else
    the temp folder). A cached summary records the build's fingerprint and is ignored once the
    build changes.

    Args:
        source: the build, opened.
        cache: read and write the cached summary. Defaults to ``True``.
        location: the build's path, where the sidecar goes. Defaults to ``None``.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> s = summarize(
        ...     TableSource(pa.table({"x": [1.0, 2.0, 3.0], "c": ["a", "b", "a"]})), cache=False
        ... )
        >>> s.rows, s.stats["x"]["mean"], s.stats["c"]["top"][0]
        (3, 2.0, ['a', 2])
    """
    fp = source.fingerprint()
    uid = uid_column_of(source)
    key = fingerprint_obj([HASH_VERSION, fp, uid, list(source.columns)])
    store = HashCache(location, key)
    kind = type(source).__name__
    found = store.get() if cache else None
    if found is not None:
        meta, hashes, (uid_hash, uid_order) = found
        uids = _uids(source, uid) if uid is not None else None
        return BuildSummary(
            kind,
            fp,
            meta["rows"],
            meta["schema"],
            uid,
            uids,
            hashes,
            meta["stats"],
            uid_hash,
            uid_order,
        )
    scan = _Scan(uid)
    for k in range(source.num_shards):
        scan.add(source.read_shard(k))
    hashes = {c: np.concatenate(p) if p else np.zeros(0, np.uint64) for c, p in scan.parts.items()}
    stats: dict[str, dict[str, Any]] = {
        c: _number_stats(np.concatenate(v)) for c, v in scan.numbers.items()
    }
    stats.update({name: _category_stats(t) for name, t in scan.counts.items()})
    uids = (
        pa.chunked_array(scan.uid_parts).combine_chunks()
        if uid is not None and scan.uid_parts
        else None
    )
    uid_hash = column_hash(uids) if uids is not None and not pat.is_integer(uids.type) else None
    uid_order = np.argsort(uid_hash, kind="stable") if uid_hash is not None else None
    summary = BuildSummary(
        kind, fp, scan.rows, scan.schema, uid, uids, hashes, stats, uid_hash, uid_order
    )
    if cache:
        _remember(store, summary, key)
    return summary


def _uids(source: Source, uid: str) -> pa.Array:
    return pa.chunked_array(
        [source.read_shard(k, columns=[uid]).column(0) for k in range(source.num_shards)]
    ).combine_chunks()


class _Scan:
    """What one pass over the shards keeps: hashes per column, numbers, category counts, UIDs."""

    def __init__(self, uid: str | None) -> None:
        self.uid = uid
        self.parts: dict[str, list[NDArray[np.uint64]]] = {}
        self.numbers: dict[str, list[NDArray[Any]]] = {}
        self.counts: dict[str, pa.Table] = {}
        self.uid_parts: list[pa.Array] = []
        self.schema: dict[str, str] = {}
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for name in table.column_names:
            col = table.column(name)
            self.schema.setdefault(name, str(col.type))
            if name == self.uid:
                self.uid_parts.extend(col.chunks)
                continue
            self.parts.setdefault(name, []).append(column_hash(col))
            if _is_number(col.type):
                arr = col.to_numpy() if not col.null_count else pc.drop_null(col).to_numpy()
                self.numbers.setdefault(name, []).append(np.asarray(arr))
            elif _is_category(col.type):
                self._count(name, col)

    def _count(self, name: str, col: Any) -> None:
        vc = pc.value_counts(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
        t = pa.table({"value": pc.cast(vc.field("values"), pa.string()), "n": vc.field("counts")})
        self.counts[name] = (
            t if name not in self.counts else pa.concat_tables([self.counts[name], t])
        )


def _category_stats(t: pa.Table) -> dict[str, Any]:
    g = (
        t.group_by("value")
        .aggregate([("n", "sum")])
        .sort_by([("n_sum", "descending"), ("value", "ascending")])
    )
    values, ns = g.column("value").to_pylist(), g.column("n_sum").to_pylist()
    total = int(sum(ns))
    return {
        "type": "category",
        "count": total,
        "distinct": len(values),
        "top": [[v, int(n)] for v, n in zip(values[:TOP], ns[:TOP])],
        "shares": {str(v): n / total for v, n in zip(values, ns)} if len(values) <= 1000 else None,
    }


def _remember(store: HashCache, summary: BuildSummary, key: str) -> None:
    """Write the summary's sidecar (its statistics, then the hashes as arrays)."""
    meta = {
        "format": SIDECAR_FORMAT,
        "key": key,
        "build": summary.fingerprint,
        "rows": summary.rows,
        "schema": summary.schema,
        "stats": summary.stats,
        "hashed": list(summary.hashes),
    }
    arrays: dict[str, Any] = {f"h{i}": h for i, h in enumerate(summary.hashes.values())}
    if summary.uid_hash is not None:
        arrays["uid_hash"] = summary.uid_hash
        arrays["uid_order"] = summary.uid_order
    store.put(meta, arrays)
