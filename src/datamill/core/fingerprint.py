"""Content fingerprints and fingerprint chains for caches (xxhash, never pickle or hash())."""

from __future__ import annotations

import json
import os
from typing import Any

import xxhash

from datamill.core.io import PathLike, open_bytes

__all__ = ["chain", "fingerprint_bytes", "fingerprint_file", "fingerprint_obj"]

_CHUNK = 1 << 22


def fingerprint_bytes(data: bytes) -> str:
    """xxh3-128 hex digest of ``data``."""
    return xxhash.xxh3_128_hexdigest(data)


def fingerprint_file(source: PathLike) -> str:
    """Hash of a file's (or zip member's) full content, independent of its path and mtime.

    Examples:
        >>> import tempfile, pathlib, os
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_text("hello")
        >>> a = fingerprint_file(p); os.utime(p, (1, 1)); a == fingerprint_file(p)
        True
    """
    h = xxhash.xxh3_128()
    with open_bytes(source) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, os.PathLike):
        return os.path.normpath(os.fspath(obj))
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot fingerprint object of type {type(obj).__name__}")


def fingerprint_obj(obj: Any) -> str:
    """Hash of a JSON-able object (dict keys sorted), stable across processes and runs."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_default)
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def chain(parent: str, transform: str, params: Any = None) -> str:
    """``H(parent, "datamill.x@version", params)``: the next link of a fingerprint chain."""
    return fingerprint_obj([parent, transform, params])
