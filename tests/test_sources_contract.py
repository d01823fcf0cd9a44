"""Every Source datamill ships passes one conformance harness (``tests/contracts.check_source``).

Each case builds two small real outputs (from /work/shared/data where there is one): the source
checked (reopened from disk for the fingerprint) and one over different content.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.core.source import Source, TableSource
from tests.contracts import check_source

Opener = Callable[[], Source]
Case = Callable[[Path, Path], tuple[Opener, Opener]]


def _table(n: int, *, bump: int = 0) -> pa.Table:
    x = np.arange(n, dtype=np.int64)
    return pa.table(
        {
            "id": [f"s{i}" for i in range(n)],
            "x": x + bump,
            "ids": pa.array([[int(i)] * int(i % 3) for i in x], pa.list_(pa.int32())),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(np.repeat(x, 2).astype(np.float32)), 2
            ),
        }
    )


def table_case(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    return (
        lambda: TableSource(_table(50), shard_size=7, uid_column="id"),
        lambda: TableSource(_table(50, bump=1), shard_size=7, uid_column="id"),
    )


def _parquet(tmp: Path, *, folder: bool, shard_by: str) -> tuple[Opener, Opener]:
    from datamill.core.parquet import ParquetSource

    for name, bump in (("a", 0), ("b", 1)):
        root = tmp / name
        root.mkdir()
        table = _table(45, bump=bump)
        if folder:
            pq.write_table(table.slice(0, 30), root / "part-0.parquet", row_group_size=8)
            pq.write_table(table.slice(30), root / "part-1.parquet", row_group_size=8)
        else:
            pq.write_table(table, root / "data.parquet", row_group_size=8)
    target = (lambda name: tmp / name) if folder else (lambda name: tmp / name / "data.parquet")
    return (
        lambda: ParquetSource(target("a"), shard_by=shard_by),  # type: ignore[arg-type]
        lambda: ParquetSource(target("b"), shard_by=shard_by),
    )  # type: ignore[arg-type]


def parquet_file_row_groups(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    return _parquet(tmp, folder=False, shard_by="row_group")


def parquet_file_files(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    return _parquet(tmp, folder=False, shard_by="file")


def parquet_folder_row_groups(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    return _parquet(tmp, folder=True, shard_by="row_group")


def parquet_folder_files(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    return _parquet(tmp, folder=True, shard_by="file")


HOUSE_CONFIG = {
    "input_features": [
        {"name": "LotArea", "type": "number"},
        {"name": "MSZoning", "type": "category"},
        {
            "name": "Neighborhood",
            "type": "set",
            "preprocessing": {"max_dense_bytes": 0},
        },  # CSR layout
        {"name": "Exterior1st", "type": "set"},
    ],
    "output_features": [{"name": "SalePrice", "type": "number"}],
}


def hdf5_house_prices(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    from datamill.loader.sources import open_source
    from datamill.preprocessing.api import preprocess

    lines = (data / "house_prices_train.csv").read_text().splitlines(keepends=True)
    paths = []
    for name, rows in (("full", lines), ("head", lines[:701])):
        folder = tmp / name
        folder.mkdir()
        (folder / "house.csv").write_text("".join(rows))
        out = preprocess(folder / "house.csv", HOUSE_CONFIG)
        assert out.hdf5_path is not None
        paths.append(out.hdf5_path)
    import h5py

    with h5py.File(paths[0]) as f:
        assert f["Neighborhood"].attrs["layout"] == "csr"
    opened = open_source(paths[0])
    assert type(opened).__name__ == "HDF5Source"
    from datamill.preprocessing.hdf5 import HDF5Source

    return lambda: HDF5Source(paths[0], shard_size=400), lambda: HDF5Source(
        paths[1], shard_size=400
    )


def bert_parquet(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    from datamill.loader.sources import open_source
    from datamill.pretrain.bert import build_bert_samples

    raw = tmp / "raw.txt"
    raw.write_text(
        "".join((data / "wikitext2_test.raw").read_text().splitlines(keepends=True)[:300])
    )
    for name, seed in (("a", 0), ("b", 1)):
        build_bert_samples(
            raw,
            out=tmp / f"{name}.parquet",
            vocab_size=500,
            max_seq_length=32,
            dupe_factor=1,
            seed=seed,
            workers=1,
        )
    src = open_source(tmp / "a.parquet")
    assert type(src).__name__ == "BertParquetSource"
    return lambda: open_source(tmp / "a.parquet"), lambda: open_source(tmp / "b.parquet")


def word2vec(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    from datamill.pretrain.word2vec import SkipGramSamples, build_skipgram

    with zipfile.ZipFile(data / "ptb.zip") as z:
        lines = z.read("ptb/ptb.train.txt").decode().splitlines()[:400]
    sentences = [line.split() for line in lines]
    a = build_skipgram(sentences, min_freq=2, seed=0, progress=False)
    a.save(tmp / "a")
    b = build_skipgram(sentences, min_freq=2, seed=1, progress=False)
    return (
        lambda: SkipGramSamples.load(tmp / "a").source(shard_size=1000),
        lambda: b.source(shard_size=1000),
    )


def corpus(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    from datamill.text.corpus_build import build_corpus
    from datamill.text.source import CorpusSource

    lines = (data / "timemachine.txt").read_text().splitlines()
    build_corpus(lines[:1500], level="word", lowercase=True, out=tmp / "a")
    build_corpus(lines[1500:3000], level="word", lowercase=True, out=tmp / "b")
    return (
        lambda: CorpusSource(tmp / "a", num_steps=20, shard_size=200),
        lambda: CorpusSource(tmp / "b", num_steps=20, shard_size=200),
    )


def shardset(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    from datamill.shards import ShardsetDataset

    for name, bump in (("a", 0), ("b", 1)):
        t = _table(70, bump=bump)
        ds = ShardsetDataset.create(
            tmp / name, t.select(["id", "x", "ids"]), uid="id", shardset="main", shard_size=20
        )
        ds.add("extra", t.select(["id", "vec"]).slice(5), route=True)
    return lambda: ShardsetDataset(tmp / "a"), lambda: ShardsetDataset(tmp / "b")


def mix(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    from datamill.loader import Mix

    def make(bump: int) -> Opener:
        return lambda: Mix(
            [
                (TableSource(_table(40, bump=bump), shard_size=16), 0.75),
                (TableSource(_table(30, bump=bump + 7).select(["id", "x"]), shard_size=8), 0.25),
            ],
            epoch_size=48,
            names=["a", "b"],
        )

    return make(0), make(1)


def object_store(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    """RemoteParquetSource through its local shard cache (a local pyarrow filesystem stands in for
    S3)."""
    import pyarrow.fs as pafs

    from datamill.loader.remote import RemoteParquetSource

    for name, bump in (("a", 0), ("b", 1)):
        (tmp / name).mkdir()
        t = _table(50, bump=bump)
        for i in range(3):
            pq.write_table(t.slice(i * 20, 20), tmp / name / f"part-{i}.parquet")
    fs = pafs.SubTreeFileSystem(str(tmp), pafs.LocalFileSystem())
    return (
        lambda: RemoteParquetSource("s3://a", cache_dir=tmp / "cache", filesystem=fs),
        lambda: RemoteParquetSource("s3://b", cache_dir=tmp / "cache", filesystem=fs),
    )


def object_store_shardset(tmp: Path, data: Path) -> tuple[Opener, Opener]:
    """A shardset dataset read through the local shard cache (a local pyarrow filesystem stands in
    for S3)."""
    import pyarrow.fs as pafs

    from datamill.shards import ShardsetDataset

    shardset(tmp, data)
    fs = pafs.SubTreeFileSystem(str(tmp), pafs.LocalFileSystem())
    return (
        lambda: ShardsetDataset("s3://a", cache_dir=tmp / "cache", filesystem=fs),
        lambda: ShardsetDataset("s3://b", cache_dir=tmp / "cache", cache_limit=1, filesystem=fs),
    )


CASES: list[Case] = [
    table_case,
    parquet_file_row_groups,
    parquet_file_files,
    parquet_folder_row_groups,
    parquet_folder_files,
    hdf5_house_prices,
    bert_parquet,
    word2vec,
    corpus,
    shardset,
    mix,
    object_store,
    object_store_shardset,
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.__name__) for c in CASES])
def test_source_conformance(case: Case, tmp_path: Path, data_dir: Path) -> None:
    open_a, open_b = case(tmp_path, data_dir)
    source = open_a()
    assert isinstance(source, Source)
    check_source(source, reopen=open_a, different=open_b())


class _Broken(TableSource):
    """Breaks the contract: an out-of-range shard is an IndexError, an unknown column a KeyError."""

    def read_shard(self, index: int, *, columns: object = None) -> pa.Table:
        if not 0 <= index < self.num_shards:
            raise IndexError(index)
        if columns is not None and any(c not in self.columns for c in columns):  # type: ignore[attr-defined]
            raise KeyError(columns)
        return super().read_shard(index, columns=columns)  # type: ignore[arg-type]


class _Short(TableSource):
    def read_shard(self, index: int, *, columns: object = None) -> pa.Table:
        return super().read_shard(index, columns=columns).slice(1)  # type: ignore[arg-type]


def test_harness_catches_contract_breaks() -> None:
    with pytest.raises(IndexError):
        check_source(_Broken(_table(10), shard_size=4))
    with pytest.raises(AssertionError, match="rows"):
        check_source(_Short(_table(10), shard_size=4))
    with pytest.raises(AssertionError, match="same for different content"):
        check_source(TableSource(_table(10)), different=TableSource(_table(10)))
