"""Parquet datasets on object storage (``s3://``), read through a bounded local shard cache.

:class:`RemoteParquetSource` is a :class:`~datamill.core.source.Source` over the ``*.parquet``
files under an ``s3://bucket/prefix`` (one file = one shard; the row counts come from the Parquet
footers, read with small range requests when the source opens). Reading a shard downloads the whole
file into a :class:`ShardFileCache`, so the Loader's shard cache, which loads shards in the order of
the epoch's plan and ``prefetch`` ahead, is also what prefetches downloads.

The local cache never trusts what it has not checked:

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

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash
from numpy.typing import NDArray

from datamill.core.errors import (
    CacheError,
    ConfigError,
    DataFileError,
    DataFileNotFoundError,
    SchemaError,
)
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.io import atomic_write
from datamill.core.source import check_read_args

__all__ = ["RemoteParquetSource", "ShardFileCache", "is_remote", "s3_filesystem", "split_url"]

CHUNK = 8 << 20


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ``s3://`` URL.

    Examples:
        >>> is_remote("s3://bucket/data"), is_remote("/tmp/data")
        (True, False)
    """
    return str(path).startswith("s3://")


def split_url(url: str) -> str:
    """``s3://bucket/key`` -> ``bucket/key`` (pyarrow's S3 path).

    Raises:
        ConfigError: not an ``s3://bucket/...`` URL.

    Examples:
        >>> split_url("s3://bucket/data/")
        'bucket/data'
    """
    if not is_remote(url) or not url[5:].strip("/"):
        raise ConfigError(f"expected an s3://bucket/prefix URL, got {url!r}")
    return url[5:].strip("/")


def s3_filesystem(*, endpoint: str | None = None, access_key: str | None = None, secret_key: str | None = None,
                  region: str | None = None, allow_bucket_creation: bool = False) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem from arguments or the usual ``AWS_*`` environment variables.

    Args:
        endpoint: ``http(s)://host:port`` of an S3-compatible server. Defaults to ``None``
            (``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, then AWS itself).
        access_key: defaults to ``None`` (``AWS_ACCESS_KEY_ID``).
        secret_key: defaults to ``None`` (``AWS_SECRET_ACCESS_KEY``).
        region: defaults to ``None`` (``AWS_REGION``, ``AWS_DEFAULT_REGION``, then ``us-east-1``).
        allow_bucket_creation: let ``create_dir("bucket")`` create buckets. Defaults to ``False``.

    Examples:
        >>> fs = s3_filesystem(endpoint="http://127.0.0.1:9", access_key="k", secret_key="s")
        >>> type(fs).__name__
        'S3FileSystem'
    """
    env = os.environ
    endpoint = endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {"region": region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
                              or "us-east-1", "allow_bucket_creation": allow_bucket_creation}
    if endpoint:
        scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
        kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    access_key = access_key or env.get("AWS_ACCESS_KEY_ID")
    secret_key = secret_key or env.get("AWS_SECRET_ACCESS_KEY")
    if access_key and secret_key:
        kwargs.update(access_key=access_key, secret_key=secret_key)
    return pafs.S3FileSystem(**kwargs)


class ShardFileCache:
    """Local, checked copies of remote files in ``cache_dir``, at most ``cache_limit`` bytes (LRU).

    Args:
        filesystem: where the files are (any ``pyarrow.fs.FileSystem``).
        cache_dir: the local folder (created).
        cache_limit: bytes kept at most; a single larger file is still fetched (and evicted next).
            Defaults to ``None`` (no limit).

    Examples:
        >>> import tempfile
        >>> remote = Path(tempfile.mkdtemp()); (remote / "a.bin").write_bytes(b"x" * 10)
        10
        >>> cache = ShardFileCache(pafs.LocalFileSystem(), Path(tempfile.mkdtemp()) / "c", cache_limit=15)
        >>> len(cache.read(str(remote / "a.bin"))), cache.stats()["downloads"], cache.stats()["hits"]
        (10, 1, 0)
        >>> _ = cache.read(str(remote / "a.bin")); cache.stats()["hits"]
        1
    """

    def __init__(self, filesystem: pafs.FileSystem, cache_dir: str | os.PathLike[str], *,
                 cache_limit: int | None = None) -> None:
        if cache_limit is not None and cache_limit < 0:
            raise ConfigError(f"cache_limit must be >= 0 bytes, got {cache_limit}")
        self.fs, self.dir, self.limit = filesystem, Path(cache_dir), cache_limit
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._in_use: dict[str, int] = {}
        self._lru: OrderedDict[str, int] = OrderedDict()  # local name -> bytes, least recent first
        for meta in sorted(self.dir.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
            data = self.dir / meta.stem
            if data.is_file():
                self._lru[meta.stem] = data.stat().st_size
        self.downloads = self.hits = self.evictions = self.bytes_fetched = self.rejected = 0

    def stats(self) -> dict[str, int]:
        """Downloads, cache hits, evictions, bytes fetched, copies rejected, bytes held now."""
        with self._lock:
            return {"downloads": self.downloads, "hits": self.hits, "evictions": self.evictions,
                    "bytes_fetched": self.bytes_fetched, "rejected": self.rejected,
                    "bytes_cached": sum(self._lru.values())}

    @staticmethod
    def local_name(remote: str) -> str:
        """The cached file's name: a hash of the remote path, then its base name."""
        return f"{xxhash.xxh3_64_hexdigest(remote.encode('utf-8'))}-{Path(remote).name}"

    def _sidecar(self, info: pafs.FileInfo) -> dict[str, Any]:
        return {"remote": info.path, "size": int(info.size), "mtime_ns": info.mtime_ns}

    def read(self, remote: str, *, info: pafs.FileInfo | None = None, check: Any = None) -> bytes:
        """The content of ``remote`` (from the cache, or downloaded and checked first).

        Args:
            remote: the path on ``filesystem``.
            info: its ``FileInfo`` (looked up when ``None``).
            check: ``check(data: bytes)`` raising on a bad download (e.g. a Parquet footer check).

        Raises:
            DataFileNotFoundError: no such remote file. DataFileError: the download fails ``check``
            or has the wrong size. CacheError: the cache folder cannot be written.
        """
        if info is None:
            info = self.fs.get_file_info(remote)
        if info.type != pafs.FileType.File:
            raise DataFileNotFoundError("no such remote file", path=remote)
        name = self.local_name(remote)
        with self._lock:
            key_lock = self._key_locks.setdefault(name, threading.Lock())
            self._in_use[name] = self._in_use.get(name, 0) + 1
        try:
            with key_lock:
                data = self._cached(name, info)
                if data is None:
                    data = self._download(remote, name, info, check)
                else:
                    with self._lock:
                        self.hits += 1
                with self._lock:
                    self._lru[name] = len(data)
                    self._lru.move_to_end(name)
            return data
        finally:
            with self._lock:
                self._in_use[name] -= 1
                if not self._in_use[name]:
                    del self._in_use[name]
            self._evict()

    def _cached(self, name: str, info: pafs.FileInfo) -> bytes | None:
        path, meta_path = self.dir / name, self.dir / f"{name}.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            data = path.read_bytes()
        except (OSError, ValueError):
            return None
        want = self._sidecar(info)
        if any(meta.get(k) != v for k, v in want.items()) or len(data) != want["size"] \
                or meta.get("xxh3") != xxhash.xxh3_128_hexdigest(data):
            with self._lock:
                self.rejected += 1
            self._remove(name)
            return None
        return data

    def _download(self, remote: str, name: str, info: pafs.FileInfo, check: Any) -> bytes:
        chunks = []
        try:
            with self.fs.open_input_stream(remote) as f:
                while chunk := f.read(CHUNK):
                    chunks.append(chunk)
        except OSError as exc:
            raise DataFileError(f"download failed: {exc}", path=remote) from exc
        data = b"".join(chunks)
        if len(data) != info.size:
            raise DataFileError(f"downloaded {len(data)} bytes, the object has {info.size}", path=remote,
                                hint="the object changed or the transfer broke; retry")
        if check is not None:
            check(data)
        try:
            with atomic_write(self.dir / name, "wb") as f:
                f.write(data)
            with atomic_write(self.dir / f"{name}.json") as f:  # the sidecar last: the commit marker
                json.dump({**self._sidecar(info), "xxh3": xxhash.xxh3_128_hexdigest(data)}, f, sort_keys=True)
        except OSError as exc:
            raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
        with self._lock:
            self.downloads += 1
            self.bytes_fetched += len(data)
        return data

    def _remove(self, name: str) -> None:
        for p in (self.dir / f"{name}.json", self.dir / name):  # the marker first
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def _evict(self) -> None:
        if self.limit is None:
            return
        victims = []
        with self._lock:
            total = sum(self._lru.values())
            for name in list(self._lru):
                if total <= self.limit:
                    break
                if name in self._in_use:
                    continue
                total -= self._lru.pop(name)
                victims.append(name)
                self.evictions += 1
        for name in victims:
            self._remove(name)


class RemoteParquetSource:
    """The ``*.parquet`` files under an ``s3://`` prefix (sorted by key, one file = one shard), cached locally.

    Args:
        url: ``s3://bucket/prefix`` (a folder of Parquet files) or ``s3://bucket/key.parquet``.
        cache_dir: the local shard cache folder.
        cache_limit: bytes the local cache keeps at most. Defaults to ``None`` (no limit).
        filesystem: the filesystem to use. Defaults to ``None`` (:func:`s3_filesystem` from the environment).

    Raises:
        DataFileNotFoundError: nothing at ``url``. DataFileError: a file is not Parquet.
        SchemaError: the files disagree on the schema.
    """

    def __init__(self, url: str, *, cache_dir: str | os.PathLike[str], cache_limit: int | None = None,
                 filesystem: pafs.FileSystem | None = None) -> None:
        self.url = url.rstrip("/")
        self.fs = filesystem if filesystem is not None else s3_filesystem()
        root = split_url(self.url)
        try:
            top = self.fs.get_file_info(root)
            if top.type == pafs.FileType.File:
                infos = [top]
            else:
                infos = sorted((i for i in self.fs.get_file_info(pafs.FileSelector(root, recursive=True))
                                if i.type == pafs.FileType.File and i.path.endswith(".parquet")), key=lambda i: i.path)
        except OSError as exc:
            raise DataFileNotFoundError(f"cannot list the object store: {exc}", path=self.url) from exc
        if not infos:
            raise DataFileNotFoundError("no *.parquet object under this prefix", path=self.url)
        self.infos = infos
        self.cache = ShardFileCache(self.fs, cache_dir, cache_limit=cache_limit)
        sizes, schema = [], None
        for info in infos:
            try:
                with self.fs.open_input_file(info.path) as f:
                    md = pq.ParquetFile(f).metadata
            except (OSError, pa.ArrowException) as exc:
                raise DataFileError(f"not a readable Parquet object ({exc})", path=f"s3://{info.path}") from exc
            s = md.schema.to_arrow_schema().remove_metadata()
            if schema is None:
                schema = s
            elif not s.equals(schema):
                raise SchemaError(f"schema {s} differs from the first file's {schema}", path=f"s3://{info.path}")
            sizes.append(md.num_rows)
        assert schema is not None
        self.schema = schema
        self._sizes = np.asarray(sizes, dtype=np.int64)

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
                raise DataFileError(f"downloaded copy is not Parquet ({exc})", path=f"s3://{info.path}") from exc
            if got != rows:
                raise DataFileError(f"downloaded copy has {got} rows, expected {rows}", path=f"s3://{info.path}")

        data = self.cache.read(info.path, info=info, check=check)
        return pq.read_table(pa.BufferReader(data), columns=cols)

    def fingerprint(self) -> str:
        """Hash of the objects' keys, sizes and modification times (no content read)."""
        return fingerprint_obj(["datamill.loader.RemoteParquetSource@1", self.url,
                                [(i.path, i.size, i.mtime_ns) for i in self.infos]])

    def __repr__(self) -> str:
        return f"RemoteParquetSource({self.url!r}, {self.num_shards} files)"
