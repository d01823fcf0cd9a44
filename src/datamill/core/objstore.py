"""Object storage (``s3://``): pyarrow's S3 filesystem, located errors, and a bounded local file cache.

* :func:`s3_filesystem` builds pyarrow's ``S3FileSystem`` from arguments or the usual environment
  variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL``, ``AWS_REGION``).
* :func:`store_error` turns pyarrow's S3 failures (missing bucket or object, bad credentials, an
  unreachable endpoint) into one located :class:`~datamill.core.errors.DatamillError`.
* :class:`ShardFileCache` keeps checked local copies of remote files in ``cache_dir``, at most
  ``cache_limit`` bytes (least recently used evicted first). A download goes to a temporary file;
  its size must equal the object's and an optional ``check`` must pass; only then is it renamed,
  and its sidecar JSON (remote path, size, modification time, xxh3 of the content) is written last.
  A cached copy counts only when its sidecar matches the object and its content hashes to the
  recorded value, so a truncated or corrupt copy is downloaded again.
* :func:`fetch_input` gives a local copy of one remote input file (preprocessing inputs), cached
  under the same rules.

The loader's :class:`~datamill.loader.remote.RemoteParquetSource` and the shardset datasets
(:class:`~datamill.shards.dataset.ShardsetDataset` on ``s3://``) both read through this cache.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import xxhash

from datamill.core.checks import check_int
from datamill.core.errors import (
    CacheError,
    ConfigError,
    DataFileError,
    DataFileNotFoundError,
    DatamillError,
)
from datamill.core.io import atomic_write

__all__ = [
    "ShardFileCache",
    "default_cache_dir",
    "fetch_input",
    "is_remote",
    "s3_filesystem",
    "split_url",
    "store_error",
]

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
        if cache_limit is not None:
            check_int(cache_limit, name="cache_limit (bytes)", low=0, high=2**62)
        self.fs, self.dir, self.limit = filesystem, Path(cache_dir), cache_limit
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise CacheError("the shard cache folder is a file (or lies under one)", path=self.dir,
                             hint="pass a folder as --cache-dir (cache_dir=), or remove the file") from exc
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._in_use: dict[str, int] = {}
        self._lru: OrderedDict[str, int] = OrderedDict()  # local name -> bytes, least recent first
        for meta in sorted(self.dir.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
            data = self.dir / meta.stem
            if data.is_file():
                self._lru[meta.stem] = data.stat().st_size
        self.downloads = self.hits = self.evictions = self.bytes_fetched = self.rejected = 0

    def __getstate__(self) -> dict[str, Any]:
        # locks stay in this process (spawned DataLoader workers pickle the source); counters restart
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_key_locks", "_in_use")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._key_locks, self._in_use = threading.Lock(), {}, {}

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


def default_cache_dir() -> Path:
    """The shard cache folder used when none is given: ``$DATAMILL_CACHE_DIR`` or ``<tmp>/datamill-shard-cache``.

    Examples:
        >>> default_cache_dir() == Path(os.environ.get("DATAMILL_CACHE_DIR") or tempfile.gettempdir()
        ...                             + "/datamill-shard-cache")
        True
    """
    env = os.environ.get("DATAMILL_CACHE_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "datamill-shard-cache"


_HINTS = (
    (("NO_SUCH_BUCKET", "NoSuchBucket"), "no such bucket", "check the bucket name (create it first)"),
    (("NO_SUCH_KEY", "NoSuchKey", "Path does not exist", "NOT_FOUND"), "no such object",
     "check the key (a prefix is listed, an object is read)"),
    (("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch", "FORBIDDEN", "403"),
     "access denied (bad or missing credentials?)",
     "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or pass the keys) for this endpoint"),
    (("NETWORK_CONNECTION", "Could not connect", "curlCode", "Timeout", "timed out"),
     "the object store is unreachable",
     "check AWS_ENDPOINT_URL (http://host:port) and that the server is up"),
)


def store_error(exc: BaseException, url: str) -> DatamillError:
    """One located error for an object-store failure (a DatamillError is returned as it is).

    Examples:
        >>> err = store_error(OSError("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation"), "s3://b/x")
        >>> type(err).__name__, err.path
        ('DataFileNotFoundError', 's3://b/x')
        >>> type(store_error(OSError("AWS Error ACCESS_DENIED during HeadObject"), "s3://b/x")).__name__
        'DataFileError'
    """
    if isinstance(exc, DatamillError):
        return exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for needles, what, hint in _HINTS:
        if any(n in text for n in needles):
            cls = DataFileNotFoundError if what.startswith("no such") else DataFileError
            err: DatamillError = cls(f"{what}: {text}", path=url, hint=hint)
            return err
    return DataFileError(f"object store request failed: {text}", path=url)


class _NamedCache(ShardFileCache):
    """A cache whose copies keep the remote base name (one folder per remote path) and record the ETag."""

    def __init__(self, filesystem: pafs.FileSystem, cache_dir: Path, *, etag: str | None) -> None:
        super().__init__(filesystem, cache_dir)
        self.etag = etag

    @staticmethod
    def local_name(remote: str) -> str:
        return Path(remote).name

    def _sidecar(self, info: pafs.FileInfo) -> dict[str, Any]:
        return {**super()._sidecar(info), "etag": self.etag}


def fetch_input(url: str, *, cache_dir: str | os.PathLike[str] | None = None,
                filesystem: pafs.FileSystem | None = None) -> Path:
    """A checked local copy of the object ``url`` (downloaded once; reused while its size, mtime and ETag hold).

    The copy keeps the object's base name (so outputs named after the input keep the name) and
    lives in ``<cache_dir>/inputs/<hash of the URL>/``.

    Args:
        url: ``s3://bucket/key``.
        cache_dir: the cache folder. Defaults to ``None`` (:func:`default_cache_dir`).
        filesystem: the filesystem. Defaults to ``None`` (:func:`s3_filesystem` from the environment).

    Raises:
        DataFileNotFoundError: no such bucket or object. DataFileError: bad credentials, an
        unreachable endpoint, a broken transfer.

    Examples:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); _ = (d / "a.csv").write_text("x\\n1\\n")
        >>> fetch_input(str(d / "a.csv"), cache_dir=d / "c", filesystem=pafs.LocalFileSystem()).name
        'a.csv'
    """
    fs = filesystem if filesystem is not None else s3_filesystem()
    remote = split_url(url) if is_remote(url) else url
    folder = Path(cache_dir if cache_dir is not None else default_cache_dir()) / "inputs" / \
        xxhash.xxh3_64_hexdigest(remote.encode("utf-8"))
    try:
        info = fs.get_file_info(remote)
        if info.type == pafs.FileType.Directory:
            raise DataFileError("expected an object, found a prefix (a folder)", path=url,
                                hint="name one file (s3://bucket/path/data.csv)")
        if info.type != pafs.FileType.File:
            raise DataFileNotFoundError("no such object", path=url, hint="check the bucket and key")
        with fs.open_input_file(remote) as f:  # the ETag tells a rewrite of the same size within a second
            etag = f.metadata().get("ETag")
        cache = _NamedCache(fs, folder, etag=None if etag is None else etag.decode("utf-8", "replace"))
        cache.read(remote, info=info)
    except DatamillError:
        raise
    except OSError as exc:
        raise store_error(exc, url) from exc
    return folder / Path(remote).name
