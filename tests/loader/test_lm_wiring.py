"""Language-model loaders wired into the rest: ``Loader.from_state`` and the torch DataLoader."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.loader import Batching, Loader
from datamill.loader.lm import LMLoader
from tests.loader.test_lm import digests, keep_lang, lm_mix, make, reference


def test_from_state_resumes_with_another_world_size() -> None:
    """States of 2 ranks, resumed by ``Loader.from_state`` with 4 (batch size following): the
    global batches go on as in the unbroken run; settings default to the saved ones."""
    old = [make(lm_mix(), world=2, rank=r, global_batch=8) for r in range(2)]
    digests(old, 2)
    states = [json.loads(json.dumps(ld.state_dict())) for ld in old]
    new = [
        Loader.from_state(
            lm_mix(), states, world_size=4, rank=r, batching=Batching(filter=keep_lang)
        )
        for r in range(4)
    ]
    assert all(isinstance(ld, LMLoader) and ld.batch_size == 2 for ld in new)
    assert new[0].packing == old[0].packing and new[0].balance == "tokens_squared"
    assert digests(new, 3) == reference(8, "best_fit", 5)[2:]


def test_from_state_names_what_it_cannot_restore() -> None:
    ld = make(lm_mix(), world=2, rank=0, global_batch=8)
    state = ld.state_dict()
    with pytest.raises(ConfigError, match="filter"):
        Loader.from_state(lm_mix(), state)  # the filter is a function: pass it again
    with pytest.raises(ConfigError, match="does not divide"):
        Loader.from_state(lm_mix(), state, world_size=3, batching=Batching(filter=keep_lang))


@pytest.mark.torch
def test_torch_dataloader_yields_the_loaders_steps_and_resumes() -> None:
    """``TorchLoaderDataset(lm_loader)`` under a DataLoader (in process and 2 workers): the
    loader's batches as tensors, in order; its states resume the loader and the dataset."""
    import torch

    from datamill.loader.torch import TorchLoaderDataset

    def take(ds: Any, n: int, workers: int = 0) -> list[np.ndarray]:
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        return [b["input_ids"].numpy() for _, b in zip(range(n), dl)]

    want = [
        b["input_ids"] for _, b in zip(range(5), make(lm_mix(), world=1, rank=0, global_batch=8))
    ]
    ds = TorchLoaderDataset(make(lm_mix(), world=1, rank=0, global_batch=8))
    assert all(np.array_equal(a, b) for a, b in zip(take(ds, 5, workers=2), want))
    state = ds.state_dict(2)  # after 2 steps consumed
    again = make(lm_mix(), world=1, rank=0, global_batch=8)
    again.load_state_dict(state)
    assert np.array_equal(next(iter(again))["input_ids"], want[2])
    worker = TorchLoaderDataset(make(lm_mix(), world=1, rank=0, global_batch=8))
    worker.load_state_dict(state)
    saved = worker.state_dict()  # a worker's state: its start and steps yielded
    assert all(np.array_equal(a, b) for a, b in zip(take(worker, 2), want[2:]))
    resumed = TorchLoaderDataset(make(lm_mix(), world=1, rank=0, global_batch=8))
    resumed.load_state_dict({**worker.state_dict(), "yielded": 1})
    assert np.array_equal(take(resumed, 1)[0], want[3])
    assert saved["yielded"] == 0
    with pytest.raises(ResumeStateError):
        resumed.load_state_dict({"format": "datamill.loader/9"})
