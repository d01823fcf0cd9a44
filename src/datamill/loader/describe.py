"""What a dataset holds: ``datamill describe SOURCE`` and the web UI's dataset page.

* :func:`describe`: any datamill output's kind, counts, columns and size, the null counts and
  min/max of its columns from Parquet footers (:func:`footer_stats`: no data page is read), a
  shardset dataset's shardsets and ``check`` violations, a preprocessed dataset's metadata;
* :func:`column_values`: one column's most common values and a histogram (it reads the column,
  one shard at a time).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamill.core.constants import HDF5_SUFFIX, META_SUFFIX
from datamill.core.errors import DatamillError, SchemaError
from datamill.core.source import Source

__all__ = [
    "KINDS",
    "check_column",
    "column_values",
    "describe",
    "details",
    "footer_stats",
    "number_text",
    "preprocessed_meta",
    "summary",
    "values_stats",
]

KINDS = {
    "ShardsetDataset": "shardset dataset",
    "HDF5Source": "preprocessed HDF5",
    "ParquetSource": "Parquet",
    "CorpusSource": "corpus",
    "BertParquetSource": "BERT Parquet",
}
"""Source class name -> the kind of dataset it reads."""
TOP = 10
BINS = 20


def describe(source: str | os.PathLike[str], *, check: bool = True) -> dict[str, Any]:
    """Everything :func:`summary` and :func:`details` say about the dataset at ``source``.

    Args:
        source: a local datamill output (as :func:`~datamill.sources.open_source` takes).
        check: run a shardset dataset's ``check`` (reads every shard's UIDs). Defaults to ``True``.

    Raises:
        DatamillError: ``source`` is not a readable datamill output.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> from datamill.shards.dataset import ShardsetDataset
        >>> root = tempfile.mkdtemp() + "/d"
        >>> table = pa.table({"id": [1, 2, 3], "x": [5, None, 2]})
        >>> _ = ShardsetDataset.create(root, table, uid="id", shardset="a", shard_size=2)
        >>> d = describe(root)
        >>> d["kind"], d["num_samples"], d["footer"]["a/x"]["nulls"], d["check"]
        ('shardset dataset', 3, 1, [])
    """
    from datamill.loader.sources import open_source

    src = open_source(source)
    return summary(src, path=source) | details(src, path=source, check=check)


def summary(src: Source, *, path: str | os.PathLike[str]) -> dict[str, Any]:
    """``kind, num_samples, num_shards, columns, bytes, shardsets`` of an opened source (``bytes``
    of the files at ``path``)."""
    return {
        "kind": KINDS.get(type(src).__name__, type(src).__name__),
        "num_samples": int(np.asarray(src.shard_sizes(), dtype=np.int64).sum()),
        "num_shards": int(src.num_shards),
        "columns": list(src.columns),
        "bytes": _size(Path(path)),
        "shardsets": list(getattr(src, "shardsets", [])),
    }


def details(src: Source, *, path: str | os.PathLike[str], check: bool = True) -> dict[str, Any]:
    """``footer`` statistics (or ``footer_error``), a shardset dataset's ``describe`` (and its
    ``check`` violations when ``check``) or another source's ``schema``, and ``meta`` (a
    preprocessed dataset's metadata)."""
    from datamill.shards.check import check_report
    from datamill.shards.dataset import ShardsetDataset

    out: dict[str, Any] = {}
    try:
        out["footer"] = footer_stats(src)
    except (DatamillError, OSError, pa.ArrowException) as exc:
        out["footer_error"] = (
            exc.one_line() if isinstance(exc, DatamillError) else f"{type(exc).__name__}: {exc}"
        )
    if isinstance(src, ShardsetDataset):
        out["describe"] = src.describe()
        if check:
            out["check"] = check_report(src.loc)
    else:
        cols = list(src.columns)
        schema = src.read_shard(0, columns=cols).slice(0, 0).schema if src.num_shards else []
        out["schema"] = [{"name": f.name, "type": str(f.type)} for f in schema]
    meta = preprocessed_meta(path)
    if meta is not None:
        out["meta"] = meta
    return out


def preprocessed_meta(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``meta.json`` beside a preprocessed HDF5 file (``None`` for other outputs)."""
    from datamill.preprocessing.meta import read_meta

    path = Path(path)
    if path.suffix != HDF5_SUFFIX:  # a folder such as "." has no name to replace
        return None
    meta_path = path.with_name(path.name.removesuffix(HDF5_SUFFIX) + META_SUFFIX)
    return read_meta(meta_path) if meta_path.is_file() else None


def _size(path: Path) -> int | None:
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():  # an object store's URL
        return None
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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
        ...     number_text(-0.0),
        ... )
        ('1872', '215,245', '0.1', '0.30000000000000004', '0.0')
    """
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        value = value + 0.0  # a footer's -0.0 (Parquet's minimum of a column holding 0) reads 0.0
        return str(np.float32(value)) if float32 else repr(value)
    return str(value)


def _texts(entry: dict[str, Any]) -> dict[str, Any]:
    out = {k: _plain(v) for k, v in entry.items() if k != "float32"}
    for end in ("min", "max"):
        out[f"{end}_text"] = number_text(out[end], float32=bool(entry.get("float32")))
    return out


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
            out.update({f"{ss['name']}/{c}": _texts(acc[c]) for c in ss["columns"] if c in acc})
        return out
    if isinstance(source, ParquetSource):
        acc = {}
        for md in source._meta:
            _merge(acc, md)
        return {c: _texts(e) for c, e in acc.items()}
    return None


def column_values(
    source: Source, column: str, *, on_shard: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """:func:`values_stats` of ``column``, read one shard at a time (``on_shard(k)`` after ``k``
    shards are read).

    Raises:
        SchemaError: the source has no such column.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> src = TableSource(pa.table({"x": [1, 1, 2]}), shard_size=2)
        >>> column_values(src, "x")["top"][0]
        {'value': 1, 'count': 2}
    """
    check_column(source, column)
    parts: list[pa.Array] = []
    for k in range(int(source.num_shards)):
        parts.extend(source.read_shard(k, columns=[column]).column(column).chunks)
        if on_shard is not None:
            on_shard(k + 1)
    return values_stats(pa.chunked_array(parts) if parts else pa.array([]))


def check_column(source: Source, column: str) -> None:
    """Refuse a column ``source`` does not have (before any of it is read).

    Raises:
        SchemaError: the source has no such column.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> try:
        ...     check_column(TableSource(pa.table({"x": [1]}), shard_size=1), "y")
        ... except SchemaError as exc:
        ...     print(exc.one_line())
        column "y": unknown column 'y'; expected one of ['x']: pass one of those names
    """
    if column not in source.columns:
        raise SchemaError(
            f"unknown column {column!r}; expected one of {list(source.columns)}: pass one of"
            " those names",
            column=column,
        )


def values_stats(column: pa.ChunkedArray | pa.Array) -> dict[str, Any]:
    """Top values (counts) and a histogram of one column's values.

    Numbers get a histogram of their values; binary values and lists a histogram of their lengths;
    strings, integers and booleans their ``TOP`` most common values (strings get no histogram: their
    most common values are drawn as bars).

    Examples:
        >>> s = values_stats(pa.array([1, 1, 2, None, 3]))
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
