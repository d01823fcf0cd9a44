"""File sources (Parquet, HDF5) and real datamill outputs read through the Loader."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import DataFileError, DataFileNotFoundError, SchemaError
from datamill.core.source import Source
from datamill.loader import Batching, Loader, Workers
from datamill.loader.sources import HDF5Source, ParquetSource


def _write(path: Path, start: int, n: int, row_group_size: int) -> None:
    x = np.arange(start, start + n)
    pq.write_table(
        pa.table({"x": x, "ids": [[int(i)] * int(i % 3) for i in x]}),
        path,
        row_group_size=row_group_size,
    )


def test_parquet_row_groups_and_files_as_shards(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", 0, 25, 10)
    _write(tmp_path / "b.parquet", 25, 7, 10)
    src = ParquetSource(tmp_path)
    assert isinstance(src, Source)
    assert src.shard_sizes().tolist() == [10, 10, 5, 7] and src.columns == ["x", "ids"]
    assert src.read_shard(3, columns=["x"]).to_pydict() == {"x": list(range(25, 32))}
    by_file = ParquetSource(tmp_path, shard_by="file")
    assert (
        by_file.shard_sizes().tolist() == [25, 7]
        and by_file.read_shard(1, columns=["x"]).num_rows == 7
    )
    got = sorted(
        x for b in Loader(src, 6, seed=3, workers=Workers(threads=2)) for x in b["x"].tolist()
    )
    assert got == list(range(32))
    assert src.fingerprint() == ParquetSource(tmp_path).fingerprint() != by_file.fingerprint()


def test_parquet_errors(tmp_path: Path) -> None:
    with pytest.raises(DataFileNotFoundError) as info:
        ParquetSource(tmp_path / "missing.parquet")
    assert info.value.path == str(tmp_path / "missing.parquet")
    with pytest.raises(DataFileNotFoundError):
        ParquetSource(tmp_path)  # empty folder
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataFileError) as info2:
        ParquetSource(tmp_path / "bad.parquet")
    assert info2.value.path == str(tmp_path / "bad.parquet")
    (tmp_path / "bad.parquet").unlink()
    _write(tmp_path / "a.parquet", 0, 5, 5)
    pq.write_table(pa.table({"y": [1.0]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaError) as info3:
        ParquetSource(tmp_path)
    assert info3.value.path == str(tmp_path / "b.parquet")


def test_hdf5_preprocessed_layout(tmp_path: Path) -> None:
    path = tmp_path / "d.hdf5"
    n = 23
    with h5py.File(path, "w") as f:
        f.create_dataset("label", data=np.arange(n, dtype=np.int8))
        f.create_dataset("image", data=np.arange(n * 2 * 3 * 4, dtype=np.uint8).reshape(n, 2, 3, 4))
        f.create_dataset("name", data=np.array([f"n{i}".encode() for i in range(n)]))
        g = f.create_group("tags")
        lengths = np.arange(n) % 3
        g.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(lengths)]))
        g.create_dataset("indices", data=np.arange(int(lengths.sum()), dtype=np.int32))
        g.attrs["layout"] = "csr"
        g.attrs["vocab_size"] = 100
    src = HDF5Source(path, shard_size=5)
    assert src.columns == ["image", "label", "name", "tags"] and src.shard_sizes().tolist() == [
        5,
        5,
        5,
        5,
        3,
    ]
    batch = next(iter(Loader(src, 23, batching=Batching(shuffle=False))))
    assert batch["image"].shape == (n, 2, 3, 4) and batch["image"].dtype == np.uint8
    np.testing.assert_array_equal(batch["image"][7], np.arange(n * 24).reshape(n, 2, 3, 4)[7])
    assert batch["name"][4] == "n4" and batch["label"].tolist() == list(range(n))
    assert batch["tags_mask"].sum(axis=1).tolist() == (np.arange(n) % 3).tolist()
    shuffled = [b["label"].tolist() for b in Loader(src, 4, seed=1, rank=1, world_size=2)]
    assert sum(map(len, shuffled)) == 11


def test_hdf5_errors(tmp_path: Path) -> None:
    with pytest.raises(DataFileNotFoundError):
        HDF5Source(tmp_path / "nope.hdf5")
    bad = tmp_path / "bad.hdf5"
    bad.write_bytes(b"not hdf5 at all")
    with pytest.raises(DataFileError) as info:
        HDF5Source(bad)
    assert info.value.path == str(bad)
    uneven = tmp_path / "uneven.hdf5"
    with h5py.File(uneven, "w") as f:
        f.create_dataset("a", data=np.arange(3))
        f.create_dataset("b", data=np.arange(4))
    with pytest.raises(DataFileError, match="different numbers of rows"):
        HDF5Source(uneven)


def test_bert_parquet_from_wikitext2(data_dir: Path, tmp_path: Path) -> None:
    from datamill.pretrain import bert

    out = tmp_path / "bert.parquet"
    res = bert.build_bert_samples(
        data_dir / "wikitext2_test.raw",
        out=out,
        vocab_size=2000,
        max_seq_length=64,
        dupe_factor=1,
        workers=1,
    )
    src = ParquetSource(out)
    n = int(src.shard_sizes().sum())
    assert n == res.samples > 1000
    seen: list[int] = []
    for rank in range(2):
        loader = Loader(
            src,
            64,
            seed=7,
            rank=rank,
            world_size=2,
            columns=["tokens", "masked_positions", "is_random_next"],
            workers=Workers(threads=1),
        )
        for batch in loader:
            assert batch["tokens"].shape[1] == 64 and batch["tokens"].dtype == np.int32
            assert batch["masked_positions_mask"].shape == batch["masked_positions"].shape
            assert batch["is_random_next"].dtype == bool
            seen.append(len(batch["tokens"]))
        assert loader.stats()["yielded"] == n // 2 + (n % 2 if rank == 0 else 0)
    assert sum(seen) == n
