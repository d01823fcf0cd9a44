"""torchdata's StatefulDataLoader over the torch adapter: a mid-epoch checkpoint resumes exactly."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.core.errors import ResumeStateError
from datamill.core.source import TableSource
from datamill.loader import Loader

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
stateful_worker = pytest.importorskip("torchdata.stateful_dataloader.worker")
from datamill.loader.torch import TorchLoaderDataset  # needs torch, checked above

pytestmark = [
    pytest.mark.torch,  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]


@pytest.fixture(autouse=True)
def _prompt_worker_shutdown(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Worker processes poll, and are joined, every 0.5 s instead of torch's 5 s; the iterators of
    a test are collected at its end.

    A refused state raises while StatefulDataLoader builds its iterator; the half-built iterator
    (held by the exception's traceback) never tells its workers to stop, so when it is dropped
    (by the garbage collector, during some later test) its shutdown waits out one status interval
    per worker: 10 s of three tests (measured: 10.1-10.3 s each, 0.2-1.2 s for the same cases
    otherwise). :func:`_assert_refused` drops it at once."""
    import torch.utils.data._utils as torch_utils

    monkeypatch.setattr(torch_utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    monkeypatch.setattr(stateful_worker, "MP_STATUS_CHECK_INTERVAL", 0.5)
    yield


def _assert_refused(dl: Any, state: dict[str, Any], match: str) -> None:
    """Resuming ``dl`` from ``state`` raises ResumeStateError matching ``match``; the half-built
    iterator the traceback holds is freed at once (see :func:`_prompt_worker_shutdown`)."""
    with pytest.raises(ResumeStateError, match=match) as refused:
        dl.load_state_dict(state)
        list(dl)
    traceback.clear_frames(refused.tb)


def _source() -> TableSource:
    rng = np.random.default_rng(11)
    n = 203
    blobs = [
        rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes() for _ in range(n)
    ]
    return TableSource(
        pa.table(
            {
                "uid": np.arange(n, dtype=np.int64),
                "blob": pa.array(blobs, pa.binary()),
                "y": rng.random(n, dtype=np.float32),
            }
        ),
        shard_size=30,
    )


def _loader(num_workers: int) -> object:
    ds = TorchLoaderDataset(Loader(_source(), 8, seed=3, collate="torch"))
    return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)


def _rows(batches: list[dict[str, object]]) -> list[tuple[int, bytes, float]]:
    out = []
    for b in batches:  # a binary column: its bytes (uint8 tensor) + "<col>_offsets"
        uid, values, offs, y = b["uid"], b["blob"], b["blob_offsets"], b["y"]
        o = offs.tolist()  # type: ignore[attr-defined]
        blobs = [values[o[i] : o[i + 1]].numpy().tobytes() for i in range(len(o) - 1)]  # type: ignore[index]
        out += list(zip(uid.tolist(), blobs, y.tolist()))  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 6, 13])
def test_checkpoint_mid_epoch_resumes_exactly(num_workers: int, stop: int) -> None:
    full = _rows(list(_loader(num_workers)))  # type: ignore[call-overload]
    table = _source().table
    assert sorted(r[0] for r in full) == list(range(table.num_rows))  # every sample once
    blobs = table.column("blob").to_pylist()
    assert all(blob == blobs[uid] for uid, blob, _ in full)  # with equal bytes
    dl = _loader(num_workers)
    it = iter(dl)  # type: ignore[call-overload]
    head = [next(it) for _ in range(stop)]
    state = dl.state_dict()  # type: ignore[attr-defined]
    del it
    resumed = _loader(num_workers)
    resumed.load_state_dict(state)  # type: ignore[attr-defined]
    tail = list(resumed)  # type: ignore[call-overload]
    assert _rows(head) + _rows(tail) == full


def _worker_states(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``datamill.torch_worker/1`` states inside a StatefulDataLoader state (0 or N workers)."""
    if "dataset_state" in state:
        return [state["dataset_state"]]
    snaps = state["_snapshot"]["_worker_snapshots"]
    return [snaps[w]["dataset_state"] for w in sorted(snaps)]


def _stateful(loader: Loader, num_workers: int) -> Any:
    return stateful.StatefulDataLoader(
        TorchLoaderDataset(loader), batch_size=None, num_workers=num_workers
    )


def _saved(num_workers: int, stop: int = 3) -> dict[str, Any]:
    dl = _loader(num_workers)
    it = iter(dl)  # type: ignore[call-overload]
    for _ in range(stop):
        next(it)
    state: dict[str, Any] = dl.state_dict()  # type: ignore[attr-defined]
    del it
    return state


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    ("other", "field"),
    [
        (
            lambda: Loader(TableSource(_source().table.slice(1), shard_size=30), 8, seed=3),
            "dataset",
        ),
        (lambda: Loader(_source(), 8, seed=4), "seed"),
        (lambda: Loader(_source(), 16, seed=3), "batch_size"),
    ],
)
def test_a_worker_state_of_another_dataset_seed_or_batch_size_is_refused(
    num_workers: int, other: Any, field: str
) -> None:
    """Regression: these states were accepted and resumed somewhere else (exit 0)."""
    state = _saved(num_workers)
    assert all("dataset_fingerprint" in w["loader"] for w in _worker_states(state))
    dl = _stateful(other(), num_workers)
    _assert_refused(dl, state, field if field != "dataset" else "fingerprint")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("yielded", 10_000, "yielded"),
        ("yielded", -1, "yielded"),
        ("start", [0, 2], "starts at"),
        ("loader", None, "without its Loader state"),
    ],
)
def test_a_tampered_worker_state_is_refused(
    num_workers: int, key: str, value: Any, match: str
) -> None:
    state = _saved(num_workers)
    for w in _worker_states(state):
        w[key] = value
    dl = _loader(num_workers)
    _assert_refused(dl, state, match)
