"""The torch side: collate="torch" and the IterableDataset adapter under DataLoader worker
processes."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datamill.loader import Loader
from tests.strategies import FakeSource

torch = pytest.importorskip("torch")
from datamill.loader import Batching, Workers
from datamill.loader.torch import TorchLoaderDataset

pytestmark = pytest.mark.torch


def _drop_odd(t: pa.Table) -> pa.Array:
    return pc.equal(pc.bit_wise_and(t["x"], 1), 0)


def test_dataloader_two_workers_yields_every_sample_once_in_loader_order() -> None:
    src = FakeSource([37, 0, 55, 21, 64])
    loader = Loader(
        src, 16, seed=4, columns=["x", "vec", "ids"], collate="torch", batching=Batching(window=2)
    )
    expected = [
        b["x"].tolist() for b in Loader(src, 16, seed=4, columns=["x"], batching=Batching(window=2))
    ]
    dl = torch.utils.data.DataLoader(TorchLoaderDataset(loader), batch_size=None, num_workers=2)
    got = list(dl)
    assert [b["x"].tolist() for b in got] == expected
    assert sorted(x for b in got for x in b["x"].tolist()) == list(range(177))
    assert got[0]["vec"].dtype == torch.int64 and got[0]["vec"].shape == (16, 2)
    assert got[0]["ids_mask"].dtype == torch.bool


def test_worker_batches_arrive_in_one_storage_with_the_loaders_values() -> None:
    # a worker's batch crosses to the main process as one shared-memory storage, not one per column
    src = FakeSource([37, 0, 55, 21, 64])
    loader = Loader(src, 16, seed=4, columns=["x", "vec", "ids"], batching=Batching(window=2))
    want = list(TorchLoaderDataset(loader))  # no worker: nothing packed
    dl = torch.utils.data.DataLoader(TorchLoaderDataset(loader), batch_size=None, num_workers=2)
    got = list(dl)
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape
            assert torch.equal(g[k], w[k])
        assert len({t.untyped_storage().data_ptr() for t in g.values()}) == 1
        assert len({t.untyped_storage().data_ptr() for t in w.values()}) > 1


def _pool_name(t: pa.Table) -> pa.Table:
    return t.append_column("pool", pa.array([pa.default_memory_pool().backend_name] * t.num_rows))


def test_worker_processes_use_jemalloc_and_the_main_process_keeps_its_pool() -> None:
    # the default pool (mimalloc) zeroes fresh pages for most of a worker's buffers
    main_pool = pa.default_memory_pool().backend_name
    loader = Loader(
        FakeSource([20]), 10, seed=0, columns=["x"], batching=Batching(transform=_pool_name)
    )
    got = list(
        torch.utils.data.DataLoader(TorchLoaderDataset(loader), batch_size=None, num_workers=1)
    )
    assert [list(set(b["pool"])) for b in got] == [["jemalloc"], ["jemalloc"]]
    assert pa.default_memory_pool().backend_name == main_pool


def test_adapter_resume_with_other_worker_count() -> None:
    src = FakeSource([40] * 5)
    make = lambda: Loader(src, 8, seed=1, columns=["x"], batching=Batching(filter=_drop_odd))
    ds = TorchLoaderDataset(make())
    full = [
        b["x"].tolist() for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    ]
    assert len(full) == 25 and sorted(itertools.chain.from_iterable(full)) == list(range(0, 200, 2))
    state = ds.state_dict(batches_consumed=9)
    ds2 = TorchLoaderDataset(make())
    ds2.load_state_dict(state)
    tail = [
        b["x"].tolist() for b in torch.utils.data.DataLoader(ds2, batch_size=None, num_workers=1)
    ]
    assert tail == full[9:]
    ds2.set_epoch(1)
    epoch1 = [b["x"].tolist() for b in torch.utils.data.DataLoader(ds2, batch_size=None)]
    assert epoch1 == [
        b["x"].tolist()
        for b in Loader(src, 8, seed=1, epoch=1, columns=["x"], batching=Batching(filter=_drop_odd))
    ]


def test_collate_torch_tensors() -> None:
    batch = next(
        iter(
            Loader(
                FakeSource([6]),
                6,
                collate="torch",
                workers=Workers(pin_memory=True),
                batching=Batching(shuffle=False),
            )
        )
    )
    assert isinstance(batch["x"], torch.Tensor) and batch["x"].tolist() == list(range(6))
    assert batch["uid"] == [f"u{i}" for i in range(6)]
    assert np.array_equal(batch["ids"].numpy()[3], [3, 3, 3])


def test_adapter_carries_replication_and_elastic_history_and_refuses_refill() -> None:
    from datamill.core.errors import ConfigError
    from datamill.loader.torch import TorchLoaderDataset

    src = FakeSource([30, 25, 20])
    old = [Loader(src, 5, seed=2, rank=r, world_size=2) for r in range(2)]
    seen = []
    for ld in old:
        seen += next(iter(ld))["x"].tolist()
    new = [
        Loader(
            src, 5, seed=2, rank=r, world_size=6, collate="torch", batching=Batching(replication=2)
        )
        for r in range(6)
    ]
    got: list[list[int]] = []
    for ld in new:
        ld.load_state_dict([o.state_dict() for o in old])
        ds = TorchLoaderDataset(ld)
        got.append(
            [x for b in torch.utils.data.DataLoader(ds, batch_size=None) for x in b["x"].tolist()]
        )
    assert got[0] == got[1] and got[2] == got[3] and got[4] == got[5]  # replicas agree
    assert sorted(seen + got[0] + got[2] + got[4]) == list(
        range(75)
    )  # the elastic rest, exactly once
    with pytest.raises(ConfigError, match="refill"):
        TorchLoaderDataset(Loader(src, 5, batching=Batching(refill=True)))
