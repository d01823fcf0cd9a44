"""Server-built leases collated as a whole (numpy, torch) give the in-process Loader's batches, and
one batch's arrays are independent of another's."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.loader import Loader
from datamill.loader.collate import collate_numpy
from datamill.shards.dataset import ShardsetDataset
from datamill.sources import open_source

pytestmark = pytest.mark.server

_N = 900


def _mixed(n: int) -> pa.Table:
    """Every column kind the lease-level collate has a fast path for, nulls included, and some
    it converts batch by batch (ragged lists, dictionaries)."""
    rng = np.random.default_rng(5)
    holes = rng.random(n) < 0.02  # some batches of 32 with a null, some without

    def masked(values: np.ndarray) -> pa.Array:
        return pa.array(values, mask=holes)

    return pa.table(
        {
            "uid": np.arange(n, dtype=np.int64),
            "i8": masked(rng.integers(-100, 100, n).astype(np.int8)),
            "u64": pa.array(rng.integers(0, 2**40, n).astype(np.uint64)),
            "f32": masked(rng.normal(size=n).astype(np.float32)),
            "flag": masked(rng.random(n) < 0.5),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.normal(size=3 * n).astype(np.float32)), 3
            ),
            "img": pa.array(
                [
                    None if h else bytes(rng.integers(0, 255, i % 5, dtype=np.uint8))
                    for i, h in enumerate(holes)
                ],
                pa.binary(),
            ),
            "name": pa.array([None if h else f"n{i}" for i, h in enumerate(holes)]),
            "ids": pa.array([list(range(i % 4)) for i in range(n)], pa.list_(pa.int32())),
            "tag": pa.array([f"t{i % 3}" for i in range(n)]).dictionary_encode(),
        }
    )


@pytest.fixture(scope="module")
def mixed(server: dict[str, Any]) -> dict[str, Any]:
    """The shared server with ``mixed``: the table above, in shards of 100 (direct mode too)."""
    path = server["root"] / "mixed"
    if not path.exists():
        ShardsetDataset.create(path, _mixed(_N), uid="uid", shardset="main", shard_size=100)
        with Client(server["url"], server["admin"]) as c:
            c.register("mixed", name="mixed", client_location=str(path.resolve()))
    return server


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        if a.dtype == object:
            return a.dtype == b.dtype and a.shape == b.shape and a.tolist() == b.tolist()
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, list):
        return a == b
    return bool(
        a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()
    )


_AS_BYTES = functools.partial(collate_numpy, binary="bytes")


@pytest.mark.parametrize(
    "collate",
    ["numpy", "torch", "arrow", _AS_BYTES],
    ids=lambda c: c if isinstance(c, str) else "numpy_binary_bytes",
)
def test_server_built_leases_collated_whole_equal_the_in_process_loader(
    mixed: dict[str, Any], collate: Any
) -> None:
    """numpy and torch: collated a lease at a time; "arrow" and a callable: a table per batch, as
    before."""
    if collate == "torch":
        pytest.importorskip("torch")
    source = open_source(mixed["root"] / "mixed")
    for rank in range(2):
        remote = RemoteLoader(
            mixed["url"],
            mixed["read"],
            "mixed",
            batch_size=32,
            seed=3,
            rank=rank,
            collate=collate,
            leases=Leases(
                world_size=2,
                name=f"lease-collate-{collate if isinstance(collate, str) else 'bytes'}",
                size=6,
            ),
        )
        assert (remote.lease_collate is not None) == (collate in ("numpy", "torch"))
        got = list(remote)
        ref = list(Loader(source, 32, seed=3, rank=rank, world_size=2, collate=collate))
        assert len(got) == len(ref) == -(-_N // 64)
        if collate == "arrow":
            assert all(isinstance(a, pa.Table) and a.equals(b) for a, b in zip(got, ref))
            got, ref = [collate_numpy(a) for a in got], [collate_numpy(b) for b in ref]
        for a, b in zip(got, ref):
            assert list(a) == list(b)
            assert all(_equal(a[k], b[k]) for k in a), [k for k in a if not _equal(a[k], b[k])]
        assert remote.stats["batches"] == len(ref)


@pytest.mark.parametrize("collate", ["numpy", "torch"])
def test_direct_batches_collated_a_block_at_a_time_equal_the_in_process_loader(
    mixed: dict[str, Any], collate: str
) -> None:
    """A direct client collates its batches as it builds them, each block's columns converted
    once: the in-process Loader's arrays (dtypes, shapes, bytes, writeability), every column
    kind, nulls included."""
    if collate == "torch":
        pytest.importorskip("torch")
    path = mixed["root"] / "mixed"
    remote = RemoteLoader(
        mixed["url"],
        mixed["read"],
        "mixed",
        batch_size=32,
        seed=6,
        collate=collate,
        leases=Leases(name=f"direct-block-{collate}", size=5),
        transport=Transport("direct"),
    )
    assert remote._direct is not None and remote._direct.block is not None
    got = list(remote)
    ref = list(Loader(open_source(path), 32, seed=6, collate=collate))
    assert len(got) == len(ref) == -(-_N // 32)
    for a, b in zip(got, ref):
        assert list(a) == list(b)
        assert all(_equal(a[k], b[k]) for k in a), [k for k in a if not _equal(a[k], b[k])]
        flags = [k for k in a if isinstance(a[k], np.ndarray) and a[k].size]
        assert all(a[k].flags.writeable == b[k].flags.writeable for k in flags)


@pytest.mark.parametrize("collate", ["numpy", "torch"])
def test_mutating_one_batch_leaves_the_others_unchanged(
    mixed: dict[str, Any], collate: str
) -> None:
    """A training loop writing into its batch in place (numpy: the writeable arrays; torch: every
    tensor) cannot change another batch of the same lease."""
    torch = pytest.importorskip("torch") if collate == "torch" else None
    remote = RemoteLoader(
        mixed["url"],
        mixed["read"],
        "mixed",
        batch_size=32,
        seed=4,
        collate=collate,
        leases=Leases(name=f"lease-mutate-{collate}", size=8),
    )
    batches = []
    for batch in remote:
        batches.append(batch)
        if len(batches) == 8:  # one lease
            break
    copies = [
        {
            k: (
                v.copy()
                if isinstance(v, np.ndarray)
                else list(v)
                if isinstance(v, list)
                else v.clone()
            )
            for k, v in b.items()
        }
        for b in batches
    ]
    for batch in batches[::2]:  # every other batch is overwritten
        for value in batch.values():
            if isinstance(value, np.ndarray):
                if value.flags.writeable and value.size:
                    value[...] = None if value.dtype == object else 0
            elif torch is not None and isinstance(value, torch.Tensor):
                value.fill_(0)
    for batch, before in zip(batches[1::2], copies[1::2]):
        assert all(_equal(batch[k], before[k]) for k in batch)


def test_leases_of_several_mebibytes_arrive_whole(server: dict[str, Any]) -> None:
    # a lease's body goes out in pieces of 1 MiB and is read into one Arrow buffer: 4 MB leases
    # of 20 KB samples give the in-process Loader's bytes
    path = server["root"] / "big"
    rng = np.random.default_rng(8)
    blobs = [bytes(rng.integers(0, 256, 20_000, dtype=np.uint8)) for _ in range(400)]
    table = pa.table({"uid": np.arange(400, dtype=np.int64), "blob": pa.array(blobs, pa.binary())})
    ShardsetDataset.create(path, table, uid="uid", shardset="main", shard_size=100)
    with Client(server["url"], server["admin"]) as c:
        c.register("big", name="big")
    lease = 6  # batches of 32 x 20 KB: 3.8 MB a lease
    remote = RemoteLoader(
        server["url"],
        server["read"],
        "big",
        batch_size=32,
        seed=2,
        leases=Leases(name="big-leases", size=lease),
        transport=Transport(ack_window=16),
    )
    got = list(remote)
    ref = list(Loader(open_source(path), 32, seed=2))
    assert 32 * 20_000 * lease > 3 << 20 and len(got) == len(ref) == 13
    for a, b in zip(got, ref):
        assert a["uid"].tolist() == b["uid"].tolist()
        assert a["blob"].tobytes() == b["blob"].tobytes()
        assert a["blob_offsets"].tolist() == b["blob_offsets"].tolist()
