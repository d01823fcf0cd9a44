"""Column statistics for the web UI.

* :func:`footer_stats`: null counts and min/max per column from Parquet footers only (no data page
  is read), summed over every shard file of a shardset dataset or every file of a Parquet source;
* :class:`ValueStats`: top values and a histogram of one column, computed on demand on a
  background thread (one shard at a time, so the page can show progress) and cached by the
  dataset's fingerprint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamill.core.errors import DatamillError
from datamill.core.source import Source

__all__ = ["ValueJob", "ValueStats", "column_values_stats", "footer_stats", "number_text"]

TOP = 10
BINS = 20


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


_EMPTY = {"nulls": 0, "min": None, "max": None, "values": 0, "exact": True}


def _merge(acc: dict[str, Any], md: pq.FileMetaData) -> None:
    for rg in range(md.num_row_groups):
        group = md.row_group(rg)
        for ci in range(group.num_columns):
            col = group.column(ci)
            entry = acc.setdefault(col.path_in_schema.split(".")[0], dict(_EMPTY))
            entry.setdefault("float32", col.physical_type == "FLOAT")
            st = col.statistics
            entry["values"] += int(group.num_rows)
            if st is None or not st.has_null_count:
                entry["exact"] = False
            else:
                entry["nulls"] += int(st.null_count)
            if st is not None and st.has_min_max and not isinstance(st.min, bytes):
                entry["min"] = st.min if entry["min"] is None else min(entry["min"], st.min)
                entry["max"] = st.max if entry["max"] is None else max(entry["max"], st.max)


def number_text(value: Any, *, float32: bool = False) -> str:
    """A value as the UI shows it: integers of five digits or more with thousands separators (a
    year stays 1872), floats at their precision.

    Examples:
        >>> (
        ...     number_text(1872),
        ...     number_text(215245),
        ...     number_text(0.10000000149011612, float32=True),
        ...     number_text(0.1 + 0.2),
        ... )
        ('1872', '215,245', '0.1', '0.30000000000000004')
    """
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return str(np.float32(value)) if float32 else repr(value)
    return str(value)


def _texts(entry: dict[str, Any]) -> dict[str, Any]:
    f32 = bool(entry.pop("float32", False))
    return {
        **entry,
        "min_text": number_text(entry["min"], float32=f32),
        "max_text": number_text(entry["max"], float32=f32),
    }


def footer_stats(source: Source) -> dict[str, dict[str, Any]] | None:
    """Per column ``{"nulls", "min", "max", "values", "exact"}`` from Parquet footers, or ``None``.

    ``None`` when the source keeps no Parquet files (HDF5, corpus). Binary min/max are left out.
    For a shardset dataset the keys are ``"shardset/column"``.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> from datamill.shards.dataset import ShardsetDataset
        >>> ds = ShardsetDataset.create(
        ...     tempfile.mkdtemp() + "/d",
        ...     pa.table({"id": [1, 2, 3], "x": [5, None, 2]}),
        ...     uid="id",
        ...     shardset="a",
        ...     shard_size=2,
        ... )
        >>> s = footer_stats(ds)["a/x"]
        >>> s["nulls"], s["min"], s["max"], s["values"]
        (1, 2, 5, 3)
    """
    from datamill.core.parquet import ParquetSource
    from datamill.shards.dataset import ShardsetDataset

    if isinstance(source, ShardsetDataset):
        out: dict[str, dict[str, Any]] = {}
        for ss in source.manifest["shardsets"]:
            if ss["format"] != "parquet":
                continue
            acc: dict[str, Any] = {}
            for k in range(int(ss["num_shards"])):
                path = source.loc.join(source.shard_path(ss["name"], k))
                with source.loc.fs.open_input_file(path) as f:
                    _merge(acc, pq.read_metadata(f))
            for c in ss["columns"]:
                if c in acc:
                    out[f"{ss['name']}/{c}"] = _texts({k: _plain(v) for k, v in acc[c].items()})
        return out
    if isinstance(source, ParquetSource):
        acc = {}
        for md in source._meta:
            _merge(acc, md)
        return {c: _texts({k: _plain(v) for k, v in e.items()}) for c, e in acc.items()}
    return None


def column_values_stats(column: pa.ChunkedArray | pa.Array) -> dict[str, Any]:
    """Top values (counts) and a histogram of one column's values.

    Numbers get a histogram of their values; binary values and lists a histogram of their lengths;
    strings, integers and booleans their ``TOP`` most common values (strings get no histogram: their
    most common values are drawn as bars).

    Examples:
        >>> s = column_values_stats(pa.array([1, 1, 2, None, 3]))
        >>> s["top"][0], s["nulls"], s["histogram"]["counts"][0], sum(s["histogram"]["counts"])
        ({'value': 1, 'count': 2}, 1, 2, 4)
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid, types = arr.drop_null(), pa.types
    tops = (types.is_string, types.is_large_string, types.is_integer, types.is_boolean)
    top = _top_values(valid) if any(f(arr.type) for f in (*tops, types.is_dictionary)) else []
    data, of = _histogram_data(valid)
    data = None if data is None else data[np.isfinite(data)]
    histogram = _histogram(data) if data is not None and len(data) else None
    return {
        "count": len(arr),
        "nulls": arr.null_count,
        "top": top,
        "histogram": histogram,
        "of": of,
    }


def _top_values(valid: pa.Array) -> list[dict[str, Any]]:
    """The :data:`TOP` most common values with their counts (ties in first-seen order)."""
    vc = pc.value_counts(valid)
    if not len(vc):
        return []
    counts = vc.field("counts").to_numpy()
    order = np.argsort(-counts, kind="stable")[:TOP]
    values = vc.field("values").take(pa.array(order)).to_pylist()
    return [{"value": _plain(v), "count": int(counts[i])} for v, i in zip(values, order)]


def _histogram_data(valid: pa.Array) -> tuple[np.ndarray[Any, Any] | None, str]:
    """What the histogram counts and of what: numbers their ``"value"``, binary values and lists
    their ``"length"`` (``None``: no histogram)."""
    t = valid.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.asarray(valid.cast(pa.float64()).to_numpy(zero_copy_only=False)), "value"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return np.asarray(pc.list_value_length(valid)).astype(np.float64), "length"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return np.asarray(pc.binary_length(valid)).astype(np.float64), "length"
    return None, "value"


def _histogram(data: np.ndarray[Any, Any]) -> dict[str, list[Any]]:
    """:data:`BINS` equal bins over the values' range (one bin when they are all equal)."""
    lo, hi = float(data.min()), float(data.max())
    counts, edges = np.histogram(
        data, bins=BINS if hi > lo else 1, range=(lo, hi if hi > lo else lo + 1)
    )
    return {"counts": [int(c) for c in counts], "edges": [float(e) for e in edges]}


@dataclass
class ValueJob:
    """One column's computation: ``done`` of ``total`` shards read, then ``result`` or ``error``."""

    total: int
    done: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None
    parts: list[pa.Array] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        """``{"status": "running"|"done"|"error", "done", "total", ...}`` as JSON."""
        status = "error" if self.error else "done" if self.result is not None else "running"
        return {"status": status} | {
            k: getattr(self, k) for k in ("done", "total", "error", "result")
        }


class ValueStats:
    """Compute and cache :func:`column_values_stats` per ``(dataset fingerprint, column)``.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> vs = ValueStats()
        >>> job = vs.get("fp", "x", lambda: TableSource(pa.table({"x": [1, 1, 2]}), shard_size=2))
        >>> vs.wait("fp", "x", timeout=10).result["top"][0]
        {'value': 1, 'count': 2}
    """

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], ValueJob] = {}
        self._events: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, fingerprint: str, column: str, open_source: Callable[[], Source]) -> ValueJob:
        """The job of ``column`` (started now on a background thread if new)."""
        key = (fingerprint, column)
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                return job
            source = open_source()
            job = self._jobs[key] = ValueJob(total=int(source.num_shards))
            event = self._events[key] = threading.Event()
        threading.Thread(
            target=self._run,
            args=(job, source, column, event),
            daemon=True,
            name=f"datamill-ui-stats-{column}",
        ).start()
        return job

    def wait(self, fingerprint: str, column: str, *, timeout: float) -> ValueJob:
        """The job after it finished (or after ``timeout`` seconds)."""
        self._events[(fingerprint, column)].wait(timeout)
        return self._jobs[(fingerprint, column)]

    @staticmethod
    def _run(job: ValueJob, source: Source, column: str, event: threading.Event) -> None:
        try:
            for k in range(job.total):
                job.parts.extend(source.read_shard(k, columns=[column]).column(column).chunks)
                job.done = k + 1
            col = pa.chunked_array(job.parts) if job.parts else pa.array([])
            job.result = column_values_stats(col)
        except DatamillError as exc:
            job.error = exc.one_line()
        except (pa.ArrowException, ValueError, OSError) as exc:
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.parts = []
            event.set()
