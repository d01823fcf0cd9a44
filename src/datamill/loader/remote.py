"""Parquet datasets on object storage (``s3://``), read through a bounded local shard cache.

:class:`RemoteParquetSource` is a :class:`~datamill.core.source.Source` over the ``*.parquet``
files under an ``s3://bucket/prefix`` (one file = one shard; the row counts come from the Parquet
footers, read with small range requests, 16 at a time, when the source opens). Reading a shard
downloads the whole file into a :class:`ShardFileCache`, so the Loader's shard cache, which loads
shards in the order of the epoch's plan and ``prefetch`` ahead, is also what prefetches downloads.

The local cache (:class:`~datamill.core.objstore.ShardFileCache`, re-exported here with
:func:`s3_filesystem`, :func:`is_remote` and :func:`split_url`) never trusts what it has not
checked:

* a download goes to a temporary file beside its final name; its size must equal the object's and
  its Parquet footer must hold the expected rows; only then is it renamed, and its sidecar JSON
  (remote path, size, modification time, xxh3 of the content) is written last, atomically;
* a cached file counts only when its sidecar exists and matches the object, and its content hashes
  to the recorded value when it is read (a truncated or corrupt copy is downloaded again);
* the cache holds at most ``cache_limit`` bytes: least recently used files are evicted first (never
  one being read). Several processes may share a ``cache_dir``; each bounds what it sees.

Credentials and endpoint come from the usual variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_REGION``) or from
:func:`s3_filesystem`'s arguments.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError, SchemaError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.objstore import (
    ShardFileCache,
    default_cache_dir,
    is_remote,
    s3_filesystem,
    split_url,
    store_error,
)
from datamill.core.source import check_read_args
from datamill.core.storage import filesystem_for, scheme_of

__all__ = [
    "FOOTER_THREADS",
    "RemoteParquetSource",
    "ShardFileCache",
    "is_remote",
    "s3_filesystem",
    "split_url",
]

FOOTER_THREADS = 16
"""Parquet footers read at once when a source opens (the row counts; one small ranged GET pair
each)."""


class RemoteParquetSource:
    """The ``*.parquet`` files under an ``s3://`` prefix (sorted by key, one file = one shard),
    cached locally.

    Args:
        url: ``s3://bucket/prefix`` (a folder of Parquet files) or ``s3://bucket/key.parquet``.
        cache_dir: the local shard cache folder. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: bytes the local cache keeps at most. Defaults to ``None`` (no limit).
        filesystem: the filesystem to use. Defaults to ``None`` (the URL scheme's:
            :func:`~datamill.core.storage.filesystem_for`).

    Raises:
        DataFileNotFoundError: nothing at ``url``. DataFileError: a file is not Parquet.
        SchemaError: the files disagree on the schema.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.fs, root = filesystem_for(self.url, filesystem=filesystem)
        self.prefix = scheme_of(self.url).prefix
        try:
            top = self.fs.get_file_info(root)
            if top.type == pafs.FileType.File:
                infos = [top]
            else:
                infos = sorted(
                    (
                        i
                        for i in self.fs.get_file_info(pafs.FileSelector(root, recursive=True))
                        if i.type == pafs.FileType.File and i.path.endswith(".parquet")
                    ),
                    key=lambda i: i.path,
                )
        except DatamillError:
            raise
        except OSError as exc:
            raise store_error(exc, self.url) from exc
        if not infos:
            raise DataFileNotFoundError("no *.parquet object under this prefix", path=self.url)
        self.infos = infos
        self.cache = ShardFileCache(
            self.fs,
            cache_dir if cache_dir is not None else default_cache_dir(),
            cache_limit=cache_limit,
        )
        sizes, schema = [], None
        with ThreadPoolExecutor(
            max_workers=min(FOOTER_THREADS, len(infos))
        ) as pool:  # footers: parallel GETs
            footers = list(pool.map(self._footer, infos))
        for info, md in zip(infos, footers):
            s = md.schema.to_arrow_schema().remove_metadata()
            if schema is None:
                schema = s
            elif not s.equals(schema):
                raise SchemaError(
                    f"schema {s} differs from the first file's {schema}",
                    path=f"{self.prefix}{info.path}",
                )
            sizes.append(md.num_rows)
        assert schema is not None
        self.schema = schema
        self._sizes = np.asarray(sizes, dtype=np.int64)

    def _footer(self, info: pafs.FileInfo) -> pq.FileMetaData:
        try:
            with self.fs.open_input_file(info.path) as f:
                return pq.ParquetFile(f).metadata
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(
                f"not a readable Parquet object ({exc})", path=f"{self.prefix}{info.path}"
            ) from exc

    def __getstate__(
        self,
    ) -> dict[str, Any]:  # spawned DataLoader workers pickle the source; FileInfo does not
        return {**self.__dict__, "infos": [(i.path, i.size, i.mtime_ns) for i in self.infos]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        infos = [
            pafs.FileInfo(p, pafs.FileType.File, mtime_ns=m, size=s) for p, s, m in state["infos"]
        ]
        self.__dict__.update({**state, "infos": infos})

    @property
    def columns(self) -> list[str]:
        """The files' columns."""
        return list(self.schema.names)

    @property
    def num_shards(self) -> int:
        """Number of files."""
        return len(self.infos)

    def shard_sizes(self) -> NDArray[np.int64]:
        """Rows per file (from the footers)."""
        return self._sizes.copy()

    def shard_nbytes(self) -> NDArray[np.int64]:
        """Bytes per file (what a shard costs to fetch and cache)."""
        return np.asarray([i.size for i in self.infos], dtype=np.int64)

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        """File ``index`` (from the local cache, downloaded and checked first if needed)."""
        cols = check_read_args(self, index, columns, path=self.url)
        info, rows = self.infos[int(index)], int(self._sizes[int(index)])

        def check(data: bytes) -> None:
            try:
                got = pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows
            except (OSError, pa.ArrowException) as exc:
                raise DataFileError(
                    f"downloaded copy is not Parquet ({exc})", path=f"{self.prefix}{info.path}"
                ) from exc
            if got != rows:
                raise DataFileError(
                    f"downloaded copy has {got} rows, expected {rows}",
                    path=f"{self.prefix}{info.path}",
                )

        data = self.cache.read(info.path, info=info, check=check)
        return pq.read_table(pa.BufferReader(data), columns=cols)

    def fingerprint(self) -> str:
        """Hash of the objects' keys, sizes and modification times (no content read)."""
        return fingerprint_obj(
            [
                "datamill.loader.RemoteParquetSource@1",
                self.url,
                [(i.path, i.size, i.mtime_ns) for i in self.infos],
            ]
        )

    def __repr__(self) -> str:
        return f"RemoteParquetSource({self.url!r}, {self.num_shards} files)"
