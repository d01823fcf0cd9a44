"""Copying finished task shards into the output dataset while the run goes on.

A thread takes each finished task's shard from the work folder and writes it through the run's
:class:`~datamill.shards.ShardsetWriter` (whose folder is switched in at the end), so when the last
task ends only shard 0 (which carries the run's counts in its metadata) and the commit are left: no
long publishing step after the progress bar reaches its end. The work folder stays the record of
what is done: a killed run loses the writer's folder, and the next run copies the finished shards
again.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from datamill.shards import ShardsetWriter
from datamill.shards.writer import KEEP_META
from datamill.text.tok_task import TaskConfig, shard_name

__all__ = ["ShardCopier"]


class ShardCopier:
    """Copies task shards ``k >= 1`` into ``writer`` in a thread as :meth:`done` reports them."""

    def __init__(self, writer: ShardsetWriter, work: Path, cfg: TaskConfig) -> None:
        self.writer, self.work, self.cfg = writer, work, cfg
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="tokenize-publish", daemon=True)
        self._thread.start()

    def done(self, receipt: dict[str, Any]) -> None:
        """Task ``receipt["task"]`` has finished: copy its shard (shard 0 waits for the end)."""
        k = int(receipt["task"])
        if k != 0:
            self._queue.put((k, int(receipt["file"])))

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.error is None:
                try:
                    self.copy(*item)
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by close()
                    self.error = exc

    def copy(self, k: int, file: int, metadata: bytes | None = None) -> None:
        """Write task ``k``'s shard (with ``metadata`` under the writer's kept key)."""
        table = pq.read_table(self.work / shard_name(k))
        if metadata is not None:
            table = table.replace_schema_metadata({KEEP_META: metadata})
        self.writer.write_shard(k, table, source=self.cfg.files[file].url)

    def close(self, *, check: bool = True) -> None:
        """Wait for the copies in flight; raise the first copy error when ``check``."""
        self._queue.put(None)
        self._thread.join()
        if check and self.error is not None:
            raise self.error
