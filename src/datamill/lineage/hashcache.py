"""Where ``datamill diff`` keeps a build's row hashes, and how the build points at them.

The row hashes and statistics of a build (:func:`datamill.lineage.summary.summarize`) are computed
once and kept in a sidecar beside the build: ``.rowhash.npz`` inside a folder build (hidden, as
``shards check`` expects of files the manifest does not list), ``X.rowhash.npz`` beside a file
build ``X.hdf5``. The sidecar's header records the **key** it was computed for (the hash version,
the build's fingerprint, its UID column and columns), so a sidecar left from an earlier build is
stale and ignored.

The build's own record points at it: a shardset dataset's ``dataset.json`` and a preprocessed
file's ``meta.json`` (in its ``datamill`` header) get ``"row_hashes": {"file": ..., "format": ...,
"key": ...}``, rewritten atomically and only when the record is all that changes (a manifest or
metadata file that changed since the build was opened is left alone). The pointer is not part of
the build's fingerprint. A later diff reads the sidecar the record names when the record's key is
the build's key now; otherwise it recomputes and writes both again. A file of the sidecar's name
that is not a row-hash file is never replaced (the temporary cache folder is used instead), and
builds on object storage use that folder too.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.constants import DATASET_MANIFEST, HDF5_SUFFIX, META_SUFFIX, ROW_HASHES_KEY
from datamill.core.io import atomic_write

__all__ = ["SIDECAR_FORMAT", "SIDECAR_NAME", "HashCache", "read_sidecar_header", "sidecar_path"]

SIDECAR_FORMAT = "datamill.rowhash/1"
SIDECAR_NAME = ".rowhash.npz"
HEADER = "datamill"  # (meta.json's header: datamill.preprocessing.meta.HEADER)
Cached = tuple[dict[str, Any], dict[str, NDArray[np.uint64]], tuple[Any, Any]]


def _cache_dir() -> Path:
    return Path(os.environ.get("DATAMILL_CACHE_DIR") or tempfile.gettempdir()) / "datamill-rowhash"


def sidecar_path(location: str | os.PathLike[str], /) -> Path | None:
    """Where the row hashes of the build at ``location`` are kept beside it (``None``: remote).

    Examples:
        >>> sidecar_path("out/train.hdf5").as_posix(), sidecar_path("s3://bucket/ds")
        ('out/train.rowhash.npz', None)
    """
    text = os.fspath(location)
    if "://" in text:
        return None
    path = Path(text)
    if path.is_dir():
        return path / SIDECAR_NAME
    return path.with_suffix(".rowhash.npz")


def _record_path(location: str | os.PathLike[str]) -> Path | None:
    """The build's manifest (``dataset.json``) or metadata (``X.meta.json``), if it has one."""
    text = os.fspath(location)
    if "://" in text:
        return None
    path = Path(text)
    if path.is_dir():
        found = path / DATASET_MANIFEST
    elif path.name.endswith(HDF5_SUFFIX):
        found = path.with_name(path.name.removesuffix(HDF5_SUFFIX) + META_SUFFIX)
    else:
        return None
    return found if found.is_file() else None


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _section(doc: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """Where the record lives in ``doc``: the manifest itself, or meta.json's header."""
    if path.name == DATASET_MANIFEST:
        return doc
    header = doc.get(HEADER)
    return header if isinstance(header, dict) else None


def _without_record(doc: dict[str, Any] | None, path: Path) -> Any:
    if doc is None:
        return None
    section = _section(doc, path)
    if section is None or ROW_HASHES_KEY not in section:
        return doc
    trimmed = json.loads(json.dumps(doc))
    section_copy = _section(trimmed, path)
    assert section_copy is not None
    del section_copy[ROW_HASHES_KEY]
    return trimmed


def read_sidecar_header(path: Path, /) -> dict[str, Any] | None:
    """The JSON header of a row-hash file, or ``None`` (absent, unreadable, or not ours)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
    except (OSError, ValueError, KeyError, EOFError):
        return None
    return meta if isinstance(meta, dict) else None


def _read_cache(path: Path, key: str) -> Cached | None:
    """The cached summary at ``path`` if it is for ``key`` (the build as it is now)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if not isinstance(meta, dict) or meta.get("key") != key:
                return None  # stale: the build changed since (or another build's file)
            hashes = {c: z[f"h{i}"] for i, c in enumerate(meta["hashed"])}
            uid_hash = z["uid_hash"] if "uid_hash" in z.files else None
            uid_order = z["uid_order"] if "uid_order" in z.files else None
    except (OSError, ValueError, KeyError, EOFError):
        return None  # a damaged cache entry: recompute
    return meta, hashes, (uid_hash, uid_order)


def _write_cache(path: Path, meta: dict[str, Any], arrays: dict[str, Any]) -> bool:
    """Write atomically; never replace a file that is not a row-hash file of ours."""
    if path.exists() and (read_sidecar_header(path) or {}).get("format") != SIDECAR_FORMAT:
        return False  # a user's file (or something else) has the name: leave it alone
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
    except OSError:
        return False  # a read-only build: the temp cache instead
    return True


class HashCache:
    """The cached row hashes of the build at ``location`` for ``key`` (see the module docstring).

    Examples:
        >>> import tempfile
        >>> build = Path(tempfile.mkdtemp()) / "x.hdf5"
        >>> _ = build.write_bytes(b"")
        >>> cache = HashCache(build, "k1")
        >>> cache.get() is None
        True
        >>> cache.put({"format": SIDECAR_FORMAT, "key": "k1", "hashed": ["a"]},
        ...           {"h0": np.arange(3, dtype=np.uint64)})
        >>> HashCache(build, "k1").get()[1]["a"].tolist(), HashCache(build, "k2").get()
        ([0, 1, 2], None)
    """

    def __init__(self, location: str | os.PathLike[str] | None, key: str) -> None:
        self.key = key
        self.sidecar = sidecar_path(location) if location is not None else None
        self.record_file = _record_path(location) if location is not None else None
        self.opened = _read_json(self.record_file)  # (as it was before hashing)

    def record(self) -> dict[str, Any] | None:
        """The build's pointer to its row hashes (``None``: it has none)."""
        if self.opened is None or self.record_file is None:
            return None
        section = _section(self.opened, self.record_file)
        found = section.get(ROW_HASHES_KEY) if section is not None else None
        return found if isinstance(found, dict) else None

    def get(self) -> Cached | None:
        """The cached summary: where the build's record points, else the sidecar, else the
        temporary cache folder; ``None`` when none is for ``key``."""
        places = [] if self.sidecar is None else [self.sidecar]
        rec = self.record()
        name = rec.get("file") if rec is not None else None
        if (
            rec is not None
            and rec.get("key") == self.key
            and isinstance(name, str)
            and Path(name).name == name
            and self.record_file is not None
        ):
            places.insert(0, self.record_file.parent / name)
        for path in places + [_cache_dir() / f"{self.key}.npz"]:
            found = _read_cache(path, self.key)
            if found is not None:
                return found
        return None

    def put(self, meta: dict[str, Any], arrays: dict[str, Any]) -> None:
        """Write the summary beside the build (else the temp cache) and point the build at it."""
        if self.sidecar is not None and _write_cache(self.sidecar, meta, arrays):
            self._point_at(self.sidecar)
            return
        _write_cache(_cache_dir() / f"{self.key}.npz", meta, arrays)

    def _point_at(self, sidecar: Path) -> None:
        path = self.record_file
        if path is None or self.opened is None or path.is_symlink():
            return  # (a linked manifest is not replaced by a file)
        now = _read_json(path)
        if now is None or _without_record(now, path) != _without_record(self.opened, path):
            return  # rebuilt or edited since it was opened: not ours to touch now
        section = _section(now, path)
        wanted = {"file": sidecar.name, "format": SIDECAR_FORMAT, "key": self.key}
        if section is None or section.get(ROW_HASHES_KEY) == wanted:
            return
        section[ROW_HASHES_KEY] = wanted
        try:
            with atomic_write(path) as f:
                if path.name == DATASET_MANIFEST:  # (as the shardset writer formats it)
                    f.write(json.dumps(now, indent=2, sort_keys=True))
                else:
                    json.dump(now, f, ensure_ascii=False)
        except OSError:
            return  # a read-only build: the sidecar is still found by its name
