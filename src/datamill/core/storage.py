"""The one storage seam: ``filesystem_for(url) -> (pyarrow FileSystem, path)`` over a scheme table.

Every reader and writer that may meet a URL asks this module; nothing else in datamill looks at a
URL's scheme, cuts it, or reads a storage library's error text. :data:`SCHEMES` holds one
:class:`Scheme` per URL scheme:

* ``file`` (local paths and ``file://``): pyarrow's ``LocalFileSystem``; read and written in place.
* ``s3`` (``s3://bucket/key``): :mod:`datamill.core.s3` (``AWS_*`` variables, its error hints).
* ``memory`` (``memory://bucket/key``, for tests): :mod:`datamill.core.memfs`, one in-memory
  filesystem per process that behaves as an object store.

A *remote* scheme (``s3``, ``memory``) has no local paths: readers download into the checked shard
cache (:class:`~datamill.core.objstore.ShardFileCache`), writers stage locally and publish with
:func:`upload`, and its failures become located errors through :func:`storage_error`.

Adding a scheme (say ``gs://``) is one module with ``<name>_filesystem()``, its hints and
``recognises(exc)``, plus one row in :data:`SCHEMES`; ``tests/core/test_storage.py`` runs the
storage contract against every row.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from datamill.core import memfs, s3
from datamill.core.checks import check_path
from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError, DatamillError

__all__ = [
    "SCHEMES",
    "Scheme",
    "Staged",
    "filesystem_for",
    "is_remote",
    "local_path",
    "new_generation",
    "publish",
    "recognised_error",
    "scheme_of",
    "split_url",
    "storage_error",
    "upload",
]

Hints = tuple[tuple[tuple[str, ...], str, str], ...]

_CHUNK = 8 << 20


@dataclass(frozen=True)
class Scheme:
    """One URL scheme: how to get its filesystem, whether it is remote, and what its errors mean."""

    name: str
    prefix: str
    """What a URL of this scheme starts with (``"s3://"``)."""
    remote: bool
    """No local paths: read through the shard cache, written by staging locally and uploading."""
    filesystem: Callable[[], pafs.FileSystem]
    hints: Hints
    """``(substrings of the library's message, what it means, how to fix it)``, tried in order."""
    recognises: Callable[[BaseException], bool]
    """Whether an exception that carries no location came from this scheme's library."""
    example: str


_LOCAL_HINTS: Hints = (
    (("No such file", "not found", "does not exist"), "no such file or folder", "check the path"),
    (("Permission denied",), "permission denied", "check the file's permissions"),
)

SCHEMES: dict[str, Scheme] = {
    "file": Scheme(
        "file",
        "file://",
        remote=False,
        filesystem=pafs.LocalFileSystem,
        hints=_LOCAL_HINTS,
        recognises=lambda exc: False,
        example="/path/to/data or file:///path/to/data",
    ),
    "s3": Scheme(
        "s3",
        "s3://",
        remote=True,
        filesystem=s3.s3_filesystem,
        hints=s3.HINTS,
        recognises=s3.recognises,
        example="s3://bucket/prefix",
    ),
    "memory": Scheme(
        "memory",
        "memory://",
        remote=True,
        filesystem=memfs.memory_filesystem,
        hints=(*_LOCAL_HINTS[:1], *s3.HINTS[:1]),
        recognises=memfs.recognises,
        example="memory://bucket/prefix",
    ),
}
"""Scheme name -> :class:`Scheme`; a path without ``scheme://`` is ``file``."""


def scheme_of(url: str | os.PathLike[str]) -> Scheme:
    """The scheme of ``url`` (a path without ``scheme://`` is ``file``).

    Raises:
        ConfigError: an unknown ``scheme://``, naming the known ones.

    Examples:
        >>> scheme_of("s3://b/k").name, scheme_of("/tmp/x").name, scheme_of("file:///tmp/x").name
        ('s3', 'file', 'file')
        >>> scheme_of("gs://b/k")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: unknown storage scheme 'gs://' in 'gs://b/k'; datamill
        reads file://, s3://, memory://
    """
    text = os.fspath(url)
    if isinstance(text, bytes):  # pragma: no cover - datamill never passes bytes paths
        text = text.decode()
    head, sep, _ = text.partition("://")
    if (
        not sep or "/" in head or not head.isidentifier()
    ):  # a plain path (maybe with "://" further in)
        return SCHEMES["file"]
    for scheme in SCHEMES.values():
        if text.startswith(scheme.prefix):
            return scheme
    known = ", ".join(s.prefix for s in SCHEMES.values())
    raise ConfigError(f"unknown storage scheme '{head}://' in {text!r}; datamill reads {known}")


def is_remote(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` names an object store (a remote scheme), not a local path.

    Examples:
        >>> is_remote("s3://bucket/data"), is_remote("memory://b/d"), is_remote("/tmp/data")
        (True, True, False)
    """
    try:
        return scheme_of(url).remote
    except ConfigError:
        return False


def filesystem_for(
    url: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``url`` and the path on it (``s3://bucket/key`` -> ``(S3FileSystem,
    "bucket/key")``).

    Args:
        url: a local path, ``file://``, ``s3://`` or ``memory://`` URL.
        filesystem: use this filesystem instead of the scheme's default (e.g. an ``S3FileSystem``
            with explicit keys). Defaults to ``None``.

    Raises:
        ConfigError: an unknown scheme, or a remote URL without a bucket.

    Examples:
        >>> fs, path = filesystem_for("memory://bucket/data/")
        >>> type(fs).__name__, path
        ('_ObjectStoreLike', 'bucket/data')
        >>> filesystem_for("file:///tmp/x")[1]
        '/tmp/x'
    """
    scheme = scheme_of(url)
    fs = filesystem if filesystem is not None else scheme.filesystem()
    text = os.fspath(url)
    if not scheme.remote:
        local = check_path(text.removeprefix(scheme.prefix))
        return fs, os.path.abspath(local)
    return fs, split_url(text)


def local_path(url: str | os.PathLike[str]) -> Path:
    """A local path or ``file://`` URL as a :class:`~pathlib.Path` (kept relative when it was).

    Raises:
        ConfigError: ``url`` is remote (it has no local path).

    Examples:
        >>> local_path("file:///tmp/x"), local_path("data/x.csv")
        (PosixPath('/tmp/x'), PosixPath('data/x.csv'))
    """
    scheme = scheme_of(url)
    if scheme.remote:
        raise ConfigError(f"{os.fspath(url)!r} is on {scheme.prefix} storage, not a local path")
    return Path(check_path(os.fspath(url).removeprefix(scheme.prefix)))


def split_url(url: str) -> str:
    """The path on its filesystem of a remote URL (``s3://bucket/key/`` -> ``bucket/key``).

    Raises:
        ConfigError: not a remote URL, or one without a bucket.

    Examples:
        >>> split_url("s3://bucket/data/")
        'bucket/data'
    """
    scheme = scheme_of(url)
    path = url[len(scheme.prefix) :].strip("/") if scheme.remote else ""
    if not path:
        raise ConfigError(
            f"expected a URL like {scheme.example if scheme.remote else 's3://bucket/prefix'}, "
            f"got {url!r}"
        )
    return path


def storage_error(exc: BaseException, url: str) -> DatamillError:
    """One located error for a storage failure at ``url`` (a DatamillError is returned as it is).

    Examples:
        >>> err = storage_error(OSError("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation"), "s3://b/x")
        >>> type(err).__name__, err.path
        ('DataFileNotFoundError', 's3://b/x')
        >>> type(storage_error(OSError("AWS Error ACCESS_DENIED during HeadObject"), "s3://b/x")).__name__
        'DataFileError'
    """
    if isinstance(exc, DatamillError):
        return exc
    try:
        hints = scheme_of(url).hints
    except ConfigError:
        hints = ()
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for needles, what, hint in hints:
        if any(n in text for n in needles):
            cls = DataFileNotFoundError if what.startswith("no such") else DataFileError
            err: DatamillError = cls(f"{what}: {text}", path=url, hint=hint)
            return err
    if isinstance(exc, FileNotFoundError):
        return DataFileNotFoundError(f"not found: {text}", path=url)
    return DataFileError(f"storage request failed: {text}", path=url)


def recognised_error(exc: BaseException) -> Scheme | None:
    """The scheme whose library raised ``exc`` (for an error that reached the CLI without a
    location)."""
    return next((s for s in SCHEMES.values() if s.recognises(exc)), None)


def upload(source: str | os.PathLike[str] | bytes, fs: pafs.FileSystem, path: str) -> None:
    """Write a local file (or bytes) to ``path`` on ``fs``: how every writer publishes a staged
    output.

    Object stores have no rename, so writers build their output in a local scratch folder and call
    this for each object, the commit marker (``dataset.json``, the Parquet file) last.

    Examples:
        >>> fs, path = filesystem_for("memory://bucket/up.txt")
        >>> upload(b"hello", fs, path)
        >>> fs.get_file_info(path).size
        5
    """
    if fs.type_name == "local" and "/" in path:  # a folder is made (object stores need none)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        if isinstance(source, bytes):
            out.write(source)
            return
        with Path(source).open("rb") as data:
            while chunk := data.read(_CHUNK):
                out.write(chunk)


Staged = str | os.PathLike[str] | bytes
"""What :func:`publish` uploads: a local file (its path) or the bytes themselves."""


def publish(
    fs: pafs.FileSystem,
    objects: Sequence[tuple[Staged, str]],
    commit: tuple[Staged, str],
    *,
    url: str,
    before_commit: Callable[[], None] | None = None,
    keep: Sequence[str] = (),
) -> None:
    """Publish a staged output: every object in order, then the commit marker **last**.

    Every writer to object storage stages its output locally, then calls this: each PUT is atomic,
    so a reader sees the previous commit marker (and the previous output, untouched) until the new
    one lands. An overwrite that cannot reuse the keys it replaces uploads to a fresh generation
    folder and commits a marker naming it (:func:`new_generation`). On any failure (of an upload,
    or raised by ``before_commit``, which runs just before the marker: e.g. a check that nobody
    else committed meanwhile) the objects uploaded so far are removed, except those in ``keep``,
    and the marker is not written.

    Args:
        fs: the filesystem written to.
        objects: ``(local file or bytes, path on fs)`` pairs, uploaded in order.
        commit: the commit marker, uploaded last.
        url: what error messages name.
        before_commit: called after the objects, before the marker. Defaults to ``None``.
        keep: paths left in place on failure (an upload marker). Defaults to ``()``.

    Raises:
        DatamillError: the storage's failure, located at ``url`` (or what ``before_commit`` raised).

    Examples:
        >>> fs, root = filesystem_for("memory://bucket/out")
        >>> publish(fs, [(b"x", root + "/a.bin")], (b"{}", root + "/done.json"), url="memory://b")
        >>> fs.get_file_info(root + "/done.json").size
        2
    """
    done: list[str] = []
    try:
        for source, path in objects:
            upload(source, fs, path)
            done.append(path)
        if before_commit is not None:
            before_commit()
        upload(commit[0], fs, commit[1])
    except BaseException as exc:
        for path in done:  # best effort: no committed marker lists them
            if path in keep:
                continue
            try:
                fs.delete_file(path)
            except OSError:
                pass
        if isinstance(exc, OSError) and not isinstance(exc, DatamillError):
            raise storage_error(exc, url) from exc
        raise


def new_generation() -> str:
    """A fresh folder name for an overwrite published beside what it replaces (``.gen-`` and 12
    hex digits).

    Examples:
        >>> name = new_generation()
        >>> name.startswith(".gen-") and len(name) == 17
        True
    """
    return f".gen-{secrets.token_hex(6)}"
