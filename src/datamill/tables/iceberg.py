"""``IcebergSource``: an Apache Iceberg table, pinned to one snapshot, as a Source.

``pyiceberg`` plans the snapshot once, when the source opens (its manifests: data files, their row
counts, delete files); the Parquet data files are read by
:class:`~datamill.tables.common.ParquetFilesSource`, columns matched by Iceberg field id (so renamed
and added columns read as the snapshot's schema says). Positional delete files are read at open
(into keep masks); equality deletes and deletion vectors are refused with a message naming them.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError
from datamill.core.optional import require
from datamill.core.storage import scheme_of, storage_error
from datamill.tables.common import (
    ParquetFilesSource,
    ShardBy,
    TableFile,
    location_fs,
    s3_env_options,
)

__all__ = ["IcebergSource", "iceberg_io_properties", "latest_metadata"]

_SEQ = re.compile(r"^v?(\d+)[-.]")
_ICEBERG_S3 = {
    "region": "s3.region",
    "endpoint": "s3.endpoint",
    "AWS_ACCESS_KEY_ID": "s3.access-key-id",
    "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
}


def iceberg_io_properties(location: str) -> dict[str, str]:
    """pyiceberg FileIO properties for ``location``: on ``s3://``, the ``AWS_*`` variables.

    Examples:
        >>> iceberg_io_properties("/tmp/wh/db/t")
        {}
    """
    return s3_env_options(location, _ICEBERG_S3)


def latest_metadata(location: str, fs: pafs.FileSystem, root: str) -> str:
    """The newest ``metadata/*.metadata.json`` of a table location (by its sequence number:
    ``00004-<uuid>.metadata.json`` or ``v4.metadata.json``), as a URL or local path.

    Raises:
        DataFileNotFoundError: the location holds no Iceberg metadata.
    """
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/metadata", allow_not_found=True))
    except OSError as exc:
        raise storage_error(exc, location) from exc
    found = []
    for info in infos:
        name = info.path.rpartition("/")[2]
        m = _SEQ.match(name)
        if name.endswith(".metadata.json") and m:
            found.append((int(m.group(1)), name))
    if not found:
        raise DataFileNotFoundError(
            "no Iceberg metadata (metadata/*.metadata.json) in this table location", path=location
        )
    return f"{location.rstrip('/')}/metadata/{max(found)[1]}"


def _fs_path(uri: str) -> str:
    """A data file URI as its path on its filesystem (``file:///a/b`` -> ``/a/b``, ``s3://b/k`` ->
    ``b/k``)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("", "file"):
        return urllib.parse.unquote(parsed.path) if parsed.scheme else uri
    return f"{parsed.netloc}{parsed.path}"


def _load(table: Any, location: str | None, catalog: Any) -> Any:
    """A pyiceberg Table from a Table, a catalog identifier, a location or a metadata file."""
    if not isinstance(table, str):
        return table
    if catalog is not None:
        return catalog.load_table(table)
    assert location is not None
    static = require("pyiceberg.table", extra="tables").StaticTable
    fs, root = location_fs(location)
    meta = location if location.endswith(".metadata.json") else latest_metadata(location, fs, root)
    uri = meta if scheme_of(meta).remote else "file://" + os.path.abspath(meta)
    try:
        return static.from_metadata(uri, properties=iceberg_io_properties(location))
    except FileNotFoundError as exc:
        raise DataFileNotFoundError("no such Iceberg metadata file", path=meta) from exc
    except (OSError, ValueError) as exc:
        raise DataFileError(f"not readable Iceberg metadata ({exc})", path=meta) from exc


def _arrow_schema(schema: Any) -> tuple[pa.Schema, dict[str, int]]:
    """The snapshot's schema as Arrow (large strings as plain strings) and its field ids."""
    to_arrow = require("pyiceberg.io.pyarrow", extra="tables").schema_to_pyarrow
    arrow = to_arrow(schema, include_field_ids=False)
    plain = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    fields = [pa.field(f.name, plain.get(f.type, f.type), f.nullable) for f in arrow]
    return pa.schema(fields), {f.name: int(f.field_id) for f in schema.fields}


def _positional_keep(
    fs: pafs.FileSystem, data_path: str, rows: int, deletes: Iterable[Any], location: str
) -> tuple[np.ndarray[Any, Any] | None, str]:
    """The keep mask of one data file from its positional delete files (``None``: none apply)."""
    keep: np.ndarray[Any, Any] | None = None
    names = []
    for d in sorted(deletes, key=lambda d: d.file_path):
        content = getattr(d.content, "name", str(d.content))
        if content != "POSITION_DELETES" or str(d.file_format).upper().endswith("PUFFIN"):
            kind = "equality deletes" if content == "EQUALITY_DELETES" else "deletion vectors"
            raise DataFileError(
                f"the snapshot has {kind} ({d.file_path}), which datamill does not apply",
                path=location,
                hint="rewrite the table's data files (compaction) so it has no "
                f"{kind}, or read a snapshot before them; positional deletes are applied",
            )
        try:
            with fs.open_input_file(_fs_path(d.file_path)) as f:
                t = pq.read_table(f, columns=["file_path", "pos"])
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(f"cannot read delete file ({exc})", path=d.file_path) from exc
        mine = t.filter(pc.equal(t.column("file_path"), pa.scalar(_uri_of(t, data_path))))
        pos = mine.column("pos").to_numpy()
        if len(pos):
            keep = np.ones(rows, dtype=np.bool_) if keep is None else keep
            keep[pos[pos < rows]] = False
        names.append(d.file_path.rpartition("/")[2])
    return keep, ",".join(names)


def _uri_of(deletes: pa.Table, data_path: str) -> str:
    """How the delete file spells the data file's path (a URI, as in the manifests)."""
    for value in deletes.column("file_path").unique().to_pylist():
        if _fs_path(value) == data_path:
            return str(value)
    return data_path


def _plan(tbl: Any, snapshot_id: int, fs: pafs.FileSystem, location: str) -> list[TableFile]:
    files = []
    try:
        tasks = list(tbl.scan(snapshot_id=snapshot_id).plan_files())
    except ValueError as exc:  # pyiceberg refuses equality deletes while planning
        if "equality delete" not in str(exc).lower():
            raise
        raise DataFileError(
            f"snapshot {snapshot_id} has equality deletes, which datamill does not apply",
            path=location,
            shard=f"snapshot {snapshot_id}",
            hint="rewrite the table's data files (compaction) so it has no equality deletes, or "
            "read a snapshot before them; positional deletes are applied",
        ) from exc
    for task in sorted(tasks, key=lambda t: t.file.file_path):
        path = _fs_path(task.file.file_path)
        if str(task.file.file_format).upper().rpartition(".")[2] != "PARQUET":
            raise DataFileError(
                f"data file format {task.file.file_format} is not read (Parquet only)",
                path=task.file.file_path,
            )
        rows = int(task.file.record_count)
        keep, deletes = _positional_keep(fs, path, rows, task.delete_files, location)
        files.append(TableFile(path, int(task.file.file_size_in_bytes), rows, keep, (), deletes))
    return files


def _snapshot(tbl: Any, snapshot_id: int | None, location: str) -> Any:
    """Snapshot ``snapshot_id`` of the table (None: the current one).

    Raises:
        DataFileError: the table has no snapshot yet.
        DataFileNotFoundError: the snapshot was expired (or never existed).
    """
    if snapshot_id is None:
        snap = tbl.current_snapshot()
        if snap is None:
            raise DataFileError("the Iceberg table has no snapshot yet (empty)", path=location)
    else:
        snap = tbl.snapshot_by_id(int(snapshot_id))
        if snap is None:
            raise DataFileNotFoundError(
                f"Iceberg snapshot {snapshot_id} is not in the table's metadata: it was "
                "expired or never existed",
                path=location,
                shard=f"snapshot {snapshot_id}",
                hint="resume from a snapshot that was not expired "
                f"(present: {[s.snapshot_id for s in tbl.snapshots()][-5:]})",
            )
    return snap


class IcebergSource(ParquetFilesSource):
    """An Apache Iceberg table at one snapshot (the current one when not given), one shard per
    data file.

    Args:
        table: a pyiceberg ``Table`` (from any catalog), a table identifier (``"db.t"``, with
            ``catalog=``), or the table's location (its folder, local or ``s3://``; the newest
            ``metadata/*.metadata.json`` is read) or one metadata file.
        snapshot_id: the snapshot to read. Defaults to ``None`` (the current snapshot).
        catalog: the pyiceberg catalog ``table`` is named in. Defaults to ``None``.
        shard_by: ``"auto"`` (each data file a shard, its row groups for a file over
            :data:`~datamill.tables.common.LARGE_FILE_BYTES`), ``"file"`` or ``"row_group"``.
            Defaults to ``"auto"``.
        cache_dir: on object storage: the local shard cache. Defaults to ``None``.
        cache_limit: on object storage: bytes the cache keeps at most. Defaults to ``None``.
        filesystem: the filesystem to read data files with. Defaults to ``None`` (the location's).
        uid_column: the column identifying a sample. Defaults to ``None``.

    Raises:
        DataFileNotFoundError: no table there, or the snapshot was expired or its data files were
            removed: the error names the snapshot id.
        DataFileError: equality deletes or deletion vectors in the snapshot (named), a data file
            that is not Parquet.

    Examples:
        >>> import tempfile
        >>> from pyiceberg.catalog.sql import SqlCatalog
        >>> wh = tempfile.mkdtemp()
        >>> cat = SqlCatalog("doc", uri=f"sqlite:///{wh}/cat.db", warehouse=f"file://{wh}")
        >>> cat.create_namespace("db")
        >>> t = cat.create_table("db.t", schema=pa.schema([("x", pa.int64())]))
        >>> t.append(pa.table({"x": pa.array([1, 2, 3], pa.int64())}))
        >>> src = IcebergSource(t)
        >>> src.snapshot_id == t.current_snapshot().snapshot_id, src.shard_sizes().tolist()
        (True, [3])
        >>> IcebergSource("db.t", catalog=cat).fingerprint() == src.fingerprint()
        True
    """

    kind = "iceberg"
    pin = "snapshot_id"

    def __init__(
        self,
        table: Any,
        *,
        snapshot_id: int | None = None,
        catalog: Any = None,
        shard_by: ShardBy = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        filesystem: pafs.FileSystem | None = None,
        uid_column: str | None = None,
    ) -> None:
        location = os.fspath(table).rstrip("/") if isinstance(table, (str, os.PathLike)) else None
        tbl = _load(os.fspath(table) if location else table, location, catalog)
        if location is None or catalog is not None:
            location = tbl.metadata.location
            location = _fs_path(location) if location.startswith("file:") else location
        assert location is not None
        snap = _snapshot(tbl, snapshot_id, location)
        self.snapshot_id: int = int(snap.snapshot_id)
        self.version = self.snapshot_id
        schema_id = snap.schema_id if snap.schema_id is not None else tbl.metadata.current_schema_id
        ice_schema = next(s for s in tbl.schemas().values() if s.schema_id == schema_id)
        schema, ids = _arrow_schema(ice_schema)
        fs, root = location_fs(location, filesystem)
        try:
            files = _plan(tbl, self.snapshot_id, fs, location)
        except DatamillError:
            raise
        except (OSError, ValueError) as exc:
            raise storage_error(exc, location) from exc
        super().__init__(
            location,
            files,
            schema,
            fs=fs,
            root=root,
            table=("iceberg", self.snapshot_id, str(tbl.metadata.table_uuid)),
            field_ids=ids,
            shard_by=shard_by,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            uid_column=uid_column,
        )
