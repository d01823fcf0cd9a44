"""A ``torch.utils.data.IterableDataset`` over a served iteration (imports torch).

Use ``DataLoader(RemoteTorchDataset(...), batch_size=None, num_workers=N)``: the server already
batches. Each DataLoader worker is its own client taking slot ``w`` of ``N`` within the rank (the
rank's leases are dealt round-robin over the slots), so every batch of the rank is yielded exactly
once whatever ``N``; with ``N > 1`` the batch order within the rank is interleaved lease by lease.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from datamill.client.loader import RemoteLoader
from datamill.client.options import Transport
from datamill.core.optional import require

torch = require("torch", extra="torch")
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["RemoteTorchDataset"]


class RemoteTorchDataset(IterableDataset[Any]):
    """Served batches for a ``DataLoader(..., batch_size=None)`` (arguments as
    :class:`RemoteLoader`; the ``slot`` and ``slots`` of its ``transport`` are the DataLoader
    worker's).

    Examples:
        >>> ds = RemoteTorchDataset("http://127.0.0.1:8470", None, "cifar", batch_size=32)
        >>> ds.kwargs["collate"], ds.epoch
        ('torch', 0)
    """

    def __init__(self, url: str, key: str | None, dataset: str, **kwargs: Any) -> None:
        super().__init__()
        kwargs.setdefault("collate", "torch")
        self.url, self.key, self.dataset = url, key, dataset
        self.epoch = int(kwargs.pop("epoch", 0))
        self.kwargs = kwargs

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` on the next ``iter(DataLoader)``."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        slot, slots = (0, 1) if info is None else (info.id, info.num_workers)
        kwargs = dict(self.kwargs)
        transport = kwargs.pop("transport", None) or Transport()
        loader = RemoteLoader(
            self.url,
            self.key,
            self.dataset,
            epoch=self.epoch,
            transport=dataclasses.replace(transport, slot=slot, slots=slots),
            **kwargs,
        )  # built in the worker: one client id per worker process
        yield from loader
