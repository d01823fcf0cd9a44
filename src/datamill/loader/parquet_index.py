"""The index of a Parquet prefix on object storage: what a source needs from every object, in one
small object beside them, so that opening the prefix makes no request per object.

``write_parquet_index(url)`` writes ``<prefix>/_datamill_index.json`` (:data:`INDEX_NAME`, ignored
by Spark/Hive readers like every ``_``-file): for each ``*.parquet`` object under the prefix its key
(relative to the prefix), byte size, modification time (as the store lists it), row count and the
xxh3-128 of its content, and the objects' common Arrow schema. It is written when the objects are
(``local=``: the files just uploaded, so nothing is downloaded), or later for objects already on the
store (each downloaded once).

:class:`~datamill.loader.remote.RemoteParquetSource` trusts the index only when the prefix's
listing equals it exactly (same keys, sizes and modification times): then the row counts and the
schema come from it (no HEAD and no footer GET per object; one LIST and the index's GET), and every
download is checked against the recorded content hash instead of an ETag recorded at open, so an
object changed since is still a located error, never other bytes. A prefix without an index, or
whose listing differs (an object added, removed or rewritten after the index), is opened as
before: every footer read.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash

from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError, SchemaError
from datamill.core.storage import filesystem_for, storage_error, upload

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "ParquetIndex",
    "read_parquet_index",
    "write_parquet_index",
]

INDEX_NAME = "_datamill_index.json"
"""The index object's name, directly under the prefix."""
INDEX_FORMAT = "datamill.parquet-index/1"
INDEX_THREADS = 8
"""Objects hashed (or downloaded and hashed) at once while an index is written."""


@dataclass(frozen=True)
class ParquetIndex:
    """What an index records, in the listing's order (sorted by key)."""

    rows: list[int]
    schema: pa.Schema
    xxh3: list[str]


def _key(root: str, path: str) -> str:
    return path[len(root) + 1 :] if path.startswith(root + "/") else path


def parquet_objects(fs: pafs.FileSystem, root: str) -> tuple[list[pafs.FileInfo], bool]:
    """The ``*.parquet`` objects under ``root`` sorted by path (one recursive listing), and whether
    an index object lies directly under it."""
    listed = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    files = [i for i in listed if i.type == pafs.FileType.File]
    infos = sorted((i for i in files if i.path.endswith(".parquet")), key=lambda i: i.path)
    return infos, any(i.path == f"{root}/{INDEX_NAME}" for i in files)


def read_parquet_index(
    fs: pafs.FileSystem, root: str, infos: Sequence[pafs.FileInfo]
) -> ParquetIndex | None:
    """The index under ``root`` when it describes exactly these listed objects (keys, sizes,
    modification times), else ``None`` (absent, unreadable, another format, or stale)."""
    try:
        with fs.open_input_stream(f"{root}/{INDEX_NAME}") as f:
            raw = json.loads(f.read())
        if raw.get("format") != INDEX_FORMAT:
            return None
        objects = raw["objects"]
        listing = [[_key(root, i.path), int(i.size), i.mtime_ns] for i in infos]
        if [[o["key"], o["size"], o["mtime_ns"]] for o in objects] != listing:
            return None
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
        rows = [int(o["rows"]) for o in objects]
        sums = [str(o["xxh3"]) for o in objects]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return ParquetIndex(rows, schema, sums)


def _describe(
    fs: pafs.FileSystem, info: pafs.FileInfo, local: Path | None, key: str, shown: str
) -> tuple[int, pa.Schema, str]:
    """``(rows, schema, xxh3)`` of one object: from the local file of the same key and size, else
    downloaded."""
    mine = None if local is None else local / key
    try:
        if mine is not None and mine.is_file() and mine.stat().st_size == info.size:
            data = pa.py_buffer(mine.read_bytes())
        else:
            with fs.open_input_file(info.path) as f:
                data = f.read_buffer()
        md = pq.ParquetFile(pa.BufferReader(data)).metadata
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(f"not a readable Parquet object ({exc})", path=shown) from exc
    schema = md.schema.to_arrow_schema().remove_metadata()
    return int(md.num_rows), schema, xxhash.xxh3_128_hexdigest(data)


def write_parquet_index(
    url: str,
    *,
    local: str | os.PathLike[str] | None = None,
    filesystem: pafs.FileSystem | None = None,
) -> int:
    """Write the index of the Parquet objects under ``url`` (see the module doc); their number.

    Args:
        url: the prefix (``s3://bucket/prefix``), as a source opens it.
        local: a local folder holding the same files under the same relative keys (what was just
            uploaded): a file of the object's size is read there instead of downloading the
            object. Its content is still what the index records, so a file that differs from the
            object makes every read of that object fail its check. Defaults to ``None`` (every
            object downloaded once).
        filesystem: the filesystem. Defaults to ``None`` (the URL scheme's).

    Raises:
        DataFileNotFoundError: no ``*.parquet`` object under ``url``. SchemaError: the objects
            disagree on the schema. DataFileError: an object is not Parquet, or the store fails.

    Examples:
        >>> from datamill.loader.remote import RemoteParquetSource
        >>> fs, root = filesystem_for("memory://idx/ds")
        >>> with fs.open_output_stream(root + "/a.parquet") as f:
        ...     pq.write_table(pa.table({"x": [1, 2, 3]}), f)
        >>> write_parquet_index("memory://idx/ds", filesystem=fs)
        1
        >>> RemoteParquetSource("memory://idx/ds", filesystem=fs).shard_sizes().tolist()
        [3]
    """
    fs, root = filesystem_for(url.rstrip("/"), filesystem=filesystem)
    folder = None if local is None else Path(local)
    try:
        infos, _ = parquet_objects(fs, root)
        if not infos:
            raise DataFileNotFoundError("no *.parquet object under this prefix", path=url)
        keys = [_key(root, i.path) for i in infos]
        with ThreadPoolExecutor(max_workers=min(INDEX_THREADS, len(infos))) as pool:
            found = list(
                pool.map(
                    lambda i, k: _describe(fs, i, folder, k, f"{url.rstrip('/')}/{k}"), infos, keys
                )
            )
        schema = found[0][1]
        for k, (_, s, _) in zip(keys, found):
            if not s.equals(schema):
                raise SchemaError(f"schema {s} differs from the first object's {schema}", path=k)
        index = {
            "format": INDEX_FORMAT,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
            "objects": [
                {"key": k, "size": int(i.size), "mtime_ns": i.mtime_ns, "rows": r, "xxh3": h}
                for k, i, (r, _, h) in zip(keys, infos, found)
            ],
        }
        upload(json.dumps(index, sort_keys=True).encode("utf-8"), fs, f"{root}/{INDEX_NAME}")
    except DatamillError:
        raise
    except OSError as exc:
        raise storage_error(exc, url) from exc
    return len(infos)
