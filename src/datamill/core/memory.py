"""Giving freed memory back to the operating system (keeps peak RSS near the live working set)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import pyarrow as pa

__all__ = ["release_memory"]


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Return free memory to the OS: Arrow's pool, and glibc's heaps (``malloc_trim(0)``).

    Worker threads allocate from their own glibc arenas, which keep freed blocks (and so RSS) until
    trimmed; the same trick Dask uses to bound worker memory. A no-op where glibc is absent.
    """
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
