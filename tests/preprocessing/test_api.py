"""End to end: real files, every feature type, HDF5 layout, split without leakage, unseen data,
load, CLI, demo."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import datamill
from datamill.cli import main
from datamill.core.errors import CacheError
from datamill.preprocessing import api
from datamill.preprocessing.demo import HOUSE_CONFIG, IMAGE_CONFIG
from datamill.preprocessing.demo import run as run_demo
from datamill.preprocessing.features import handler_class
from datamill.preprocessing.features.base import CSR


def test_house_prices_end_to_end(data_copy) -> None:  # type: ignore[no-untyped-def]
    house = data_copy("house_prices_train.csv")
    out = api.preprocess(house, HOUSE_CONFIG)
    assert out.hdf5_path == house.with_suffix(".hdf5")
    assert out.meta_path == house.parent / "house_prices_train.meta.json"
    with h5py.File(out.hdf5_path) as f:
        assert sorted(f) == [
            "Alley",
            "CentralAir",
            "LotArea",
            "LotFrontage",
            "MSSubClass",
            "MSZoning",
            "SalePrice",
            "split",
        ]
        assert (
            f["LotArea"].dtype == np.float32 and f["MSZoning"].dtype == np.int8
        )  # Ludwig int_type: 6 values
        assert f["split"].dtype == np.int8 and f["LotArea"].chunks is not None
        assert f["CentralAir"].shape == (1460,)
    meta = json.loads(out.meta_path.read_text())  # type: ignore[union-attr]
    zoning = meta["MSZoning"]
    assert zoning["idx2str"][0] == "<UNK>" and zoning["vocab_size"] == len(zoning["idx2str"])
    assert set(zoning) >= {"idx2str", "str2idx", "str2freq", "vocab_size", "preprocessing"}
    assert meta["LotFrontage"]["preprocessing"]["missing_value_strategy"] == "fill_with_mean"
    # the integer category MSSubClass keeps its raw strings
    assert "60" in meta["MSSubClass"]["str2idx"] and "60.0" not in meta["MSSubClass"]["str2idx"]
    data, m = api.load(out.hdf5_path)  # type: ignore[arg-type]
    raw = pd.read_csv(house, keep_default_na=False)
    assert (m.decode("CentralAir", data["CentralAir"]) == raw["CentralAir"].to_numpy()).all()
    assert (m.decode("MSZoning", data["MSZoning"]) == raw["MSZoning"].to_numpy()).all()
    alley = m.decode("Alley", data["Alley"])
    assert (
        set(alley) == {"<UNK>", "Grvl", "Pave"}
        and (alley == "<UNK>").sum() == (raw["Alley"] == "NA").sum()
    )
    np.testing.assert_allclose(data["SalePrice"], np.log1p(raw["SalePrice"].to_numpy()), rtol=1e-6)
    # the loader reads it through the Source protocol
    from datamill.sources import HDF5Source

    src = HDF5Source(out.hdf5_path)
    assert src.shard_sizes().sum() == 1460
    shard = src.read_shard(0, columns=["CentralAir", "MSZoning"])
    assert shard.column("MSZoning").to_numpy().tolist()[:100] == data["MSZoning"][:100].tolist()


def test_split_fits_on_train_rows_only() -> None:
    t = pa.table(
        {
            "c": ["a", "a", "b", "zz", "zz", "zz"],
            "x": [1.0, 3.0, None, 100.0, 200.0, None],
            "s": ["train", "train", "train", "validation", "test", "test"],
        }
    )
    cfg = {
        "input_features": [
            {"name": "c", "type": "category"},
            {
                "name": "x",
                "type": "number",
                "preprocessing": {
                    "normalization": "zscore",
                    "missing_value_strategy": "fill_with_mean",
                },
            },
        ],
        "preprocessing": {"split": {"type": "fixed", "column": "s"}},
    }
    out = api.preprocess(t, cfg)
    assert out.data["split"].tolist() == [0, 0, 0, 1, 2, 2]
    assert out.metadata["c"]["idx2str"] == ["<UNK>", "a", "b"]  # "zz" only in validation/test
    assert out.data["c"].tolist() == [1, 1, 2, 0, 0, 0]
    x = out.metadata["x"]
    assert x["preprocessing"]["computed_fill_value"] == 2.0 and x["mean"] == 2.0 and x["count"] == 3


def test_random_split_is_seeded_and_proportional() -> None:
    t = pa.table({"x": np.arange(20000, dtype=np.float64)})
    cfg = {
        "input_features": [{"name": "x", "type": "number"}],
        "preprocessing": {"split": {"probabilities": [0.6, 0.2, 0.2]}, "seed": 7},
    }
    a, b = api.preprocess(t, cfg).data["split"], api.preprocess(t, cfg).data["split"]
    assert (a == b).all()
    assert np.bincount(a).tolist() == [12000, 4000, 4000]  # exact sizes, as Ludwig's
    other = api.preprocess(
        t, {**cfg, "preprocessing": {"split": {"probabilities": [0.6, 0.2, 0.2]}, "seed": 8}}
    )
    assert (other.data["split"] != a).any()


def test_unseen_data_with_metadata_nothing_refitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = tmp_path / "train.csv"
    train.write_text("c,x,b\nred,1,Y\nblue,3,N\nred,,Y\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "input_features:\n  - {name: c, type: category}\n"
        "  - {name: x, type: number, preprocessing: {normalization: minmax, "
        "missing_value_strategy: fill_with_mean}}\n  - {name: b, type: binary}\n"
    )
    assert main(["-q", "preprocess", str(train), "--config", str(cfg)]) == 0
    new = tmp_path / "new.csv"
    new.write_text("c,x,b\ngreen,,N\nblue,5,\n")
    for t in ("category", "number", "binary"):
        monkeypatch.setattr(handler_class(t), "fit", lambda *a, **k: pytest.fail("refitted"))
    assert (
        main(["-q", "preprocess", str(new), "--metadata", str(tmp_path / "train.meta.json")]) == 0
    )
    data, meta = api.load(tmp_path / "new.hdf5")
    assert data["c"].tolist() == [0, 2]  # green unknown -> <UNK>; blue keeps its id
    assert data["x"].tolist() == [0.5, 2.0]  # fill 2 (train mean), minmax from train (1..3)
    assert data["b"].tolist() == [False, False]
    assert meta["c"]["idx2str"] == ["<UNK>", "red", "blue"]


def test_every_feature_type_end_to_end(tmp_path: Path, data_copy) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "all.csv"
    p.write_text(
        "n,c,b,s,g,q,t,ts\n"
        "1.5,x,yes,a b,a a b,x y z,Hello world,1 2 3\n"
        "2.5,y,no,b c,c,y,the cat,4 5\n"
        ",x,,,,,,\n"
    )
    cfg = {
        "input_features": [
            {"name": "n", "type": "number"},
            {"name": "c", "type": "category"},
            {"name": "b", "type": "binary"},
            {"name": "s", "type": "set"},
            {"name": "g", "type": "bag"},
            {"name": "q", "type": "sequence"},
            {"name": "t", "type": "text"},
            {"name": "ts", "type": "timeseries"},
        ],
        "preprocessing": {"split": {"type": "none"}},
    }
    out = api.preprocess(p, cfg)
    data, meta = api.load(out.hdf5_path)  # type: ignore[arg-type]
    assert sorted(data) == ["b", "c", "g", "n", "q", "s", "t_char", "t_word", "ts"]
    assert all(len(v) == 3 for v in data.values())
    assert (
        data["s"].dtype == np.int8
        and data["g"].dtype == np.float32
        and data["ts"].dtype == np.float32
    )
    assert meta.decode("q", data["q"][0]).tolist() == ["x", "y", "z"]
    assert meta.decode("t_word", data["t_word"][1]).tolist()[:2] == ["the", "cat"]
    assert data["t_word"][2].tolist() == [0] * data["t_word"].shape[1]  # missing text -> empty row
    s_vocab = meta.vocab("s")
    assert (
        data["s"][0, s_vocab["a"]] == 1
        and data["s"][0, s_vocab["b"]] == 1
        and data["s"][0].sum() == 2
    )
    # images: paths relative to the CSV, category label
    labels = data_copy("cifar10_tiny") / "labels.csv"
    img = api.preprocess(labels, IMAGE_CONFIG)
    assert (
        img.data["image_path"].shape == (100, 32, 32, 3)
        and img.data["image_path"].dtype == np.uint8
    )
    assert img.metadata["label"]["vocab_size"] == 11


def test_sparse_set_layout_in_hdf5(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text("s\n" + "\n".join(f"t{i} t{i + 1}" for i in range(50)) + "\n")
    cfg = {
        "input_features": [{"name": "s", "type": "set", "preprocessing": {"max_dense_bytes": 0}}],
        "preprocessing": {"split": {"type": "none"}},
    }
    out = api.preprocess(p, cfg)
    with h5py.File(out.hdf5_path) as f:  # type: ignore[arg-type]
        assert f["s"].attrs["layout"] == "csr" and f["s"].attrs["vocab_size"] == 53
        assert f["s"]["offsets"].shape == (51,)
    data, meta = api.load(out.hdf5_path)  # type: ignore[arg-type]
    csr = data["s"]
    assert isinstance(csr, CSR) and len(csr) == 50
    row = csr.indices[csr.offsets[7] : csr.offsets[8]]
    assert sorted(meta.decode("s", row).tolist()) == ["t7", "t8"]
    from datamill.sources import HDF5Source

    shard = HDF5Source(out.hdf5_path).read_shard(0)  # type: ignore[arg-type]
    assert shard.num_rows == 50 and shard.column("s")[7].as_py() is not None


def test_load_rejects_mismatched_pair(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("c\nx\n")
    b.write_text("c\ny\n")
    cfg = {"input_features": [{"name": "c", "type": "category"}]}
    api.preprocess(a, cfg)
    api.preprocess(b, cfg)
    (tmp_path / "a.meta.json").write_bytes((tmp_path / "b.meta.json").read_bytes())
    with pytest.raises(CacheError) as info:
        api.load(tmp_path / "a.hdf5")
    assert info.value.path == str(tmp_path / "a.meta.json")


def test_top_level_verb_with_dataframe_and_output_dir(tmp_path: Path) -> None:
    df = pd.DataFrame({"c": ["a", "b", "a"], "x": [1, 2, 3]})
    cfg = {
        "input_features": [
            {"name": "c", "type": "category"},
            {"name": "x", "type": "number", "preprocessing": {"normalization": "none"}},
        ],
        "preprocessing": {"split": {"type": "none"}},
    }
    mem = datamill.preprocess(df, cfg)
    assert mem.hdf5_path is None and mem.data["c"].tolist() == [1, 2, 1]
    saved = datamill.preprocess(df, cfg, output_dir=tmp_path)
    assert saved.hdf5_path == tmp_path / "dataset.hdf5"
    assert datamill.preprocess(df, cfg, output_dir=tmp_path).cached
    data, meta = datamill.load(saved.hdf5_path)
    assert data["x"].tolist() == [1.0, 2.0, 3.0] and meta.features == ["c", "x"]


def test_cli_summary_and_output_dir(
    tmp_path: Path, data_copy, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    house = data_copy("house_prices_train.csv")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(HOUSE_CONFIG))
    assert (
        main(
            [
                "-q",
                "preprocess",
                str(house),
                "--config",
                str(cfg),
                "--output-dir",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "1,460 rows, 7 features, fitted" in text and "MSZoning" in text and "int8" in text
    assert (tmp_path / "o" / "house_prices_train.hdf5").exists()
    assert (
        main(
            [
                "-q",
                "preprocess",
                str(house),
                "--config",
                str(cfg),
                "--output-dir",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    assert "reused cache" in capsys.readouterr().out
    assert main(["-q", "preprocess", str(house), "--config", str(cfg), "--skip-save"]) == 0
    assert not (house.parent / "house_prices_train.hdf5").exists()


def test_demo_section(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(data_dir, tmp_path)
    text = capsys.readouterr().out
    assert "house_prices_train.csv: 1,460 rows" in text and "cache reused=True" in text
    assert "image_path" in text and "100x32x32x3" in text and len(text.splitlines()) <= 25
