"""torchdata's StatefulDataLoader over the torch adapter: a mid-epoch checkpoint resumes exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from datamill.core.source import TableSource
from datamill.loader import Loader

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
from datamill.loader.torch import TorchLoaderDataset  # needs torch, checked above

pytestmark = [
    pytest.mark.torch,  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]


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
