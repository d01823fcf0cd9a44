"""binary / number / category: values, metadata, missing values, identity of integer categories."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, DataFileError
from datamill.preprocessing.api import preprocess
from datamill.preprocessing.features import get_handler
from datamill.preprocessing.features.base import FeatureContext
from datamill.preprocessing.features.number import NumberParams

#: these tests check one feature on every row, unnormalized: no split, numbers as they are (Ludwig's
#: defaults, a 0.7/0.1/0.2 split and zscore number inputs, are tested in test_ludwig_parity.py)
NO_SPLIT = {"preprocessing": {"split": {"type": "none"}, "number": {"normalization": "none"}}}


def _one(table: pa.Table, feature: dict) -> tuple[np.ndarray, dict]:  # type: ignore[type-arg]
    out = preprocess(table, {**NO_SPLIT, "input_features": [feature]})
    return out.data[feature["name"]], out.metadata[feature["name"]]


def test_category_ids_by_frequency_unk_zero_and_most_common() -> None:
    t = pa.table({"c": ["b", "a", "b", "c", "b", "a", "d"]})
    ids, meta = _one(t, {"name": "c", "type": "category", "preprocessing": {"most_common": 2}})
    assert meta["idx2str"] == ["<UNK>", "b", "a"]
    assert meta["vocab_size"] == 3 and meta["str2freq"]["b"] == 3
    assert meta["str2idx"] == {"<UNK>": 0, "b": 1, "a": 2}
    assert ids.tolist() == [1, 2, 1, 0, 1, 2, 0]
    assert ids.dtype == np.int8  # the smallest dtype for 3 ids (Ludwig int_type)


def test_category_missing_fill_and_mode() -> None:
    t = pa.table({"c": ["x", None, "y", "y"]})
    ids, meta = _one(t, {"name": "c", "type": "category"})
    assert ids.tolist() == [2, 0, 1, 1] and meta["preprocessing"]["computed_fill_value"] == "<UNK>"
    ids, meta = _one(
        t,
        {
            "name": "c",
            "type": "category",
            "preprocessing": {"missing_value_strategy": "fill_with_mode"},
        },
    )
    assert meta["preprocessing"]["computed_fill_value"] == "y" and ids.tolist() == [2, 1, 1, 1]
    ids, _ = _one(
        t, {"name": "c", "type": "category", "preprocessing": {"missing_value_strategy": "ffill"}}
    )
    assert ids.tolist() == [1, 1, 2, 2]  # x, x, y, y: tie broken by token
    ids, _ = _one(
        t, {"name": "c", "type": "category", "preprocessing": {"missing_value_strategy": "bfill"}}
    )
    assert ids.tolist() == [2, 1, 1, 1]
    out = preprocess(
        pa.table({"c": ["x", None, "y"], "n": [1.0, 2.0, 3.0]}),
        {
            **NO_SPLIT,
            "input_features": [
                {
                    "name": "c",
                    "type": "category",
                    "preprocessing": {"missing_value_strategy": "drop_row"},
                },
                {"name": "n", "type": "number"},
            ],
        },
    )
    assert out.num_rows == 2 and out.data["n"].tolist() == [1.0, 3.0]


def test_integer_category_with_nulls_keeps_identity(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # pandas turns ints with NaN into floats; 4 must stay "4", in CSV and DataFrame inputs alike
    df = pd.DataFrame({"k": [4, None, 7, 4]})
    assert df["k"].dtype == np.float64
    _, meta_df = _one(pa.Table.from_pandas(df), {"name": "k", "type": "category"})
    p = tmp_path / "k.csv"
    p.write_text("k\n4\n\n7\n4\n")
    out = preprocess(p, {**NO_SPLIT, "input_features": [{"name": "k", "type": "category"}]})
    assert meta_df["idx2str"] == out.metadata["k"]["idx2str"] == ["<UNK>", "4", "7"]
    unseen = preprocess(pa.table({"k": [4, 5]}), None, metadata=out.metadata)
    assert unseen.data["k"].tolist() == [1, 0]


def test_number_normalizations_match_numpy() -> None:
    x = np.array([1.0, 4.0, 2.0, 10.0, 3.0])
    t = pa.table({"x": x})
    for norm, expect in [
        ("zscore", (x - x.mean()) / x.std(ddof=1)),
        ("minmax", (x - x.min()) / (x.max() - x.min())),
        ("iq", (x - np.median(x)) / (np.quantile(x, 0.75) - np.quantile(x, 0.25))),
        ("log1p", np.log1p(x)),
        ("none", x),
    ]:
        got, meta = _one(
            t, {"name": "x", "type": "number", "preprocessing": {"normalization": norm}}
        )
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expect, rtol=1e-6, err_msg=norm)
        assert meta["normalization"] == norm
    assert meta["mean"] == pytest.approx(4.0) and meta["min"] == 1.0 and meta["max"] == 10.0


def test_number_fill_with_mean_and_const() -> None:
    t = pa.table({"x": [1.0, None, 3.0]})
    got, meta = _one(
        t,
        {
            "name": "x",
            "type": "number",
            "preprocessing": {"missing_value_strategy": "fill_with_mean"},
        },
    )
    assert got.tolist() == [1.0, 2.0, 3.0] and meta["preprocessing"]["computed_fill_value"] == 2.0
    got, _ = _one(t, {"name": "x", "type": "number", "preprocessing": {"fill_value": -1}})
    assert got.tolist() == [1.0, -1.0, 3.0]


@given(st.lists(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), min_size=1, max_size=5))
def test_number_stats_merge_equals_one_block(blocks: list[list[float]]) -> None:
    h = get_handler("number")
    params = NumberParams(normalization="iq")
    ctx = FeatureContext("x", "x", None, None)
    merged = None
    for b in blocks:
        s = h.fit(pa.array(b, pa.float64()), params, ctx)
        merged = s if merged is None else h.merge(merged, s)
    whole_stats = h.fit(pa.array([v for b in blocks for v in b], pa.float64()), params, ctx)
    try:
        whole = h.finalize(whole_stats, params, ctx)
    except DataFileError:
        with pytest.raises(DataFileError, match="interquartile range is 0"):
            h.finalize(merged, params, ctx)
        return
    parts = h.finalize(merged, params, ctx)  # (iq with an interquartile range of 0: refused)
    for k in ("count", "min", "max", "q1", "median", "q3"):
        assert parts[k] == whole[k]
    assert parts["mean"] == pytest.approx(whole["mean"], rel=1e-9, abs=1e-6)
    assert parts["std"] == pytest.approx(whole["std"], rel=1e-6, abs=1e-6)


def test_binary_default_and_custom_strings() -> None:
    t = pa.table({"b": ["Y", "N", "Y", None, "Y"]})
    got, meta = _one(t, {"name": "b", "type": "binary"})
    assert got.dtype == np.bool_ and got.tolist() == [True, False, True, False, True]
    assert meta["bool2str"] == [
        "N",
        "Y",
    ]  # the null was filled with the column's false label "N" (Ludwig's)
    assert meta["preprocessing"]["computed_fill_value"] == "N" and meta["str2freq"]["N"] == 2
    _, meta = _one(pa.table({"b": ["Y", "N", "N"]}), {"name": "b", "type": "binary"})
    assert meta["bool2str"] == ["N", "Y"]
    t = pa.table({"b": ["good", "bad", "good"]})
    got, _ = _one(
        t,
        {
            "name": "b",
            "type": "binary",
            "preprocessing": {"true_strings": ["good"], "false_strings": ["bad"]},
        },
    )
    assert got.tolist() == [True, False, True]
    got, _ = _one(
        t, {"name": "b", "type": "binary", "preprocessing": {"fallback_true_label": "bad"}}
    )
    assert got.tolist() == [False, True, False]
    with pytest.raises(DataFileError) as info:  # no automatic label for a conventional value
        _one(pa.table({"b": ["Y", "maybe"]}), {"name": "b", "type": "binary"})
    assert info.value.column == "b" and info.value.row == 1
    for values in (["Y", "N", "maybe"], ["a", "b", "c"], ["Y", "N", "y"]):  # Ludwig refuses them
        with pytest.raises(ConfigError, match="expects 2 distinct values") as info2:
            _one(pa.table({"b": values}), {"name": "b", "type": "binary"})
        assert info2.value.column == "b"


def test_binary_follows_ludwigs_str2bool_and_automatic_label() -> None:
    t = pa.table({"b": ["human", "bot", None, "bot"]})
    with pytest.warns(UserWarning, match="automatic fallback_true_label 'bot'"):
        got, meta = _one(
            t, {"name": "b", "type": "binary"}
        )  # Ludwig: the first sorted value is true
    assert got.tolist() == [False, True, False, True]
    assert meta["fallback_true_label"] == "bot" and meta["str2bool"] == {
        "bot": True,
        "human": False,
    }
    assert (
        meta["preprocessing"]["computed_fill_value"] == "human"
    )  # Ludwig: reverse-sorted first false value
    with pytest.warns(UserWarning):
        got, meta = _one(
            t,
            {
                "name": "b",
                "type": "binary",
                "preprocessing": {"missing_value_strategy": "fill_with_true"},
            },
        )
    assert (
        got.tolist() == [False, True, True, True]
        and meta["preprocessing"]["computed_fill_value"] == "bot"
    )
    # conventional strings first, then the fallback label (Ludwig's str2bool): "no" stays false
    got, _ = _one(
        pa.table({"b": ["no", "cat", "cat"]}),
        {"name": "b", "type": "binary", "preprocessing": {"fallback_true_label": "no"}},
    )
    assert got.tolist() == [False, False, False]
    got, _ = _one(
        pa.table({"b": ["yes", "cat", "yes"]}),
        {"name": "b", "type": "binary", "preprocessing": {"fallback_true_label": "cat"}},
    )
    assert got.tolist() == [True, True, True]
    _, meta = _one(pa.table({"b": ["Y", "N", None]}), {"name": "b", "type": "binary"})
    # Ludwig stores the first sorted value (unused: both values are conventional)
    assert meta["fallback_true_label"] == "N" and meta["str2bool"] == {"N": False, "Y": True}
    _, meta = _one(pa.table({"b": ["1", "0", None]}), {"name": "b", "type": "binary"})
    assert meta["fallback_true_label"] is None  # numbers: pandas casts them, no label


@given(st.lists(st.sampled_from(["a", "b", "c", "dd", "é", "4"]), min_size=1, max_size=60))
def test_category_roundtrip_and_frequency_order(values: list[str]) -> None:
    out = preprocess(
        pa.table({"c": values}), {**NO_SPLIT, "input_features": [{"name": "c", "type": "category"}]}
    )
    ids = out.data["c"]
    assert out.metadata.decode("c", ids).tolist() == values
    meta = out.metadata["c"]
    freqs = [meta["str2freq"][t] for t in meta["idx2str"][1:]]
    assert freqs == sorted(freqs, reverse=True)
    # ties broken by token ascending
    pairs = list(zip(freqs, meta["idx2str"][1:]))
    assert pairs == sorted(pairs, key=lambda p: (-p[0], p[1]))


def test_nan_counts_as_missing() -> None:
    t = pa.table({"x": pa.array([1.0, float("nan"), 3.0]), "s": ["1", "nan", "3"]})
    out = preprocess(
        t,
        {
            **NO_SPLIT,
            "input_features": [
                {
                    "name": "x",
                    "type": "number",
                    "preprocessing": {"missing_value_strategy": "fill_with_mean"},
                },
                {"name": "s", "type": "number", "preprocessing": {"fill_value": 7}},
            ],
        },
    )
    assert out.data["x"].tolist() == [1.0, 2.0, 3.0] and out.data["s"].tolist() == [1.0, 7.0, 3.0]


def test_id_dtype_grows_with_the_vocabulary() -> None:
    """Ludwig's int_type: int8 up to 128 ids (<UNK> included), then int16."""
    for distinct, dtype in ((127, np.int8), (128, np.int16)):
        t = pa.table({"c": [f"v{i}" for i in range(distinct)]})
        ids, meta = _one(
            t, {"name": "c", "type": "category", "preprocessing": {"most_common": 1000}}
        )
        assert meta["vocab_size"] == distinct + 1 and ids.dtype == dtype
        assert sorted(ids.tolist()) == list(range(1, distinct + 1))
