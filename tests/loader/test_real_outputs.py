"""The Loader over other capabilities' real outputs: a cifar10_tiny shardset dataset (with a
PNG-decoding transform), a preprocessed HDF5 of house prices, an LM corpus."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.loader import Batching, Loader, Workers
from datamill.loader.sources import HDF5Source, open_source
from tests.contracts import check_resume


def decode_png(table: pa.Table) -> pa.Table:
    """Transform: PNG bytes -> a (32, 32, 3) uint8 image column (a per-sample PIL loop, as users
    write)."""
    from PIL import Image

    images = np.stack(
        [
            np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
            for b in table.column("png").to_pylist()
        ]
    )
    flat = pa.array(images.reshape(-1))
    for dim in reversed(images.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, dim)
    return table.drop_columns(["png"]).append_column("image", flat)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    from datamill import shards
    from datamill.core.io import read_table

    src = data_dir / "cifar10_tiny"
    labels = read_table(src / "labels.csv")
    paths = labels.column("image_path").to_pylist()
    images = pa.table(
        {
            "id": labels.column("id"),
            "png": pa.array([(src / p).read_bytes() for p in paths], pa.binary()),
        }
    )
    root = tmp_path_factory.mktemp("cifar") / "ds"
    ds = shards.ShardsetDataset.create(root, images, uid="id", shardset="image", shard_size=30)
    ds = ds.add("label", labels.select(["id", "label"]), route=True)
    keep = pa.array(np.flatnonzero(np.arange(100) % 5 != 4))
    ds.add(
        "caption",
        pa.table(
            {
                "id": labels.column("id"),
                "caption": [f"a {x}" for x in labels.column("label").to_pylist()],
            }
        ).take(keep),
        route=True,
    )
    return root


def test_iterate_cli_over_the_shardset_dataset(
    cifar_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datamill.cli import main

    assert (
        main(
            [
                "-q",
                "iterate",
                str(cifar_root),
                "--batch-size",
                "32",
                "--columns",
                "id,label",
                "--world-size",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ShardsetDataset: 100 samples in 4 shards" in out and "yielded 50" in out


def test_cifar10_tiny_shardset_two_ranks_with_transform(cifar_root: Path, data_dir: Path) -> None:
    from PIL import Image

    cifar_shards = open_source(cifar_root)

    assert cifar_shards.shard_sizes().tolist() == [30, 30, 30, 10]
    uids, captions = [], 0
    for rank in range(2):
        loader = Loader(
            cifar_shards,
            16,
            seed=5,
            rank=rank,
            world_size=2,
            batching=Batching(transform=decode_png),
            workers=Workers(threads=2),
        )
        for batch in loader:
            assert batch["image"].shape[1:] == (32, 32, 3) and batch["image"].dtype == np.uint8
            uids += batch["id"].tolist()
            captions += sum(c is not None for c in batch["caption"])
            first = (batch["id"][0], batch["image"][0])
        assert loader.stats()["yielded"] == 50
    all_ids = cifar_shards.uids.to_pylist()
    assert len(all_ids) == 100 and sorted(uids) == sorted(all_ids) and captions == 80
    want = np.asarray(
        Image.open(data_dir / "cifar10_tiny" / "images" / f"{first[0]}.png").convert("RGB")
    )
    np.testing.assert_array_equal(first[1], want)


def test_cifar10_tiny_shardset_resume(cifar_root: Path) -> None:
    cifar_shards = open_source(cifar_root)

    def make(state: dict[str, Any] | None) -> Loader:
        if state is None:
            return Loader(
                cifar_shards,
                8,
                seed=1,
                columns=["id", "label", "caption"],
                workers=Workers(threads=1),
            )
        return Loader.from_state(cifar_shards, state)

    check_resume(make, 7)


def test_preprocessed_hdf5_house_prices(data_copy: Any) -> None:
    import datamill.preprocessing.api as pre

    csv = data_copy("house_prices_train.csv")
    cfg = {
        "input_features": [
            {"name": "LotArea", "type": "number"},
            {"name": "Neighborhood", "type": "category"},
            {"name": "Street", "type": "category"},
        ],
        "output_features": [{"name": "SalePrice", "type": "number"}],
        "preprocessing": {"split": {"type": "random", "probabilities": [0.8, 0.1, 0.1]}},
    }
    out = pre.preprocess(csv, cfg)
    assert out.hdf5_path is not None
    src = open_source(out.hdf5_path)
    assert isinstance(src, HDF5Source) and {"LotArea", "Neighborhood", "SalePrice"} <= set(
        src.columns
    )
    import pyarrow.compute as pc

    train = Loader(src, 128, seed=0, batching=Batching(filter=lambda t: pc.equal(t["split"], 0)))
    rows = sum(len(b["LotArea"]) for b in train)
    s = train.stats()
    assert s["read"] == 1460 and rows == s["yielded"] == 1460 - s["filtered"] and 1000 < rows < 1300
    data, _ = pre.load(out.hdf5_path)
    batch = next(iter(Loader(src, 1460, batching=Batching(shuffle=False))))
    np.testing.assert_array_equal(batch["Neighborhood"], data["Neighborhood"])


def test_lm_corpus_source(data_dir: Path, tmp_path: Path) -> None:
    from datamill import text

    text.build_corpus(data_dir / "timemachine.txt", level="char", out=tmp_path / "corpus")
    src = open_source(tmp_path / "corpus")
    from datamill.loader.sources import CorpusSource

    assert isinstance(src, CorpusSource) and CorpusSource is text.CorpusSource
    n = int(src.shard_sizes().sum())
    batches = list(Loader(src, 32, seed=0))
    assert sum(len(b["x"]) for b in batches) == n and batches[0]["x"].shape == (32, 35)
    np.testing.assert_array_equal(batches[0]["x"][:, 1:], batches[0]["y"][:, :-1])
