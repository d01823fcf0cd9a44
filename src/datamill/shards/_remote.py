"""Shardset datasets on object storage (``s3://``): reading through the local shard cache, staged
writes.

Reading (:class:`RemoteShards`): a shard file is downloaded whole into a
:class:`~datamill.core.objstore.ShardFileCache` (``cache_dir``, ``cache_limit``, LRU eviction), so
the Loader, which reads shards in the order of the epoch's plan and ``prefetch`` ahead, also
prefetches the downloads. A download is used only when its size equals the object's and, when the
manifest records them (``shard_bytes`` / ``shard_xxh3`` of a shardset uploaded by datamill), the
size and the xxh3-128 of the content equal the manifest's; a cached copy is re-hashed against its
sidecar on every use.

Writing (:func:`stage` / :func:`upload`): :class:`~datamill.shards.writer.ShardsetWriter` writes to
a local scratch folder holding a copy of the remote ``dataset.json`` and ``samples.parquet``,
commits there with the usual checks, and then uploads: an upload marker first (new datasets), the
new shardset's files, the mapping (new datasets), and ``dataset.json`` **last**; each PUT is atomic,
so a reader sees the previous manifest (and the previous dataset, whose files are untouched) until
the new one lands. A failed upload removes what it uploaded and leaves the previous dataset
readable. An overwrite (:func:`switch_remote`) cannot reuse the keys of the dataset it replaces: it
uploads the new dataset whole under a fresh ``.gen-<hex>`` folder, puts the root ``dataset.json``
(naming that folder as ``data_dir``) and only then deletes the previous objects.
A prefix that holds objects but no ``dataset.json`` (and no upload marker of an interrupted datamill
upload) is not datamill's and is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import xxhash

from datamill.core.constants import DATASET_MANIFEST, SAMPLES_FILE
from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError, ShardsetError
from datamill.core.faults import fault_point
from datamill.core.objstore import ShardFileCache, default_cache_dir, store_error
from datamill.core.storage import Staged, new_generation, publish
from datamill.shards._fs import Location

__all__ = [  # noqa: RUF022 - Python sorted() order (house rule)
    "RemoteShards",
    "UPLOAD_MARKER",
    "discard_stage",
    "is_remote_location",
    "new_generation",
    "stage",
    "switch_remote",
    "upload",
]

UPLOAD_MARKER = ".datamill-upload"
"""Object written first when a new dataset is uploaded and removed after its manifest: a prefix
holding it (and no manifest) is an interrupted datamill upload, which a new upload may replace."""


def is_remote_location(loc: Location) -> bool:
    """Whether ``loc`` is on an object store: its scheme's ``remote`` in the scheme table."""
    return loc.remote


class RemoteShards:
    """Shard files of a remote dataset, fetched through a bounded local cache and checked."""

    def __init__(
        self, loc: Location, *, cache_dir: str | os.PathLike[str] | None, cache_limit: int | None
    ) -> None:
        self.loc = loc
        self.cache = ShardFileCache(
            loc.fs,
            cache_dir if cache_dir is not None else default_cache_dir(),
            cache_limit=cache_limit,
        )
        self._listings: dict[str, dict[str, pafs.FileInfo]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # (FileInfo does not pickle: a worker lists again)
        return {k: v if k != "_listings" else {} for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def listing(self, folder: str) -> dict[str, pafs.FileInfo]:
        """The files of one shardset folder (relative to the root) by base name (one LIST request,
        then kept)."""
        with self._lock:
            known = self._listings.get(folder)
        if known is not None:
            return known
        try:
            infos = self.loc.fs.get_file_info(
                pafs.FileSelector(self.loc.join(folder), allow_not_found=True)
            )
        except DatamillError:
            raise
        except OSError as exc:
            raise store_error(exc, self.loc.show(folder)) from exc
        found = {i.base_name: i for i in infos if i.type == pafs.FileType.File}
        with self._lock:
            self._listings[folder] = found
        return found

    def fetch(self, entry: dict[str, Any], rel: str, k: int) -> bytes:
        """The content of shard file ``rel`` (shard ``k`` of the manifest entry ``entry``),
        checked."""
        folder, name = rel.rsplit("/", 1)
        info = self.listing(folder).get(name)
        display = self.loc.show(rel)
        if info is None:
            raise DataFileNotFoundError(
                "shard file is missing", path=display, shard=k, hint="run `datamill shards check`"
            )
        sizes: Sequence[int] | None = entry.get("shard_bytes")
        sums: Sequence[str] | None = entry.get("shard_xxh3")

        def check(data: bytes) -> None:
            if sizes is not None and len(data) != int(sizes[k]):
                raise ShardsetError(
                    f"the object has {len(data)} bytes, the manifest says {sizes[k]}",
                    path=display,
                    shard=k,
                    hint="the object was replaced or truncated; run `datamill shards check`",
                )
            if sums is not None and xxhash.xxh3_128_hexdigest(data) != sums[k]:
                raise ShardsetError(
                    "the object's checksum differs from the manifest's (corrupt or replaced?)",
                    path=display,
                    shard=k,
                    hint="run `datamill shards check`",
                )

        try:
            return self.cache.read(info.path, info=info, check=check)
        except DatamillError:
            raise
        except OSError as exc:
            raise store_error(exc, display) from exc


def _objects(loc: Location) -> list[pafs.FileInfo]:
    sel = pafs.FileSelector(loc.path, allow_not_found=True, recursive=True)
    return [i for i in loc.fs.get_file_info(sel) if i.type == pafs.FileType.File]


def stage(remote: Location) -> Location:
    """A local scratch copy of the remote dataset's metadata (manifest and mapping), to write into.

    Raises:
        DataFileError: the prefix holds objects but is not a datamill dataset (nor an interrupted
            upload).
    """
    try:
        has_manifest = remote.exists(DATASET_MANIFEST)
        if not has_manifest:
            found = _objects(remote)
            if found and not any(i.base_name == UPLOAD_MARKER for i in found):
                raise DataFileError(
                    f"the prefix holds {len(found)} objects but no {DATASET_MANIFEST}: "
                    "not a datamill shardset dataset",
                    path=remote.display,
                    hint="choose an empty prefix (datamill never writes over objects of yours)",
                )
        scratch = Path(tempfile.mkdtemp(prefix="datamill-upload-"))
        if has_manifest:  # laid out as on the store (the mapping inside the data folder, if any)
            with remote.fs.open_input_stream(remote.join(DATASET_MANIFEST)) as f:
                raw = f.read()
            (scratch / DATASET_MANIFEST).write_bytes(raw)
            samples = _data_rel(json.loads(raw), SAMPLES_FILE)
            (scratch / samples).parent.mkdir(parents=True, exist_ok=True)
            with remote.fs.open_input_stream(remote.join(samples)) as f:
                (scratch / samples).write_bytes(f.read())
    except DatamillError:
        raise
    except OSError as exc:
        raise store_error(exc, remote.display) from exc
    return Location(pafs.LocalFileSystem(), str(scratch), remote.display)


def discard_stage(scratch: Location) -> None:
    """Remove the scratch folder."""
    shutil.rmtree(scratch.path, ignore_errors=True)


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")


def upload(
    scratch: Location, remote: Location, shardset: str, *, base: dict[str, Any] | None
) -> None:
    """Upload a shardset committed in ``scratch`` to ``remote``; ``dataset.json`` last (see the
    module doc).

    ``base`` is the remote manifest the write started from (``None`` for a new dataset); when the
    remote manifest changed meanwhile (a concurrent add), nothing is committed.

    Raises:
        ShardsetError: the remote manifest changed meanwhile. DataFileError: an upload failed
        (what was uploaded is removed; the previous dataset stays as it was).
    """
    local = Path(scratch.path)
    manifest = json.loads((local / DATASET_MANIFEST).read_text(encoding="utf-8"))
    entry = next(ss for ss in manifest["shardsets"] if ss["name"] == shardset)
    files = [
        local / shardset / (f"shard.{k:05d}.{entry['format']}")
        for k in range(int(entry["num_shards"]))
    ]
    sizes, sums = [], []
    for f in files:
        data = f.read_bytes()
        sizes.append(len(data))
        sums.append(xxhash.xxh3_128_hexdigest(data))
    entry["shard_bytes"], entry["shard_xxh3"] = sizes, sums
    fs = remote.fs
    marker = remote.join(UPLOAD_MARKER)
    objects: list[tuple[Staged, str]] = [(b"", marker)] if base is None else []
    objects += [(f, remote.join(_data_rel(manifest, shardset, f.name))) for f in files]
    if base is None:
        objects.append((local / SAMPLES_FILE, remote.join(SAMPLES_FILE)))

    def unchanged() -> None:
        if base is not None and remote.read_json(DATASET_MANIFEST) != base:
            raise ShardsetError(
                "the manifest changed while this shardset was written (a concurrent add?)",
                path=remote.show(DATASET_MANIFEST),
                hint="add again",
            )

    publish(
        fs,
        objects,
        (_manifest_bytes(manifest), remote.join(DATASET_MANIFEST)),
        url=remote.display,
        before_commit=unchanged,
        keep=[marker],
    )
    if base is None:
        try:
            fs.delete_file(remote.join(UPLOAD_MARKER))
        except OSError:
            pass


def _data_rel(manifest: dict[str, Any], *parts: str) -> str:
    """``parts`` inside the manifest's data folder, relative to the root."""
    d = manifest.get("data_dir")
    return "/".join([d, *parts] if d else parts)


def switch_remote(remote: Location, generation: str) -> None:
    """Make the complete dataset uploaded to ``remote/generation`` the dataset at ``remote``.

    The root ``dataset.json`` is replaced by the new one plus ``"data_dir": generation`` (one atomic
    PUT: until then readers see the previous dataset, whole); then every other object of the prefix
    (the previous dataset's, earlier generations', the generation's own manifest) is deleted. A run
    killed before the PUT leaves the previous dataset as it was (and an unlisted generation, deleted
    by the next overwrite); killed after it, the new dataset (and old objects, deleted likewise).
    """
    try:
        manifest = remote.child(generation).read_json(DATASET_MANIFEST)
        manifest["data_dir"] = generation
        fault_point("shards.remote_before_switch")
        publish(
            remote.fs,
            [],
            (_manifest_bytes(manifest), remote.join(DATASET_MANIFEST)),
            url=remote.display,
        )
        fs = remote.fs
        keep = remote.join(generation) + "/"
        for info in _objects(remote):
            if info.path == remote.join(DATASET_MANIFEST) or (
                info.path.startswith(keep)
                and info.path != remote.join(generation, DATASET_MANIFEST)
            ):
                continue
            fs.delete_file(info.path)
        for info in fs.get_file_info(pafs.FileSelector(remote.path, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and info.base_name != generation:
                try:  # the (now empty) folders of the old objects, where the store keeps folders
                    fs.delete_dir(info.path)
                except FileNotFoundError:
                    pass
    except DatamillError:
        raise
    except OSError as exc:
        raise store_error(exc, remote.display) from exc
