"""GETs of whole objects from an S3-compatible endpoint without pyarrow's HEAD first, via obstore.

pyarrow's ``S3FileSystem.open_input_file(path)`` sends a HEAD before every read (its Python API
takes no known size), and its C++ client copies each response once more into the caller's buffer.
:func:`direct_getter` gives, for an ``S3FileSystem`` configured with an explicit endpoint and keys
(what :func:`~datamill.core.s3.s3_filesystem` builds from ``AWS_ENDPOINT_URL`` and the keys), a
:class:`DirectGetter` whose :meth:`~DirectGetter.stream` sends one GET through ``obstore`` (the
Python bindings of Rust's ``object_store``: SigV4 signing, a pooled HTTP client, retries) and gives
the body in pieces that :meth:`~DirectGetter.write_into` writes straight into a cache file; the size
and the ETag come from the GET's own response.
Anything else (no endpoint, other credential sources, proxies, a custom CA file, virtual-host
addressing, ``obstore`` not installed, ``DATAMILL_S3_DIRECT_GET=0``) gets ``None``: the caller
reads through pyarrow as before.

``obstore`` runs its requests on a tokio runtime that does not survive ``fork``: in a process
forked after its parent sent a GET through it, :meth:`DirectGetter.stream` raises ``OSError`` at
once (no request) and the caller reads through pyarrow.

On a SeaweedFS on loopback, 100 objects of 6.2 MB with 6 threads: 100 requests (pyarrow's
``open_input_file`` + ``readinto``: 200) and 0.36-0.45 s of client CPU, against 0.23-0.31 s for
the hand-written SigV4 + ``http.client`` GET this module had before (reading into a reused buffer,
where obstore collects each body into a new one); in the benchmark's cold epoch (decode, gather
and the cache's copies included) no difference shows: 2.06-2.31 s of client CPU and 0.43-0.49x
the store's ceiling, against 2.03-2.66 s and 0.41-0.43x (benchmarks/RESULTS.md, issue #41, cold5).
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from datamill.core.errors import CacheError
from datamill.core.output import write_at

__all__ = ["STREAM_CHUNK", "DirectGetter", "direct_getter"]

TIMEOUT_S = 10
"""Seconds a request waits for the endpoint (to connect, and between reads of the body); then it
is tried once more and the caller falls back to pyarrow's client (its own retries)."""
STREAM_CHUNK = 256 << 10
"""Bytes of each piece :meth:`DirectGetter.stream` gives (the last one excepted): obstore gathers
the body's network reads into pieces this large, small enough to be reused by the allocator (a
cold epoch's readers touched 8k new pages instead of 65k-90k with 1 MiB pieces or whole bodies)."""
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")

_STORES: dict[tuple[DirectGetter, str], Any] = {}  # (getter, bucket) -> obstore S3Store
_STORES_LOCK = threading.Lock()
_RUNTIME_PID: list[int] = []  # the process whose obstore runtime this module started


@dataclass(frozen=True)
class DirectGetter:
    """Whole-object GETs to one S3 endpoint (path-style addressing), through ``obstore``.

    Examples:
        >>> g = DirectGetter("http://127.0.0.1:9000", "key", "secret", "", "us-east-1")
        >>> g.endpoint, "secret" in repr(g)
        ('http://127.0.0.1:9000', False)
    """

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    session_token: str = field(repr=False)
    region: str = "us-east-1"

    def _store(self, bucket: str) -> Any:
        """This process's ``S3Store`` for ``bucket`` (one HTTP connection pool each, kept)."""
        with _STORES_LOCK:
            store = _STORES.get((self, bucket))
            if store is None:
                from obstore.store import S3Store

                options: dict[str, Any] = {
                    "endpoint": self.endpoint,
                    "access_key_id": self.access_key,
                    "secret_access_key": self.secret_key,
                    "region": self.region,
                    "virtual_hosted_style_request": False,
                }
                if self.session_token:
                    options["session_token"] = self.session_token
                store = _STORES[(self, bucket)] = S3Store(
                    bucket,
                    client_options={
                        "allow_http": self.endpoint.startswith("http://"),
                        "connect_timeout": datetime.timedelta(seconds=TIMEOUT_S),
                        "read_timeout": datetime.timedelta(seconds=TIMEOUT_S),
                        "timeout": datetime.timedelta(hours=1),
                    },
                    retry_config={
                        "max_retries": 1,
                        "retry_timeout": datetime.timedelta(seconds=3 * TIMEOUT_S),
                        "backoff": {"init_backoff": datetime.timedelta(milliseconds=50)},
                    },
                    **options,
                )
            return store

    def stream(self, path: str, size: int) -> tuple[Iterator[Any], str | None]:
        """GET the object ``path`` (``bucket/key``), ``size`` bytes expected: (its body in pieces
        of :data:`STREAM_CHUNK` bytes, buffer-protocol objects; its ETag).

        The caller writes each piece where the bytes belong (the cache writes them into its file),
        so no buffer of the whole object is allocated.

        Raises:
            OSError: the endpoint answered with an error (refused, missing), could not be reached
                (tried twice), the object does not have ``size`` bytes, or this process was forked
                from one that used ``obstore`` (its runtime's threads are not here); or, while the
                pieces are read, the body broke off or had more than ``size`` bytes.
        """
        pid = os.getpid()
        with _STORES_LOCK:
            if not _RUNTIME_PID:
                _RUNTIME_PID.append(pid)
            elif _RUNTIME_PID[0] != pid:
                raise OSError("obstore's runtime was started by a parent process (fork)")
        import obstore
        from obstore.exceptions import BaseError

        bucket, _, key = path.lstrip("/").partition("/")
        try:
            got = obstore.get(self._store(bucket), key)
            meta = got.meta
            if meta["size"] != size:
                raise OSError(f"the object has {meta['size']} bytes, expected {size} (changed?)")
            pieces = got.stream(min_chunk_size=STREAM_CHUNK)
        except (BaseError, OSError, ValueError, RuntimeError) as exc:
            raise OSError(f"GET {path} failed: {exc}") from exc
        return _counted(pieces, path, size, BaseError), meta.get("e_tag")

    def write_into(
        self, path: str, size: int, fd: int, *, digest: Any, where: Path
    ) -> tuple[int, str | None]:
        """GET the object ``path`` into the open file ``fd`` from offset 0, each piece written at
        its place as it arrives and fed to ``digest`` (an ``xxhash`` hasher): (bytes, ETag).

        The bytes land once, in the file's page cache (a copy of the cache decodes from its
        mapping): no buffer of the whole object is allocated.

        Raises:
            OSError: the GET failed (:meth:`stream`). CacheError: the file could not be written
                (``where`` names the cache folder).
        """
        pieces, etag = self.stream(path, size)
        done = 0
        for piece in pieces:
            try:
                done = write_at(fd, memoryview(piece), done)
            except OSError as exc:  # CacheError is no OSError: not taken for a failed GET
                raise CacheError(f"cannot write the shard cache: {exc}", path=where) from exc
            digest.update(piece)
        return done, etag


def _counted(pieces: Any, path: str, size: int, errors: type[Exception]) -> Iterator[Any]:
    """``pieces`` of a body of ``size`` bytes, each failure (and a size other than ``size``) an
    ``OSError``."""
    got = 0
    try:
        for piece in pieces:
            got += len(piece)
            if got > size:
                raise OSError(f"GET {path}: more than the object's {size} bytes arrived")
            yield piece
    except (errors, ValueError, RuntimeError) as exc:
        raise OSError(f"GET {path} failed: {exc}") from exc
    if got != size:
        raise OSError(f"GET {path}: {got} bytes arrived, the object has {size}")


def direct_getter(fs: pafs.FileSystem) -> DirectGetter | None:
    """A :class:`DirectGetter` for ``fs`` when it is an ``S3FileSystem`` with an explicit endpoint
    and keys and nothing the getter does not do (see the module doc), else ``None``.

    Examples:
        >>> from datamill.core.s3 import s3_filesystem
        >>> fs = s3_filesystem(endpoint="http://127.0.0.1:9", access_key="k", secret_key="s")
        >>> direct_getter(fs).endpoint, direct_getter(pafs.LocalFileSystem())
        ('http://127.0.0.1:9', None)
    """
    if not isinstance(fs, pafs.S3FileSystem) or os.environ.get("DATAMILL_S3_DIRECT_GET") == "0":
        return None
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    try:
        import obstore  # noqa: F401
    except ImportError:
        return None
    try:
        cfg: dict[str, Any] = fs.__reduce__()[1][0]
    except (TypeError, IndexError, AttributeError):
        return None
    refused = (
        cfg.get("anonymous"),
        not cfg.get("access_key"),
        not cfg.get("secret_key"),
        not cfg.get("endpoint_override"),
        cfg.get("scheme") not in ("http", "https"),
        cfg.get("role_arn"),
        cfg.get("force_virtual_addressing"),
        cfg.get("tls_ca_file_path"),
        (cfg.get("proxy_options") or {}).get("host"),
    )
    if any(refused):
        return None
    return DirectGetter(
        f"{cfg['scheme']}://{cfg['endpoint_override']}",
        str(cfg["access_key"]),
        str(cfg["secret_key"]),
        str(cfg.get("session_token") or ""),
        str(cfg.get("region") or "us-east-1"),
    )
