"""A dataset's content identity: what a reader checks before it trusts a copy of the dataset.

``datamill serve`` records the identity of a dataset when it is registered with a client location,
and a direct-mode client checks the copy at that location against it before it builds a batch from
it, so that a location pointing at other data of the same shape (another dataset's copy, a stale
copy, a same-size rewrite) is refused, naming the file, instead of trained on.

The identity of a file is its size and the xxh3-128 of its last 64 KiB (a Parquet file's footer:
every column chunk's offsets, sizes and statistics; cheap: one small read per file, whatever the
file's size). A metadata file that tools rewrite in place (a shardset's ``dataset.json``, a
preprocessed file's ``meta.json``, where ``datamill diff`` adds a pointer to its row hashes) is
identified by its JSON content without that pointer. The identity of a dataset is every file's
under its path (hidden files, such as caches, left out) and one ``digest`` of them all.

Examples:
    >>> import tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a.bin").write_bytes(b"abc")
    >>> ident = content_identity(d)
    >>> sorted(ident["files"]), ident["files"]["a.bin"][0]
    (['a.bin'], 3)
    >>> check_identity(d, ident, dataset="demo")
    >>> _ = (d / "a.bin").write_bytes(b"abd")
    >>> try:
    ...     check_identity(d, ident, dataset="demo")
    ... except DataFileError as err:
    ...     print(err.shard, "|", err.msg[:60])
    a.bin | dataset 'demo': this copy is not the data the server registe
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from datamill.core.constants import DATASET_MANIFEST, META_SUFFIX, ROW_HASHES_KEY
from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError
from datamill.core.fingerprint import fingerprint_obj

__all__ = ["IDENTITY_FORMAT", "check_identity", "content_identity", "file_identity"]

IDENTITY_FORMAT = "datamill.identity/1"
_TAIL = 1 << 16
_REMOTE_THREADS = 16
_MAX_FILES = 1 << 16


def _metadata(name: str) -> bool:
    return name == DATASET_MANIFEST or name.endswith(META_SUFFIX)


def _without_pointer(doc: Any) -> Any:
    """A manifest or metadata document without the row-hash pointer (top level or one down)."""
    if not isinstance(doc, dict):
        return doc
    return {
        k: {kk: vv for kk, vv in v.items() if kk != ROW_HASHES_KEY} if isinstance(v, dict) else v
        for k, v in doc.items()
        if k != ROW_HASHES_KEY
    }


def file_identity(fs: pafs.FileSystem, path: str, size: int) -> list[Any]:
    """``[size, xxh3-128 of the last 64 KiB]`` of one file (``[-1, digest of the JSON]`` for a
    manifest or metadata file)."""
    import xxhash

    with fs.open_input_file(path) as f:
        if _metadata(path.rpartition("/")[2]):
            try:
                doc = _without_pointer(json.loads(f.read()))
            except ValueError:
                return [size, ""]  # not JSON: compared by size alone
            return [-1, fingerprint_obj(doc)]
        start = max(0, size - _TAIL)
        return [size, xxhash.xxh3_128_hexdigest(f.read_at(size - start, start))]


def _files(fs: pafs.FileSystem, root: str) -> tuple[str, list[tuple[str, int]]]:
    """The kind of ``root`` (``"file"`` or ``"dir"``) and its files ``(relative path, size)``,
    hidden ones left out, sorted."""
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return "file", [("", int(info.size))]
    if info.type != pafs.FileType.Directory:
        raise DataFileNotFoundError("no dataset here", path=root)
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    base = root.rstrip("/") + "/"
    out = []
    for i in found:
        rel = i.path.removeprefix(base)
        if i.type == pafs.FileType.File and not any(p.startswith(".") for p in rel.split("/")):
            out.append((rel, int(i.size)))
    return "dir", sorted(out)[:_MAX_FILES]


def _describe(ident: list[Any]) -> str:
    if ident[0] == -1:
        return f"content digest {str(ident[1])[:16]}"
    return f"size {ident[0]} and tail digest {str(ident[1])[:16]}"


def _join(root: str, rel: str) -> str:
    return root if rel == "" else root.rstrip("/") + "/" + rel


def _identities(
    fs: pafs.FileSystem, root: str, files: list[tuple[str, int]], *, remote: bool
) -> list[list[Any]]:
    def one(item: tuple[str, int]) -> list[Any]:
        return file_identity(fs, _join(root, item[0]), item[1])

    if not remote or len(files) < 2:
        return [one(f) for f in files]
    with ThreadPoolExecutor(min(_REMOTE_THREADS, len(files))) as pool:
        return list(pool.map(one, files))


def content_identity(location: str | os.PathLike[str]) -> dict[str, Any]:
    """The content identity of the dataset at ``location`` (a path or a URL of
    :func:`~datamill.core.storage.filesystem_for`): ``{"format", "kind", "files": {relative path:
    [size, digest]}, "digest"}``.

    Raises:
        DataFileNotFoundError: nothing at ``location``.
    """
    from datamill.core.storage import filesystem_for, is_remote, storage_error

    fs, root = filesystem_for(location)
    try:
        kind, files = _files(fs, root)
        idents = _identities(fs, root, files, remote=is_remote(location))
    except DatamillError:
        raise
    except OSError as exc:  # unreachable, denied, gone while listed: located
        raise storage_error(exc, os.fspath(location)) from exc
    table = {rel: ident for (rel, _), ident in zip(files, idents)}
    return {
        "format": IDENTITY_FORMAT,
        "kind": kind,
        "files": table,
        "digest": fingerprint_obj([kind, sorted(table.items())]),
    }


def check_identity(
    location: str | os.PathLike[str], identity: Mapping[str, Any], *, dataset: str
) -> None:
    """Check that the data at ``location`` is the dataset whose identity the server recorded:
    every recorded file is there with its size and digest (files added since are ignored).

    Raises:
        DataFileError: a file differs (naming the dataset, the file, what was recorded and what was
            found, and how to fix it). DataFileNotFoundError: a recorded file is missing.
    """
    from datamill.core.storage import filesystem_for, is_remote, storage_error

    if identity.get("format") != IDENTITY_FORMAT:
        return  # a server of another release: nothing to check against
    fs, root = filesystem_for(location)
    want: Mapping[str, list[Any]] = identity["files"]
    try:
        _check_files(
            fs, root, location, want, identity, dataset=dataset, remote=is_remote(location)
        )
    except DatamillError:
        raise
    except OSError as exc:  # unreachable, denied, gone while listed: located
        raise storage_error(exc, os.fspath(location)) from exc


def _check_files(
    fs: pafs.FileSystem,
    root: str,
    location: str | os.PathLike[str],
    want: Mapping[str, list[Any]],
    identity: Mapping[str, Any],
    *,
    dataset: str,
    remote: bool,
) -> None:
    kind, files = _files(fs, root)
    sizes = dict(files)
    hint = (
        f"point the dataset's client_location at a copy of the registered data (copy it again), "
        f"or register the data at {os.fspath(location)!r} under its own name (when the server's "
        f"data changed since it was registered, register it again with its client_location)"
    )
    missing = [rel for rel in want if rel not in sizes]
    if kind != identity.get("kind") or missing:
        raise DataFileNotFoundError(
            f"dataset {dataset!r}: this copy lacks {len(missing) or 'the'} file(s) the server "
            f"registered ({', '.join(missing[:3]) or identity.get('kind')}...)",
            path=location,
            hint=hint,
        )
    names = sorted(want, key=lambda rel: (_metadata(rel.rpartition("/")[2]), rel))  # data first
    got = _identities(fs, root, [(r, sizes[r]) for r in names], remote=remote)
    for rel, found in zip(names, got):
        if list(found) != list(want[rel]):
            raise DataFileError(
                f"dataset {dataset!r}: this copy is not the data the server registered: expected "
                f"{_describe(want[rel])}, found {_describe(found)}",
                path=location,
                shard=rel or Path(os.fspath(location)).name,
                hint=hint,
            )
