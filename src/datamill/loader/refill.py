"""Full batches after filtering, with exact resumption (the streaming#800 problem).

Without ``refill`` a batch is a fixed range of positions and a filter only makes it smaller, so
resuming at ``batches_seen`` is exact. With ``refill=True`` the Loader cuts the filtered rows into
batches of exactly ``batch_size`` (the last one shorter, or dropped with ``drop_last``): which rows
form a batch then depends on the filter's decisions. :class:`Refill` keeps the rows not yet emitted
and knows where they start: position batch ``b`` of the rank's plan, after its first ``skip``
passing rows. The resume state records ``(b, skip)`` and the filter counts before ``b``; a resumed
Loader rebuilds batch ``b`` (the filter decides the same), drops ``skip`` rows and continues, so it
yields exactly what the uninterrupted run would, counts included.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pyarrow as pa

__all__ = ["Refill"]


@dataclass
class _Part:
    batch: int
    table: pa.Table  # rows of the batch's output not emitted yet
    emitted: int  # rows of the batch's output emitted (or skipped on resume) before ``table``
    counts: dict[str, int]  # the epoch's counts before this batch


class Refill:
    """Cut a stream of filtered batch tables into tables of exactly ``batch_size`` rows.

    Args:
        batch_size: rows per emitted table.
        skip: passing rows of the first pushed batch to drop (emitted before a resume). Defaults to
            ``0``.

    Examples:
        >>> r = Refill(3)
        >>> r.push(0, pa.table({"x": [1, 2]}), {}); r.ready()
        False
        >>> r.push(1, pa.table({"x": [3, 4]}), {})
        >>> r.pop().column("x").to_pylist(), r.resume_point(2)
        ([1, 2, 3], (1, 1))
        >>> r.flush().column("x").to_pylist(), r.resume_point(2)
        ([4], (2, 0))
    """

    def __init__(self, batch_size: int, *, skip: int = 0) -> None:
        self.batch_size, self._skip = int(batch_size), int(skip)
        self._parts: deque[_Part] = deque()
        self._rows = 0

    def push(self, batch: int, table: pa.Table, counts: dict[str, int]) -> None:
        """Add position batch ``batch``'s passing rows (``counts``: the epoch's counts before
        it)."""
        emitted = 0
        if self._skip:
            emitted, self._skip = min(self._skip, table.num_rows), 0
            table = table.slice(emitted)
        self._parts.append(_Part(batch, table, emitted, counts))
        self._rows += table.num_rows

    def ready(self) -> bool:
        """Whether a full batch can be popped."""
        return self._rows >= self.batch_size

    def pop(self, limit: int | None = None) -> pa.Table:
        """The next ``batch_size`` rows (or fewer: what is left, up to ``limit``)."""
        want = min(self._rows, self.batch_size if limit is None else limit)
        pieces = []
        while want:
            part = self._parts[0]
            take = min(want, part.table.num_rows)
            pieces.append(part.table.slice(0, take))
            part.table, part.emitted, want = (
                part.table.slice(take),
                part.emitted + take,
                want - take,
            )
            self._rows -= take
            if not part.table.num_rows:
                self._parts.popleft()
        # drop parts with no rows left (batches the filter emptied) so the resume point moves past
        # them
        while self._parts and not self._parts[0].table.num_rows:
            self._parts.popleft()
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]

    def flush(self) -> pa.Table | None:
        """The rows left (a short last batch), or ``None``."""
        if not self._rows:
            self._parts.clear()
            return None
        out = self.pop(limit=self._rows)
        self._parts.clear()
        return out

    def resume_point(self, next_batch: int) -> tuple[int, int]:
        """``(position batch, rows to skip)`` where the rows not emitted start (``next_batch`` when
        none are kept)."""
        if self._parts:
            return self._parts[0].batch, self._parts[0].emitted
        return next_batch, 0

    def counts_at(self, current: dict[str, int]) -> dict[str, int]:
        """The epoch's counts before the resume point (``current`` when no rows are kept)."""
        return dict(self._parts[0].counts) if self._parts else dict(current)
