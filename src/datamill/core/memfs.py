"""The ``memory://`` scheme of :mod:`datamill.core.storage`, for tests: one in-memory filesystem per
process.

It behaves as an object store (no local paths: readers download through the shard cache, writers
stage locally and upload), so the storage contract tests run every remote code path without a
server. pyarrow's own in-memory filesystem (``_MockFileSystem``, the one its tests use) holds it;
like an object store, writing an object needs no folders first.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

__all__ = ["memory_filesystem", "recognises", "reset_memory"]


class _ObjectStoreLike(pafs._MockFileSystem):  # type: ignore[misc]  # pyarrow's in-memory FS has no public name or stubs
    """Writing ``a/b/c`` makes ``a/b`` as an object store would (pyarrow's mock filesystem wants it
    first)."""

    def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> Any:
        parent = path.rpartition("/")[0]
        if parent:
            self.create_dir(parent, recursive=True)
        return super().open_output_stream(path, *args, **kwargs)


_FS: list[pafs.FileSystem] = []


def memory_filesystem() -> pafs.FileSystem:
    """The process's in-memory filesystem (made on first use).

    Examples:
        >>> fs = memory_filesystem()
        >>> with fs.open_output_stream("bucket/a.txt") as f:
        ...     _ = f.write(b"hi")
        >>> fs.get_file_info("bucket/a.txt").size
        2
        >>> reset_memory()
    """
    if not _FS:
        _FS.append(_ObjectStoreLike())
    return _FS[0]


def reset_memory() -> None:
    """Forget everything stored (a fresh filesystem on next use)."""
    _FS.clear()


def recognises(exc: BaseException) -> bool:
    """The in-memory filesystem raises plain ``FileNotFoundError``/``OSError``: nothing to
    recognise."""
    return False
