"""Ludwig's defaults and behaviour: a Ludwig user's config gives Ludwig's results (issue 19)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.loader import Batching
from datamill.preprocessing import api, pipeline
from datamill.preprocessing.config import SplitConfig
from datamill.preprocessing.split import assign_split, divisions, fit_split, hash_uniform


def test_output_features_drop_rows_without_a_target_inputs_are_filled() -> None:
    t = pa.table(
        {"x": [1.0, None, 3.0, 4.0], "y": [10.0, 20.0, None, 40.0], "c": ["a", "b", "a", None]}
    )
    cfg = {
        "input_features": [{"name": "x", "type": "number"}],
        "output_features": [{"name": "y", "type": "number"}, {"name": "c", "type": "category"}],
        "preprocessing": {"split": {"type": "none"}},
    }
    out = api.preprocess(t, cfg)
    assert out.num_rows == 2  # rows 2 (no y) and 3 (no c) dropped, row 1's missing x filled
    assert out.data["y"].tolist() == [10.0, 20.0]  # outputs: no normalization by default
    assert out.metadata["y"]["preprocessing"]["missing_value_strategy"] == "drop_row"
    assert out.metadata["x"]["normalization"] == "zscore"  # number inputs: zscore by default
    x = np.array([1.0, 0.0])  # the kept rows' x (row 1 filled with 0.0)
    np.testing.assert_allclose(out.data["x"], (x - x.mean()) / x.std(ddof=1), rtol=1e-6)
    explicit = api.preprocess(
        t,
        {
            **cfg,
            "input_features": [
                {"name": "x", "type": "number", "preprocessing": {"normalization": None}}
            ],
        },
    )
    assert explicit.data["x"].tolist() == [1.0, 0.0]  # `none` stays available


def test_applying_metadata_needs_only_the_input_columns(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text("c,x,price\nred,1,10\nblue,3,20\nred,2,30\n")
    cfg = {
        "input_features": [{"name": "c", "type": "category"}, {"name": "x", "type": "number"}],
        "output_features": [{"name": "price", "type": "number"}],
        "preprocessing": {"split": {"type": "none"}},
    }
    fitted = api.preprocess(train, cfg)
    new = tmp_path / "new.csv"
    new.write_text("c,x\nblue,2\ngreen,\n")  # inference data: no target column
    out = api.preprocess(new, metadata=fitted.meta_path)
    assert sorted(out.data) == ["c", "x"] and out.metadata.features == ["c", "x"]
    assert out.data["c"].tolist() == [2, 0] and out.data["x"][0] == pytest.approx(0.0)
    with pytest.raises(Exception) as info:  # an input column is still required
        (tmp_path / "bad.csv").write_text("c\nred\n")
        api.preprocess(tmp_path / "bad.csv", metadata=fitted.meta_path)
    assert getattr(info.value, "column", None) == "x"


def test_category_values_are_whitespace_stripped_and_pandas_missing_spellings(
    tmp_path: Path,
) -> None:
    p = tmp_path / "d.csv"
    p.write_text("c,n\nNAmes, 1\n NAmes ,2\nNAmes ,n/a\n<NA>,-nan\nNULL,NULL\nOld,#N/A N/A\n")
    out = api.preprocess(
        p,
        {
            "input_features": [
                {"name": "c", "type": "category"},
                {
                    "name": "n",
                    "type": "number",
                    "preprocessing": {"normalization": None, "fill_value": -1},
                },
            ],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    assert out.metadata["c"]["idx2str"] == ["<UNK>", "NAmes", "Old"]
    assert out.data["c"].tolist() == [1, 1, 1, 0, 0, 2]  # <NA> and NULL are missing -> <UNK>
    assert out.data["n"].tolist() == [1.0, 2.0, -1.0, -1.0, -1.0, -1.0]


def test_fixed_split_column_defaults_to_split() -> None:
    t = pa.table({"x": [1.0, 2.0, 3.0], "split": ["0", "1", "2"]})
    out = api.preprocess(
        t,
        {
            "input_features": [{"name": "x", "type": "number"}],
            "preprocessing": {"split": {"type": "fixed"}},
        },
    )
    assert out.data["split"].tolist() == [0, 1, 2]


def test_no_split_in_the_config_is_ludwigs_random_split_with_exact_sizes() -> None:
    t = pa.table({"x": np.arange(1460, dtype=np.float64)})
    out = api.preprocess(t, {"input_features": [{"name": "x", "type": "number"}]})
    assert np.bincount(out.data["split"]).tolist() == [
        1022,
        146,
        292,
    ]  # Ludwig's sizes on house prices
    assert out.metadata.header["split"] == {"train": 1022, "validation": 146, "test": 292}
    assert out.metadata["x"]["count"] == 1022  # statistics fitted on the training rows only
    none = api.preprocess(
        t,
        {
            "input_features": [{"name": "x", "type": "number"}],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    assert "split" not in none.data and none.metadata["x"]["count"] == 1460


@pytest.mark.parametrize(
    ("n", "probs", "expect"),
    [
        (1460, (0.7, 0.1, 0.2), (1022, 146, 292)),
        (10, (0.7, 0.1, 0.2), (4, 3, 3)),
        (100, (0.8, 0.2, 0.0), (80, 20, 0)),
        (5, (1.0, 0.0, 0.0), (5, 0, 0)),
    ],
)
def test_split_sizes_follow_ludwig_minimum_rows(
    n: int, probs: tuple[float, float, float], expect: tuple[int, int, int]
) -> None:
    d1, d2 = divisions(n, probs)
    assert (d1, d2 - d1, n - d2) == expect


@given(n=st.integers(1, 400), seed=st.integers(0, 2**32), cut=st.integers(0, 400))
def test_exact_random_split_is_block_decomposable(n: int, seed: int, cut: int) -> None:
    cfg = SplitConfig()
    state = fit_split(cfg, seed=seed, num_rows=n)
    whole = assign_split(cfg, state, seed=seed, lo=0, hi=n)
    cut = min(cut, n)
    parts = np.concatenate(
        [
            assign_split(cfg, state, seed=seed, lo=0, hi=cut),
            assign_split(cfg, state, seed=seed, lo=cut, hi=n),
        ]
    )
    np.testing.assert_array_equal(parts, whole)
    d1, d2 = divisions(n, cfg.probabilities)
    assert np.bincount(whole, minlength=3).tolist() == [d1, d2 - d1, n - d2]


def test_stratify_split_has_exact_sizes_within_each_class_over_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    label = ["a"] * 700 + ["b"] * 300
    t = pa.table({"x": np.arange(1000, dtype=np.float64), "label": label})
    cfg = {
        "input_features": [{"name": "x", "type": "number"}],
        "output_features": [{"name": "label", "type": "category"}],
        "preprocessing": {"split": {"type": "stratify", "column": "label"}},
    }
    one = api.preprocess(t, cfg).data["split"]
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 64)
    many = api.preprocess(t, cfg).data["split"]
    np.testing.assert_array_equal(one, many)
    # Ludwig's sizes (scikit-learn's rule, 1 - 0.7 = 0.30000000000000004: ceil gives 301 rows beside
    # train)
    assert np.bincount(one[:700]).tolist() == [489, 70, 141] and np.bincount(
        one[700:]
    ).tolist() == [210, 30, 60]


def test_hash_split_is_stable_as_the_data_grows() -> None:
    ids = [f"user{i}" for i in range(3000)]
    cfg = {
        "input_features": [{"name": "x", "type": "number"}],
        "preprocessing": {"split": {"type": "hash", "column": "id"}},
    }
    small = api.preprocess(pa.table({"x": np.zeros(1000), "id": ids[:1000]}), cfg).data["split"]
    big = api.preprocess(pa.table({"x": np.zeros(3000), "id": ids[::-1]}), cfg).data["split"]
    np.testing.assert_array_equal(
        big[::-1][:1000], small
    )  # same key, same split, wherever the row is
    np.testing.assert_allclose(np.bincount(big) / 3000, [0.7, 0.1, 0.2], atol=0.03)
    assert hash_uniform(pa.array(["user7"]))[0] == hash_uniform(pa.array(["x", "user7"]))[1]


def test_datetime_split_puts_the_earliest_rows_in_train(monkeypatch: pytest.MonkeyPatch) -> None:
    days = [f"2021-01-{d:02d}" for d in (5, 1, 9, 3, 7, 2, 10, 4, 8, 6)] * 3
    t = pa.table({"x": np.zeros(30), "when": days})
    cfg = {
        "input_features": [{"name": "x", "type": "number"}],
        "preprocessing": {"split": {"type": "datetime", "column": "when"}},
    }
    split = api.preprocess(t, cfg).data["split"]
    assert np.bincount(split).tolist() == [21, 3, 6]
    day = np.array([int(d[-2:]) for d in days])
    assert (
        day[split == 0].max()
        <= day[split == 1].min()
        <= day[split == 1].max()
        <= day[split == 2].min()
    )
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 4)
    np.testing.assert_array_equal(api.preprocess(t, cfg).data["split"], split)
    dotted = [f"{d:02d}.01.2021" for d in (5, 1, 9, 3, 7, 2, 10, 4, 8, 6)]
    other = api.preprocess(
        pa.table({"x": np.zeros(10), "when": dotted}),
        {
            **cfg,
            "preprocessing": {
                "split": {"type": "datetime", "column": "when", "datetime_format": "%d.%m.%Y"}
            },
        },
    )
    assert other.data["split"].tolist() == [
        1,
        0,
        2,
        0,
        1,
        0,
        2,
        0,
        2,
        1,
    ]  # sizes 4/3/3 (Ludwig's minimum rows)


LUDWIG_MODEL_CONFIG = """
model_type: ecd
input_features:
  - name: x
    type: number
    encoder: {type: dense, output_size: 32}
    tied: null
  - name: c
    type: category
    encoder: {type: dense}
output_features:
  - name: y
    type: binary
    decoder: {type: regressor}
    loss: {type: binary_weighted_cross_entropy}
    threshold: 0.5
combiner: {type: concat, num_fc_layers: 2}
trainer: {epochs: 3, learning_rate: 0.001}
defaults:
  category: {encoder: {type: sparse}, preprocessing: {most_common: 5}}
hyperopt: {goal: minimize}
backend: {type: local}
preprocessing: {split: {type: none}}
"""


def test_a_full_ludwig_model_config_is_accepted_with_one_notice(tmp_path: Path) -> None:
    from datamill.preprocessing.config import LudwigKeysIgnored, load_config

    (tmp_path / "model.yaml").write_text(LUDWIG_MODEL_CONFIG)
    with pytest.warns(LudwigKeysIgnored) as record:
        cfg, _ = load_config(tmp_path / "model.yaml")
    assert len(record) == 1
    message = str(record[0].message)
    assert "ignored 12 Ludwig model key(s)" in message and "trainer" in message
    assert record[0].filename == str(tmp_path / "model.yaml")  # located at the config file
    assert cfg.defaults["category"].preprocessing == {"most_common": 5}
    t = pa.table({"x": [1.0, 2.0], "c": ["a", "b"], "y": ["yes", "no"]})
    with pytest.warns(LudwigKeysIgnored):
        out = api.preprocess(t, tmp_path / "model.yaml")
    assert out.data["y"].tolist() == [True, False]


def test_typos_in_preprocessing_keys_still_fail(tmp_path: Path) -> None:
    from datamill.core.errors import ConfigError
    from datamill.preprocessing.config import load_config

    bad = LUDWIG_MODEL_CONFIG.replace("most_common: 5", "most_comon: 5")
    with pytest.warns(Warning), pytest.raises(ConfigError, match="most_comon"):
        api.preprocess(pa.table({"x": [1.0], "c": ["a"], "y": ["no"]}), load_config_dict(bad))
    with pytest.raises(ConfigError, match="encodr"):
        load_config({"input_features": [{"name": "x", "type": "number", "encodr": {}}]})
    with pytest.raises(ConfigError, match="trainr"):
        load_config({"input_features": [{"name": "x", "type": "number"}], "trainr": {}})


def load_config_dict(text: str) -> dict:  # type: ignore[type-arg]
    import yaml

    data: dict = yaml.safe_load(text)  # type: ignore[type-arg]
    return data


def test_hdf5_source_reads_one_split_in_full_batches(tmp_path: Path) -> None:
    from datamill.core.errors import ConfigError, DataFileError
    from datamill.loader.loader import Loader
    from datamill.sources import HDF5Source

    n = 1000
    t = pa.table(
        {
            "x": np.arange(n, dtype=np.float64),
            "s": [f"t{i % 7} t{i % 5}" for i in range(n)],
            "c": [f"c{i % 3}" for i in range(n)],
        }
    )
    cfg = {
        "input_features": [
            {"name": "x", "type": "number", "preprocessing": {"normalization": None}},
            {"name": "s", "type": "set", "preprocessing": {"max_dense_bytes": 0}},
            {"name": "c", "type": "category"},
        ]
    }
    out = api.preprocess(t, cfg, output_dir=tmp_path)
    split = out.data["split"]
    for name, k in (("train", 0), ("validation", 1), ("test", 2)):
        src = HDF5Source(out.hdf5_path, split=name, shard_size=64)  # type: ignore[arg-type]
        assert src.num_rows == int((split == k).sum()) and "split" not in src.columns
        x = np.concatenate(
            [src.read_shard(i).column("x").to_numpy() for i in range(src.num_shards)]
        )
        np.testing.assert_array_equal(x, np.flatnonzero(split == k))
        sets = src.read_shard(1).column("s").to_pylist()
        rows = np.flatnonzero(split == k)[64:128]
        full = HDF5Source(out.hdf5_path).read_shard(0, columns=["s"]).column("s").to_pylist()
        assert sets == [full[r] for r in rows]
    batches = [
        len(b["x"])
        for b in Loader(
            HDF5Source(out.hdf5_path, split="train"),
            128,
            seed=1,
            batching=Batching(shuffle=True, drop_last=True),
        )
    ]
    assert batches == [128] * (700 // 128)  # full batches of one split, not a ragged filter
    with pytest.raises(ConfigError):
        HDF5Source(out.hdf5_path, split="holdout")  # type: ignore[arg-type]
    none = api.preprocess(
        t, {**cfg, "preprocessing": {"split": {"type": "none"}}}, output_dir=tmp_path / "n"
    )
    with pytest.raises(DataFileError):
        HDF5Source(none.hdf5_path, split="train")  # type: ignore[arg-type]


@pytest.mark.torch
def test_torch_collate_gives_int64_ids(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from datamill.loader.loader import Loader
    from datamill.sources import HDF5Source

    t = pa.table({"c": ["a", "b", "a", "c"] * 10, "x": np.arange(40, dtype=np.float64)})
    out = api.preprocess(
        t,
        {"input_features": [{"name": "c", "type": "category"}, {"name": "x", "type": "number"}]},
        output_dir=tmp_path,
    )
    batch = next(iter(Loader(HDF5Source(out.hdf5_path, split="train"), 8, collate="torch")))  # type: ignore[arg-type]
    assert batch["c"].dtype == torch.int64 and batch["x"].dtype == torch.float32
    torch.nn.Embedding(4, 2)(batch["c"])  # goes straight in


def test_cli_iterate_one_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datamill.cli import main

    t = pa.table({"x": np.arange(100, dtype=np.float64)})
    out = api.preprocess(
        t, {"input_features": [{"name": "x", "type": "number"}]}, output_dir=tmp_path
    )
    assert main(["-q", "iterate", str(out.hdf5_path), "--split", "test", "--batch-size", "10"]) == 0
    assert "20 samples" in capsys.readouterr().out


def test_date_feature_is_ludwigs_component_vector() -> None:
    t = pa.table(
        {
            "d": ["2021-03-04 05:06:07", "2020-12-31", "04/03/2021", None],
            "e": ["04.03.2021", "31.12.2020", "01.01.2000", "29.02.2024"],
        }
    )
    out = api.preprocess(
        t,
        {
            "input_features": [
                {"name": "d", "type": "date"},
                {"name": "e", "type": "date", "preprocessing": {"datetime_format": "%d.%m.%Y"}},
            ],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    d = out.data["d"]
    assert d.dtype == np.int32 and d.shape == (4, 9)
    assert d[0].tolist() == [
        2021,
        3,
        4,
        3,
        63,
        5,
        6,
        7,
        5 * 3600 + 6 * 60 + 7,
    ]  # Thursday = 3, day 63
    assert d[1].tolist() == [2020, 12, 31, 3, 366, 0, 0, 0, 0]
    assert d[2].tolist()[:3] == [2021, 4, 3]  # pandas' month-first reading of a non-ISO value
    assert d[3].tolist() == [0] * 9  # missing, fill_value "" -> zeros (Ludwig: the current time)
    assert out.data["e"][3].tolist()[:5] == [2024, 2, 29, 3, 60]


def test_date_that_does_not_parse_is_a_located_error(tmp_path: Path) -> None:
    from datamill.core.errors import DataFileError

    p = tmp_path / "d.csv"
    p.write_text("d\n2021-01-01\nnot a date\n")
    with pytest.raises(DataFileError) as info:
        api.preprocess(
            p,
            {
                "input_features": [{"name": "d", "type": "date"}],
                "preprocessing": {"split": {"type": "none"}},
            },
        )
    assert info.value.line == 3 and info.value.column == "d"


def test_vector_feature_fixed_size_floats(tmp_path: Path) -> None:
    from datamill.core.errors import DataFileError

    t = pa.table({"v": ["1 2 3", " 0.5  -1 1e3 ", None, "4 5 6"]})
    out = api.preprocess(
        t,
        {
            "input_features": [{"name": "v", "type": "vector"}],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    assert out.data["v"].dtype == np.float32 and out.metadata["v"]["vector_size"] == 3
    assert out.data["v"].tolist() == [[1, 2, 3], [0.5, -1, 1000], [0, 0, 0], [4, 5, 6]]
    p = tmp_path / "v.csv"
    p.write_text("v\n1 2\n3 4 5\n")
    with pytest.raises(DataFileError) as info:
        api.preprocess(
            p,
            {
                "input_features": [
                    {"name": "v", "type": "vector", "preprocessing": {"vector_size": 2}}
                ],
                "preprocessing": {"split": {"type": "none"}},
            },
        )
    assert info.value.column == "v"
    with pytest.raises(DataFileError) as info:
        api.preprocess(
            pa.table({"v": ["1 x"]}),
            {
                "input_features": [{"name": "v", "type": "vector"}],
                "preprocessing": {"split": {"type": "none"}},
            },
        )
    assert info.value.row == 0


def test_outlier_strategy_replaces_values_beyond_the_threshold() -> None:
    x = [10.0] * 20 + [11.0] * 20 + [1000.0]
    t = pa.table({"x": x})
    base = {"normalization": None, "outlier_threshold": 3.0}
    out = api.preprocess(
        t,
        {
            "input_features": [
                {
                    "name": "x",
                    "type": "number",
                    "preprocessing": {**base, "outlier_strategy": "fill_with_mean"},
                }
            ],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    mean = float(np.mean(x))
    assert out.metadata["x"]["computed_outlier_fill_value"] == pytest.approx(mean)
    assert (
        out.data["x"][-1] == pytest.approx(mean, rel=1e-6) and out.data["x"][:40].tolist() == x[:40]
    )
    const = api.preprocess(
        t,
        {
            "input_features": [
                {
                    "name": "x",
                    "type": "number",
                    "preprocessing": {
                        **base,
                        "outlier_strategy": "fill_with_const",
                        "fill_value": -1,
                    },
                }
            ],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    assert const.data["x"][-1] == -1.0
    plain = api.preprocess(
        t,
        {
            "input_features": [
                {"name": "x", "type": "number", "preprocessing": {"normalization": None}}
            ],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    assert (
        plain.data["x"][-1] == 1000.0 and "computed_outlier_fill_value" not in plain.metadata["x"]
    )


def test_binary_fill_with_true_and_minus_one_is_false() -> None:
    t = pa.table({"b": ["1", "-1", None, "-1"]})  # (a third value "-1.0": refused, as Ludwig)
    out = api.preprocess(
        t,
        {
            "input_features": [
                {
                    "name": "b",
                    "type": "binary",
                    "preprocessing": {"missing_value_strategy": "fill_with_true"},
                }
            ],
            "preprocessing": {"split": {"type": "none"}},
        },
    )
    assert out.data["b"].tolist() == [True, False, True, False]
    assert out.metadata["b"]["preprocessing"]["computed_fill_value"] == "1"


@pytest.mark.parametrize("sampling", [{"sample_ratio": 0.25}, {"sample_size": 250}])
def test_sampling_keeps_an_exact_seeded_subset_block_by_block(
    sampling: dict, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[type-arg]
    t = pa.table({"x": np.arange(1000, dtype=np.float64)})
    cfg = {
        "input_features": [
            {"name": "x", "type": "number", "preprocessing": {"normalization": None}}
        ],
        "preprocessing": sampling,
    }
    one = api.preprocess(t, cfg)
    assert one.num_rows == 250 and np.bincount(one.data["split"]).tolist() == [175, 25, 50]
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 33)
    many = api.preprocess(t, cfg)
    np.testing.assert_array_equal(one.data["x"], many.data["x"])
    np.testing.assert_array_equal(one.data["split"], many.data["split"])
    assert (np.diff(one.data["x"]) > 0).all()  # a subset, in file order


def test_sample_ratio_and_size_together_is_an_error() -> None:
    from datamill.core.errors import ConfigError
    from datamill.preprocessing.config import load_config

    with pytest.raises(ConfigError, match="not both"):
        load_config(
            {
                "input_features": [{"name": "x", "type": "number"}],
                "preprocessing": {"sample_ratio": 0.5, "sample_size": 3},
            }
        )


def test_sequence_length_symbols_and_start_stop() -> None:
    t = pa.table({"s": ["a b c d", "b", "a z"]})
    nosplit = {"split": {"type": "none"}}
    fixed = api.preprocess(
        t,
        {
            "input_features": [
                {
                    "name": "s",
                    "type": "sequence",
                    "preprocessing": {
                        "sequence_length": 6,
                        "padding_symbol": "[PAD]",
                        "unknown_symbol": "[UNK]",
                    },
                }
            ],
            "preprocessing": nosplit,
        },
    )
    assert fixed.data["s"].shape == (3, 6) and fixed.metadata["s"]["idx2str"][:2] == [
        "[PAD]",
        "[UNK]",
    ]
    assert fixed.metadata.decode("s", fixed.data["s"][2][:2]).tolist() == ["a", "z"]
    short = api.preprocess(
        t,
        {
            "input_features": [
                {"name": "s", "type": "sequence", "preprocessing": {"sequence_length": 2}}
            ],
            "preprocessing": nosplit,
        },
    )
    assert short.data["s"].shape == (3, 2)
    wrapped = api.preprocess(
        t,
        {
            "input_features": [
                {"name": "s", "type": "sequence", "preprocessing": {"start_stop": True}}
            ],
            "preprocessing": nosplit,
        },
    )
    meta = wrapped.metadata["s"]
    assert (
        meta["idx2str"][:4] == ["<PAD>", "<UNK>", "<SOS>", "<EOS>"]
        and meta["max_sequence_length"] == 6
    )
    assert wrapped.metadata.decode("s", wrapped.data["s"][1]).tolist()[:3] == [
        "<SOS>",
        "b",
        "<EOS>",
    ]
    assert wrapped.data["s"][1, 3:].tolist() == [0, 0, 0]


def test_text_with_a_local_hugging_face_tokenizer_is_one_sequence(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "the": 4, "cat": 5, "sat": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    t = pa.table({"review": ["the cat sat", "the dog", None]})
    cfg = {
        "input_features": [
            {
                "name": "review",
                "type": "text",
                "preprocessing": {
                    "tokenizer": "hf_tokenizer",
                    "pretrained_model_name_or_path": str(tmp_path / "tok"),
                },
            }
        ],
        "preprocessing": {"split": {"type": "none"}},
    }
    out = api.preprocess(t, cfg, output_dir=tmp_path)
    assert sorted(out.data) == ["review"] and out.metadata["review"]["hdf5_keys"] == ["review"]
    assert out.data["review"].tolist() == [[2, 4, 5, 6, 3], [2, 4, 1, 3, 0], [2, 3, 0, 0, 0]]
    assert out.metadata["review"]["idx2str"][:4] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    fixed = api.preprocess(
        t,
        {
            **cfg,
            "input_features": [
                {
                    "name": "review",
                    "type": "text",
                    "preprocessing": {
                        "pretrained_model_name_or_path": str(tmp_path / "tok" / "tokenizer.json"),
                        "sequence_length": 3,
                    },
                }
            ],
        },
    )
    assert fixed.data["review"].tolist()[0] == [2, 4, 5]
    from datamill.core.errors import ConfigError

    with pytest.raises(ConfigError, match="downloads nothing"):
        api.preprocess(
            t,
            {
                **cfg,
                "input_features": [
                    {
                        "name": "review",
                        "type": "text",
                        "preprocessing": {"pretrained_model_name_or_path": "bert-base-uncased"},
                    }
                ],
            },
        )


def test_image_size_and_channels_inferred_from_a_sample_and_standardized(tmp_path: Path) -> None:
    from PIL import Image

    from datamill.preprocessing.features.image import IMAGENET1K_MEAN, IMAGENET1K_STD

    sizes = [(10, 20), (14, 30), (12, 40)]  # (h, w): the first image alone would give 10 x 20
    for i, (h, w) in enumerate(sizes):
        Image.new("L" if i else "RGB", (w, h), 200 if i else (200, 200, 200)).save(
            tmp_path / f"{i}.png"
        )  # 2 of 3 grey
    (tmp_path / "d.csv").write_text("img\n0.png\n1.png\n2.png\n")
    nosplit = {"split": {"type": "none"}}
    out = api.preprocess(
        tmp_path / "d.csv",
        {"input_features": [{"name": "img", "type": "image"}], "preprocessing": nosplit},
        skip_save=True,
    )
    assert (out.metadata["img"]["height"], out.metadata["img"]["width"]) == (
        12,
        30,
    )  # rounded means
    assert out.metadata["img"]["num_channels"] == 1 and out.data["img"].shape == (3, 12, 30, 1)
    first = api.preprocess(
        tmp_path / "d.csv",
        {
            "input_features": [
                {"name": "img", "type": "image", "preprocessing": {"infer_image_sample_size": 1}}
            ],
            "preprocessing": nosplit,
        },
        skip_save=True,
    )
    assert first.data["img"].shape == (3, 10, 20, 3)
    std = api.preprocess(
        tmp_path / "d.csv",
        {
            "input_features": [
                {
                    "name": "img",
                    "type": "image",
                    "preprocessing": {
                        "standardize_image": "imagenet1k",
                        "num_channels": 3,
                        "height": 4,
                        "width": 4,
                    },
                }
            ],
            "preprocessing": nosplit,
        },
        skip_save=True,
    )
    x = std.data["img"]
    assert x.dtype == np.float32 and x.shape == (3, 4, 4, 3)
    np.testing.assert_allclose(
        x[0, 0, 0], (200 / 255 - np.array(IMAGENET1K_MEAN)) / np.array(IMAGENET1K_STD), rtol=1e-5
    )


@pytest.mark.parametrize(
    ("option", "expect"),
    [("oversample_minority", (559, 280)), ("undersample_majority", (280, 140))],
)
def test_class_balancing_changes_the_training_rows_only(
    option: str, expect: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    label = (["no"] * 8 + ["yes"] * 2) * 100  # 1000 rows, 80 % "no"
    t = pa.table({"x": np.arange(1000, dtype=np.float64), "label": label})
    cfg = {
        "input_features": [
            {"name": "x", "type": "number", "preprocessing": {"normalization": None}}
        ],
        "output_features": [{"name": "label", "type": "binary"}],
        "preprocessing": {"split": {"type": "stratify", "column": "label"}, option: 0.5},
    }
    out = api.preprocess(t, cfg)
    split, y = out.data["split"], out.data["label"]
    assert (
        int((~y[split == 0]).sum()),
        int(y[split == 0].sum()),
    ) == expect  # (majority, minority) in train
    assert np.bincount(split)[1:].tolist() == [
        100,
        201,
    ]  # validation and test untouched (Ludwig's stratified sizes)
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 77)
    again = api.preprocess(t, cfg)
    np.testing.assert_array_equal(again.data["x"], out.data["x"])


def test_class_balancing_needs_an_output_feature() -> None:
    from datamill.core.errors import ConfigError

    with pytest.raises(ConfigError, match="output feature"):
        api.preprocess(
            pa.table({"x": [1.0]}),
            {
                "input_features": [{"name": "x", "type": "number"}],
                "preprocessing": {"oversample_minority": 1.0},
            },
        )


def test_global_max_sequence_length_caps_every_sequence() -> None:
    t = pa.table({"s": ["a b c d e f"], "q": ["x y z"]})
    out = api.preprocess(
        t,
        {
            "input_features": [
                {"name": "s", "type": "sequence"},
                {"name": "q", "type": "sequence", "preprocessing": {"max_sequence_length": 2}},
            ],
            "preprocessing": {"split": {"type": "none"}, "global_max_sequence_length": 4},
        },
    )
    assert out.data["s"].shape == (1, 4) and out.data["q"].shape == (1, 2)
