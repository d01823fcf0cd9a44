"""The Ray engine gives the local engine's output: metadata and every tensor, feature type by
feature type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import DataFileError, SchemaError
from datamill.preprocessing import pipeline
from datamill.preprocessing.api import load, preprocess
from datamill.preprocessing.features.base import CSR
from datamill.shards import ShardsetDataset

pytestmark = pytest.mark.ray

BLOCK = 64  # rows per block in these tests: several blocks, so the block-order merge is exercised


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", BLOCK)


def _header_free(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    out["datamill"] = {k: v for k, v in doc["datamill"].items() if k not in ("hdf5", "dataset")}
    return out


def assert_same(local: dict[str, Any], ray_data: dict[str, Any]) -> None:
    assert sorted(local) == sorted(ray_data)
    for key, want in local.items():
        got = ray_data[key]
        if isinstance(want, CSR):
            assert isinstance(got, CSR), key
            np.testing.assert_array_equal(got.indices, want.indices, err_msg=key)
            np.testing.assert_array_equal(got.offsets, want.offsets, err_msg=key)
            assert got.vocab_size == want.vocab_size
            if want.values is None:
                assert got.values is None
            else:
                np.testing.assert_array_equal(got.values, want.values, err_msg=key)
        else:
            assert got.dtype == want.dtype and got.shape == want.shape, key
            np.testing.assert_array_equal(got, want, err_msg=key)


def _mixed(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = np.array(["red", "green", "blue", "cyan", "x", "yy", "zzz", "Good", "film", "."])

    def text(k: int) -> list[str | None]:
        return [
            None if rng.random() < 0.05 else " ".join(rng.choice(words, rng.integers(0, 6)))
            for _ in range(k)
        ]

    num = rng.normal(3.0, 2.0, n)
    num[rng.random(n) < 0.1] = np.nan
    return pa.table(
        {
            "b": pa.array([None if rng.random() < 0.05 else bool(v) for v in rng.random(n) < 0.3]),
            "num": num,
            "num2": rng.integers(0, 1000, n).astype(float),
            "cat": pa.array(
                rng.choice(["a", "b", "c", "d", "e"], n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
            ),
            "tags": text(n),
            "words": text(n),
            "review": text(n),
            "series": [
                " ".join(str(x) for x in rng.integers(0, 9, rng.integers(1, 5))) for _ in range(n)
            ],
        }
    )


CONFIG: dict[str, Any] = {
    "input_features": [
        {"name": "b", "type": "binary"},
        {
            "name": "num",
            "type": "number",
            "preprocessing": {
                "normalization": "zscore",
                "missing_value_strategy": "fill_with_mean",
            },
        },
        {"name": "num2", "type": "number", "preprocessing": {"normalization": "minmax"}},
        {"name": "cat", "type": "category", "preprocessing": {"missing_value_strategy": "ffill"}},
        {"name": "tags", "type": "set", "preprocessing": {"missing_value_strategy": "bfill"}},
        {
            "name": "bag_tags",
            "column": "tags",
            "type": "bag",
            "preprocessing": {"max_dense_bytes": 0},
        },
        {"name": "words", "type": "sequence", "preprocessing": {"padding": "left"}},
        {"name": "review", "type": "text"},
        {"name": "series", "type": "timeseries"},
    ],
    "output_features": [{"name": "cat_out", "column": "cat", "type": "category"}],
    "preprocessing": {"split": {"type": "random", "probabilities": [0.7, 0.2, 0.1]}, "seed": 5},
}


def test_every_feature_type_with_a_split_equals_local(ray_cluster: Any, tmp_path: Path) -> None:
    pacsv.write_csv(_mixed(700), tmp_path / "d.csv")
    local = preprocess(tmp_path / "d.csv", CONFIG, output_dir=tmp_path / "local")
    out = preprocess(
        tmp_path / "d.csv",
        CONFIG,
        output_dir=tmp_path / "ray",
        engine="ray",
        engine_options={"fmt": "hdf5"},
    )
    assert _header_free(out.metadata.to_dict()) == _header_free(local.metadata.to_dict())
    assert out.metadata.header["fingerprint"] == local.metadata.header["fingerprint"]
    data, _ = load(out.hdf5_path)  # the assembled HDF5
    local_data, _ = load(local.hdf5_path)
    assert_same(local_data, data)
    ds = ShardsetDataset(tmp_path / "ray" / "d.shards")  # the shardset dataset
    assert ds.num_shards == 11 and len(ds) == 700
    assert ds.read_shard(1).column("uid").to_pylist() == list(range(64, 128))
    out.hdf5_path = None  # read the tensors back from the shards instead
    out._data = None
    assert_same(local_data, out.data)
    # nodes: both of the 2-node cluster ran tasks (prepare and transform)
    used = {n for pair in out.nodes for n in pair}  # type: ignore[attr-defined]
    assert len(used) == 2


def test_metadata_applied_to_new_data_and_parquet_folder(ray_cluster: Any, tmp_path: Path) -> None:
    pacsv.write_csv(_mixed(300), tmp_path / "train.csv")
    fitted = preprocess(tmp_path / "train.csv", CONFIG, output_dir=tmp_path / "local")
    new = _mixed(250, seed=3)
    parts = tmp_path / "new"
    parts.mkdir()
    for i, lo in enumerate(range(0, 250, 90)):  # a folder of Parquet files, read as one dataset
        pq.write_table(new.slice(lo, 90), parts / f"part-{i}.parquet")
    pq.write_table(new, tmp_path / "new.parquet")
    local = preprocess(
        tmp_path / "new.parquet", metadata=fitted.meta_path, output_dir=tmp_path / "local"
    )
    out = preprocess(
        parts,
        metadata=fitted.meta_path,
        output_dir=tmp_path / "ray",
        engine="ray",
        engine_options={"uid_column": "num2"} if False else None,
    )
    assert ShardsetDataset(tmp_path / "ray" / "new.shards").num_shards == 4
    assert "split" not in out.data and out.num_rows == 250
    assert_same(local.data, out.data)
    for name in ("cat", "tags", "words", "review"):
        assert out.metadata[name] == local.metadata[name]


def test_images_are_read_on_the_workers(ray_cluster: Any, data_dir: Path, tmp_path: Path) -> None:
    cfg = {
        "input_features": [
            {"name": "image_path", "type": "image", "preprocessing": {"num_channels": 1}}
        ],
        "output_features": [{"name": "label", "type": "category"}],
    }
    csv = data_dir / "cifar10_tiny" / "labels.csv"
    local = preprocess(csv, cfg, output_dir=tmp_path / "local")
    out = preprocess(
        csv, cfg, output_dir=tmp_path / "ray", engine="ray", engine_options={"uid_column": "id"}
    )
    assert _header_free(out.metadata.to_dict()) == _header_free(local.metadata.to_dict())
    assert_same(local.data, out.data)
    ds = ShardsetDataset(tmp_path / "ray" / "labels.shards")
    ids = pacsv.read_csv(csv)["id"].to_pylist()
    assert ds.uid_column == "id" and ds.uids.to_pylist() == ids
    np.testing.assert_array_equal(
        np.asarray(ds.get(ids[70])["image_path"], np.uint8).reshape(32, 32, 1),
        local.data["image_path"][70],
    )


def test_errors_are_located_as_locally(ray_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("x,c\n1,a\n2,b\n" + "3,c\n" * 100 + "oops,d\n")
    cfg = {"input_features": [{"name": "x", "type": "number"}, {"name": "c", "type": "category"}]}
    with pytest.raises(DataFileError) as info:
        preprocess(tmp_path / "bad.csv", cfg, output_dir=tmp_path / "o", engine="ray")
    with pytest.raises(DataFileError) as local:
        preprocess(tmp_path / "bad.csv", cfg, output_dir=tmp_path / "o")
    assert (
        (info.value.line, info.value.column) == (local.value.line, local.value.column) == (104, "x")
    )
    assert info.value.path == local.value.path
    with pytest.raises(SchemaError) as missing:
        preprocess(
            tmp_path / "bad.csv",
            {"input_features": [{"name": "nope", "type": "number"}]},
            output_dir=tmp_path / "o",
            engine="ray",
        )
    assert missing.value.column == "nope"
    assert not (tmp_path / "o" / "bad.meta.json").exists()


def test_jsonl_and_in_memory_inputs_equal_local(ray_cluster: Any, tmp_path: Path) -> None:
    cfg = {
        "input_features": [
            {"name": "cat", "type": "category"},
            {"name": "num2", "type": "number"},
            {"name": "words", "type": "sequence"},
        ],
        "preprocessing": {"split": {"type": "random"}, "seed": 1},
    }
    table = _mixed(200, seed=4).select(["cat", "num2", "words"])
    import json

    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    local = preprocess(tmp_path / "d.jsonl", cfg, output_dir=tmp_path / "local")
    out = preprocess(tmp_path / "d.jsonl", cfg, output_dir=tmp_path / "ray", engine="ray")
    assert _header_free(out.metadata.to_dict()) == _header_free(local.metadata.to_dict())
    assert_same(local.data, out.data)
    mem_local = preprocess(table, cfg)
    mem = preprocess(table, cfg, output_dir=tmp_path / "mem", engine="ray")
    assert mem.dataset_path == tmp_path / "mem" / "dataset.shards"  # type: ignore[attr-defined]
    assert_same(mem_local.data, mem.data)


def test_ludwig_defaults_date_and_vector_and_inference_without_outputs_equal_local(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """No split in the config (Ludwig's exact 0.7/0.1/0.2), stratified split, drop_row on a missing
    output, the date and vector types, and metadata applied to data without the output column."""
    rng = np.random.default_rng(11)
    n = 400
    target = rng.normal(size=n)
    target[rng.random(n) < 0.1] = np.nan  # outputs default to drop_row, as in Ludwig
    t = _mixed(n).append_column(
        "when", pa.array([f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(n)])
    )
    t = t.append_column(
        "emb", pa.array([" ".join(f"{v:.3f}" for v in rng.normal(size=3)) for _ in range(n)])
    )
    t = t.append_column("y", pa.array(target))
    pacsv.write_csv(t, tmp_path / "d.csv")
    cfg: dict[str, Any] = {
        "input_features": [
            {"name": "num2", "type": "number"},
            {"name": "cat", "type": "category"},
            {"name": "when", "type": "date"},
            {"name": "emb", "type": "vector", "preprocessing": {"vector_size": 3}},
        ],
        "output_features": [{"name": "y", "type": "number"}],
    }
    for split in (None, {"type": "stratify", "column": "cat", "probabilities": [0.6, 0.2, 0.2]}):
        c = dict(cfg, preprocessing={"split": split}) if split else cfg
        local = preprocess(tmp_path / "d.csv", c, output_dir=tmp_path / f"local{bool(split)}")
        out = preprocess(
            tmp_path / "d.csv", c, output_dir=tmp_path / f"ray{bool(split)}", engine="ray"
        )
        assert _header_free(out.metadata.to_dict()) == _header_free(local.metadata.to_dict())
        assert_same(local.data, out.data)
        assert out.num_rows == int(np.isfinite(target).sum())  # rows with a missing output dropped
    pacsv.write_csv(
        t.drop_columns(["y"]).slice(0, 120), tmp_path / "new.csv"
    )  # inference data: no target
    fitted = tmp_path / "localFalse" / "d.meta.json"
    local = preprocess(tmp_path / "new.csv", metadata=fitted, output_dir=tmp_path / "local_new")
    out = preprocess(
        tmp_path / "new.csv", metadata=fitted, output_dir=tmp_path / "ray_new", engine="ray"
    )
    assert "y" not in out.data and out.num_rows == 120
    assert_same(local.data, out.data)
