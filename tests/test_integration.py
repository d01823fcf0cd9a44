"""Capabilities working together on real data: preprocess/BERT outputs -> shardsets -> loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from datamill.loader import Loader
from datamill.preprocessing.api import load, preprocess
from datamill.shards import ShardsetDataset
from datamill.shards.check import check_dataset
from datamill.shards.convert import from_bert_parquet, from_hdf5

CONFIG = {
    "input_features": [
        {"name": "MSZoning", "type": "category"},
        {"name": "LotArea", "type": "number", "preprocessing": {"normalization": "zscore"}},
    ],
    "output_features": [{"name": "CentralAir", "type": "binary"}],
}


def test_preprocessed_hdf5_becomes_a_shardset_dataset_and_loads(data_copy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    csv = data_copy("house_prices_train.csv")
    preprocess(csv, CONFIG)
    arrays, _ = load(csv.with_suffix(".hdf5"))
    ds = from_hdf5(csv.with_suffix(".hdf5"), tmp_path / "hp", shard_size=500)
    assert len(ds) == 1460 and check_dataset(tmp_path / "hp") == []
    again = ShardsetDataset(tmp_path / "hp")
    assert len(again) == 1460 and again.num_shards == 3
    row = again.get(7)
    assert row["MSZoning"] == arrays["MSZoning"][7] and row["CentralAir"] == arrays["CentralAir"][7]
    seen = []
    for batch in Loader(again, 256, seed=3, columns=["uid", "LotArea"]):
        seen.append(batch["uid"])
        np.testing.assert_allclose(batch["LotArea"], arrays["LotArea"][batch["uid"]])
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(1460))


def test_bert_parquet_becomes_a_shardset_dataset(data_dir: Path, tmp_path: Path) -> None:
    from datamill.pretrain.bert import build_bert_samples

    raw = tmp_path / "wiki.raw"
    raw.write_text(
        "\n".join((data_dir / "wikitext2_test.raw").read_text(encoding="utf-8").splitlines()[:300]),
        encoding="utf-8",
    )
    out = tmp_path / "bert.parquet"
    build_bert_samples(raw, out=out, vocab_size=400, max_seq_length=64, dupe_factor=1, seed=0)
    n = pq.read_metadata(out).num_rows
    ds = from_bert_parquet(out, tmp_path / "bds", shard_size=50)
    assert len(ds) == n
    first = pq.read_table(out).slice(0, 1).to_pylist()[0]
    assert ds.get(0)["tokens"] == first["tokens"]
    assert sum(len(b["tokens"]) for b in Loader(ds, 32, seed=0)) == n
