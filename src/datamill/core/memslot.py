"""A shared-memory slot: one ``memfd`` a worker process writes into and another process maps
through ``/proc/PID/fd/FD`` (the batches of :mod:`datamill.loader.procs`, the leases of
:mod:`datamill.serve.data.workers`); kept and reused, grown when a write needs more.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["MemSlot"]


class MemSlot:
    """One shared-memory file (``memfd``, named ``name``), mapped writable in this process.

    Examples:
        >>> import sys
        >>> if sys.platform == "linux":
        ...     s = MemSlot("doc"); s.region(3)[:] = 7; assert s.size == 1 << 20
    """

    def __init__(self, name: str) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        self.size = 0
        self.map: mmap.mmap | None = None

    def region(self, n: int) -> np.ndarray:
        """The slot's first ``n`` bytes, writable (the file grown when too small)."""
        if n > self.size:
            size = max(n + (n >> 2), 1 << 20)
            os.ftruncate(self.fd, size)
            if self.map is not None:
                self.map.close()
            self.map, self.size = mmap.mmap(self.fd, size), size
        assert self.map is not None
        return np.frombuffer(self.map, dtype=np.uint8, count=n)
