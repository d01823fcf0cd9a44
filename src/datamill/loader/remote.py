"""Parquet datasets on object storage (``s3://``), read through a bounded local shard cache.

:class:`RemoteParquetSource` is a :class:`~datamill.core.source.Source` over the ``*.parquet``
files under an ``s3://bucket/prefix`` (one file = one shard; the row counts come from the Parquet
footers, read with small range requests, 16 at a time, when the source opens, and recorded in
``cache_dir``: a later open of the same objects, same keys, sizes and times, only lists them; a
prefix indexed by :func:`~datamill.loader.parquet_index.write_parquet_index` is opened from its
index, with no request per object, and each download is checked against the recorded hash).
Reading a shard downloads the whole file into a :class:`ShardFileCache`, so the Loader's shard
cache, which loads shards in the order of the epoch's plan and ``prefetch`` ahead (with warm-up,
the default here: the next window while one is consumed), is also what prefetches downloads.

The local cache (:class:`~datamill.core.objstore.ShardFileCache`, re-exported here with
:func:`s3_filesystem`, :func:`is_remote` and :func:`split_url`) never trusts what it has not
checked:

* a download's size must equal the object's and its Parquet footer must hold the expected rows;
  a direct S3 GET (:mod:`datamill.core.s3get`) is written into a temporary file beside the final
  name as it arrives, and the shard is decoded from that file's mapping (the bytes land once, in
  its page cache); through pyarrow the shard is decoded from the downloaded bytes and a background
  thread at the lowest CPU priority writes them (``write_behind``: at most 256 MiB wait in memory,
  beyond that a download writes its copy itself; ``source.cache.flush()`` waits for the writes);
  either way the file is renamed and its sidecar JSON (remote path, size, modification time, xxh3
  of the content) written last, atomically;
* a cached file counts only when its sidecar exists and matches the object, and its content hashes
  to the recorded value when it is read (a truncated or corrupt copy is downloaded again);
* the cache holds at most ``cache_limit`` bytes: least recently used files are evicted first (never
  one being read). Several processes may share a ``cache_dir``; each bounds what it sees.

Credentials and endpoint come from the usual variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_REGION``) or from
:func:`s3_filesystem`'s arguments.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash
from numpy.typing import NDArray

from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError, SchemaError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.objstore import (
    ShardFileCache,
    default_cache_dir,
    is_remote,
    object_etag,
    s3_filesystem,
    split_url,
    store_error,
)
from datamill.core.parquet import open_parquet
from datamill.core.source import SchemaColumns, check_read_args
from datamill.core.storage import filesystem_for, scheme_of
from datamill.loader.parquet_index import ParquetIndex, parquet_objects, read_parquet_index

__all__ = [
    "FOOTER_THREADS",
    "RemoteParquetSource",
    "ShardFileCache",
    "decode_parquet",
    "is_remote",
    "s3_filesystem",
    "split_url",
]

FOOTERS_FORMAT = "datamill.parquet-footers/2"  # 2: each object's ETag
"""The row counts and schema of a prefix's objects, kept in ``cache_dir`` beside the copies."""

FOOTER_THREADS = 16
"""Parquet footers read at once when a source opens (row counts; a HEAD and a ranged GET each)."""


_PRELOADED = threading.Event()


def _preload() -> None:
    """Import what the first batch's gather imports: ``pyarrow.compute`` (``Table.take``).

    Not pandas: the gather builds its index arrays without ``pa.array`` (which imports pandas on its
    first call), so nothing on a batch's path needs it; importing it here cost 0.25-0.35 s of CPU in
    every cold epoch of a fresh process (issue #41).
    """
    import pyarrow.compute  # noqa: F401


def _preload_in_background() -> None:
    """Run :func:`_preload` in a thread once per process, so its CPU time (about 0.2 s, most of a
    cold first batch) overlaps the footer downloads instead of following them."""
    if not _PRELOADED.is_set():
        _PRELOADED.set()
        threading.Thread(target=_preload, name="datamill-preload", daemon=True).start()


def decode_parquet(data: pa.Buffer, columns: Sequence[str] | None) -> pa.Table:
    """The Parquet file in ``data`` decoded into buffers of the jemalloc pool (when available).

    Through :func:`~datamill.core.parquet.open_parquet` (the decode pool: jemalloc).
    ``ParquetFile.read``, not ``pq.read_table``: the latter goes through ``pyarrow.dataset``, whose
    first import (pandas included) took 0.4-0.7 s of a cold first batch.

    Examples:
        >>> import io
        >>> sink = io.BytesIO(); pq.write_table(pa.table({"x": [1, 2], "y": ["a", "b"]}), sink)
        >>> decode_parquet(pa.py_buffer(sink.getvalue()), ["y"]).to_pydict()
        {'y': ['a', 'b']}
    """
    return open_parquet(pa.BufferReader(data)).read(columns=columns)


class RemoteParquetSource(SchemaColumns):
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

    remote = True
    """Reads cost a round trip to object storage: a Loader warms up by default
    (:class:`~datamill.loader.options.Batching` ``warmup=None``)."""

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
        index: ParquetIndex | None = None
        try:
            top = self.fs.get_file_info(root)
            if top.type == pafs.FileType.File:
                infos = [top]
            else:
                infos, indexed = parquet_objects(self.fs, root)
                if indexed and infos:
                    index = read_parquet_index(self.fs, root, infos)
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
            write_behind=True,  # through pyarrow: the copy written in the background
        )
        _preload_in_background()  # while the footers download
        self._footers_recorded = False  # row counts from the record, not the objects
        self.xxh3: list[str] | None = None  # each object's content hash (from an index)
        etags: list[str | None] = [None] * len(infos)
        if index is not None:  # no request per object; downloads checked against the hashes
            sizes, schema, self.xxh3 = index.rows, index.schema, index.xxh3
        else:
            sizes, schema, etags = self._open_footers(infos)
        self.etags = etags  # each object's version when opened: every download is checked
        self.schema = schema
        self._sizes = np.asarray(sizes, dtype=np.int64)

    def _open_footers(
        self, infos: list[pafs.FileInfo]
    ) -> tuple[list[int], pa.Schema, list[str | None]]:
        """Row counts, schema and ETags of a prefix without an index: from the record a previous
        open kept in ``cache_dir`` while the objects are the same, else from every footer."""
        listing = [[i.path, int(i.size), i.mtime_ns] for i in infos]
        known = self._known_footers(listing)
        if known is not None and known[2] != self._etags(infos):
            known = None  # rewritten in the same second at the same size: read them again
        self._footers_recorded = known is not None
        if known is None:
            sizes, schema, etags = self._read_footers(infos)
            self._remember_footers(listing, sizes, schema, etags)
            return sizes, schema, etags
        return known

    def _read_footers(
        self, infos: list[pafs.FileInfo]
    ) -> tuple[list[int], pa.Schema, list[str | None]]:
        """Row counts, the common schema and the ETags from every file's footer (parallel
        GETs)."""
        sizes, schema, etags = [], None, []
        with ThreadPoolExecutor(max_workers=min(FOOTER_THREADS, len(infos))) as pool:
            footers = list(pool.map(self._footer, infos))
        for info, (md, etag) in zip(infos, footers):
            etags.append(etag)
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
        return sizes, schema, etags

    def _etags(self, infos: list[pafs.FileInfo]) -> list[str | None]:
        """Every object's ETag now (parallel HEAD requests; ``None`` where the store has none)."""

        def head(info: pafs.FileInfo) -> str | None:
            try:
                with self.fs.open_input_file(info.path) as f:  # a HEAD; nothing is read
                    return object_etag(f)
            except OSError:
                return None

        with ThreadPoolExecutor(max_workers=min(FOOTER_THREADS, len(infos))) as pool:
            return list(pool.map(head, infos))

    def _footers_path(self) -> Path:
        return self.cache.dir / f"{xxhash.xxh3_64_hexdigest(self.url.encode('utf-8'))}.footers"

    def _known_footers(
        self, listing: list[list[Any]]
    ) -> tuple[list[int], pa.Schema, list[str | None]] | None:
        """The row counts and schema a previous open recorded for exactly this listing, or None.

        Trusted only when every object's key, size and modification time are the ones recorded
        (what :meth:`fingerprint` hashes too); anything unreadable or different is read again.
        """
        if any(m is None for _, _, m in listing):
            return None
        try:
            raw = json.loads(self._footers_path().read_text(encoding="utf-8"))
            if raw.get("format") != FOOTERS_FORMAT or raw.get("listing") != listing:
                return None
            rows = [int(r) for r in raw["rows"]]
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
            etags = [None if e is None else str(e) for e in raw["etags"]]
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
            return None
        return (rows, schema, etags) if len(rows) == len(listing) == len(etags) else None

    def _remember_footers(
        self, listing: list[list[Any]], rows: list[int], schema: pa.Schema, etags: list[str | None]
    ) -> None:
        """Record the footers beside the cached copies (a later open of the same objects lists)."""
        if any(m is None for _, _, m in listing):
            return
        data = json.dumps(
            {
                "format": FOOTERS_FORMAT,
                "listing": listing,
                "rows": [int(r) for r in rows],
                "etags": etags,
                "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
            }
        )
        path = self._footers_path()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
        try:  # written beside and renamed; a torn file does not parse and is read again
            tmp.write_text(data, encoding="utf-8")
            os.replace(tmp, path)
        except OSError:  # a read-only cache folder: the footers are read again next time
            tmp.unlink(missing_ok=True)

    def _footer(self, info: pafs.FileInfo) -> tuple[pq.FileMetaData, str | None]:
        try:
            with self.fs.open_input_file(info.path) as f:
                return pq.ParquetFile(f).metadata, object_etag(f)
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(
                f"not a readable Parquet object ({exc})", path=f"{self.prefix}{info.path}"
            ) from exc

    def _rows_differ(self, info: pafs.FileInfo, *, got: int, rows: int) -> DataFileError:
        """The error for a copy whose rows are not the plan's; a footer record that said ``rows``
        is stale (the object was rewritten with the same key, size and time): it is named and
        removed, so the next open reads the footers again instead of failing the same way."""
        where = f"{self.prefix}{info.path}"
        if not self._footers_recorded:
            return DataFileError(f"downloaded copy has {got} rows, expected {rows}", path=where)
        record = self._footers_path()
        record.unlink(missing_ok=True)
        return DataFileError(
            f"downloaded copy has {got} rows, but the footer record {record} said {rows} (the "
            "object was rewritten with the same key, size and time); the record is removed",
            path=where,
            hint="run again: the footers are read from the objects on the next open",
        )

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

        def check(data: pa.Buffer) -> None:
            try:
                got = pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows
            except (OSError, pa.ArrowException) as exc:
                raise DataFileError(
                    f"downloaded copy is not Parquet ({exc})", path=f"{self.prefix}{info.path}"
                ) from exc
            if got != rows:
                raise self._rows_differ(info, got=got, rows=rows)

        if self.xxh3 is not None:  # the index's content hash: the rows are the indexed ones
            data = self.cache.read_buffer(info.path, info=info, xxh3=self.xxh3[int(index)])
        else:
            data = self.cache.read_buffer(
                info.path, info=info, check=check, etag=self.etags[int(index)]
            )
        return decode_parquet(data, cols)

    def expect_reads(self, shards: Sequence[int]) -> None:
        """The shards a build reads next, in order: a bounded cache evicts in that plan's order."""
        self.cache.expect([self.infos[int(k)].path for k in shards])

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
