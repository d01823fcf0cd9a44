"""The default shuffle window stops at about :data:`~datamill.loader.order.DEFAULT_WINDOW_BYTES` of
shard files (a build holds about two windows decoded); a given window wins, and a state saved with
another window says how to resume it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import ResumeStateError
from datamill.core.parquet import ParquetSource
from datamill.loader import Batching, Loader
from datamill.loader import order as order_mod
from datamill.loader.order import default_window
from datamill.shards import ShardsetDataset

SHARDS = 12


def _wide(root: Path) -> ShardsetDataset:
    """12 shards of 40 rows of 4 KB of incompressible bytes (~160 KB of file each)."""
    rng = np.random.default_rng(3)
    n = 40 * SHARDS
    blobs = pa.array([rng.bytes(4000) for _ in range(n)], pa.binary())
    table = pa.table({"uid": np.arange(n, dtype=np.int64), "blob": blobs})
    return ShardsetDataset.create(root / "wide", table, uid="uid", shardset="main", shard_size=40)


@pytest.fixture
def wide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ShardsetDataset:
    ds = _wide(tmp_path)
    # five shards' files per window: the byte bound binds on this small dataset
    monkeypatch.setattr(order_mod, "DEFAULT_WINDOW_BYTES", int(ds.shard_nbytes().mean() * 5.5))
    return ds


def test_the_default_window_holds_the_shard_files_bytes_bound(wide: ShardsetDataset) -> None:
    sizes, nbytes = wide.shard_sizes(), wide.shard_nbytes()
    assert len(sizes) == SHARDS and (nbytes > 100_000).all()
    assert default_window(sizes) == 65_536 // 40 + 1  # by samples alone: every shard at once
    loader = Loader(wide, 16, seed=0)
    assert loader.service.window == default_window(sizes, nbytes) == 5
    # one epoch: every sample once
    uids = np.concatenate([b["uid"] for b in loader])
    assert sorted(uids.tolist()) == list(range(40 * SHARDS))
    assert Loader(wide, 16, seed=0, batching=Batching(window=3)).service.window == 3


def test_a_parquet_folder_tells_its_row_groups_bytes_and_gets_the_bounded_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(6)
    n = 40 * SHARDS
    blobs = pa.array([rng.bytes(4000) for _ in range(n)], pa.binary())
    folder = tmp_path / "pq"
    folder.mkdir()
    for k in range(3):  # 3 files of 4 row groups of 40 rows
        part = pa.table(
            {"uid": np.arange(k * 160, (k + 1) * 160), "blob": blobs[k * 160 : (k + 1) * 160]}
        )
        pq.write_table(part, folder / f"part-{k}.parquet", row_group_size=40)
    src = ParquetSource(folder)
    nbytes = src.shard_nbytes()
    assert len(nbytes) == SHARDS and (nbytes > 160_000).all() and (nbytes < 170_000).all()
    assert ParquetSource(folder, shard_by="file").shard_nbytes().tolist() == [
        int(nbytes[4 * k : 4 * k + 4].sum()) for k in range(3)
    ]
    monkeypatch.setattr(order_mod, "DEFAULT_WINDOW_BYTES", int(nbytes.mean() * 5.5))
    loader = Loader(src, 16, seed=0)
    assert loader.service.window == 5
    assert sorted(np.concatenate([b["uid"] for b in loader]).tolist()) == list(range(n))


def test_a_state_saved_with_another_window_names_it_and_from_state_resumes(
    wide: ShardsetDataset,
) -> None:
    before = Loader(wide, 16, seed=1, batching=Batching(window=SHARDS))
    it = iter(before)
    for _ in range(7):
        next(it)
    state = before.state_dict()
    rest = [b["uid"].tolist() for b in it]
    with pytest.raises(ResumeStateError) as info:
        Loader(wide, 16, seed=1).load_state_dict(state)
    assert f"Batching(window={SHARDS})" in str(info.value)
    assert "Loader.from_state" in str(info.value)
    again = Loader.from_state(wide, state)
    assert again.service.window == SHARDS
    assert [b["uid"].tolist() for b in again] == rest
