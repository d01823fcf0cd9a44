"""Conversions: a preprocessed HDF5 or a BERT Parquet into a shardset dataset, and back to one
table.

A preprocessed HDF5 is read by its one reader,
:class:`~datamill.preprocessing.hdf5.HDF5Source` (one column per root dataset, a CSR group as
a list column, a multi-dimensional array as a nested ``fixed_size_list`` column); a ``uid`` column
(the row number) is added when the file has none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from datamill.core.errors import DataFileError
from datamill.core.faults import fault_point
from datamill.core.io import atomic_path, atomic_write, check_output
from datamill.shards._tables import hdf5_to_table
from datamill.shards.create import create
from datamill.shards.dataset import ShardsetDataset

__all__ = ["EXPORT_KEY", "export", "from_bert_parquet", "from_hdf5", "hdf5_to_table"]

EXPORT_KEY = b"datamill.export"
CSV_MARKER_SUFFIX = ".datamill-export.json"
"""A CSV export's marker beside it (``all.csv`` -> ``all.csv.datamill-export.json``): the SHA-256 of
the file datamill wrote, so a later export replaces that file and never a CSV of the user's (or one
the user edited since)."""
_CSV_MARKER_FORMAT = "datamill.export/csv-1"
"""Parquet schema metadata key marking a file written by :func:`export` (its value: the dataset)."""


def from_hdf5(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    /,
    *,
    shard_size: int,
    shardset: str = "features",
    uid: str = "uid",
) -> ShardsetDataset:
    """A preprocessed HDF5 → a new shardset dataset with one shardset (``uid`` = row number if
    absent).

    Examples:
        >>> import tempfile, h5py, numpy as np
        >>> d = tempfile.mkdtemp()
        >>> with h5py.File(d + "/t.hdf5", "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(3.0))
        >>> from_hdf5(d + "/t.hdf5", d + "/ds", shard_size=2).get(2)
        {'uid': 2, 'x': 2.0}
    """
    return create(
        root, hdf5_to_table(path, uid=uid), uid=uid, shardset=shardset, shard_size=shard_size
    )


def from_bert_parquet(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    /,
    *,
    shard_size: int,
    shardset: str = "bert",
    uid: str = "uid",
) -> ShardsetDataset:
    """A BERT Parquet (``build_bert_samples`` output) → a dataset; ``uid`` = row number if absent.

    Examples:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> d = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"tokens": [[1, 2], [3]]}), d + "/b.parquet")
        >>> from_bert_parquet(d + "/b.parquet", d + "/ds", shard_size=1).get(1)
        {'uid': 1, 'tokens': [3]}
    """
    return create(root, path, uid=uid, shardset=shardset, shard_size=shard_size, add_uid=True)


def export(
    ds: ShardsetDataset,
    out: str | os.PathLike[str],
    /,
    *,
    columns: Sequence[str] | None = None,
    join: str = "left",
    overwrite: bool = False,
) -> pa.Table:
    """Write the joined dataset to one Parquet or CSV file (atomically); returns the table.

    An earlier export at ``out`` is replaced: a Parquet export carries a key in its metadata, a CSV
    export a marker file beside it (:data:`CSV_MARKER_SUFFIX`) with the file's SHA-256, so a CSV
    the user wrote or edited since is never replaced (not even with ``overwrite=True``). A path
    inside the dataset, or any other file, is refused.

    Raises:
        DataFileError: ``out`` is inside the dataset folder or holds something else.
        OutputError: the disk is full (an earlier file at ``out`` is kept).

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> d = tempfile.mkdtemp()
        >>> ds = ShardsetDataset.create(
        ...     d + "/ds", pa.table({"uid": [1, 2, 3]}), uid="uid", shardset="a", shard_size=2
        ... )
        >>> ds = ds.add("b", pa.table({"uid": [2], "y": [7]}), route=True)
        >>> export(ds, d + "/all.csv").to_pydict()
        {'uid': [1, 2, 3], 'y': [None, 7, None]}
        >>> export(ds, d + "/some.parquet", join="inner").num_rows
        1
    """
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    target = os.fspath(out)
    csv = target.lower().endswith(".csv")
    inputs = [] if ds.loc.remote else [ds.loc.path]

    def own(p: Path) -> bool:
        return p.is_file() and (_is_csv_export(p) if csv else _is_export(p))

    check_output(target, is_own=own, inputs=inputs, what="export file", overwrite=overwrite)
    if csv:
        _check_marker_slot(Path(target))
    table = ds.to_table(columns=columns, join=join)
    with atomic_path(target) as tmp:
        if csv:
            pcsv.write_csv(table, tmp)
            new = _sha256(tmp)
            old = [_sha256(Path(target))] if Path(target).is_file() else []
            _write_marker(Path(target), [*old, new])  # either file matches while we switch
        else:
            meta = {**(table.schema.metadata or {}), EXPORT_KEY: ds.loc.display.encode()}
            pq.write_table(table.replace_schema_metadata(meta), tmp)
        fault_point("shards.export_written")
    if csv:
        _write_marker(Path(target), [new])
    return table


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _marker_hashes(path: Path) -> list[str] | None:
    """The hashes a CSV export's marker lists, or ``None`` when there is no marker of ours."""
    try:
        raw = json.loads(path.with_name(path.name + CSV_MARKER_SUFFIX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != _CSV_MARKER_FORMAT:
        return None
    hashes = raw.get("sha256")
    return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else None


def _is_csv_export(path: Path) -> bool:
    hashes = _marker_hashes(path)
    return bool(hashes) and _sha256(path) in (hashes or [])


def _check_marker_slot(path: Path) -> None:
    marker = path.with_name(path.name + CSV_MARKER_SUFFIX)
    if (marker.exists() or marker.is_symlink()) and _marker_hashes(path) is None:
        raise DataFileError(
            "refusing to replace it: it is not a datamill export marker",
            path=marker,
            hint="move that file away, or export to another path",
        )


def _write_marker(path: Path, hashes: list[str]) -> None:
    with atomic_write(path.with_name(path.name + CSV_MARKER_SUFFIX)) as f:
        json.dump({"format": _CSV_MARKER_FORMAT, "sha256": hashes}, f)


def _is_export(path: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        return EXPORT_KEY in (pq.read_schema(path).metadata or {})
    except (OSError, pa.ArrowException):
        return False
