"""Hugging Face datasets over datamill outputs: every sample once, with equal bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datamill.hf import to_dataset, to_iterable_dataset
from datamill.shards import ShardsetDataset

datasets = pytest.importorskip("datasets")


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(5)
    blobs = [
        rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes() for _ in range(n)
    ]
    ids = [rng.integers(0, 100, int(rng.integers(0, 9))).tolist() for _ in range(n)]
    return pa.table(
        {
            "uid": np.arange(n, dtype=np.int64) * 7 + 3,
            "image": pa.array(blobs, pa.binary()),
            "ids": pa.array(ids, pa.list_(pa.int64())),
            "y": rng.random(n, dtype=np.float32),
        }
    )


def _by_uid(rows: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    out = {r["uid"]: r for r in rows}
    assert len(out) == len(rows), "a uid arrived twice"
    return out


def test_shardset_to_hf_and_iterable_give_every_sample_once_with_equal_bytes(
    tmp_path: Path,
) -> None:
    table = _table(257)
    ds = ShardsetDataset.create(tmp_path / "ds", table, uid="uid", shardset="s", shard_size=50)
    expected = _by_uid(table.to_pylist())
    for hf in (ds.to_hf(), to_dataset(tmp_path / "ds")):
        assert isinstance(hf, datasets.Dataset) and len(hf) == 257
        got = _by_uid(hf.to_list())
        assert got.keys() == expected.keys()
        for uid, row in expected.items():
            assert got[uid]["image"] == row["image"] and got[uid]["ids"] == row["ids"]
            assert np.float32(got[uid]["y"]) == np.float32(row["y"])  # type: ignore[arg-type]
    it = to_iterable_dataset(tmp_path / "ds")
    assert isinstance(it, datasets.IterableDataset) and it.num_shards == ds.num_shards
    got = _by_uid(list(it))
    assert got.keys() == expected.keys()
    assert all(got[u]["image"] == r["image"] for u, r in expected.items())


def test_to_dataset_shares_the_arrow_buffers_of_a_source() -> None:
    from datamill.core.source import TableSource

    table = _table(20)
    hf = to_dataset(TableSource(table, shard_size=8))
    assert hf.data.table.column("image").to_pylist() == table.column("image").to_pylist()
    assert hf.column_names == table.column_names


def test_preprocessed_hdf5_to_dataset(tmp_path: Path) -> None:
    from datamill.preprocessing.api import preprocess
    from datamill.preprocessing.hdf5 import HDF5Source

    data = Path(os.environ.get("DATAMILL_DATA", "/work/shared/data"))
    csv = tmp_path / "house.csv"
    csv.write_text(
        "".join((data / "house_prices_train.csv").read_text().splitlines(keepends=True)[:301])
    )
    out = preprocess(
        csv,
        {
            "input_features": [
                {"name": "LotArea", "type": "number"},
                {"name": "MSZoning", "type": "category"},
                {"name": "Exterior1st", "type": "set"},
            ],
            "output_features": [{"name": "SalePrice", "type": "number"}],
        },
    )
    assert out.hdf5_path is not None
    hf = to_dataset(out.hdf5_path)
    src = HDF5Source(out.hdf5_path)
    expected = pa.concat_tables([src.read_shard(k) for k in range(src.num_shards)])
    assert len(hf) == expected.num_rows == 300
    assert hf.to_list() == expected.to_pylist()
