"""``DeltaSource``: a Delta Lake table, pinned to one version, as a Source.

The version's log is replayed by ``deltalake`` (delta-rs) once, when the source opens: the data
files it lists (each a shard), their row counts, partition values and deletion vectors (read into
keep masks). The files themselves are read by :class:`~datamill.tables.common.ParquetFilesSource`
(pyarrow, through the storage seam and, on ``s3://``, the shard cache).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.optional import require
from datamill.core.storage import scheme_of
from datamill.tables.common import (
    ParquetFilesSource,
    ShardBy,
    TableFile,
    location_fs,
    s3_env_options,
)

__all__ = ["READER_FEATURES", "DeltaSource", "delta_storage_options"]

READER_FEATURES = frozenset(
    {"deletionVectors", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "variantType"}
)
"""Delta reader features this source reads (others are refused, named)."""
_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_DELTA_S3 = {
    "region": "AWS_REGION",
    "endpoint": "AWS_ENDPOINT_URL",
    "allow_http": "AWS_ALLOW_HTTP",
    **{k: k for k in _CREDENTIALS},
}


def delta_storage_options(location: str) -> dict[str, str]:
    """delta-rs storage options for ``location``: on ``s3://``, the ``AWS_*`` variables datamill's
    own S3 filesystem reads (:func:`~datamill.core.s3.s3_filesystem`).

    Examples:
        >>> delta_storage_options("/tmp/table")
        {}
    """
    return s3_env_options(location, _DELTA_S3)


def _open_table(location: str, version: int | None) -> Any:
    deltalake = require("deltalake", extra="tables")
    uri = os.path.abspath(location) if not scheme_of(location).remote else location
    try:
        return deltalake.DeltaTable(
            uri, version=version, storage_options=delta_storage_options(location) or None
        )
    except Exception as exc:  # delta-rs raises its own DeltaError/TableNotFoundError (Exception)
        text = " ".join(str(exc).split())
        if version is not None and ("version" in text.lower() or "not found" in text.lower()):
            raise DataFileNotFoundError(
                f"Delta version {version} cannot be read ({text}): its log was cleaned up or it "
                "never existed",
                path=location,
                shard=f"version {version}",
                hint="resume from a version whose log and files still exist",
            ) from exc
        gone = ("not a Delta table", "No files in log", "not found", "does not exist", "NotFound")
        if any(g in text for g in gone):
            raise DataFileNotFoundError(f"no Delta table here ({text})", path=location) from exc
        raise DataFileError(f"cannot open the Delta table ({text})", path=location) from exc


def _check_protocol(dt: Any, location: str) -> None:
    proto = dt.protocol()
    unknown = sorted(set(proto.reader_features or ()) - READER_FEATURES)
    if unknown:
        raise DataFileError(
            f"the Delta table needs reader feature(s) {unknown}, which datamill does not read",
            path=location,
            hint=f"datamill reads Delta tables with reader features {sorted(READER_FEATURES)}",
        )
    mode = (dt.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise DataFileError(
            f"the Delta table uses column mapping (mode {mode!r}), which datamill does not read",
            path=location,
            hint="rewrite the table without delta.columnMapping.mode",
        )


def _keep_masks(dt: Any, *, remote: bool) -> dict[str, np.ndarray[Any, Any]]:
    """Deletion vectors as keep masks, by the file's path on its filesystem (none to read when the
    table's protocol has no deletion vectors)."""
    if "deletionVectors" not in (dt.protocol().reader_features or ()):
        return {}
    reader = pa.RecordBatchReader.from_stream(dt.deletion_vectors())
    table = reader.read_all()
    out: dict[str, np.ndarray[Any, Any]] = {}
    for uri, mask in zip(
        table.column("filepath").to_pylist(), table.column("selection_vector").to_pylist()
    ):
        path = urllib.parse.unquote(urllib.parse.urlparse(uri).path)
        if remote:
            parsed = urllib.parse.urlparse(uri)
            path = f"{parsed.netloc}{urllib.parse.unquote(parsed.path)}"
        out[path] = np.asarray(mask, dtype=np.bool_)
    return out


def _files(dt: Any, root: str, parts: list[str], *, remote: bool) -> list[TableFile]:
    adds = pa.table(dt.get_add_actions(flatten=True))
    masks = _keep_masks(dt, remote=remote)
    paths = [urllib.parse.unquote(p) for p in adds.column("path").to_pylist()]
    sizes = adds.column("size_bytes").to_pylist()
    rows = adds.column("num_records").to_pylist()
    part_values = {c: adds.column(f"partition.{c}").to_pylist() for c in parts}
    files = []
    for i in np.argsort(np.array(paths, dtype=object), kind="stable"):
        rel = paths[i]
        path = rel if rel.startswith("/") or "://" in rel else f"{root}/{rel}"
        keep = masks.get(path)
        n = -1 if rows[i] is None else int(rows[i])  # -1: no statistics, the footer says
        if keep is not None and n >= 0 and len(keep) < n:  # rows past the last deleted: kept
            keep = np.concatenate([keep, np.ones(n - len(keep), dtype=np.bool_)])
        files.append(
            TableFile(
                path,
                int(sizes[i]),
                int(n),
                keep,
                tuple((c, part_values[c][i]) for c in parts),
                deletes="" if keep is None else f"dv:{int(np.count_nonzero(~keep))}",
            )
        )
    return files


class DeltaSource(ParquetFilesSource):
    """A Delta Lake table at one version (the latest when not given), one shard per data file.

    Args:
        path: the table's folder (local) or URL (``s3://bucket/table``).
        version: the version to read. Defaults to ``None`` (the latest, resolved once now).
        shard_by: ``"auto"`` (each data file a shard, its row groups for a file over
            :data:`~datamill.tables.common.LARGE_FILE_BYTES`), ``"file"`` or ``"row_group"``.
            Defaults to ``"auto"``.
        cache_dir: on object storage: the local shard cache. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: on object storage: bytes the cache keeps at most. Defaults to ``None``.
        filesystem: the filesystem to read data files with. Defaults to ``None`` (the location's).
        uid_column: the column identifying a sample. Defaults to ``None``.

    Raises:
        DataFileNotFoundError: no table there, or the version (its log, or data files it lists)
            was cleaned up or vacuumed: the error names the version.
        DataFileError: the table needs a Delta feature datamill does not read (column mapping,
            an unknown reader feature: named).

    Examples:
        >>> import tempfile, deltalake
        >>> path = tempfile.mkdtemp()
        >>> deltalake.write_deltalake(path, pa.table({"x": [1, 2, 3]}))
        >>> deltalake.write_deltalake(path, pa.table({"x": [4]}), mode="append")
        >>> src = DeltaSource(path, version=0)
        >>> src.version, src.shard_sizes().tolist(), src.fingerprint().startswith("delta@v0-")
        (0, [3], True)
        >>> DeltaSource(path).version
        1
    """

    kind = "delta"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        version: int | None = None,
        shard_by: ShardBy = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        filesystem: pafs.FileSystem | None = None,
        uid_column: str | None = None,
    ) -> None:
        location = os.fspath(path).rstrip("/")
        if version is not None and (isinstance(version, bool) or int(version) < 0):
            raise ConfigError(f"version must be an integer >= 0, got {version!r}")
        dt = _open_table(location, None if version is None else int(version))
        _check_protocol(dt, location)
        self.version: int = int(dt.version())
        fs, root = location_fs(location, filesystem)
        remote = scheme_of(location).remote
        meta = dt.metadata()
        parts = list(meta.partition_columns or ())
        schema = pa.schema(dt.schema().to_arrow())
        files = _files(dt, root, parts, remote=remote)
        super().__init__(
            location,
            files,
            schema,
            fs=fs,
            root=root,
            table=("delta", self.version, meta.id),
            shard_by=shard_by,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            uid_column=uid_column,
        )
