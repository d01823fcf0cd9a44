"""Reading object storage (``s3://``, ``memory://``): a bounded, checked local file cache.

URLs, filesystems and error translation live in :mod:`datamill.core.storage` (the one storage seam);
``is_remote``, ``split_url``, ``s3_filesystem`` and ``store_error`` are re-exported here under their
old names.
* :class:`ShardFileCache` keeps checked local copies of remote files in ``cache_dir``, at most
  ``cache_limit`` bytes plus the copies being read at the moment (never evicted mid-read; least
  recently used, or last needed by the plan, evicted first). A download goes to a temporary file;
  its size must equal the object's and an optional ``check`` must pass; only then is it renamed,
  and its sidecar JSON (remote path, size, modification time, xxh3 of the content) is written last.
  A cached copy counts only when its sidecar matches the object and its content hashes to the
  recorded value, so a truncated or corrupt copy is downloaded again. A reader that recorded the
  object's ETag when it opened (``etag=``) gets only that version: a cached copy of another
  version is downloaded again, and a download whose ETag differs (the object was rewritten since,
  even at the same size) is a located error, never other bytes under the same fingerprint.
* :func:`fetch_input` gives a local copy of one remote input file (preprocessing inputs), cached
  under the same rules.

The loader's :class:`~datamill.loader.remote.RemoteParquetSource` and the shardset datasets
(:class:`~datamill.shards.dataset.ShardsetDataset` on ``s3://``) both read through this cache.
"""

from __future__ import annotations

import json
import mmap
import os
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import xxhash

from datamill.core.checks import check_int
from datamill.core.errors import (
    CacheError,
    DataFileError,
    DataFileNotFoundError,
    DatamillError,
)
from datamill.core.output import write_at
from datamill.core.s3 import s3_filesystem
from datamill.core.s3get import DirectGetter, direct_getter
from datamill.core.storage import filesystem_for, is_remote, split_url, storage_error

__all__ = [
    "ShardFileCache",
    "default_cache_dir",
    "fetch_input",
    "is_remote",
    "object_etag",
    "s3_filesystem",
    "split_url",
    "store_error",
]

CHUNK = 8 << 20
SCRATCH_MAX = 256 << 20
"""Objects up to this size are downloaded through a per-thread reused buffer (:func:`_scratch`)."""
WRITE_BEHIND_MAX = 256 << 20
"""Bytes of downloaded copies a write-behind cache holds in memory at most while the background
writer has not written them (a download past it writes its copy itself, as without write-behind)."""
TMP_SUFFIX = ".partial"
"""A copy or sidecar being written (``.<name>.<random>.partial``), renamed when complete."""
STALE_TMP_S = 3600
"""Partial files older than this are a crashed writer's, removed when a cache opens."""


class ShardFileCache:
    """Local, checked copies of remote files in ``cache_dir``, at most ``cache_limit`` bytes (LRU).

    Args:
        filesystem: where the files are (any ``pyarrow.fs.FileSystem``).
        cache_dir: the local folder (created).
        cache_limit: bytes kept at most; a single larger file is still fetched (and evicted next).
            Defaults to ``None`` (no limit).
        write_behind: a download through pyarrow is returned from memory and its copy written
            by a background thread at the lowest CPU priority (at most :data:`WRITE_BEHIND_MAX`
            bytes waiting, and at most ``cache_limit``; a read of a waiting copy is served from
            memory; :meth:`flush` waits for them); a failed write leaves the file uncached
            (downloaded again next time) and warns once (``RuntimeWarning``). A direct S3 GET
            (:mod:`datamill.core.s3get`) always writes its copy as it arrives and is decoded from
            it. Defaults to ``False`` (written before the read returns).

    Examples:
        >>> import tempfile
        >>> remote = Path(tempfile.mkdtemp()); (remote / "a.bin").write_bytes(b"x" * 10)
        10
        >>> cache = ShardFileCache(
        ...     pafs.LocalFileSystem(), Path(tempfile.mkdtemp()) / "c", cache_limit=15
        ... )
        >>> (
        ...     len(cache.read(str(remote / "a.bin"))),
        ...     cache.stats()["downloads"],
        ...     cache.stats()["hits"],
        ... )
        (10, 1, 0)
        >>> _ = cache.read(str(remote / "a.bin")); cache.stats()["hits"]
        1
    """

    def __init__(
        self,
        filesystem: pafs.FileSystem,
        cache_dir: str | os.PathLike[str],
        *,
        cache_limit: int | None = None,
        write_behind: bool = False,
    ) -> None:
        if cache_limit is not None:
            check_int(cache_limit, name="cache_limit (bytes)", low=0, high=2**62)
        self.fs, self.dir, self.limit = filesystem, Path(cache_dir), cache_limit
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise CacheError(
                "the shard cache folder is a file (or lies under one)",
                path=self.dir,
                hint="pass a folder as --cache-dir (cache_dir=), or remove the file",
            ) from exc
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._in_use: dict[str, int] = {}
        self._next_use: dict[str, int] = {}  # local name -> position in the plan (see expect)
        self._lru: OrderedDict[str, int] = OrderedDict()  # local name -> bytes, least recent first
        self.write_behind = bool(write_behind)
        self._init_pending()
        now = time.time()
        for tmp in self.dir.glob(f".*{TMP_SUFFIX}"):  # another process may be writing a new one
            try:
                if now - tmp.stat().st_mtime > STALE_TMP_S:
                    tmp.unlink()
            except OSError:
                pass
        for meta in sorted(self.dir.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
            data = self.dir / meta.stem
            if data.is_file():
                self._lru[meta.stem] = data.stat().st_size
        self.downloads = self.hits = self.evictions = self.bytes_fetched = self.rejected = 0

    def __getstate__(self) -> dict[str, Any]:
        # locks stay in this process (spawned DataLoader workers pickle the source); counters
        # restart
        return {
            k: v
            for k, v in self.__dict__.items()
            if k
            not in (
                "_lock",
                "_key_locks",
                "_in_use",
                "_next_use",
                "_pending",
                "_written",
                "_getter",
            )
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._key_locks, self._in_use = threading.Lock(), {}, {}
        self._next_use = {}
        self._init_pending()

    def _init_pending(self) -> None:
        # downloaded, waiting for the writer: name -> (content, its sidecar)
        self._pending: dict[str, tuple[pa.Buffer, dict[str, Any]]] = {}
        self._pending_bytes = 0
        self._warned = False  # a failed background write said once (RuntimeWarning)
        # background writes submitted and not ended (their eviction included), by id of the copy
        self._writing: dict[int, pa.Buffer] = {}
        self._written = threading.Condition(self._lock)
        self._pid = os.getpid()  # a forked child forgets its parent's waiting copies (not its own)

    def _forked(self) -> None:
        """In a forked child: the copies waiting for the parent's writer are the parent's to write
        (this process's writer is another thread), so they are forgotten here."""
        if self._pid != os.getpid():
            self._init_pending()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every copy waiting for the background writer is written and the cache is back
        within its limit (``write_behind``); whether none is left."""
        self._forked()
        with self._written:
            return self._written.wait_for(lambda: not self._pending and not self._writing, timeout)

    def stats(self) -> dict[str, int]:
        """Downloads, cache hits, evictions, bytes fetched, copies rejected, bytes held now."""
        with self._lock:
            return {
                "downloads": self.downloads,
                "hits": self.hits,
                "evictions": self.evictions,
                "bytes_fetched": self.bytes_fetched,
                "rejected": self.rejected,
                "bytes_cached": sum(self._lru.values()),
            }

    @staticmethod
    def local_name(remote: str) -> str:
        """The cached file's name: a hash of the remote path, then its base name."""
        return f"{xxhash.xxh3_64_hexdigest(remote.encode('utf-8'))}-{Path(remote).name}"

    def _sidecar(self, info: pafs.FileInfo) -> dict[str, Any]:
        return {"remote": info.path, "size": int(info.size), "mtime_ns": info.mtime_ns}

    def read(self, remote: str, **options: Any) -> bytes:
        """The content of ``remote`` (from the cache, or downloaded and checked first): the bytes of
        :meth:`read_buffer` (same keywords: ``info``, ``check``, ``etag``, ``xxh3``)."""
        data: bytes = self.read_buffer(remote, **options).to_pybytes()
        return data

    def read_buffer(
        self,
        remote: str,
        *,
        info: pafs.FileInfo | None = None,
        check: Any = None,
        etag: str | None = None,
        xxh3: str | None = None,
    ) -> pa.Buffer:
        """The content of ``remote`` without a copy (from the cache, or downloaded and checked
        first): the cached file mapped into memory (read-only); with ``write_behind``, a
        download's own buffer through pyarrow (its copy is written in the background).

        A download streams into the cache file (hashed on the way) and the mapping of that file is
        returned, so the bytes are copied once, from the network into the page cache, instead of
        into a new buffer and then into the file; a warm read maps the file instead of copying it.
        The mapping stays valid when the copy is evicted or replaced later (both unlink or rename,
        never write in place).

        Args:
            remote: the path on ``filesystem``.
            info: its ``FileInfo`` (looked up when ``None``).
            check: ``check(data)`` raising on a bad download (e.g. a Parquet footer check);
                ``data`` is a bytes-like object (a ``pyarrow.Buffer``).
            etag: the object's ETag when the reader opened it: only that version is read.
                Defaults to ``None`` (size and modification time only).
            xxh3: the xxh3-128 (hex) the content must hash to (recorded when the object was
                written, e.g. by a Parquet index): only that content is read, cached or
                downloaded. Defaults to ``None``.

        Raises:
            DataFileNotFoundError: no such remote file. DataFileError: the download fails ``check``
            or has the wrong size, or another ETag than ``etag``, or another hash than ``xxh3``.
            CacheError: the cache folder cannot be written.
        """
        if info is None:
            info = self.fs.get_file_info(remote)
        if info.type != pafs.FileType.File:
            raise DataFileNotFoundError("no such remote file", path=remote)
        name = self.local_name(remote)
        self._forked()
        with self._lock:
            key_lock = self._key_locks.setdefault(name, threading.Lock())
            self._in_use[name] = self._in_use.get(name, 0) + 1
        try:
            want = self._want(info, etag, xxh3)
            with key_lock:
                data = self._pending_copy(name, want)
                if data is None:
                    data = self._cached(name, want)
                if data is None:
                    data = self._download(remote, name, info, check, want)
                else:
                    with self._lock:
                        self.hits += 1
                with self._lock:
                    self._lru[name] = len(data)
                    self._lru.move_to_end(name)
                    self._next_use.pop(name, None)  # read: its next use is past the plan given
            return data
        finally:
            with self._lock:
                self._in_use[name] -= 1
                if not self._in_use[name]:
                    del self._in_use[name]
            self._evict()

    def _want(self, info: pafs.FileInfo, etag: str | None, xxh3: str | None) -> dict[str, Any]:
        """What a copy's sidecar must say: the object's path, size and time, and the ETag and the
        content hash when the reader knows them (another version is downloaded again)."""
        want = self._sidecar(info)
        if etag is not None:
            want["etag"] = etag
        if xxh3 is not None:
            want["xxh3"] = xxh3
        return want

    def _pending_copy(self, name: str, want: dict[str, Any]) -> pa.Buffer | None:
        """The copy of ``name`` downloaded and not yet written (``write_behind``), if it is this
        version of the object."""
        with self._lock:
            data, meta = self._pending.get(name, (None, {}))
        if data is None or any(meta.get(k) != v for k, v in want.items()):
            return None
        return data

    def _cached(self, name: str, want: dict[str, Any]) -> pa.Buffer | None:
        path, meta_path = self.dir / name, self.dir / f"{name}.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            with open(path, "rb") as f:
                data = _mapped(f, os.fstat(f.fileno()).st_size)
        except (OSError, ValueError):
            return None
        if (
            any(meta.get(k) != v for k, v in want.items())
            or len(data) != want["size"]
            or meta.get("xxh3") != xxhash.xxh3_128_hexdigest(data)
        ):
            with self._lock:
                self.rejected += 1
            self._remove(name)
            return None
        return data

    def _download(
        self, remote: str, name: str, info: pafs.FileInfo, check: Any, want: dict[str, Any]
    ) -> pa.Buffer:
        """Stream ``remote`` into a temporary file beside the copy (hashed on the way), check it,
        rename it, then write the sidecar (the commit marker); the file's mapping is returned.

        Not fsynced: a copy is trusted only when its content hashes to the sidecar's ``xxh3`` when
        it is read, so a copy torn by a crash is downloaded again, and an fsync per file (two per
        shard) cost more than the download of a small shard on a busy disk.
        """
        if (
            self.write_behind
            and 0 < info.size <= SCRATCH_MAX
            and self._direct() is None  # a direct GET streams into the file: nothing to hold
            and self._reserve(name, info.size)
        ):
            return self._download_behind(remote, name, info, check, want)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{name}.", suffix=TMP_SUFFIX)
        except OSError as exc:
            raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
        try:
            with os.fdopen(fd, "wb") as out:
                got, digest, now = self._stream(remote, out, info.size)
                data = _mapped(out, got)
            self._check(remote, data, now, digest, want, check)
            try:
                os.replace(tmp, self.dir / name)
                self._write_sidecar(name, {**want, "xxh3": digest})
            except OSError as exc:
                raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self._lock:
            self.downloads += 1
            self.bytes_fetched += got
        return data

    @staticmethod
    def _check(
        remote: str,
        data: pa.Buffer,
        now: str | None,
        digest: str,
        want: dict[str, Any],
        check: Any,
    ) -> None:
        """A download's checks: the version (ETag) the reader opened, the size, the content hash
        the reader knows (``want``, see :meth:`_want`), then ``check(data)``."""
        etag, size, xxh3 = want.get("etag"), want["size"], want.get("xxh3")
        if etag is not None and now is not None and now != etag:
            raise DataFileError(
                f"the object changed since the source was opened (ETag {now}, was {etag})",
                path=remote,
                hint="open the dataset again (a new Loader or Source) to read the new version",
            )
        if len(data) != size:
            raise DataFileError(
                f"downloaded {len(data)} bytes, the object has {size}",
                path=remote,
                hint="the object changed or the transfer broke; retry",
            )
        if xxh3 is not None and digest != xxh3:
            raise DataFileError(
                f"the object's content differs from the one recorded when it was written (xxh3 "
                f"{digest}, recorded {xxh3}): it changed since",
                path=remote,
                hint="open the dataset again (a new Loader or Source) to read the new version; "
                "rewrite its index if it has one (write_parquet_index)",
            )
        if check is not None:
            check(data)

    def _reserve(self, name: str, size: int) -> bool:
        """Room for ``size`` more bytes waiting for the writer (taken when there is), and no other
        version of ``name`` waiting."""
        cap = WRITE_BEHIND_MAX if self.limit is None else min(WRITE_BEHIND_MAX, self.limit)
        with self._lock:  # a bounded cache: no more waiting than it may hold
            if self._pending_bytes + size > cap or name in self._pending:
                return False
            self._pending_bytes += size
            return True

    def _download_behind(
        self, remote: str, name: str, info: pafs.FileInfo, check: Any, want: dict[str, Any]
    ) -> pa.Buffer:
        """:meth:`_download` with ``write_behind``: one GET into a new buffer (decoded from there:
        no copy between the download and Arrow), checked, returned; the copy and its sidecar are
        written by the background writer (:meth:`_write_pending`), the same way."""
        try:
            try:
                fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{name}.", suffix=TMP_SUFFIX)
            except OSError as exc:
                raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
            try:
                buf = pa.allocate_buffer(info.size)  # Arrow's default pool
                got, now = self._into(remote, memoryview(buf).cast("B"))  # Arrow's format: "b"
                data = buf.slice(0, got)
                digest = xxhash.xxh3_128_hexdigest(data)
                self._check(remote, data, now, digest, want, check)
            except BaseException:
                os.close(fd)
                Path(tmp).unlink(missing_ok=True)
                raise
        except BaseException:
            with self._lock:
                self._pending_bytes -= info.size
            raise
        meta = {**want, "xxh3": digest}
        with self._lock:
            self._pending[name] = (data, meta)
            self._writing[id(data)] = data
            self.downloads += 1
            self.bytes_fetched += len(data)
        try:
            _writer().submit(self._write_pending, name, fd, tmp, data, meta)
        except RuntimeError:  # the interpreter is shutting down: written here
            self._write_pending(name, fd, tmp, data, meta)
        return data

    def _direct(self) -> DirectGetter | None:
        """The S3 endpoint's direct GETs (one request, no HEAD first), or ``None`` (through
        pyarrow); decided once per cache (and again in an unpickled copy)."""
        if not hasattr(self, "_getter"):
            self._getter = direct_getter(self.fs)
        return self._getter

    def _into(self, remote: str, view: memoryview) -> tuple[int, str | None]:
        """One GET of ``remote`` through pyarrow (a HEAD, then a ranged GET) into ``view``
        (``len(view)`` bytes expected): (bytes, ETag)."""
        try:
            with self.fs.open_input_file(remote) as f:
                return int(f.readinto(view)), object_etag(f)
        except OSError as exc:
            raise DataFileError(f"download failed: {exc}", path=remote) from exc

    def _write_pending(
        self, name: str, fd: int, tmp: str, data: pa.Buffer, meta: dict[str, Any]
    ) -> None:
        """In the background writer: the waiting copy of ``name`` into its temporary file, renamed,
        then its sidecar (the commit marker); on a failure the file stays uncached. The cache is
        back within its limit before :meth:`flush` can return."""
        try:
            try:
                try:
                    write_at(fd, memoryview(data))
                finally:
                    os.close(fd)
                os.replace(tmp, self.dir / name)
                self._write_sidecar(name, meta)
            except OSError as exc:  # a full or read-only disk: downloaded again, said once
                self._remove(name)
                Path(tmp).unlink(missing_ok=True)
                with self._lock:
                    self._lru.pop(name, None)
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"{self.dir}: could not write the local copy of {name} ({exc}); shards are "
                        "read from the store, not cached: free space in the cache folder or choose "
                        "another",
                        RuntimeWarning,
                        stacklevel=1,
                    )
            finally:
                with self._written:
                    mine = self._pending.get(name)
                    if mine is not None and mine[0] is data:  # not forgotten (forked)
                        del self._pending[name]
                        self._pending_bytes -= len(data)
            self._evict()
        finally:
            with self._written:
                if self._writing.get(id(data)) is data:  # not forgotten (forked)
                    del self._writing[id(data)]
                self._written.notify_all()

    def _stream(self, remote: str, out: Any, size: int) -> tuple[int, str, str | None]:
        """GET ``remote`` into the open file ``out`` (``size`` bytes): (bytes, xxh3 hex, the
        object's ETag or ``None``).

        A direct GET (:meth:`_direct_stream`) writes the body into the file as it arrives, in
        pieces of 256 KiB the allocator reuses; through pyarrow, one GET of the whole object
        into a reused buffer, hashed, then one ``pwrite``. (Writing the GET into
        a shared writable mapping of the file cost a page fault and ``page_mkwrite`` per 4 KiB
        page: 1.2 s of reader CPU per 590 MB cold epoch; issue #41, benchmarks/RESULTS.md.)
        """
        digest = xxhash.xxh3_128()
        piped = self._direct_stream(remote, out.fileno(), size, digest) if size > 0 else None
        if piped is not None:
            return piped
        if 0 < size <= SCRATCH_MAX:
            view = _scratch(size)  # through pyarrow, into this thread's reused buffer
            got, etag = self._into(remote, view)
            digest.update(view[:got])
            try:
                write_at(out.fileno(), view[:got])
            except OSError as exc:
                raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
            return got, digest.hexdigest(), etag
        try:
            f = self.fs.open_input_file(remote)
        except OSError as exc:
            raise DataFileError(f"download failed: {exc}", path=remote) from exc
        with f:  # empty, or not kept per thread: through a buffer of its own
            etag = object_etag(f)
            if size <= 0:
                return 0, digest.hexdigest(), etag
            return (*self._buffered(remote, f, out, size), etag)

    def _direct_stream(
        self, remote: str, fd: int, size: int, digest: Any
    ) -> tuple[int, str, str | None] | None:
        """One direct GET written piece by piece into the file ``fd`` and hashed on the way
        (:meth:`DirectGetter.write_into`): (bytes, xxh3 hex, ETag). ``None`` where there is no
        direct GET, or it failed (refused, broken off: the file is emptied, the caller reads
        through pyarrow)."""
        direct = self._direct()
        if direct is None:
            return None
        try:
            done, etag = direct.write_into(remote, size, fd, digest=digest, where=self.dir)
        except OSError:
            try:
                os.ftruncate(fd, 0)
            except OSError as exc:
                raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
            digest.reset()
            return None
        return done, digest.hexdigest(), etag

    def _buffered(self, remote: str, f: Any, out: Any, size: int) -> tuple[int, str]:
        """:meth:`_stream` where the file cannot be mapped: the GET into a buffer, then written."""
        try:
            data = f.read_buffer(size)
        except OSError as exc:
            raise DataFileError(f"download failed: {exc}", path=remote) from exc
        try:
            out.seek(0)
            out.write(data)
            out.truncate(data.size)
            out.flush()
        except OSError as exc:
            raise CacheError(f"cannot write the shard cache: {exc}", path=self.dir) from exc
        return int(data.size), xxhash.xxh3_128_hexdigest(data)

    def _write_sidecar(self, name: str, meta: dict[str, Any]) -> None:
        """The sidecar (the commit marker), written beside and renamed."""
        final = self.dir / f"{name}.json"
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{final.name}.", suffix=TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(meta, sort_keys=True).encode("utf-8"))
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _remove(self, name: str) -> None:
        for p in (self.dir / f"{name}.json", self.dir / name):  # the marker first
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def expect(self, remotes: Sequence[str]) -> None:
        """The order in which ``remotes`` will be read next (a plan's shards, first needed first).

        Eviction then follows the plan (Belady's rule with the plan as the future): copies not in
        it, or already read since, go first (least recently used first), then the copies needed
        last. A bounded cache thus keeps, at the start of an epoch, the copies that epoch reads
        before it evicts them, instead of the ones read last. Only the order of eviction changes.
        """
        order = {self.local_name(r): i for i, r in enumerate(remotes)}
        with self._lock:
            self._next_use = order

    def _evict(self) -> None:
        """Remove copies until at most ``limit`` bytes are held (in the plan's order)."""
        if self.limit is None:
            return
        victims = []
        with self._lock:
            total = sum(self._lru.values())
            later = self._next_use
            # not needed by the plan (least recently used first), then needed last first
            ranked = [n for n in self._lru if n not in later] + sorted(
                (n for n in self._lru if n in later), key=lambda n: -later[n]
            )
            for name in ranked:
                if total <= self.limit:
                    break
                if name in self._pending:  # removed by its writer's own pass once written, so
                    total -= self._lru[name]  # a copy the plan needs sooner is not removed for it
                    continue
                if name in self._in_use:
                    continue
                total -= self._lru.pop(name)
                victims.append(name)
                self.evictions += 1
        for name in victims:
            self._remove(name)


def object_etag(f: Any) -> str | None:
    """The ETag of an open object (``None`` where the filesystem has none: local, memory)."""
    try:
        raw = f.metadata().get("ETag")
    except (OSError, AttributeError, pa.ArrowException):
        return None
    return None if raw is None else raw.decode("utf-8", "replace")


_SCRATCH = threading.local()


def _scratch(size: int) -> memoryview:
    """This thread's download buffer, at least ``size`` bytes (grown, never shrunk; it goes with
    the thread: a reader pool's threads end with its last build). Reused, so its pages are
    faulted in once per thread instead of once per download."""
    buf: bytearray | None = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < size:
        buf = _SCRATCH.buf = bytearray(size)
    return memoryview(buf)[:size]


_WRITER: list[tuple[int, ThreadPoolExecutor]] = []  # (the process id that made it, the writer)
_WRITER_LOCK = threading.Lock()


def _lowest_priority() -> None:
    """This thread at nice 19 (Linux: a thread's own priority), so a write-behind cache's writes
    take the CPU the readers and the training loop leave idle."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux / not allowed: normal priority
        pass


def _writer() -> ThreadPoolExecutor:
    """The process's one background writer thread of write-behind caches (created on first use,
    and again in a forked child, which has no copy of its parent's thread; its queue is finished
    when the interpreter exits, as every ``ThreadPoolExecutor``'s is)."""
    with _WRITER_LOCK:
        if not _WRITER or _WRITER[0][0] != os.getpid():  # none yet, or the parent's (forked)
            pool = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="datamill-cache-write",
                initializer=_lowest_priority,
            )
            _WRITER[:] = [(os.getpid(), pool)]
        return _WRITER[0][1]


def _mapped(f: Any, size: int) -> pa.Buffer:
    """The first ``size`` bytes of the open file ``f`` (readable: a download's file comes from
    ``mkstemp``, opened read-write), mapped read-only (pages faulted in at once where the platform
    can: ``MAP_POPULATE``), as a zero-copy ``pyarrow.Buffer``; read into memory where the file
    system cannot map files."""
    if size <= 0:
        return pa.py_buffer(b"")
    try:
        populate = getattr(mmap, "MAP_POPULATE", 0)
        if populate:
            mapped = mmap.mmap(
                f.fileno(), size, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ
            )
        else:
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # a file system without mmap
        return pa.py_buffer(os.pread(f.fileno(), size, 0))
    return pa.py_buffer(mapped)


def default_cache_dir() -> Path:
    """The shard cache folder used when none is given: ``$DATAMILL_CACHE_DIR`` or
    ``<tmp>/datamill-shard-cache``.

    Examples:
        >>> default_cache_dir() == Path(
        ...     os.environ.get("DATAMILL_CACHE_DIR")
        ...     or tempfile.gettempdir() + "/datamill-shard-cache"
        ... )
        True
    """
    env = os.environ.get("DATAMILL_CACHE_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "datamill-shard-cache"


store_error = storage_error
"""The located error of a storage failure (:func:`datamill.core.storage.storage_error`; the old
name)."""


class _NamedCache(ShardFileCache):
    """A cache whose copies keep the remote base name (one folder per remote path) and record the
    ETag."""

    def __init__(self, filesystem: pafs.FileSystem, cache_dir: Path, *, etag: str | None) -> None:
        super().__init__(filesystem, cache_dir)
        self.etag = etag

    @staticmethod
    def local_name(remote: str) -> str:
        return Path(remote).name

    def _sidecar(self, info: pafs.FileInfo) -> dict[str, Any]:
        return {**super()._sidecar(info), "etag": self.etag}


def fetch_input(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    filesystem: pafs.FileSystem | None = None,
) -> Path:
    """A checked local copy of the object ``url`` (downloaded once; reused while its size, mtime and
    ETag hold).

    The copy keeps the object's base name (so outputs named after the input keep the name) and
    lives in ``<cache_dir>/inputs/<hash of the URL>/``.

    Args:
        url: ``s3://bucket/key``.
        cache_dir: the cache folder. Defaults to ``None`` (:func:`default_cache_dir`).
        filesystem: the filesystem. Defaults to ``None`` (the URL scheme's,
            :func:`~datamill.core.storage.filesystem_for`).

    Raises:
        DataFileNotFoundError: no such bucket or object. DataFileError: bad credentials, an
        unreachable endpoint, a broken transfer.

    Examples:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); _ = (d / "a.csv").write_text("x\\n1\\n")
        >>> fetch_input(str(d / "a.csv"), cache_dir=d / "c", filesystem=pafs.LocalFileSystem()).name
        'a.csv'
    """
    fs, remote = filesystem_for(url, filesystem=filesystem)
    folder = (
        Path(cache_dir if cache_dir is not None else default_cache_dir())
        / "inputs"
        / xxhash.xxh3_64_hexdigest(remote.encode("utf-8"))
    )
    try:
        info = fs.get_file_info(remote)
        if info.type == pafs.FileType.Directory:
            raise DataFileError(
                "expected an object, found a prefix (a folder)",
                path=url,
                hint="name one file (s3://bucket/path/data.csv)",
            )
        if info.type != pafs.FileType.File:
            raise DataFileNotFoundError("no such object", path=url, hint="check the bucket and key")
        with fs.open_input_file(
            remote
        ) as f:  # the ETag tells a rewrite of the same size within a second
            etag = f.metadata().get("ETag")
        cache = _NamedCache(
            fs, folder, etag=None if etag is None else etag.decode("utf-8", "replace")
        )
        cache.read_buffer(remote, info=info)
    except DatamillError:
        raise
    except OSError as exc:
        raise store_error(exc, url) from exc
    return folder / Path(remote).name
