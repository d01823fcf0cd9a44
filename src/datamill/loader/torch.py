"""A ``torch.utils.data.IterableDataset`` over a :class:`~datamill.loader.Loader` (imports torch).

Use it with ``DataLoader(dataset, batch_size=None, num_workers=N)``: the Loader already batches.
Worker ``w`` of ``N`` (from ``torch.utils.data.get_worker_info()``) builds the rank's batches
``w, w + N, ...`` and the DataLoader takes one batch from each worker in turn, so the batch sequence
is exactly the Loader's, for any ``N``; worker *processes* help when a transform is GIL-bound Python.

* ``collate="numpy"`` batches are made torch tensors (what DataLoader would do anyway).
* A batch emptied by the filter is yielded as an empty batch here (skipping it would shift the
  round-robin between workers).
* Workers are forked copies: call :meth:`TorchLoaderDataset.set_epoch` before each epoch, and resume
  with :meth:`TorchLoaderDataset.state_dict` ``(batches_consumed)`` / ``load_state_dict`` in the main
  process. ``max_errors`` and ``stats()`` are per worker process.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from datamill.core.optional import require
from datamill.loader.collate import collate_numpy, collate_torch
from datamill.loader.loader import Loader
from datamill.loader.order import worker_batches

torch = require("torch", extra="torch")
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["TorchLoaderDataset"]


class TorchLoaderDataset(IterableDataset[Any]):
    """Wrap a Loader for ``torch.utils.data.DataLoader(..., batch_size=None)``.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.core.source import TableSource
        >>> ds = TorchLoaderDataset(Loader(TableSource(pa.table({"x": list(range(6))})), 4, collate="torch"))
        >>> [len(b["x"]) for b in torch.utils.data.DataLoader(ds, batch_size=None)]
        [4, 2]
    """

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        if loader.collate_fn is collate_numpy:  # DataLoader would convert (and warn on read-only arrays)
            loader = copy.copy(loader)
            loader.collate_fn = collate_torch
        self.loader = loader
        self._start = (loader.epoch, loader.state_dict()["batches_seen"])

    def __len__(self) -> int:
        return int(len(self.loader) - self._start[1])

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` from its start on the next ``iter(DataLoader)``."""
        self.loader.set_epoch(epoch)
        self._start = (epoch, 0)

    def state_dict(self, batches_consumed: int) -> dict[str, Any]:
        """The resume state after the main process consumed ``batches_consumed`` batches of this iteration."""
        state = self.loader.state_dict()
        epoch, start = self._start
        state.update(epoch=epoch, batches_seen=start + int(batches_consumed),
                     samples_seen=min(len(self.loader.plan(epoch).seq), (start + int(batches_consumed)) * self.loader.batch_size))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` (see :meth:`Loader.load_state_dict`)."""
        self.loader.load_state_dict(state)
        self._start = (self.loader.epoch, self.loader.state_dict()["batches_seen"])

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        loader = self.loader
        epoch, start = self._start
        loader.epoch = epoch
        total = loader.plan(epoch).total_batches
        for res in loader.iter_batches(worker_batches(total, worker=worker, num_workers=num_workers, start=start)):
            loader._account(res)
            yield res.output if res.output is not None else loader.collate_fn(res.empty)
