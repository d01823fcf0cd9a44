"""Filesystem plumbing for shardset datasets: local paths or any pyarrow filesystem URI.

Reading shard files (Parquet or CSV) turns every pyarrow failure into a
:class:`~datamill.core.errors.DataFileError` naming the file; writing goes to a temporary name in
the same folder and is moved into place only when complete.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from datamill.core.checks import check_path
from datamill.core.errors import DataFileError, DataFileNotFoundError, SchemaError
from datamill.core.io import csv_options
from datamill.core.objstore import store_error
from datamill.core.storage import filesystem_for, scheme_of

__all__ = ["Location", "file_format", "read_any", "resolve", "write_any"]


class Location:
    """A folder on a pyarrow filesystem; ``display`` is what error messages show; ``remote`` (from
    the scheme table, :class:`~datamill.core.storage.Scheme`) whether it is on an object store (no
    local paths: read through the shard cache, written by staging and publishing)."""

    def __init__(
        self, fs: pafs.FileSystem, path: str, display: str, *, remote: bool = False
    ) -> None:
        self.fs, self.path, self.display = fs, path.rstrip("/") or "/", display.rstrip("/")
        self.remote = remote

    def join(self, *parts: str) -> str:
        return "/".join([self.path, *parts])

    def show(self, *parts: str) -> str:
        return "/".join([self.display, *parts])

    def child(self, *parts: str) -> Location:
        """The folder ``parts`` below this one, on the same filesystem."""
        return Location(self.fs, self.join(*parts), self.show(*parts), remote=self.remote)

    def exists(self, *parts: str) -> bool:
        return bool(self.fs.get_file_info(self.join(*parts)).type != pafs.FileType.NotFound)

    def listdir(self, *parts: str) -> list[str]:
        sel = pafs.FileSelector(self.join(*parts), allow_not_found=True)
        return sorted(info.base_name for info in self.fs.get_file_info(sel))

    def read_json(self, name: str) -> Any:
        try:
            info = self.fs.get_file_info(self.path)
        except OSError as exc:  # an object store's failure: bad credentials, no bucket, unreachable
            raise store_error(exc, self.show(name)) from exc
        if info.type == pafs.FileType.File:
            raise DataFileError(
                "expected a shardset dataset folder, found a file",
                path=self.display,
                hint="pass the dataset folder (the one holding dataset.json)",
            )
        if info.type == pafs.FileType.NotFound:
            raise DataFileNotFoundError(
                "no such dataset folder",
                path=self.display,
                hint="check the path, or create it with `datamill shards create`",
            )
        try:
            with self.fs.open_input_stream(self.join(name)) as f:
                return json.loads(f.read().decode("utf-8"))
        except FileNotFoundError as exc:
            raise DataFileNotFoundError("no such file", path=self.show(name)) from exc
        except OSError as exc:
            raise store_error(exc, self.show(name)) from exc
        except (UnicodeDecodeError, ValueError) as exc:
            raise DataFileError(f"not valid JSON: {exc}", path=self.show(name)) from exc

    def tmp_name(self, stem: str) -> str:
        return f".tmp-{stem}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def write_json_atomic(self, name: str, obj: Any, *, durable: bool = True) -> None:
        """Write ``name`` via a temporary file + move (the commit marker is written this way).

        ``durable=False`` skips the fsync (for scratch files that a crash makes worthless anyway).
        """
        tmp = self.tmp_name(name)
        data = json.dumps(obj, indent=2, sort_keys=True).encode("utf-8")
        with self.fs.open_output_stream(self.join(tmp)) as f:
            f.write(data)
        if durable and not self.remote:
            _fsync(self.join(tmp))
        self.fs.move(self.join(tmp), self.join(name))

    def size(self, *parts: str) -> int:
        """Bytes of one file (0 when absent)."""
        info = self.fs.get_file_info(self.join(*parts))
        return int(info.size or 0) if info.type == pafs.FileType.File else 0

    def tree_size(self, *parts: str) -> int:
        """Bytes of every file under a folder (a listing, no reads)."""
        sel = pafs.FileSelector(self.join(*parts), allow_not_found=True, recursive=True)
        return sum(
            int(i.size or 0) for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File
        )

    def remove_tree(self, name: str) -> None:
        if self.exists(name):
            self.fs.delete_dir(self.join(name))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve(root: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None) -> Location:
    """A local path or a URL of a registered scheme (``file://``, ``s3://``, ``memory://``) →
    :class:`Location`.

    A remote URL uses ``filesystem`` or its scheme's (:func:`~datamill.core.storage.filesystem_for`;
    S3: endpoint and keys from the ``AWS_*`` variables).

    Raises:
        ConfigError: an unregistered ``scheme://`` (``gs://``...), naming the known ones, as
            preprocessing and the loader do (:func:`~datamill.core.storage.scheme_of`).
    """
    text = os.fspath(root)
    scheme = scheme_of(text)  # an unregistered scheme:// is refused here, as everywhere
    if scheme.remote:
        fs, path = filesystem_for(text, filesystem=filesystem)
        return Location(fs, path, text, remote=True)
    local = check_path(text.removeprefix(scheme.prefix), name="the dataset path")
    return Location(pafs.LocalFileSystem(), os.path.abspath(local), text)


def file_format(path: str) -> str:
    low = path.lower()
    if low.endswith((".parquet", ".pq")):
        return "parquet"
    if low.endswith(".csv"):
        return "csv"
    raise DataFileError(
        "expected a .parquet or .csv shard file",
        path=path,
        hint="convert it to Parquet or CSV first",
    )


def _read_parquet(source: Any, columns: list[str] | None, display: str) -> pa.Table:
    pf = pq.ParquetFile(source)
    names = pf.schema_arrow.names
    missing = [c for c in columns or [] if c not in names]
    if missing:  # (ParquetFile.read would leave them out without a word)
        raise DataFileError(
            f"missing column {missing[0]!r}; the file has {', '.join(names)}", path=display
        )
    return pf.read(columns=columns)


def read_any(
    fs: pafs.FileSystem,
    path: str,
    *,
    display: str,
    columns: list[str] | None = None,
    schema: pa.Schema | None = None,
    data: bytes | None = None,
) -> pa.Table:
    """Read a Parquet or CSV file (or its content ``data``, already fetched); CSV columns get the
    types of ``schema``."""
    fmt = file_format(path)
    try:
        if fmt == "parquet":  # ParquetFile.read: pq.read_table's pyarrow.dataset imports pandas
            if data is not None:
                return _read_parquet(pa.BufferReader(data), columns, display)
            with fs.open_input_file(path) as f:
                return _read_parquet(f, columns, display)
        types = {f.name: f.type for f in schema} if schema is not None else None
        if data is not None:
            return pcsv.read_csv(
                pa.BufferReader(data), **csv_options("csv", columns=columns, column_types=types)
            )
        with fs.open_input_stream(path) as f:
            return pcsv.read_csv(f, **csv_options("csv", columns=columns, column_types=types))
    except DataFileError:
        raise
    except FileNotFoundError as exc:
        raise DataFileNotFoundError("no such shard file", path=display) from exc
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, KeyError):
            raise DataFileError(f"missing column: {exc}", path=display) from exc
        raise DataFileError(
            f"cannot read this {fmt.upper()} file (corrupt or truncated?): {exc}",
            path=display,
            hint="re-write the file",
        ) from exc


def write_any(fs: pafs.FileSystem, path: str, table: pa.Table, fmt: str, *, local: bool) -> None:
    """Write one shard file (Parquet or CSV); a ``local`` one is fsynced."""
    if (
        fmt == "parquet"
    ):  # dictionary pages only for flat columns (nested ids: 25% slower, no smaller)
        flat = [f.name for f in table.schema if not pa.types.is_nested(f.type)]
        pq.write_table(table, path, filesystem=fs, use_dictionary=flat)
    else:
        try:
            with fs.open_output_stream(path) as f:
                pcsv.write_csv(table, f)
        except pa.ArrowInvalid as exc:
            fs.delete_file(path)
            raise SchemaError(
                f"a CSV shard cannot hold these column types ({exc})",
                path=path,
                hint="write Parquet shards (fmt='parquet', --format parquet) for nested columns",
            ) from exc
    if local:
        _fsync(path)
