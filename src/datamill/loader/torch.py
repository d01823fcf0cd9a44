"""A ``torch.utils.data.IterableDataset`` over a :class:`~datamill.loader.Loader` (imports torch).

:class:`TorchLoaderDataset` is the entry point (the loader module never imports this adapter: there
is no ``Loader.to_torch()``, which would be an import cycle; a language-model loader gets an
:class:`~datamill.loader.lm_torch.LMTorchDataset`). Use it with
``DataLoader(dataset, batch_size=None, num_workers=N)``: the Loader already batches. A Loader with
``Workers(processes=N)`` under ``DataLoader(dataset, batch_size=None, num_workers=0)`` has its
batches built in its own worker processes and handed over in shared memory
(:mod:`datamill.loader.procs`: nothing pickled, the trainer's CPU per batch a copy and a collate).
Worker ``w`` of ``N`` (from ``torch.utils.data.get_worker_info()``) builds the rank's batches
``w, w + N, ...`` through the loader's :class:`~datamill.loader.service.BatchService` and the
DataLoader takes one batch from each worker in turn, so the batch sequence is exactly the Loader's,
for any ``N``; worker *processes* help when a transform is GIL-bound Python.

* ``collate="numpy"`` batches are made torch tensors (what DataLoader would do anyway), by a copy of
  the service with the torch collate; the user's Loader is never changed.
* In a DataLoader worker process the tensors of a batch are packed into one storage (each a view
  of it, same dtype, shape and values) before they are sent: torch sends every storage through its
  own shared-memory segment and file descriptor, so one storage per batch instead of one per column
  cut the workers' and the main process's CPU for a 3 KB-binary batch by about a third.
* A worker process uses jemalloc as Arrow's memory pool (:func:`_worker_memory_pool`).
* A batch emptied by the filter is yielded as an empty batch here (skipping it would shift the
  round-robin between workers).
* The adapter keeps its own position: call :meth:`TorchLoaderDataset.set_epoch` before each epoch,
  and resume with :meth:`TorchLoaderDataset.state_dict` ``(batches_consumed)`` / ``load_state_dict``
  in the main process. It also follows torchdata's ``Stateful`` protocol: ``state_dict()`` without
  arguments is the calling worker's position (the batches it has yielded), so a torchdata
  ``StatefulDataLoader(dataset, batch_size=None, num_workers=N)`` checkpoint taken mid-epoch resumes
  exactly: each worker restarts after its last batch the main process consumed. ``max_errors``
      applies per worker process and iteration
  (:meth:`~datamill.loader.service.BatchService.accounting`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.core.optional import require
from datamill.loader.collate import collate_numpy, collate_torch
from datamill.loader.elastic import norm_elastic
from datamill.loader.lm import LMLoader
from datamill.loader.lm_torch import LMTorchDataset
from datamill.loader.loader import Loader
from datamill.loader.order import Elastic, worker_batches
from datamill.loader.procs import ProcessBuilds

torch = require("torch", extra="torch")
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["WORKER_STATE_FORMAT", "TorchLoaderDataset", "pack_tensors"]

WORKER_STATE_FORMAT = "datamill.torch_worker/1"
"""The format of a worker's ``state_dict()`` (torchdata's ``Stateful`` protocol)."""


class TorchLoaderDataset(IterableDataset[Any]):
    """Wrap a Loader for ``torch.utils.data.DataLoader(..., batch_size=None)``.

    The loader's rank, world size and position (epoch, batches seen) are taken when wrapping; the
    loader itself is not changed by the adapter.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.core.source import TableSource
        >>> ds = TorchLoaderDataset(
        ...     Loader(TableSource(pa.table({"x": list(range(6))})), 4, collate="torch")
        ... )
        >>> [len(b["x"]) for b in torch.utils.data.DataLoader(ds, batch_size=None)]
        [4, 2]
    """

    def __new__(cls, loader: Any) -> Any:
        """A language-model loader gets an :class:`~datamill.loader.lm_torch.LMTorchDataset`."""
        if isinstance(loader, LMLoader):
            return LMTorchDataset(loader)
        return super().__new__(cls)

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        if loader.refill:
            raise ConfigError(
                "the torch adapter does not support Batching(refill=True) (its workers build "
                "position batches)",
                hint="iterate the Loader itself, or filter without refill",
            )
        service = loader.service
        if (
            service.collate_fn is collate_numpy
        ):  # DataLoader would convert (and warn on read-only arrays)
            service = service.replace(collate=collate_torch)
        self.service, self.rank, self.world_size = service, loader.rank, loader.world_size
        self.replication = loader.replication
        state = loader.state_dict()
        self._start = (int(state["epoch"]), int(state["batches_seen"]))
        self._elastic: Elastic = norm_elastic(state.get("elastic"))
        self._skip = self._yielded = (
            0  # this worker's batches skipped on resume / yielded in this iteration
        )
        # the loader's Workers(processes=N): batches built in worker processes and handed over in
        # shared memory when iterated in this process (DataLoader(num_workers=0))
        self._procs = (
            ProcessBuilds(service, loader.workers.processes) if loader.workers.processes else None
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_procs"] = None  # a DataLoader worker process builds in process
        return state

    def _where(self) -> dict[str, Any]:
        return {"elastic": self._elastic, "replication": self.replication}

    def __len__(self) -> int:
        epoch, start = self._start
        return self.service.num_batches(epoch, self.rank, self.world_size, **self._where()) - start

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` from its start on the next ``iter(DataLoader)``."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self._start, self._elastic = (int(epoch), 0), ()
        self._skip = 0

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The resume state after the main process consumed ``batches_consumed`` batches of this
        iteration.

        Without ``batches_consumed`` (torchdata's ``Stateful`` protocol, called in each worker by a
        ``StatefulDataLoader``): this worker's position, ``{"format", "start", "elastic",
        "yielded"}``.
        """
        epoch, start = self._start
        if batches_consumed is None:
            return {
                "format": WORKER_STATE_FORMAT,
                "start": [epoch, start],
                "elastic": [[w, list(cs)] for w, cs in self._elastic],
                "yielded": self._yielded,
                # the Loader's state at ``start``: dataset fingerprint, seed and order config
                "loader": self.service.resume_state(
                    epoch=epoch,
                    batches_seen=start,
                    rank=self.rank,
                    world_size=self.world_size,
                    **self._where(),
                ),
            }
        return self.service.resume_state(
            epoch=epoch,
            batches_seen=start + int(batches_consumed),
            rank=self.rank,
            world_size=self.world_size,
            **self._where(),
        )

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume at ``state`` (one rank's or every rank's, checked and re-split like
        :meth:`Loader.load_state_dict`).

        A worker state (from ``state_dict()`` in a worker) makes this worker skip the batches it had
        yielded; it carries the Loader's state at the worker's start, checked like any other.

        Raises:
            ResumeStateError: a state of another dataset, seed or order settings (batch size, world
                size...), or a worker state whose counters disagree with it.
        """
        if isinstance(state, Mapping) and state.get("format") == WORKER_STATE_FORMAT:
            self._start, self._elastic, self._skip = self._worker_point(state)
            return
        point = self.service.resume_point(
            state, rank=self.rank, world_size=self.world_size, replication=self.replication
        )
        self._start, self._elastic = (point.epoch, point.batches_seen), point.elastic
        self._skip = 0

    def _worker_point(self, state: Mapping[str, Any]) -> tuple[tuple[int, int], Elastic, int]:
        """``(start, elastic, yielded)`` of a worker state, its Loader state checked by
        :meth:`BatchService.resume_point` and its counters against that state."""
        loader_state = state.get("loader")
        if not isinstance(loader_state, Mapping):
            raise ResumeStateError(
                "a torch worker state without its Loader state (dataset fingerprint, seed, order)",
                hint="resume from a state saved by this version's StatefulDataLoader",
            )
        point = self.service.resume_point(
            loader_state, rank=self.rank, world_size=self.world_size, replication=self.replication
        )
        try:
            start = tuple(int(v) for v in state["start"])
            elastic = norm_elastic(state.get("elastic"))
            yielded = state["yielded"]
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise ResumeStateError(f"malformed torch worker state: {exc}") from exc
        if start != (point.epoch, point.batches_seen) or elastic != point.elastic:
            raise ResumeStateError(
                f"torch worker state starts at (epoch, batch) {list(start)}, but its Loader state "
                f"at {[point.epoch, point.batches_seen]}",
                hint="the state was edited or mixes two runs; resume from a state saved by the run",
            )
        if isinstance(yielded, bool) or not isinstance(yielded, int) or yielded < 0:
            raise ResumeStateError(
                f"torch worker state: yielded must be an int >= 0, got {yielded!r}"
            )
        return (point.epoch, point.batches_seen), point.elastic, yielded

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch, start = self._start
        total = self.service.num_batches(epoch, self.rank, self.world_size, **self._where())
        accounting = self.service.accounting()
        mine = worker_batches(total, worker=worker, num_workers=num_workers, start=start)
        if self._skip > len(mine):
            raise ResumeStateError(
                f"torch worker state says worker {worker} yielded {self._skip:,} batches, but it "
                f"has only {len(mine):,} in epoch {epoch} from batch {start:,}",
                hint="the state was edited or belongs to another run or worker count",
            )
        mine = mine[self._skip :]
        self._yielded, self._skip = self._skip, 0
        pack = info is not None  # a worker process: the batch crosses to the main process
        if pack:
            _worker_memory_pool()
        build = self.service.build if pack or self._procs is None else self._procs.build
        for res in build(epoch, self.rank, mine, world_size=self.world_size, **self._where()):
            accounting.add(res)
            self._yielded += 1
            out = res.output if res.output is not None else self.service.collate_fn(res.empty)
            yield pack_tensors(out) if pack else out


_POOL_SET = False


def _worker_memory_pool() -> None:
    """In a DataLoader worker process, make jemalloc Arrow's default memory pool (once).

    A worker decodes and gathers every shard its batches need into new Arrow buffers; with the
    default mimalloc pool, which hands freed memory back to the system within milliseconds, most
    of those buffers landed on fresh pages the kernel had to zero first (40% of a worker's CPU in a
    profile of 3 KB binary samples). jemalloc keeps freed pages for reuse: worker CPU fell by about
    a third. The worker process is the loader's own, so the user's main process keeps its pool;
    a pyarrow built without jemalloc keeps its default.
    """
    global _POOL_SET
    if _POOL_SET:
        return
    _POOL_SET = True
    import pyarrow as pa

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):  # a build without jemalloc
        pass


ALIGN = 64
"""Byte alignment of each tensor packed into a batch's storage (any dtype's itemsize divides it)."""


def pack_tensors(batch: Any) -> Any:
    """``batch`` (a dict) with its CPU tensors copied into views of one new storage.

    Values, dtypes and shapes are unchanged; other entries are kept as they are. Pinned tensors,
    tensors needing gradients, and batches with fewer than two tensors are returned unchanged.

    Examples:
        >>> b = pack_tensors({"x": torch.arange(3), "m": torch.ones(2, 2, dtype=torch.bool)})
        >>> b["x"].tolist(), b["m"].shape, b["x"].untyped_storage().data_ptr() == b[
        ...     "m"
        ... ].untyped_storage().data_ptr()
        ([0, 1, 2], torch.Size([2, 2]), True)
    """
    if not isinstance(batch, dict):
        return batch
    tensors = {
        k: v
        for k, v in batch.items()
        if isinstance(v, torch.Tensor)
        and v.device.type == "cpu"
        and not v.requires_grad
        and not v.is_pinned()
    }
    if len(tensors) < 2:
        return batch
    starts, total = {}, 0
    for k, t in tensors.items():
        starts[k] = total
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    buf = torch.empty(total, dtype=torch.uint8)
    out = dict(batch)
    for k, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        view = buf[starts[k] : starts[k] + nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        out[k] = view
    return out
