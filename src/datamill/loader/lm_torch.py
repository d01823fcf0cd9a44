"""A ``torch.utils.data.IterableDataset`` over an :class:`~datamill.loader.lm.LMLoader` (imports
torch).

``TorchLoaderDataset(lm_loader)`` makes an :class:`LMTorchDataset`. Use it with
``DataLoader(dataset, batch_size=None, num_workers=N)``: worker ``w`` builds global steps
``start + w, start + w + N, ...`` (each worker plans every step, which reads and packs each
window's lengths, and gathers only its own steps' tokens), and DataLoader takes one batch from each
worker in turn, so the batches are exactly the loader's, in order. The dataset yields one batch per
global step without end: stop at your step budget.

Resume: ``state_dict(batches_consumed)`` in the main process is the loader's resume state after
that many steps of this iteration (any world size resumes from it, as from
:meth:`LMLoader.state_dict`); ``state_dict()`` in a worker (torchdata's ``StatefulDataLoader``) is
that worker's ``{"format", "loader", "yielded"}``, and ``load_state_dict`` takes either.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from datamill.core.errors import ResumeStateError
from datamill.core.optional import require
from datamill.loader.collate import to_torch
from datamill.loader.lm import LM_STATE_FORMAT, LMLoader

require("torch", extra="torch")
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["LM_WORKER_STATE_FORMAT", "LMTorchDataset"]

LM_WORKER_STATE_FORMAT = "datamill.lm-torch-worker/1"


class LMTorchDataset(IterableDataset[Any]):
    """Global steps of a language-model loader for ``DataLoader(..., batch_size=None)``.

    The loader's position is taken when wrapping; the loader itself is not changed.

    Examples:
        >>> import pyarrow as pa
        >>> import torch
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader, Packing
        >>> from datamill.loader.torch import TorchLoaderDataset
        >>> src = TableSource(pa.table({"tokens": [[1, 2, 3], [4, 5], [6, 7, 8, 9]] * 4}))
        >>> ds = TorchLoaderDataset(Loader(src, 2, packing=Packing(seq_len=5, window=6)))
        >>> dl = torch.utils.data.DataLoader(ds, batch_size=None)
        >>> batches = [b for _, b in zip(range(3), dl)]
        >>> batches[0]["input_ids"].shape, ds.state_dict(3)["step"]
        (torch.Size([2, 5]), 3)
    """

    def __init__(self, loader: LMLoader) -> None:
        super().__init__()
        self.loader = loader
        self._start = loader.core()
        self._skip = self._yielded = 0  # this worker's steps skipped on resume / yielded

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """The loader's resume state after ``batches_consumed`` steps of this iteration, or, without
        it (in a worker), this worker's position."""
        if batches_consumed is None:
            return {
                "format": LM_WORKER_STATE_FORMAT,
                "loader": self.loader.state_at(self._start),
                "yielded": self._yielded,
            }
        return self.loader.state_at(self.loader.advance(self._start, int(batches_consumed)))

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume at a loader state (one rank's or every rank's, any world size with the same
        global batch) or at a worker's state.

        Raises:
            ResumeStateError: a state of another run or settings, or a malformed worker state.
        """
        if isinstance(state, Mapping) and state.get("format") == LM_WORKER_STATE_FORMAT:
            yielded = state.get("yielded")
            if isinstance(yielded, bool) or not isinstance(yielded, int) or yielded < 0:
                raise ResumeStateError(
                    f"torch worker state: yielded must be an int >= 0, got {yielded!r}"
                )
            self.loader.load_state_dict(state["loader"])
            self._start, self._skip = self.loader.core(), yielded
            return
        if isinstance(state, Mapping) and state.get("format") != LM_STATE_FORMAT:
            raise ResumeStateError(
                f"not a language-model loader state (format {state.get('format')!r})",
                hint="resume from LMLoader.state_dict() or this dataset's state_dict()",
            )
        self.loader.load_state_dict(state)
        self._start, self._skip = self.loader.core(), 0

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        skip, self._skip = self._skip, 0
        self._yielded = skip
        core, k = dict(self._start), 0
        ld = self.loader
        while True:
            plan = ld.plan_step(int(core["step"]), core["sources"], core["taken"])
            core = plan.after
            mine, k = k % workers == worker, k + 1
            if not mine:
                continue
            if skip:
                skip -= 1
                continue
            out = ld.build(plan)
            self._yielded += 1
            yield to_torch(out) if ld.collate == "numpy" else out
